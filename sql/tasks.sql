-- The task functions of the SQL contract: submit (one and many), cancel, retry, resubmit,
-- prune, and the insert notification. Applications call these by name; see docs/sql.md.
-- Every function that reads the clock takes it as `p_now`/`now_` so tests can move time.

-- The first rule about what a task runs that these values break, or null when they break
-- none. One CASE expression, so the planner inlines it into the set-based checks below.
create or replace function sked.task_rule_broken(
  command text[], args text[], labels text[], queue text, env jsonb, artifact_url text,
  artifact_sha256 text)
returns text
language sql immutable parallel safe as $$
  select case
    when command is not null
         and (cardinality(command) = 0 or command[1] = '' or array_position(command, null) is not null)
      then 'tasks_command_must_not_be_empty'
    when array_position(args, null) is not null then 'tasks_args_must_not_contain_null'
    when array_position(labels, null) is not null then 'tasks_labels_must_not_contain_null'
    when not (length(queue) between 1 and 64
              and ltrim(queue, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-') = ''
              and ltrim(left(queue, 1), '_.:-') <> '')
      then 'tasks_queue_name_must_be_1_to_64_word_characters'
    when env <> '{}'::jsonb and not sked.env_is_valid(env) then 'tasks_env_must_be_an_object_of_strings'
    when artifact_url is not null and artifact_url !~ '^(file:///|https?://|pg:)'
      then 'tasks_artifact_url_scheme_must_be_file_http_https_or_pg'
    when artifact_sha256 is not null and artifact_sha256 !~ '^[0-9a-f]{64}$'
      then 'tasks_artifact_sha256_must_be_64_lowercase_hex'
    when artifact_url like 'pg:%' and artifact_url <> 'pg:' || artifact_sha256
      then 'tasks_pg_artifact_url_must_name_its_sha256'
  end
$$;

-- Raises check_violation for a broken rule, naming it as the constraint (as a CHECK
-- constraint would), with a sentence for people.
create or replace function sked.task_rule_raise(rule text, queue text) returns void
language plpgsql as $$
declare
  says text := case rule
    when 'tasks_command_must_not_be_empty' then
      'command must be a non-empty array whose first element (the program) is not empty, without nulls'
    when 'tasks_args_must_not_contain_null' then 'args must not contain null'
    when 'tasks_labels_must_not_contain_null' then 'labels must not contain null'
    when 'tasks_queue_name_must_be_1_to_64_word_characters' then
      format('queue %L must be 1 to 64 characters of A-Z, a-z, 0-9, _ . : - starting with a letter or digit', queue)
    when 'tasks_env_must_be_an_object_of_strings' then
      'env must be a JSON object whose values are strings (names not empty, without =)'
    when 'tasks_artifact_url_scheme_must_be_file_http_https_or_pg' then
      'artifact_url must start with file:///, http://, https:// or pg:'
    when 'tasks_artifact_sha256_must_be_64_lowercase_hex' then
      'artifact_sha256 must be 64 lowercase hexadecimal digits'
    when 'tasks_pg_artifact_url_must_name_its_sha256' then
      'an artifact stored in Postgres is named pg:<artifact_sha256>'
    else rule end;
begin
  raise exception 'sked.tasks: % (%)', says, rule
    using errcode = 'check_violation', constraint = rule, table = 'tasks', schema = 'sked';
end
$$;

-- Inserts (INSERT, COPY, the submit functions) are checked once per statement over all new
-- rows, which costs far less per row than a row trigger; an update that changes one of these
-- columns is checked row by row. Claims, finishes and heartbeats change none of them and
-- pay nothing, unlike CHECK constraints, which every update of a row evaluates.
create or replace function sked.tasks_before_update_validate() returns trigger
language plpgsql as $$
declare
  rule text := sked.task_rule_broken(new.command, new.args, new.labels, new.queue, new.env,
                                     new.artifact_url, new.artifact_sha256);
begin
  if rule is not null then
    perform sked.task_rule_raise(rule, new.queue);
  end if;
  return new;
end
$$;

create or replace trigger tasks_before_update_validate
  before update of command, args, labels, queue, env, artifact_url, artifact_sha256
  on sked.tasks
  for each row execute function sked.tasks_before_update_validate();

-- One small notification per statement (never per row): the distinct queues that received
-- claimable tasks. A per-row NOTIFY would serialise commits and cap insert throughput.
-- The same statement trigger first checks the new rows' rules (see above).
create or replace function sked.tasks_after_insert_notify() returns trigger
language plpgsql as $$
declare
  queues text;
  broken record;
begin
  select b.rule, b.queue into broken
    from (select sked.task_rule_broken(n.command, n.args, n.labels, n.queue, n.env,
                                       n.artifact_url, n.artifact_sha256) as rule, n.queue
            from new_rows n) b
   where b.rule is not null
   limit 1;
  if found then
    perform sked.task_rule_raise(broken.rule, broken.queue);
  end if;
  -- Shards (sql/shards.sql) are covered by the notification of the statement that inserted
  -- their parent: the parent, in the same queue, was inserted waiting, or blocked with them.
  select string_agg(distinct queue, ',') into queues from new_rows
   where sked.state_is_claimable(state) and shard_of is null;
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
-- first task's id and inserts nothing. `shards` (1 to 10000) or `broadcast` make a sharded
-- task (docs/shards.md). `cpu_millis` and `memory_mb` request capacity (docs/runtime.md),
-- `max_output_bytes` caps stdout and stderr, `run_as` names the user the task runs as.
-- `replicas`, `restart_policy` and `health_check` describe a service (kind 'service',
-- docs/services.md). A `preemptible` task may be stopped while it runs to make room for a
-- copy of a service, and waits again (docs/runtime.md, "Services first"); a service cannot be.
drop function if exists sked.task_submit(text[], text[], text, integer, jsonb, jsonb, timestamptz,
                                         interval, integer, interval, text, text, text[], text,
                                         text, text, text, interval, interval);
drop function if exists sked.task_submit(text[], text[], text, integer, jsonb, jsonb, timestamptz,
                                         interval, integer, interval, text, text, text[], text,
                                         text, text, text, interval, interval, integer, boolean);
drop function if exists sked.task_submit(text[], text[], text, integer, jsonb, jsonb, timestamptz,
                                         interval, integer, interval, text, text, text[], text,
                                         text, text, text, interval, interval, integer, boolean,
                                         integer, integer, bigint, text);
drop function if exists sked.task_submit(text[], text[], text, integer, jsonb, jsonb, timestamptz,
                                         interval, integer, interval, text, text, text[], text,
                                         text, text, text, interval, interval, integer, boolean,
                                         integer, integer, bigint, text, integer, text, jsonb);
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
  backoff_max     interval    default '1 hour',
  shards          integer     default null,
  broadcast       boolean     default false,
  cpu_millis      integer     default null,
  memory_mb       integer     default null,
  max_output_bytes bigint     default null,
  run_as          text        default null,
  replicas        integer     default null,
  restart_policy  text        default null,
  health_check    jsonb       default null,
  preemptible     boolean     default false
) returns uuid
language plpgsql as $$
#variable_conflict use_column
declare
  new_id uuid;
begin
  insert into sked.tasks as t (command, args, queue, priority, input, env, next_run_at, max_attempts,
                               timeout, owner, idempotency_key, labels, artifact_url,
                               artifact_sha256, output_path, kind, backoff_base, backoff_max,
                               shard_total, broadcast, cpu_millis, memory_mb, max_output_bytes,
                               run_as, replicas, restart_policy, health_check, preemptible)
  values (task_submit.command, task_submit.args, task_submit.queue, task_submit.priority,
          task_submit.input, task_submit.env,
          coalesce(task_submit.run_at, now()) + coalesce(task_submit.delay, interval '0'),
          task_submit.max_attempts, task_submit.timeout, task_submit.owner,
          task_submit.idempotency_key, task_submit.labels, task_submit.artifact_url,
          task_submit.artifact_sha256, task_submit.output_path, task_submit.kind,
          task_submit.backoff_base, task_submit.backoff_max, task_submit.shards,
          coalesce(task_submit.broadcast, false), task_submit.cpu_millis, task_submit.memory_mb,
          task_submit.max_output_bytes, task_submit.run_as, task_submit.replicas,
          task_submit.restart_policy, task_submit.health_check,
          coalesce(task_submit.preemptible, false))
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

-- Raises check_violation (tasks_preemptible_must_be_a_boolean) for a `preemptible` key
-- whose JSON value is not a boolean; its return type lets a CASE of sked.tasks_from_json call it.
create or replace function sked.task_preemptible_refuse(value jsonb) returns boolean
language plpgsql as $$
begin
  raise exception 'sked.tasks: preemptible must be a boolean (true or false), not %', value
    using errcode = 'check_violation', constraint = 'tasks_preemptible_must_be_a_boolean',
          table = 'tasks', schema = 'sked';
end
$$;

-- The rows a JSON array of task objects stands for (keys: the arguments of
-- sked.task_submit), with the table's defaults filled in and a new id each, in input order
-- (`ord` counts from 1). Objects without `owner` get `owner_`; `run_at` defaults to `p_now`.
-- Shared by sked.tasks_submit and sked.workflow_submit. The key `shards` is the column
-- shard_total. `preemptible` must be a JSON boolean (or null, which means false): the text
-- reading of jsonb_to_record would take 1 or "yes" for true.
drop function if exists sked.tasks_from_json(jsonb, text, timestamptz);
create or replace function sked.tasks_from_json(
  tasks jsonb, owner_ text default current_user, p_now timestamptz default now())
returns table (
  new_id uuid, ord bigint, command text[], args text[], queue text, priority integer, input jsonb,
  env jsonb, next_run_at timestamptz, max_attempts integer, timeout interval, owner text,
  idempotency_key text, labels text[], artifact_url text, artifact_sha256 text,
  output_path text, kind text, backoff_base interval, backoff_max interval,
  shard_total integer, broadcast boolean, cpu_millis integer, memory_mb integer,
  max_output_bytes bigint, run_as text, replicas integer, restart_policy text,
  health_check jsonb, preemptible boolean)
language sql volatile as $$
  select sked.uuid_v7(), r.ord, x.command, coalesce(x.args, '{}'),
         coalesce(x.queue, 'default'), coalesce(x.priority, 0), x.input,
         coalesce(x.env, '{}'),
         coalesce(x.run_at, p_now) + coalesce(x.delay, interval '0'),
         coalesce(x.max_attempts, 3), x.timeout,
         coalesce(x.owner, owner_), x.idempotency_key,
         coalesce(x.labels, '{}'), x.artifact_url, x.artifact_sha256, x.output_path,
         coalesce(x.kind, 'command'),
         coalesce(x.backoff_base, interval '1 second'),
         coalesce(x.backoff_max, interval '1 hour'),
         x.shards, coalesce(x.broadcast, false), x.cpu_millis, x.memory_mb,
         x.max_output_bytes, x.run_as, x.replicas, x.restart_policy, x.health_check,
         case coalesce(jsonb_typeof(r.elem -> 'preemptible'), 'null')
           when 'boolean' then (r.elem -> 'preemptible')::boolean
           when 'null' then false
           else sked.task_preemptible_refuse(r.elem -> 'preemptible') end
    from jsonb_array_elements(tasks) with ordinality as r(elem, ord),
         jsonb_to_record(r.elem) as x(command text[], args text[], queue text, priority integer,
                                      input jsonb, env jsonb, run_at timestamptz,
                                      delay interval, max_attempts integer, timeout interval,
                                      owner text, idempotency_key text, labels text[],
                                      artifact_url text, artifact_sha256 text,
                                      output_path text, kind text, backoff_base interval,
                                      backoff_max interval, shards integer, broadcast boolean,
                                      cpu_millis integer, memory_mb integer,
                                      max_output_bytes bigint, run_as text,
                                      replicas integer, restart_policy text,
                                      health_check jsonb)
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
    -- One row per task with the table's defaults filled in; ids are made there so that
    -- they can be answered in input order.
    select * from sked.tasks_from_json(tasks, owner_, now())
  ), plain as (
    -- Tasks without an idempotency key cannot conflict: a plain insert, cheaper than the
    -- speculative insertion that ON CONFLICT needs for every row.
    insert into sked.tasks (id, command, args, queue, priority, input, env, next_run_at,
                            max_attempts, timeout, owner, idempotency_key, labels, artifact_url,
                            artifact_sha256, output_path, kind, backoff_base, backoff_max,
                            shard_total, broadcast, cpu_millis, memory_mb, max_output_bytes,
                            run_as, replicas, restart_policy, health_check, preemptible)
    select i.new_id, i.command, i.args, i.queue, i.priority, i.input, i.env, i.next_run_at,
           i.max_attempts, i.timeout, i.owner, i.idempotency_key, i.labels, i.artifact_url,
           i.artifact_sha256, i.output_path, i.kind, i.backoff_base, i.backoff_max,
           i.shard_total, i.broadcast, i.cpu_millis, i.memory_mb, i.max_output_bytes, i.run_as,
           i.replicas, i.restart_policy, i.health_check, i.preemptible
      from input i where i.idempotency_key is null order by i.ord
  ), keyed as (
    insert into sked.tasks as t (id, command, args, queue, priority, input, env, next_run_at,
                                 max_attempts, timeout, owner, idempotency_key, labels,
                                 artifact_url, artifact_sha256, output_path, kind, backoff_base,
                                 backoff_max, shard_total, broadcast, cpu_millis, memory_mb,
                                 max_output_bytes, run_as, replicas, restart_policy,
                                 health_check, preemptible)
    select i.new_id, i.command, i.args, i.queue, i.priority, i.input, i.env, i.next_run_at,
           i.max_attempts, i.timeout, i.owner, i.idempotency_key, i.labels, i.artifact_url,
           i.artifact_sha256, i.output_path, i.kind, i.backoff_base, i.backoff_max,
           i.shard_total, i.broadcast, i.cpu_millis, i.memory_mb, i.max_output_bytes, i.run_as,
           i.replicas, i.restart_policy, i.health_check, i.preemptible
      from input i where i.idempotency_key is not null order by i.ord
    on conflict (owner, idempotency_key)
      where idempotency_key is not null and state in ('blocked', 'waiting', 'running', 'retry')
      do nothing
    returning t.id, t.owner, t.idempotency_key
  )
  -- A row skipped by its idempotency key answers with the task that holds the key: one
  -- inserted earlier in this batch, or an unfinished one already in the table.
  select case
           when i.idempotency_key is null then i.new_id
           else coalesce(
             (select d.id from keyed d where d.id = i.new_id),
             (select d.id from keyed d
               where d.owner = i.owner and d.idempotency_key = i.idempotency_key),
             (select t.id from sked.tasks t
               where t.owner = i.owner and t.idempotency_key = i.idempotency_key
                 and t.state in ('blocked', 'waiting', 'running', 'retry')))
         end
    from input i
   order by i.ord;
end
$$;

-- Cancel a task. A task that has not started ends `cancelled` at once; a running task gets a
-- cancel request that its worker acts on within a second (it kills the process group and
-- records `cancelled`). The parent of a sharded task takes its shards with it (see
-- sked.shards_cancel). Returns the state after the call: 'cancelled', 'running' (cancel
-- requested), or the final state the task already had; null when there is no such task.
create or replace function sked.task_cancel(p_id uuid, p_now timestamptz default now())
returns text
language plpgsql as $$
declare
  result text;
  settles boolean;
  sharded boolean;
  running text;
  queues text;
begin
  update sked.tasks set state = 'cancelled', finished_at = p_now, error = 'cancelled before it ran'
   where id = p_id and sked.state_waits_to_run(state)
  returning state, children > 0 or workflow_id is not null, trigger_rule = 'shards'
    into result, settles, sharded;
  if found then
    if sharded then
      running := sked.shards_cancel(p_id, p_now);
    end if;
    -- Its children follow their trigger rules, and its workflow may be finished now.
    if settles then
      queues := sked.tasks_settle(array[p_id], p_now);
    end if;
    -- One notification: stopping running shards comes first; a task released by the cancel
    -- then waits for the workers' poll.
    if running is not null then
      perform pg_notify('sked_cancel', running);
    elsif queues is not null then
      perform pg_notify('sked_tasks', left(queues, 7000));
    end if;
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

-- Run a finished task (failed, cancelled or succeeded) again. It keeps its attempt count
-- (attempt numbers only grow, which keeps fencing sound) and gets at least one more attempt;
-- a successful attempt is moved to the history first. It becomes `waiting` now, or, in a
-- DAG, what its trigger rule gives with its parents as they are (`blocked` while some are
-- unfinished); its descendants that ended upstream_failed or skipped wait for it again (see
-- sked.tasks_rerun). The parent of a finished sharded task runs again with its shards that
-- did not succeed, or with all of them when all did (sked.shards_to_rerun). Returns the new
-- state, the unchanged state when the task is not finished, or null when absent.
create or replace function sked.task_retry(p_id uuid, p_now timestamptz default now())
returns text
language plpgsql as $$
declare
  result text;
  sharded boolean;
  queues text;
begin
  select state, trigger_rule = 'shards' into result, sharded from sked.tasks where id = p_id for update;
  if sharded and result in ('succeeded', 'cancelled', 'upstream_failed', 'skipped') then
    queues := sked.tasks_rerun(sked.shards_to_rerun(p_id), p_now);
    if queues is not null then
      perform pg_notify('sked_tasks', left(queues, 7000));
    end if;
    select state into result from sked.tasks where id = p_id;
  elsif result in ('failed', 'cancelled', 'succeeded') then
    queues := sked.tasks_rerun(array[p_id], p_now);
    if queues is not null then
      perform pg_notify('sked_tasks', left(queues, 7000));
    end if;
    select state into result from sked.tasks where id = p_id;
  end if;
  return result;
end
$$;

-- Submit a new task with the definition of task p_id ("run again"): what it runs (kind,
-- command or artifact, args), its input and environment (the real values, which API answers
-- mask), queue, priority, labels, output path, timeout, max_attempts (as the task has it
-- now, which retries and interrupted attempts raise), backoff, shards or broadcast (a
-- sharded task is submitted sharded again), resource requests, output cap, user and
-- whether it is preemptible. The new task belongs to p_owner, waits from
-- p_now, and has no idempotency key. Tasks of a workflow and shards run as part of their
-- workflow or parent and are refused (retry them, or resubmit the parent). Returns the new
-- id, or null when there is no such task.
create or replace function sked.task_resubmit(
  p_id uuid, p_owner text default current_user, p_now timestamptz default now())
returns uuid
language plpgsql as $$
declare
  source record;
  new_id uuid;
begin
  select t.workflow_id, t.shard_of into source from sked.tasks t where t.id = p_id;
  if not found then
    return null;
  end if;
  if source.workflow_id is not null then
    raise exception 'sked.tasks: a task of a workflow runs with its workflow and cannot be resubmitted on its own (tasks_resubmit_is_not_for_workflow_tasks)'
      using errcode = 'check_violation', constraint = 'tasks_resubmit_is_not_for_workflow_tasks',
            table = 'tasks', schema = 'sked';
  end if;
  if source.shard_of is not null then
    raise exception 'sked.tasks: a shard runs as part of its parent %; resubmit the parent (tasks_resubmit_is_not_for_shards)', source.shard_of
      using errcode = 'check_violation', constraint = 'tasks_resubmit_is_not_for_shards',
            table = 'tasks', schema = 'sked';
  end if;
  insert into sked.tasks (owner, queue, priority, kind, command, args, artifact_url,
                          artifact_sha256, input, env, labels, output_path, timeout,
                          max_attempts, backoff_base, backoff_max, shard_total, broadcast,
                          next_run_at, cpu_millis, memory_mb, max_output_bytes, run_as,
                          replicas, restart_policy, health_check, preemptible)
  select p_owner, t.queue, t.priority, t.kind, t.command, t.args, t.artifact_url,
         t.artifact_sha256, t.input, t.env, t.labels, t.output_path, t.timeout,
         t.max_attempts, t.backoff_base, t.backoff_max, t.shard_total, t.broadcast, p_now,
         t.cpu_millis, t.memory_mb, t.max_output_bytes, t.run_as, t.replicas,
         t.restart_policy, t.health_check, t.preemptible
    from sked.tasks t where t.id = p_id
  returning id into new_id;
  return new_id;
end
$$;

-- Retention: delete finished tasks (succeeded, failed, cancelled, upstream_failed, skipped)
-- that finished before `p_before`, with their attempts, logs and edges, at most `p_limit`
-- tasks per call (call again until it returns 0). A workflow's tasks go only once the
-- workflow has finished before `p_before`, and the workflow row goes with its last task.
-- Unfinished tasks are never touched. Returns the tasks deleted.
-- One call at a time (an advisory lock held until the transaction ends): two calls deleting
-- parts of one workflow at once would each see the other's tasks still there and both leave
-- the workflow row behind. The key spells "skedprun".
create or replace function sked.tasks_prune(p_before timestamptz, p_limit integer default 10000)
returns integer
language plpgsql as $$
declare
  deleted integer;
  workflows uuid[];
begin
  perform pg_advisory_xact_lock(8316852618927437166);
  with doomed as (
    select t.id, t.workflow_id from sked.tasks t
     where t.finished_at < p_before
       and t.state in ('succeeded', 'failed', 'cancelled', 'upstream_failed', 'skipped')
       and (t.workflow_id is null
            or exists (select 1 from sked.workflows w
                        where w.id = t.workflow_id and w.finished_at < p_before))
     limit p_limit
     for update skip locked
  ), logs as (
    delete from sked.task_logs l using doomed d where l.task_id = d.id
  ), exits as (
    delete from sked.service_exits x using doomed d where x.task_id = d.id
  ), attempts as (
    delete from sked.task_attempts a using doomed d where a.task_id = d.id
  ), edges as (
    delete from sked.task_edges e using doomed d where e.task_id = d.id or e.depends_on = d.id
  ), tasks as (
    delete from sked.tasks t using doomed d where t.id = d.id returning t.workflow_id
  )
  select count(*), array_agg(distinct t.workflow_id) filter (where t.workflow_id is not null)
    into deleted, workflows
    from tasks t;
  if workflows is not null then
    delete from sked.workflows w
     where w.id = any(workflows)
       and not exists (select 1 from sked.tasks t where t.workflow_id = w.id);
  end if;
  return deleted;
end
$$;
