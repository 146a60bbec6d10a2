-- The task functions of the SQL contract: submit (one and many), cancel, retry, and the
-- insert notification. Applications call these by name; see docs/sql.md.
-- Every function that reads the clock takes it as `p_now`/`now_` so tests can move time.

-- One small notification per statement (never per row): the distinct queues that received
-- claimable tasks. A per-row NOTIFY would serialise commits and cap insert throughput.
create or replace function sked.tasks_after_insert_notify() returns trigger
language plpgsql as $$
declare
  queues text;
begin
  select string_agg(distinct queue, ',') into queues from new_rows where state in ('waiting', 'retry');
  if queues is not null then
    perform pg_notify('sked_tasks', left(queues, 7000));
  end if;
  return null;
end
$$;

create or replace trigger tasks_after_insert_notify
  after insert on sked.tasks
  referencing new table as new_rows
  for each statement execute function sked.tasks_after_insert_notify();

-- Submit one task with named arguments; returns its id. The defaults are the table's.
-- With an idempotency key, submitting again while the first task is unfinished returns the
-- first task's id and inserts nothing.
create or replace function sked.task_submit(
  command         text[]      default null,
  args            text[]      default '{}',
  queue           text        default 'default',
  priority        integer     default 0,
  input           jsonb       default null,
  env             jsonb       default '{}',
  run_at          timestamptz default null,
  delay           interval    default null,
  max_attempts    integer     default 3,
  timeout         interval    default null,
  owner           text        default current_user,
  idempotency_key text        default null,
  labels          text[]      default '{}',
  artifact_url    text        default null,
  artifact_sha256 text        default null,
  output_path     text        default null,
  kind            text        default 'command',
  backoff_base    interval    default '1 second',
  backoff_max     interval    default '1 hour'
) returns uuid
language plpgsql as $$
#variable_conflict use_column
declare
  new_id uuid;
begin
  insert into sked.tasks as t (command, args, queue, priority, input, env, next_run_at, max_attempts,
                               timeout, owner, idempotency_key, labels, artifact_url,
                               artifact_sha256, output_path, kind, backoff_base, backoff_max)
  values (task_submit.command, task_submit.args, task_submit.queue, task_submit.priority,
          task_submit.input, task_submit.env,
          coalesce(task_submit.run_at, now()) + coalesce(task_submit.delay, interval '0'),
          task_submit.max_attempts, task_submit.timeout, task_submit.owner,
          task_submit.idempotency_key, task_submit.labels, task_submit.artifact_url,
          task_submit.artifact_sha256, task_submit.output_path, task_submit.kind,
          task_submit.backoff_base, task_submit.backoff_max)
  on conflict (owner, idempotency_key)
    where idempotency_key is not null and state in ('blocked', 'waiting', 'running', 'retry')
    do nothing
  returning t.id into new_id;
  if new_id is null then
    select t.id into new_id from sked.tasks t
     where t.owner = task_submit.owner and t.idempotency_key = task_submit.idempotency_key
       and t.state in ('blocked', 'waiting', 'running', 'retry');
  end if;
  return new_id;
end
$$;

-- Submit many tasks in one statement from a JSON array of objects whose keys are the
-- arguments of sked.task_submit; returns the ids in input order. Missing keys take the
-- defaults; `owner_` applies to objects that name no owner. All or nothing: one bad task
-- rejects the whole batch. Idempotency keys are honoured as in task_submit.
create or replace function sked.tasks_submit(tasks jsonb, owner_ text default current_user)
returns table (id uuid)
language plpgsql as $$
begin
  if jsonb_typeof(tasks) is distinct from 'array' then
    raise exception 'sked.tasks_submit expects a JSON array of task objects'
      using errcode = '22023';
  end if;
  return query
  with input as materialized (
    select sked.uuid_v7() as new_id, r.ord, x.*
      from jsonb_array_elements(tasks) with ordinality as r(elem, ord),
           jsonb_to_record(r.elem) as x(command text[], args text[], queue text, priority integer,
                                        input jsonb, env jsonb, run_at timestamptz,
                                        delay interval, max_attempts integer, timeout interval,
                                        owner text, idempotency_key text, labels text[],
                                        artifact_url text, artifact_sha256 text,
                                        output_path text, kind text, backoff_base interval,
                                        backoff_max interval)
  ), inserted as (
    insert into sked.tasks as t (id, command, args, queue, priority, input, env, next_run_at,
                                 max_attempts, timeout, owner, idempotency_key, labels,
                                 artifact_url, artifact_sha256, output_path, kind,
                                 backoff_base, backoff_max)
    select i.new_id, i.command, coalesce(i.args, '{}'), coalesce(i.queue, 'default'),
           coalesce(i.priority, 0), i.input, coalesce(i.env, '{}'),
           coalesce(i.run_at, now()) + coalesce(i.delay, interval '0'),
           coalesce(i.max_attempts, 3), i.timeout, coalesce(i.owner, owner_),
           i.idempotency_key, coalesce(i.labels, '{}'), i.artifact_url, i.artifact_sha256,
           i.output_path, coalesce(i.kind, 'command'), coalesce(i.backoff_base, interval '1 second'),
           coalesce(i.backoff_max, interval '1 hour')
      from input i order by i.ord
    on conflict (owner, idempotency_key)
      where idempotency_key is not null and state in ('blocked', 'waiting', 'running', 'retry')
      do nothing
    returning t.id, t.owner, t.idempotency_key
  )
  -- A row skipped by its idempotency key answers with the task that holds the key: one
  -- inserted earlier in this batch, or an unfinished one already in the table.
  select coalesce(
           ins.id,
           (select d.id from inserted d
             where d.owner = coalesce(i.owner, owner_) and d.idempotency_key = i.idempotency_key),
           (select t.id from sked.tasks t
             where t.owner = coalesce(i.owner, owner_) and t.idempotency_key = i.idempotency_key
               and t.state in ('blocked', 'waiting', 'running', 'retry')))
    from input i
    left join inserted ins on ins.id = i.new_id
   order by i.ord;
end
$$;

-- Cancel a task. A task that has not started ends `cancelled` at once; a running task gets a
-- cancel request that its worker acts on within a second (it kills the process group and
-- records `cancelled`). Returns the state after the call: 'cancelled', 'running' (cancel
-- requested), or the final state the task already had; null when there is no such task.
create or replace function sked.task_cancel(p_id uuid, p_now timestamptz default now())
returns text
language plpgsql as $$
declare
  result text;
begin
  update sked.tasks set state = 'cancelled', finished_at = p_now, error = 'cancelled before it ran'
   where id = p_id and state in ('blocked', 'waiting', 'retry')
  returning state into result;
  if found then
    return result;
  end if;
  update sked.tasks set cancel_requested_at = coalesce(cancel_requested_at, p_now)
   where id = p_id and state = 'running'
  returning state into result;
  if found then
    perform pg_notify('sked_cancel', p_id::text);
    return result;
  end if;
  select state into result from sked.tasks where id = p_id;
  return result;
end
$$;

-- Run a finished task (failed, cancelled or succeeded) again. It becomes `waiting` now, keeps
-- its attempt count (attempt numbers only grow, which keeps fencing sound) and gets at least
-- one more attempt. A successful attempt is moved to the history first. Returns the new
-- state ('waiting'), the unchanged state when the task is not finished, or null when absent.
create or replace function sked.task_retry(p_id uuid, p_now timestamptz default now())
returns text
language plpgsql as $$
declare
  result text;
  q text;
begin
  insert into sked.task_attempts (task_id, attempt, worker_id, started_at, finished_at, outcome,
                                  exit_code, error, stdout_tail, stderr_tail)
  select t.id, t.attempt, t.worker_id, t.started_at, t.finished_at, 'succeeded', t.exit_code,
         t.error, t.stdout_tail, t.stderr_tail
    from sked.tasks t
   where t.id = p_id and t.state = 'succeeded'
  on conflict do nothing;

  update sked.tasks
     set state = 'waiting', next_run_at = p_now, finished_at = null, cancel_requested_at = null,
         max_attempts = greatest(max_attempts, attempt + 1), lease_expires_at = null,
         exit_code = null, error = null, stdout_tail = null, stderr_tail = null,
         output_sha256 = null
   where id = p_id and state in ('failed', 'cancelled', 'succeeded')
  returning state, queue into result, q;
  if found then
    perform pg_notify('sked_tasks', q);
    return result;
  end if;
  select state into result from sked.tasks where id = p_id;
  return result;
end
$$;

-- Retention: delete finished tasks (succeeded, failed, cancelled) that finished before
-- `p_before`, with their attempts and logs, at most `p_limit` tasks per call (call again
-- until it returns 0). Unfinished tasks are never touched. Returns the tasks deleted.
create or replace function sked.tasks_prune(p_before timestamptz, p_limit integer default 10000)
returns integer
language plpgsql as $$
declare
  deleted integer;
begin
  with doomed as (
    select t.id from sked.tasks t
     where t.finished_at < p_before and t.state in ('succeeded', 'failed', 'cancelled')
     limit p_limit
     for update skip locked
  ), logs as (
    delete from sked.task_logs l using doomed d where l.task_id = d.id
  ), attempts as (
    delete from sked.task_attempts a using doomed d where a.task_id = d.id
  )
  delete from sked.tasks t using doomed d where t.id = d.id;
  get diagnostics deleted = row_count;
  return deleted;
end
$$;
