-- Read-side views of the SQL contract.

-- Every attempt of every task: finished attempts from sked.task_attempts, plus the attempt
-- whose record is still the task row (the running one, or the last one of a succeeded task).
-- A task that never ran (the parent of shards) has no attempt.
create or replace view sked.task_attempt_history as
  select a.task_id, a.attempt, a.worker_id, a.started_at, a.finished_at, a.outcome,
         a.exit_code, a.error, a.stdout_tail, a.stderr_tail
    from sked.task_attempts a
  union all
  select t.id, t.attempt, t.worker_id, t.started_at, t.finished_at,
         case t.state when 'running' then 'running' else 'succeeded' end,
         t.exit_code, t.error, t.stdout_tail, t.stderr_tail
    from sked.tasks t
   where t.state in ('running', 'succeeded') and t.attempt > 0;

-- Tasks per queue and state.
create or replace view sked.queue_counts as
  select queue, state, count(*) as tasks
    from sked.tasks
   group by queue, state;

-- Workers with their liveness: alive while the heartbeat is younger than the lease.
create or replace view sked.worker_status as
  select w.*, (w.heartbeat_at + w.lease > now()) as alive,
         (select count(*) from sked.tasks t
           where t.lease_expires_at is not null and t.state = 'running' and t.worker_id = w.id) as running
    from sked.workers w;
