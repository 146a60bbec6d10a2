-- The task functions of the SQL contract: submit (one and many), cancel, retry, resubmit,
-- prune, and the insert notification. Applications call these by name; see docs/sql.md.
-- Every function that reads the clock takes it as `p_now`/`now_` so tests can move time.

-- What exec(2) takes, as Linux counts it: every string of argv (the program, then the
-- arguments) and of envp (`NAME=value`) with its terminating NUL is at most 131,072 bytes
-- (MAX_ARG_STRLEN), and the strings with their NULs and 8-byte pointers together fit ARG_MAX
-- (a quarter of the stack limit: 2 MB with the usual 8 MB). The rules of sked.task_rule_broken
-- take these sizes of a task's own strings: {the longest with its NUL, all of them with their
-- NULs and pointers}, against 131,072 and 1,048,576 bytes (the rest of ARG_MAX is left for
-- the environment the worker adds: `SKED_*`, `PATH`, …). A task beyond them would fail at
-- every attempt ("Argument list too long"). `command` is null for an artifact, whose path
-- the worker puts first (not counted).
create or replace function sked.exec_strings_size(command text[], args text[], env jsonb)
returns bigint[]
language sql immutable parallel safe as $$
  with strings(bytes) as (
    select octet_length(a) + 1 from unnest(coalesce(command, '{}') || args) a
    union all
    select octet_length(e.key) + 1 + octet_length(e.value) + 1
      from jsonb_each_text(case when jsonb_typeof(env) = 'object' then env else '{}' end) e)
  select array[coalesce(max(bytes), 0), coalesce(sum(bytes + 8), 0)]::bigint[] from strings
$$;

-- The first rule about what a task runs, or about the JSON it keeps (every number a double,
-- see migrations/20261220000001_json_numbers.sql), that these values break, or null when they
-- break none. One CASE expression, so the planner inlines it into the set-based checks below;
-- declared stable, as array_to_string is, since the planner inlines no immutable function
-- whose body calls a stable one (a call per row costs 30 µs more).
drop function if exists sked.task_rule_broken(text[], text[], text[], text, jsonb, text, text);
create or replace function sked.task_rule_broken(
  command text[], args text[], labels text[], queue text, env jsonb, artifact_url text,
  artifact_sha256 text, input jsonb, output jsonb, health_check jsonb)
returns text
language sql stable parallel safe as $$
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
    when not sked.json_numbers_fit_doubles(input) then 'tasks_input_numbers_must_fit_a_double'
    when not sked.json_numbers_fit_doubles(output) then 'tasks_output_numbers_must_fit_a_double'
    when not sked.json_numbers_fit_doubles(health_check)
      then 'tasks_health_check_numbers_must_fit_a_double'
    -- The exact size of what exec takes walks every string: it is asked only when this bound
    -- of it (each argument's bytes and 9 more for its NUL and pointer, env as JSON text twice
    -- over for its names, `=`, NULs and pointers) passes the smaller limit.
    when coalesce(octet_length(array_to_string(command, '')), 0)
         + octet_length(array_to_string(args, ''))
         + 9 * (coalesce(cardinality(command), 0) + cardinality(args))
         + 2 * octet_length(env::text) > 131072
      then case
        when (sked.exec_strings_size(command, args, env))[1] > 131072
          then 'tasks_argument_and_env_strings_must_be_at_most_131072_bytes'
        when (sked.exec_strings_size(command, args, env))[2] > 1048576
          then 'tasks_command_and_env_must_total_at_most_1048576_bytes'
      end
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
    when 'tasks_argument_and_env_strings_must_be_at_most_131072_bytes' then
      'each argument (the program included) and each env NAME=value must be at most 131,072 '
      'bytes with its terminating NUL (Linux''s MAX_ARG_STRLEN): exec refuses a longer one '
      '("Argument list too long"); pass large data as input (stdin) or in a file instead'
    when 'tasks_command_and_env_must_total_at_most_1048576_bytes' then
      'the command, its arguments and env together must be at most 1,048,576 bytes, each '
      'string counted with its NUL and an 8-byte pointer (half of the usual 2 MB ARG_MAX, '
      'the rest left for the environment the worker adds); pass large data as input (stdin) '
      'or in a file instead'
    when 'tasks_artifact_url_scheme_must_be_file_http_https_or_pg' then
      'artifact_url must start with file:///, http://, https:// or pg:'
    when 'tasks_artifact_sha256_must_be_64_lowercase_hex' then
      'artifact_sha256 must be 64 lowercase hexadecimal digits'
    when 'tasks_pg_artifact_url_must_name_its_sha256' then
      'an artifact stored in Postgres is named pg:<artifact_sha256>'
    when 'tasks_input_numbers_must_fit_a_double' then
      'input holds a number beyond the range of a double (±1.7976931348623157e308)'
    when 'tasks_output_numbers_must_fit_a_double' then
      'output holds a number beyond the range of a double (±1.7976931348623157e308)'
    when 'tasks_health_check_numbers_must_fit_a_double' then
      'health_check holds a number beyond the range of a double (±1.7976931348623157e308)'
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
                                     new.artifact_url, new.artifact_sha256, new.input,
                                     new.output, new.health_check);
begin
  if rule is not null then
    perform sked.task_rule_raise(rule, new.queue);
  end if;
  return new;
end
$$;

create or replace trigger tasks_before_update_validate
  before update of command, args, labels, queue, env, artifact_url, artifact_sha256, input,
                   health_check
  on sked.tasks
  for each row execute function sked.tasks_before_update_validate();

-- Every finish writes `output`: only a JSON output (not null) is checked.
create or replace trigger tasks_before_update_output_validate
  before update of output on sked.tasks
  for each row when (new.output is not null)
  execute function sked.tasks_before_update_validate();

-- One small notification per statement (never per row): the distinct queues that received
-- claimable tasks. A per-row NOTIFY would serialise commits and cap insert throughput.
-- The same statement trigger first checks the new rows' rules (see above) and has the new
-- rows with an idempotency key take it (sked.idempotency_keys_take, "Idempotency keys").
create or replace function sked.tasks_after_insert_notify() returns trigger
language plpgsql as $$
declare
  queues text;
  broken record;
begin
  select b.rule, b.queue into broken
    from (select sked.task_rule_broken(n.command, n.args, n.labels, n.queue, n.env,
                                       n.artifact_url, n.artifact_sha256, n.input, n.output,
                                       n.health_check) as rule, n.queue
            from new_rows n) b
   where b.rule is not null
   limit 1;
  if found then
    perform sked.task_rule_raise(broken.rule, broken.queue);
  end if;
  -- Alerts (sql/alerts.sql): notify values and webhook tasks.
  if exists (select 1 from new_rows n where n.notify is not null or n.kind = 'webhook') then
    perform sked.alerts_check_new(array(select n.notify from new_rows n where n.notify is not null),
                                  array(select n.id from new_rows n where n.kind = 'webhook'));
  end if;
  if exists (select 1 from new_rows n where n.idempotency_key is not null) then
    perform sked.idempotency_keys_take(array(select n::sked.tasks from new_rows n
                                              where n.idempotency_key is not null));
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

-- ---------------------------------------------------------------------------------------------
-- Idempotency keys
-- ---------------------------------------------------------------------------------------------
--
-- The rule (docs/sql.md, "Idempotency keys"): an owner's idempotency key names one task, the
-- first submitted with it, for as long as that task is kept, whatever state it reaches, and
-- for retention_settings.keep_keys after it is deleted. Submitting again with the
-- key and the same definition (sked.task_definition: the fields but the owner, the key and
-- when it runs) inserts nothing and answers with that task (`created` false); with another
-- definition it raises unique_violation, tasks_idempotency_key_names_another_definition. A
-- plain INSERT (or COPY) of a task whose key names another task raises unique_violation,
-- tasks_idempotency_key_names_another_task. The keys are rows of sked.idempotency_keys
-- (migrations/20261226000001_idempotency_keys.sql), read and written only by the functions
-- below, which run with their owner's rights.

-- Gives each row of `rows` that has an idempotency key the task its key names: the row's own
-- (`created`) when the key was free (never given, or forgotten: past its forget_at), else
-- the task that holds it; the first of several rows with one key in `rows` takes it. Raises
-- unique_violation (tasks_idempotency_key_names_another_definition) when a key names a task
-- of another definition, and insufficient_privilege for a row of an owner the caller may not
-- act for. Answers the rows with a key, by their place in `rows` (`ord`, from 1).
--
-- Concurrent submissions of one key: the second waits for the first's transaction; if that
-- commits, the second reads the key it wrote (the second statement below reads what has
-- committed by its start, under READ COMMITTED; a REPEATABLE READ transaction gets a
-- serialization failure instead, to retry), if it rolls back, the second takes the key.
create or replace function sked.idempotency_keys_claim(rows sked.tasks[])
returns table (ord integer, id uuid, created boolean)
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  keyed constant sked.tasks[] := array(select r from unnest(rows) r
                                        where r.idempotency_key is not null);
  places constant integer[] := array(select k from generate_subscripts(rows, 1) k
                                      where (rows[k]).idempotency_key is not null order by k);
  definitions uuid[];
  bad record;
begin
  if cardinality(keyed) = 0 then
    return;
  end if;
  select r.owner into bad from unnest(keyed) r where not sked.caller_may_read(r.owner) limit 1;
  if found then
    raise exception 'sked.tasks: this role may not submit tasks owned by %', bad.owner
      using errcode = 'insufficient_privilege';
  end if;
  definitions := array(select sked.task_definition(r) from unnest(keyed) r);
  insert into sked.idempotency_keys as x (owner, key, task_id, definition, created_at)
  select distinct on ((keyed[j]).owner, (keyed[j]).idempotency_key)
         (keyed[j]).owner, (keyed[j]).idempotency_key, (keyed[j]).id, definitions[j], now()
    from generate_subscripts(keyed, 1) j
   order by (keyed[j]).owner, (keyed[j]).idempotency_key, j
  on conflict (owner, key) do update
     set task_id = excluded.task_id, definition = excluded.definition,
         created_at = excluded.created_at, forget_at = null
   where x.forget_at <= now();
  -- A statement of its own, to read keys that a concurrent transaction committed.
  select x.task_id into bad
    from generate_subscripts(keyed, 1) j
    join sked.idempotency_keys x
      on x.owner = (keyed[j]).owner and x.key = (keyed[j]).idempotency_key
   where x.definition <> definitions[j]
   limit 1;
  if found then
    raise exception 'sked.tasks: the idempotency key names a task with another definition'
      using errcode = 'unique_violation',
            constraint = 'tasks_idempotency_key_names_another_definition',
            table = 'tasks', schema = 'sked',
            detail = format('The key names task %s.', bad.task_id),
            hint = 'Submit that task''s fields again to be answered with it, or use another key.';
  end if;
  return query
  select places[j], x.task_id, x.task_id = (keyed[j]).id
    from generate_subscripts(keyed, 1) j
    join sked.idempotency_keys x
      on x.owner = (keyed[j]).owner and x.key = (keyed[j]).idempotency_key
   order by j;
end
$$;

-- Inserted tasks with a key take it: those of a submit function have taken it already; a
-- plain INSERT's whose key names another task are refused. Called by the statement trigger
-- tasks_after_insert_notify (below) when a new row has a key: one trigger per insert, not two.
drop trigger if exists tasks_after_insert_keys on sked.tasks;
drop function if exists sked.tasks_after_insert_keys();
create or replace function sked.idempotency_keys_take(rows sked.tasks[]) returns void
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  -- Those a submit function inserted name themselves already: claimed once, not twice.
  untaken constant sked.tasks[] := array(
    select r from unnest(rows) r
     where not exists (select 1 from sked.idempotency_keys x
                        where x.owner = r.owner and x.key = r.idempotency_key
                          and x.task_id = r.id));
begin
  if cardinality(untaken) > 0
     and exists (select 1 from sked.idempotency_keys_claim(untaken) c where not c.created) then
    raise exception 'sked.tasks: the idempotency key names another task'
      using errcode = 'unique_violation',
            constraint = 'tasks_idempotency_key_names_another_task',
            table = 'tasks', schema = 'sked',
            hint = 'sked.tasks_submit answers with the task a key names instead of inserting.';
  end if;
end
$$;

-- A task's key and owner stay what they were when it took the key.
create or replace function sked.tasks_before_update_keys() returns trigger
language plpgsql as $$
begin
  if new.idempotency_key is distinct from old.idempotency_key
     or (old.idempotency_key is not null and new.owner is distinct from old.owner) then
    raise exception 'sked.tasks: a task''s idempotency key, and the owner of a task with one, cannot change'
      using errcode = 'check_violation', constraint = 'tasks_idempotency_key_is_fixed',
            table = 'tasks', schema = 'sked';
  end if;
  return new;
end
$$;

create or replace trigger tasks_before_update_keys
  before update of idempotency_key, owner on sked.tasks
  for each row execute function sked.tasks_before_update_keys();

-- A deleted task's key is forgotten after keep_keys.
create or replace function sked.tasks_after_delete_keys() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
  if exists (select 1 from old_rows o where o.idempotency_key is not null) then
    update sked.idempotency_keys x
       set forget_at = now() + (select s.keep_keys from sked.retention_settings s)
      from old_rows o
     where o.idempotency_key is not null and x.owner = o.owner
       and x.key = o.idempotency_key and x.task_id = o.id and x.forget_at is null;
  end if;
  return null;
end
$$;

create or replace trigger tasks_after_delete_keys
  after delete on sked.tasks
  referencing old table as old_rows
  for each statement execute function sked.tasks_after_delete_keys();

create or replace function sked.tasks_after_truncate_keys() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
  update sked.idempotency_keys x
     set forget_at = now() + (select s.keep_keys from sked.retention_settings s)
   where x.forget_at is null;
  return null;
end
$$;

create or replace trigger tasks_after_truncate_keys
  after truncate on sked.tasks
  for each statement execute function sked.tasks_after_truncate_keys();

-- Deletes up to p_limit keys past their forget_at; returns how many. Keys past it are free
-- to be given again before this deletes them (sked.idempotency_keys_claim).
create or replace function sked.idempotency_keys_prune(
  p_limit integer default 10000, p_now timestamptz default now())
returns integer
language sql security definer set search_path = pg_catalog, pg_temp as $$
  with gone as (
    delete from sked.idempotency_keys x
     where (x.owner, x.key) in (select f.owner, f.key from sked.idempotency_keys f
                                 where f.forget_at < p_now order by f.forget_at limit p_limit)
    returning 1)
  select count(*)::integer from gone
$$;

-- ---------------------------------------------------------------------------------------------
-- Delays count from the commit
-- ---------------------------------------------------------------------------------------------
--
-- A submission's `delay` (without `run_at`) counts from when the task becomes visible: the
-- commit of the transaction that submits it, not its start (now()), which may be long before.
-- The submit functions due such a task at now() + delay and note it in
-- sked.delays_from_commit, and the transaction in sked.delays_from_commit_due
-- (migrations/20261226000002_delay_from_commit.sql); at commit, that row's deferred trigger
-- dues the tasks, and their shards, at the clock + delay and deletes the notes: one trigger
-- event per transaction. A
-- task that another statement of the transaction claimed, finished or deleted meanwhile is
-- left as it is. `run_at`, and a plain INSERT's next_run_at, are times, not delays: they are
-- kept as given.

-- Notes the tasks p_ids, to be inserted by this transaction, whose delays p_delays count
-- from its commit, and the transaction (once) as having delays to apply. An id of a task
-- that exists already is ignored: only a new task's due time is set at commit.
create or replace function sked.delays_from_commit_note(p_ids uuid[], p_delays interval[])
returns void
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
begin
  insert into sked.delays_from_commit (task_id, delay)
  select n.id, n.delay from unnest(p_ids, p_delays) as n(id, delay)
   where not exists (select 1 from sked.tasks t where t.id = n.id)
  on conflict (task_id) do update set delay = excluded.delay;
  insert into sked.delays_from_commit_due (xact) values (pg_current_xact_id())
  on conflict (xact) do nothing;
end
$$;

-- At commit (or at the end of the statement, under SET CONSTRAINTS … IMMEDIATE): each noted
-- task still waiting or blocked, as it was inserted by this transaction, and its shards are
-- due at the clock + its delay; the notes and the transaction's row go. A later statement
-- that notes more delays notes the transaction again.
create or replace function sked.delays_from_commit_apply() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  noted_ids uuid[];
  noted_delays interval[];
  at constant timestamptz := clock_timestamp();
begin
  delete from sked.delays_from_commit_due d where d.xact = new.xact;
  with gone as (delete from sked.delays_from_commit d returning d.task_id, d.delay)
  select array_agg(g.task_id), array_agg(g.delay) into noted_ids, noted_delays from gone g;
  if noted_ids is null then
    return null;
  end if;
  update sked.tasks t set next_run_at = at + n.delay
    from unnest(noted_ids, noted_delays) as n(id, delay)
   where t.id = n.id and t.state in ('waiting', 'blocked') and t.created_at = now();
  update sked.tasks t set next_run_at = at + n.delay
    from unnest(noted_ids, noted_delays) as n(id, delay)
   where t.shard_of = n.id and t.state in ('waiting', 'blocked') and t.created_at = now();
  return null;
end
$$;

-- (A constraint trigger cannot be replaced: it is made once.)
do $$
begin
  if not exists (select 1 from pg_trigger
                  where tgrelid = 'sked.delays_from_commit_due'::regclass
                    and tgname = 'delays_from_commit_apply') then
    create constraint trigger delays_from_commit_apply
      after insert on sked.delays_from_commit_due
      deferrable initially deferred
      for each row execute function sked.delays_from_commit_apply();
  end if;
end
$$;

-- ---------------------------------------------------------------------------------------------
-- The fields of a task
-- ---------------------------------------------------------------------------------------------
--
-- What a submission says about a task are its fields, listed once, in the block below, in
-- the order of sked.task_submit's arguments. A field sets the column of its name, except
-- `run_at` and `delay` (the task is due at coalesce(run_at, now) + delay: next_run_at) and
-- `shards` (shard_total); its type is its column's (`delay`: interval). Every way in takes
-- these fields and no others, and leaves every other column to the table's defaults (or to
-- the task's place in a workflow): sked.task_submit (named arguments), sked.tasks_submit
-- (JSON objects with these keys, also the form of workflows' tasks and schedules' task
-- templates). Copies of a task carry its fields without naming them: a resubmission and a
-- copy of a service take their source's fields (sked.task_copy), a shard its parent's whole
-- row (sked.shards_insert, sql/shards.sql). A new field is a column (a migration) and its
-- name at the end of the list.
--
-- From the list and the table as it is, every migrate makes:
--   sked.task_submit(<fields>)      one task by named arguments; returns its id. An argument
--                                   left out or null takes the table's default. With an
--                                   idempotency key that names a task already, it returns
--                                   that task's id and inserts nothing (sked.tasks_submit
--                                   also says whether it created). `shards` (1 to 10000) or `broadcast` make a
--                                   sharded task (docs/shards.md); `cpu_millis` and
--                                   `memory_mb` request capacity (docs/runtime.md),
--                                   `max_output_bytes` caps stdout and stderr, `run_as` names
--                                   the user; `replicas`, `restart_policy` and `health_check`
--                                   describe a service (kind 'service', docs/services.md); a
--                                   `preemptible` task may be stopped to make room for a copy
--                                   of a service (docs/runtime.md, "Services first");
--   sked.tasks_from_json(tasks, owner_, p_now)
--                                   the new rows a JSON array of task objects stands for, in
--                                   input order: each field read from the key of its name
--                                   (a null value, or none, takes the column's default; keys
--                                   that are not fields are not read: sked.tasks_submit
--                                   refuses them, sked.workflow_submit reads its own), `owner_` for an object
--                                   that names no owner, due at coalesce(run_at, p_now) +
--                                   delay, created at p_now, a new id. A boolean field must be a JSON boolean
--                                   (or null): any other value, which the reading of JSON
--                                   would take for true or false, raises check_violation
--                                   (sked.task_boolean_refuse). Shared by sked.tasks_submit
--                                   and sked.workflow_submit;
--   sked.task_fields()              the fields' names, in order;
--   sked.task_nonfield_columns()    the columns that are not a field: identity, state,
--                                   results, the place in a workflow, under a parent or a
--                                   service, and next_run_at and shard_total;
--   sked.task_submitted_columns()   the columns a submission inserts: its fields' columns
--                                   and those of its place (id, state, created_at, and the
--                                   workflow columns sked.workflow_submit sets), which is
--                                   also what sql/roles.sql lets the submitter and server
--                                   roles insert;
--   sked.task_new(id, owner, next_run_at, shard_total)
--                                   a new row of the table's defaults, with what a way in
--                                   works out for each task (each argument defaults to its
--                                   column's default);
--   sked.task_placed(task, <the columns of its place>)
--                                   `task` at its place in a workflow: its row with the
--                                   columns of its place (id, state, created_at, workflow_id,
--                                   name, trigger_rule, parents, children, parents_pending,
--                                   branch, map_over, map_max, map_trigger_rule)
--                                   given; a row constructor that the planner inlines, far
--                                   cheaper per task than rewriting the row through JSON;
--   sked.tasks_insert(rows, whole)  the insert of new task rows that every way in ends in.

-- Raises check_violation (tasks_<field>_must_be_a_boolean) for the boolean field `field` of
-- the JSON object `task`, whose value is not a boolean; its return type lets an expression
-- of sked.tasks_from_json call it.
drop function if exists sked.task_preemptible_refuse(jsonb);
create or replace function sked.task_boolean_refuse(field text, task jsonb) returns jsonb
language plpgsql as $$
begin
  raise exception 'sked.tasks: % must be a boolean (true or false), not %', field, task -> field
    using errcode = 'check_violation', constraint = format('tasks_%s_must_be_a_boolean', field),
          table = 'tasks', schema = 'sked';
end
$$;

-- Raises invalid_parameter_value for an element of a JSON array of tasks that is not an
-- object; its return type lets an expression of sked.tasks_from_json call it.
create or replace function sked.task_json_refuse(value jsonb) returns jsonb
language plpgsql as $$
begin
  raise exception 'sked.tasks: a task is a JSON object of its fields, not a JSON %', jsonb_typeof(value)
    using errcode = '22023';
end
$$;

do $do$
declare
  fields constant text[] := array[
    'command', 'args', 'queue', 'priority', 'input', 'env', 'run_at', 'delay', 'max_attempts',
    'timeout', 'owner', 'idempotency_key', 'labels', 'artifact_url', 'artifact_sha256',
    'output_path', 'kind', 'backoff_base', 'backoff_max', 'shards', 'broadcast', 'cpu_millis',
    'memory_mb', 'max_output_bytes', 'run_as', 'replicas', 'restart_policy', 'health_check',
    'preemptible', 'notify'];
  -- The columns of a task's place that a submission sets besides its fields' columns.
  placed constant text[] := array[
    'id', 'state', 'created_at', 'workflow_id', 'name', 'trigger_rule', 'parents', 'children',
    'parents_pending', 'branch', 'map_over', 'map_max', 'map_trigger_rule', 'subworkflow'];
  -- The columns sked.task_new takes.
  given constant text[] := array['id', 'owner', 'next_run_at', 'shard_total'];
  -- The table's columns in order (name, type, default), and for each field its column and
  -- its type.
  col_names text[];
  col_types text[];
  col_defaults text[];
  field_columns text[];
  field_types text[];
  missing text;
  arguments text[];
  f regprocedure;
  src text;
  expression text;
  row_from_json text;
  row_from_arguments text;
begin
  select array_agg(a.attname::text order by a.attnum),
         array_agg(format_type(a.atttypid, a.atttypmod) order by a.attnum),
         array_agg(coalesce(pg_get_expr(d.adbin, d.adrelid), 'null') order by a.attnum)
    into col_names, col_types, col_defaults
    from pg_attribute a
    left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
   where a.attrelid = 'sked.tasks'::regclass and a.attnum > 0 and not a.attisdropped;
  field_columns := array(
    select case x.field when 'run_at' then 'next_run_at' when 'shards' then 'shard_total'
                        when 'delay' then null else x.field end
      from unnest(fields) with ordinality as x(field, i) order by x.i);
  select string_agg(c, ', ') into missing
    from unnest(field_columns) c where c <> all (col_names);
  if missing is not null then
    raise exception 'sql/tasks.sql: the fields % name no column of sked.tasks', missing;
  end if;
  field_types := array(
    select coalesce(c.type, 'interval')
      from unnest(field_columns) with ordinality as x(col, i)
      left join unnest(col_names, col_types) as c(name, type) on c.name = x.col
     order by x.i);

  execute format($f$
    create or replace function sked.task_fields() returns text[]
    language sql immutable parallel safe as $b$ select %L::text[] $b$
  $f$, fields);
  execute format($f$
    create or replace function sked.task_nonfield_columns() returns text[]
    language sql immutable parallel safe as $b$ select %L::text[] $b$
  $f$, array(select c from unnest(col_names) c where c <> all (fields)));
  execute format($f$
    create or replace function sked.task_submitted_columns() returns text[]
    language sql immutable parallel safe as $b$ select %L::text[] $b$
  $f$, array(select c from unnest(col_names) c
              where c = any (array_remove(field_columns, null)) or c = any (placed)));
  execute format($f$
    create or replace function sked.task_new(%s) returns sked.tasks
    language sql volatile as $b$ select row(%s)::sked.tasks $b$
  $f$,
  (select string_agg(format('%I %s default %s', c.name, c.type, c.def), ', ' order by k.i)
     from unnest(given) with ordinality as k(name, i)
     join unnest(col_names, col_types, col_defaults) as c(name, type, def) on c.name = k.name),
  (select string_agg(case when c.name = any (given) then format('task_new.%I', c.name)
                          else c.def end, ', ' order by c.i)
     from unnest(col_names, col_defaults) with ordinality as c(name, def, i)));

  -- Its signature changes with the columns of a place: an older one goes first.
  for f in select p.oid::regprocedure from pg_proc p
            where p.pronamespace = 'sked'::regnamespace and p.proname = 'task_placed'
              and pg_get_function_identity_arguments(p.oid) <> (
                select 'task sked.tasks, ' || string_agg(format('%I %s', c.name, c.type), ', ' order by k.i)
                  from unnest(placed) with ordinality as k(name, i)
                  join unnest(col_names, col_types) as c(name, type) on c.name = k.name)
  loop
    execute format('drop function %s', f);
  end loop;
  execute format($f$
    create or replace function sked.task_placed(task sked.tasks, %s) returns sked.tasks
    language sql immutable parallel safe as $b$ select row(%s)::sked.tasks $b$
  $f$,
  (select string_agg(format('%I %s', c.name, c.type), ', ' order by k.i)
     from unnest(placed) with ordinality as k(name, i)
     join unnest(col_names, col_types) as c(name, type) on c.name = k.name),
  (select string_agg(case when c.name = any (placed) then format('task_placed.%I', c.name)
                          else format('task.%I', c.name) end, ', ' order by c.i)
     from unnest(col_names) with ordinality as c(name, i)));

  -- A new row from the fields as `src`.<field> (a column of jsonb_to_record, or an argument
  -- of sked.task_submit): each column is its field, or its default. `owner_` and `p_now`, in
  -- both functions, are the owner of a task that names none and the time of the submission.
  for src in select unnest(array['x', 'task_submit']) loop
    expression := format('row(%s)::sked.tasks', (
      select string_agg(
               case
                 when c.name = 'owner' then format('coalesce(%s.owner, owner_)', src)
                 when c.name = 'next_run_at'
                   then format('coalesce(%1$s.run_at, p_now) + coalesce(%1$s.delay, interval ''0'')',
                               src)
                 when c.name = 'shard_total' then format('%s.shards', src)
                 when c.name = 'created_at' then 'p_now'
                 when c.name <> all (fields) then c.def
                 -- A boolean of a JSON object is read as jsonb, to be tested.
                 when c.type = 'boolean' and src = 'x'
                   then format('case when x.%1$I is null then %2$s
                                     when jsonb_typeof(x.%1$I) = ''boolean'' then x.%1$I::boolean
                                     else sked.task_boolean_refuse(%1$L, r.elem)::boolean end',
                               c.name, c.def)
                 when c.def = 'null' then format('%s.%I', src, c.name)
                 else format('coalesce(%s.%I, %s)', src, c.name, c.def)
               end, ', ' order by c.i)
        from unnest(col_names, col_types, col_defaults) with ordinality as c(name, type, def, i)));
    if src = 'x' then
      row_from_json := expression;
    else
      row_from_arguments := expression;
    end if;
  end loop;

  -- Each object is read by jsonb_to_record into its fields (a boolean field as jsonb, to be
  -- tested); each column of the row is then its field, or its default. In PL/pgSQL, which
  -- keeps the statement's plan for the session: an SQL function would plan its ~60 column
  -- expressions again at every call. (It answered a table before: a function's result type
  -- changes only by dropping it.)
  if (select p.prorettype from pg_proc p
       where p.oid = to_regprocedure('sked.tasks_from_json(jsonb, text, timestamptz)'))
     <> 'sked.tasks[]'::regtype then
    drop function sked.tasks_from_json(jsonb, text, timestamptz);
  end if;
  execute format($f$
    create or replace function sked.tasks_from_json(
      tasks jsonb, owner_ text default current_user, p_now timestamptz default now())
    returns sked.tasks[]
    language plpgsql volatile as $b$
    declare
      made sked.tasks[];
      delayed uuid[];
      delays interval[];
    begin
      -- OFFSET 0 keeps the subquery whole: each row (and its new id) is made once.
      select coalesce(array_agg(m.t order by m.ord), '{}'),
             array_agg((m.t).id order by m.ord) filter (where m.run_at is null and m.delay is not null),
             array_agg(m.delay order by m.ord) filter (where m.run_at is null and m.delay is not null)
        into made, delayed, delays
        from (select %s as t, x.run_at, x.delay, r.ord
                from jsonb_array_elements(tasks) with ordinality as r(elem, ord)
               cross join lateral jsonb_to_record(
                      case when jsonb_typeof(r.elem) = 'object' then r.elem
                           else sked.task_json_refuse(r.elem) end) as x(%s)
              offset 0) m;
      if delayed is not null then
        perform sked.delays_from_commit_note(delayed, delays);
      end if;
      return made;
    end
    $b$
  $f$,
  row_from_json,
  (select string_agg(format('%I %s', x.field, case x.type when 'boolean' then 'jsonb'
                                                         else x.type end), ', ' order by x.i)
     from unnest(fields, field_types) with ordinality as x(field, type, i)));

  -- The insert every way in ends in. Copies of services, which only sked's own functions
  -- make from their service's row, go in `whole`: those functions run as the schema's owner
  -- (shards, copies of their parent's every column too, go in by sked.shards_insert). A
  -- submission inserts the submitted columns, by the caller's rights (row-level security
  -- decides whose it may be). A task whose idempotency key names a task already (see
  -- "Idempotency keys" above) is not inserted: it answers with that task's id and `created`
  -- false. Answers in the order of `rows`.
  if pg_get_function_result(to_regprocedure('sked.tasks_insert(sked.tasks[], boolean)'))
     <> 'TABLE(id uuid, created boolean)' then
    drop function sked.tasks_insert(sked.tasks[], boolean);
  end if;
  execute format($f$
    create or replace function sked.tasks_insert(rows sked.tasks[], whole boolean default false)
    returns table (id uuid, created boolean)
    language plpgsql
    set jit = off -- planned for the rows given, a batch's plan would cost enough to be compiled
    as $b$
    begin
      if whole then
        return query insert into sked.tasks as t select * from unnest(rows) returning t.id, true;
        return;
      end if;
      -- Tasks without an idempotency key: a plain insert.
      if not exists (select 1 from unnest(rows) i where i.idempotency_key is not null) then
        return query insert into sked.tasks as t (%1$s) select %2$s from unnest(rows) i
                     returning t.id, true;
        return;
      end if;
      return query
      with input as (
        select * from unnest(rows) with ordinality
      ), claimed as materialized (
        select * from sked.idempotency_keys_claim(rows)
      ), inserted as (
        insert into sked.tasks (%1$s)
        select %2$s from input i
         where i.idempotency_key is null
            or exists (select 1 from claimed c where c.ord = i.ordinality and c.created)
         order by i.ordinality
      )
      select coalesce(c.id, i.id), coalesce(c.created, true)
        from input i left join claimed c on c.ord = i.ordinality
       order by i.ordinality;
    end
    $b$
  $f$, array_to_string(sked.task_submitted_columns(), ', '),
       (select string_agg(format('i.%I', c), ', ') from unnest(sked.task_submitted_columns()) c));

  -- sked.task_submit: one argument per field, null by default. Its signature changes with
  -- the fields: one of other arguments goes first.
  arguments := array(
    select format('%I %s', x.field, x.type)
      from unnest(fields, field_types) with ordinality as x(field, type, i) order by x.i);
  for f in select p.oid::regprocedure from pg_proc p
            where p.pronamespace = 'sked'::regnamespace and p.proname = 'task_submit'
              and pg_get_function_identity_arguments(p.oid) <> array_to_string(arguments, ', ')
  loop
    execute format('drop function %s', f);
  end loop;
  execute format($f$
    create or replace function sked.task_submit(%s) returns uuid
    language plpgsql as $b$
    declare
      owner_ text := current_user;
      p_now timestamptz := now();
      made sked.tasks := %s;
    begin
      if task_submit.run_at is null and task_submit.delay is not null then
        perform sked.delays_from_commit_note(array[made.id], array[task_submit.delay]);
      end if;
      return (select t.id from sked.tasks_insert(array[made]) t);
    end
    $b$
  $f$,
  array_to_string(arguments, ' default null, ') || ' default null', row_from_arguments);
end
$do$;

-- A new task with the fields of `source` (what it runs, how, where, whose) and the
-- `changes`; every other column takes the table's default: a new id, waiting, created now.
create or replace function sked.task_copy(source sked.tasks, changes jsonb) returns sked.tasks
language sql volatile as $$
  select jsonb_populate_record(sked.task_new(shard_total => source.shard_total),
                               to_jsonb(source) - sked.task_nonfield_columns() || changes)
$$;

-- Submit many tasks in one statement from a JSON array of objects whose keys are the
-- fields (the arguments of sked.task_submit); returns, in input order, each task's id and
-- whether it was created: false when its idempotency key names a task already, which it
-- answers with (see "Idempotency keys" above). Missing keys take the defaults; a key that is
-- not a field is refused (tasks_keys_must_be_fields); `owner_` (null: current_user) applies
-- to objects that name no owner. All or nothing: one bad task rejects the whole batch.
do $do$
begin
  if pg_get_function_result(to_regprocedure('sked.tasks_submit(jsonb, text)'))
     <> 'TABLE(id uuid, created boolean)' then
    drop function sked.tasks_submit(jsonb, text);
  end if;
end
$do$;
create or replace function sked.tasks_submit(tasks jsonb, owner_ text default current_user)
returns table (id uuid, created boolean)
language plpgsql as $$
declare
  unknown text;
begin
  if jsonb_typeof(tasks) is distinct from 'array' then
    raise exception 'sked.tasks_submit expects a JSON array of task objects'
      using errcode = '22023';
  end if;
  -- A key that is no field would be dropped unread: a misspelt field is refused instead.
  -- (One jsonb operation per task; the keys are named only when one is not a field.)
  if exists (select 1 from jsonb_array_elements(tasks) e
              where case jsonb_typeof(e) when 'object'
                         then e - sked.task_fields() <> '{}'::jsonb end) then
    select string_agg(distinct k, ', ') into unknown
      from jsonb_array_elements(tasks) e
     cross join lateral jsonb_object_keys(case jsonb_typeof(e) when 'object' then e
                                              else '{}' end) k
     where k <> all (sked.task_fields());
    raise exception 'sked.tasks: not a field of a task: % (the fields: sked.task_fields())', unknown
      using errcode = 'check_violation', constraint = 'tasks_keys_must_be_fields',
            table = 'tasks', schema = 'sked';
  end if;
  return query select i.id, i.created
                 from sked.tasks_insert(sked.tasks_from_json(tasks, coalesce(owner_, current_user), now())) i;
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
  sub boolean;
  running text;
  queues text;
begin
  update sked.tasks set state = 'cancelled', finished_at = p_now, error = 'cancelled before it ran'
   where id = p_id and sked.state_waits_to_run(state)
  returning state, children > 0 or workflow_id is not null, trigger_rule in ('shards', 'map_all_done'),
            kind = 'workflow'
    into result, settles, sharded, sub;
  if found then
    if sharded then
      running := sked.shards_cancel(p_id, p_now);
    end if;
    -- A sub-workflow task's sub-workflow is cancelled with it (sql/subworkflows.sql).
    if sub then
      perform sked.subworkflows_cancel(array[p_id], p_now);
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
  select state, trigger_rule in ('shards', 'map_all_done') into result, sharded from sked.tasks where id = p_id for update;
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

-- A task that may be submitted again, as it is: check_violation for a task of a workflow and
-- for a shard, which run as part of their workflow or parent (retry them, or resubmit the
-- parent).
create or replace function sked.task_resubmittable(t sked.tasks) returns sked.tasks
language plpgsql as $$
begin
  if t.workflow_id is not null then
    raise exception 'sked.tasks: a task of a workflow runs with its workflow and cannot be resubmitted on its own (tasks_resubmit_is_not_for_workflow_tasks)'
      using errcode = 'check_violation', constraint = 'tasks_resubmit_is_not_for_workflow_tasks',
            table = 'tasks', schema = 'sked';
  elsif t.shard_of is not null then
    raise exception 'sked.tasks: a shard runs as part of its parent %; resubmit the parent (tasks_resubmit_is_not_for_shards)', t.shard_of
      using errcode = 'check_violation', constraint = 'tasks_resubmit_is_not_for_shards',
            table = 'tasks', schema = 'sked';
  end if;
  return t;
end
$$;

-- Submit a new task with the definition of task p_id ("run again"): its fields as the task
-- has them now (sked.task_copy), which are what it runs, its input and environment (the real
-- values, which API answers mask), queue, priority, labels, output path, timeout,
-- max_attempts (which retries and interrupted attempts raise), backoff, shards or broadcast
-- (a sharded task is submitted sharded again), resource requests, output cap, user, whether
-- it is preemptible, and any other field; it belongs to p_owner, waits from p_now, and has
-- no idempotency key. Refused for a task of a workflow and a shard
-- (sked.task_resubmittable). Returns the new id, or null when there is no such task.
create or replace function sked.task_resubmit(
  p_id uuid, p_owner text default current_user, p_now timestamptz default now())
returns uuid
language sql as $$
  select (select i.id from sked.tasks_insert(array[sked.task_copy(sked.task_resubmittable(t),
            jsonb_build_object('owner', p_owner, 'next_run_at', p_now, 'idempotency_key', null))]) i)
    from sked.tasks t where t.id = p_id
$$;

-- Deletes the tasks p_ids (finished ones, locked by the caller) with their logs, service
-- exits, attempts and edges, and the workflows they leave without a task. Returns the tasks
-- deleted. Callers hold the advisory lock of sked.tasks_prune (see there).
create or replace function sked.tasks_delete(p_ids uuid[]) returns integer
language plpgsql as $$
declare
  deleted integer;
  workflows uuid[];
begin
  with logs as (
    delete from sked.task_logs l where l.task_id = any(p_ids)
  ), exits as (
    delete from sked.service_exits x where x.task_id = any(p_ids)
  ), attempts as (
    delete from sked.task_attempts a where a.task_id = any(p_ids)
  ), edges as (
    delete from sked.task_edges e where e.task_id = any(p_ids) or e.depends_on = any(p_ids)
  ), tasks as (
    delete from sked.tasks t where t.id = any(p_ids) returning t.workflow_id
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
begin
  perform pg_advisory_xact_lock(8316852618927437166);
  select sked.tasks_delete(coalesce(array_agg(d.id), '{}')) into deleted
    from (select t.id from sked.tasks t
           where t.finished_at < p_before
             and t.state in ('succeeded', 'failed', 'cancelled', 'upstream_failed', 'skipped')
             and (t.workflow_id is null
                  or exists (select 1 from sked.workflows w
                              where w.id = t.workflow_id and w.finished_at < p_before))
           limit p_limit
           for update skip locked) d;
  return deleted;
end
$$;
