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

-- Read with the reader's rights (PostgreSQL 15 and later), so that row-level security shows a
-- submitter its own tasks' attempts only (sql/roles.sql grants it then).
do $$
begin
  if current_setting('server_version_num')::integer >= 150000 then
    alter view sked.task_attempt_history set (security_invoker = true);
  end if;
end
$$;

-- Tasks per queue and state.
create or replace view sked.queue_counts as
  select queue, state, count(*) as tasks
    from sked.tasks
   group by queue, state;

-- Workers with their liveness (alive while the heartbeat is younger than the lease), the
-- tasks they run and the CPU and memory those requested. Dropped first: `w.*` grows with
-- the table, and a replaced view may only add columns at its end.
drop view if exists sked.worker_status;
create view sked.worker_status as
  select w.*, (w.heartbeat_at + w.lease > now()) as alive,
         coalesce(r.running, 0) as running,
         coalesce(r.cpu_millis, 0) as running_cpu_millis,
         coalesce(r.memory_mb, 0) as running_memory_mb
    from sked.workers w
    left join lateral (
      select count(*) as running, sum(t.cpu_millis) as cpu_millis, sum(t.memory_mb) as memory_mb
        from sked.tasks t
       where t.state = 'running' and t.worker_id = w.id
    ) r on true;
