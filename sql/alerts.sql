-- Alerts (docs/operations.md, "Alerts"): when a task succeeds, fails for good, or fails an
-- attempt and waits to be retried, the targets its `notify` names for that event are told —
-- its own `notify`, or its queue's when it has none; when a workflow succeeds or fails, those
-- of its own. A target is a webhook an operator
-- defined (sked.alert_targets) or a follow-up task. Each notification is a task of its own,
-- inserted in the statement that changes the state, so it is as durable as the change and
-- is delivered at least once:
--   * a webhook: a task of kind `webhook` in the target's queue, with `max_attempts` of the
--     target, whose input is {"target": NAME, "event": EVENT}; a worker POSTs the event,
--     signed with the target's secret, and retries with backoff until a 2xx answer;
--   * a follow-up task: the task given, submitted for the same owner, with the event as its
--     input.
-- EVENT is {"event": "task.succeeded" | "task.failed" | "task.retry", "at", "task": {…}}, or
-- {"event": "workflow.succeeded" | "workflow.failed", "at", "workflow": {…}}
-- (sked.alert_event). `webhook` tasks are sked's own: only these functions (running as the
-- schema's owner) may insert them, so that no submitter can have a worker sign a body of
-- its choosing; a follow-up task cannot be one.

-- Whether a list of a notify's event is valid: at most 16 targets, each the name of an alert
-- target or {"task": {…}} (a task that is not a webhook).
create or replace function sked.notify_list_is_valid(list jsonb) returns boolean
language sql immutable parallel safe as $$
  select jsonb_typeof(list) = 'array'
     and jsonb_array_length(list) <= 16
     and not exists (
       -- (coalesce: an element such as {} makes the test null, which must count as false.)
       select 1 from jsonb_array_elements(list) x
        where not coalesce((jsonb_typeof(x) = 'string' and length(x #>> '{}') between 1 and 64)
                           or (jsonb_typeof(x) = 'object'
                               and x - 'task' = '{}'::jsonb
                               and jsonb_typeof(x -> 'task') = 'object'
                               and (x -> 'task' ->> 'kind') is distinct from 'webhook'),
                           false))
$$;

-- Whether a notify value (a task's, a queue's or a workflow's) has the shape of one: null,
-- or an object whose keys are among on_success, on_failure and on_retry, each a valid list.
create or replace function sked.notify_shape_is_valid(n jsonb) returns boolean
language sql immutable parallel safe as $$
  select n is null
      or (jsonb_typeof(n) = 'object'
          and not exists (
            select 1 from jsonb_each(n) e
             where e.key not in ('on_success', 'on_failure', 'on_retry')
                or not sked.notify_list_is_valid(e.value)))
$$;

-- Whether a schedule's notify has the shape of one: an object of on_missed and on_failure,
-- each a valid list, and failures_in_a_row, a whole number from 1 to 1000.
create or replace function sked.schedule_notify_is_valid(n jsonb) returns boolean
language sql immutable parallel safe as $$
  select jsonb_typeof(n) = 'object'
     and not exists (
       select 1 from jsonb_each(n) e
        where case e.key
                when 'on_missed' then not sked.notify_list_is_valid(e.value)
                when 'on_failure' then not sked.notify_list_is_valid(e.value)
                when 'failures_in_a_row' then
                  not (jsonb_typeof(e.value) = 'number'
                       and (e.value #>> '{}')::numeric between 1 and 1000
                       and (e.value #>> '{}')::numeric % 1 = 0)
                else true end)
$$;

-- The first alert target a notify names that does not exist, or null. Runs as the owner:
-- the targets' secrets are no submitter's to read, their names are.
create or replace function sked.notify_unknown_target(n jsonb) returns text
language sql stable security definer set search_path = pg_catalog, pg_temp as $$
  select x #>> '{}'
    from jsonb_each(case when jsonb_typeof(n) = 'object' then n else '{}' end) e,
         jsonb_array_elements(case when jsonb_typeof(e.value) = 'array' then e.value else '[]' end) x
   where jsonb_typeof(x) = 'string'
     and not exists (select 1 from sked.alert_targets t where t.name = x #>> '{}')
   limit 1
$$;

-- Refuses new tasks whose notify is not valid or names a target that does not exist, and
-- `webhook` tasks that sked did not insert: each of those is allowed by a row of
-- sked.alert_deliveries_allowed, which only these functions write (no role may), deleted
-- here. Called by sked.tasks_after_insert_notify with the notify of each new row that has one
-- and the ids of the new webhooks.
create or replace function sked.alerts_check_new(notifies jsonb[], webhooks uuid[])
returns void
language plpgsql as $$
declare
  bad jsonb;
  unknown text;
  allowed integer;
begin
  select n into bad from unnest(notifies) n where not sked.notify_shape_is_valid(n) limit 1;
  if found then
    raise exception 'sked.tasks: notify must be an object whose keys are on_success, on_failure or on_retry, each a list of at most 16 alert target names or {"task": {…}} (not a webhook), got % (tasks_notify_must_be_an_object_of_event_lists)',
      left(bad::text, 200)
      using errcode = 'check_violation', constraint = 'tasks_notify_must_be_an_object_of_event_lists',
            table = 'tasks', schema = 'sked';
  end if;
  select t into unknown from unnest(notifies) n, sked.notify_unknown_target(n) t
   where t is not null limit 1;
  if found then
    raise exception 'sked.tasks: notify names the alert target %, which does not exist (an admin creates targets: sked alert target set NAME --webhook URL) (tasks_notify_target_must_exist)',
      unknown
      using errcode = '23503', constraint = 'tasks_notify_target_must_exist',
            table = 'tasks', schema = 'sked';
  end if;
  if cardinality(webhooks) > 0 then
    delete from sked.alert_deliveries_allowed a where a.task_id = any (webhooks);
    get diagnostics allowed = row_count;
    if allowed < cardinality(webhooks) then
      raise exception 'sked.tasks: kind webhook is sked''s own (the deliveries of alerts); name an alert target in notify instead (tasks_webhook_kind_is_for_alerts_only)'
        using errcode = 'insufficient_privilege', constraint = 'tasks_webhook_kind_is_for_alerts_only',
              table = 'tasks', schema = 'sked';
    end if;
  end if;
end
$$;

-- A notify changed by an update (an admin's, in SQL) is checked as a new one's.
create or replace function sked.tasks_before_update_notify() returns trigger
language plpgsql as $$
begin
  perform sked.alerts_check_new(array[new.notify], '{}');
  return new;
end
$$;

create or replace trigger tasks_before_update_notify
  before update of notify on sked.tasks
  for each row when (new.notify is not null and new.notify is distinct from old.notify)
  execute function sked.tasks_before_update_notify();

-- The event a task's change of state announces (`hook`: on_success, on_failure, on_retry):
-- what it is, when, and the task without what it carries (command, env, input, output,
-- which may hold secrets; its id reads them where its owner may).
create or replace function sked.alert_event(t sked.tasks, hook text, p_now timestamptz)
returns jsonb
language sql stable as $$
  select jsonb_build_object(
    'event', case hook when 'on_success' then 'task.succeeded'
                       when 'on_failure' then 'task.failed'
                       else 'task.retry' end,
    'at', p_now,
    'task', jsonb_strip_nulls(jsonb_build_object(
      'id', t.id, 'owner', t.owner, 'queue', t.queue, 'kind', t.kind, 'name', t.name,
      'state', t.state, 'attempt', t.attempt, 'max_attempts', t.max_attempts,
      'exit_code', t.exit_code, 'error', left(t.error, 2000),
      'workflow_id', t.workflow_id, 'created_at', t.created_at, 'started_at', t.started_at,
      'finished_at', t.finished_at,
      'next_run_at', case when t.state = 'retry' then t.next_run_at end)))
$$;

-- Delivers notifications: for each i, the targets `rules[i]` (a notify's list for one event)
-- are told `events[i]`, for `owners[i]`. A webhook per alert target (their ids allowed
-- first, see sked.alerts_check_new, then one insert); each follow-up task on its own: one
-- that cannot be submitted (a rule it breaks, a quota) is written to the log of the attempt
-- `tasks[i]`, `attempts[i]` that ended (or, for a workflow's, raised as a warning), and never
-- fails the change of state that called this.
create or replace function sked.alerts_deliver(owners text[], rules jsonb[], events jsonb[],
                                               tasks uuid[], attempts integer[])
returns void
language plpgsql as $$
declare
  e record;
  spec jsonb;
  ids uuid[];
  d_owners text[];
  d_queues text[];
  d_attempts integer[];
  d_inputs jsonb[];
begin
  with d as materialized (
    select sked.uuid_v7() as id, owners[i] as owner, coalesce(t.queue, 'default') as queue,
           coalesce(t.max_attempts, 10) as max_attempts,
           jsonb_build_object('target', x #>> '{}', 'event', events[i]) as input
      from generate_subscripts(owners, 1) i
      cross join lateral jsonb_array_elements(
        case when jsonb_typeof(rules[i]) = 'array' then rules[i] else '[]' end) x
      left join sked.alert_targets t on t.name = x #>> '{}'
     where jsonb_typeof(x) = 'string'
  ), allowed as (
    insert into sked.alert_deliveries_allowed (task_id) select d.id from d
  )
  select coalesce(array_agg(d.id), '{}'), coalesce(array_agg(d.owner), '{}'),
         coalesce(array_agg(d.queue), '{}'), coalesce(array_agg(d.max_attempts), '{}'),
         coalesce(array_agg(d.input), '{}')
    into ids, d_owners, d_queues, d_attempts, d_inputs
    from d;
  if cardinality(ids) > 0 then
    insert into sked.tasks (id, owner, kind, queue, max_attempts, input)
    select * from unnest(ids, d_owners, array_fill('webhook'::text, array[cardinality(ids)]),
                         d_queues, d_attempts, d_inputs);
  end if;
  for e in
    select i, x -> 'task' as task
      from generate_subscripts(owners, 1) i
      cross join lateral jsonb_array_elements(
        case when jsonb_typeof(rules[i]) = 'array' then rules[i] else '[]' end) x
     where jsonb_typeof(x) = 'object'
  loop
    spec := (e.task - 'owner' - 'idempotency_key') || jsonb_build_object('input', events[e.i]);
    begin
      perform sked.tasks_submit(jsonb_build_array(spec), owners[e.i]);
    exception when others then
      if tasks[e.i] is not null then
        insert into sked.task_logs (task_id, attempt, stream, data)
        values (tasks[e.i], attempts[e.i], 'stderr',
                format('sked: the follow-up task of %s could not be submitted: %s%s',
                       events[e.i] ->> 'event', sqlerrm, chr(10)));
      else
        raise warning 'sked: the follow-up task of % could not be submitted: %',
          events[e.i] ->> 'event', sqlerrm;
      end if;
    end;
  end loop;
end
$$;

-- After a statement that changes tasks' states: the notifications of the tasks that
-- succeeded, failed or wait to be retried and whose notify (or queue's) names targets for
-- it. Costs one statement (a look at the changed rows, and at two partial indexes' worth
-- of queues and schedules) when nothing is to be told. Without JIT: the planner's guess at
-- the transition table's size made that statement's cost pass jit_above_cost, and its
-- compilation took 120-220 ms of every single-task cancel or retry (3.5 ms without it).
create or replace function sked.alerts_after_update() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp set jit = off as $$
declare
  owners text[];
  rules jsonb[];
  events jsonb[];
  tasks uuid[];
  attempts integer[];
  own boolean;
  by_queue boolean;
  by_schedule boolean;
begin
  -- One look for the usual case, nothing to tell: no changed row has a notify, and no queue
  -- or schedule has one (the partial index schedules_notified).
  select exists (select 1 from new_rows where notify is not null),
         exists (select 1 from sked.queues where notify is not null),
         exists (select 1 from sked.schedules where notify is not null)
    into own, by_queue, by_schedule;
  if not (own or by_queue or by_schedule) then
    return null;
  end if;
  -- Schedules told of failing occurrences.
  if by_schedule and exists (select 1 from new_rows where state = 'failed') then
    select array_agg(f.owner), array_agg(f.rules), array_agg(f.event)
      into owners, rules, events
      from sked.schedule_failing_events(
             array(select n.id from new_rows n join old_rows o on o.id = n.id
                    where n.state = 'failed' and o.state <> 'failed'),
             statement_timestamp()) f;
    if owners is not null then
      perform sked.alerts_deliver(owners, rules, events,
                                  array_fill(null::uuid, array[cardinality(owners)]),
                                  array_fill(null::integer, array[cardinality(owners)]));
    end if;
  end if;
  if not (own or by_queue) then
    return null;
  end if;
  select array_agg(n.owner), array_agg(h.rules),
         array_agg(sked.alert_event(n, h.hook, statement_timestamp())),
         array_agg(n.id), array_agg(n.attempt)
    into owners, rules, events, tasks, attempts
    from new_rows n
    join old_rows o on o.id = n.id
    left join sked.queues q on n.notify is null and q.name = n.queue
    cross join lateral (
      select case n.state when 'succeeded' then 'on_success'
                          when 'failed' then 'on_failure'
                          when 'retry' then 'on_retry' end as hook) k
    cross join lateral (select k.hook, coalesce(n.notify, q.notify) -> k.hook as rules) h
   where n.state is distinct from o.state
     and n.state in ('succeeded', 'failed', 'retry')
     and jsonb_typeof(h.rules) = 'array';
  if owners is not null then
    perform sked.alerts_deliver(owners, rules, events, tasks, attempts);
  end if;
  return null;
end
$$;

-- (A trigger with transition tables cannot name columns: it fires for every update, and
-- returns after its first statement when nothing is to be told: measured 0.3 ms for a
-- statement that changes 2,000 rows, 1.4 % of it, and 0.05 ms for one row.)
create or replace trigger tasks_after_update_alerts
  after update on sked.tasks
  referencing old table as old_rows new table as new_rows
  for each statement execute function sked.alerts_after_update();

-- A workflow's notify is checked as a task's (on_retry never fires for a workflow).
create or replace function sked.workflows_before_insert_notify() returns trigger
language plpgsql as $$
begin
  perform sked.alerts_check_new(array[new.notify], '{}');
  return new;
end
$$;

create or replace trigger workflows_before_insert_notify
  before insert or update of notify on sked.workflows
  for each row when (new.notify is not null)
  execute function sked.workflows_before_insert_notify();

-- A schedule's notify is checked when it is written.
create or replace function sked.schedules_before_write_notify() returns trigger
language plpgsql as $$
declare
  unknown text;
begin
  if not sked.schedule_notify_is_valid(new.notify) then
    raise exception 'sked.schedules: notify must be an object of on_missed and on_failure, each a list of at most 16 alert target names or {"task": {…}} (not a webhook), and failures_in_a_row, a whole number from 1 to 1000, got % (schedules_notify_must_be_valid)',
      left(new.notify::text, 200)
      using errcode = 'check_violation', constraint = 'schedules_notify_must_be_valid',
            table = 'schedules', schema = 'sked';
  end if;
  unknown := sked.notify_unknown_target(new.notify);
  if unknown is not null then
    raise exception 'sked.schedules: notify names the alert target %, which does not exist (schedules_notify_target_must_exist)',
      unknown
      using errcode = '23503', constraint = 'schedules_notify_target_must_exist',
            table = 'schedules', schema = 'sked';
  end if;
  return new;
end
$$;

create or replace trigger schedules_before_write_notify
  before insert or update of notify on sked.schedules
  for each row when (new.notify is not null)
  execute function sked.schedules_before_write_notify();

-- What an event says of a schedule.
create or replace function sked.alert_schedule(s sked.schedules) returns jsonb
language sql stable as $$
  select jsonb_build_object('id', s.id, 'owner', s.owner, 'name', s.name, 'cron', s.cron,
                            'time_zone', s.time_zone)
$$;

-- The schedules whose on_failure is due after a statement that failed the tasks `failed`:
-- those whose latest finished occurrences now fail failures_in_a_row times in a row and did
-- not before the statement (its tasks were unfinished then), so that a streak is told once,
-- when it reaches the number, however many of its failures one statement writes. Read by
-- sked.alerts_after_update.
create or replace function sked.schedule_failing_events(failed uuid[], p_now timestamptz)
returns table (owner text, rules jsonb, event jsonb)
language sql stable as $$
  select s.owner, s.notify -> 'on_failure',
         jsonb_build_object('event', 'schedule.failing', 'at', p_now,
                            'schedule', sked.alert_schedule(s),
                            'failures_in_a_row', w.want,
                            'task', jsonb_build_object('id', st.newest))
    from sked.schedules s
    cross join lateral (
      select coalesce((s.notify ->> 'failures_in_a_row')::integer, 1) as want) w
    cross join lateral (
      -- Newest first: `pos` among every finished occurrence, `old_pos` among those finished
      -- before the statement.
      select coalesce(min(x.pos) filter (where x.state <> 'failed') - 1, count(*)) as now_,
             coalesce(min(x.old_pos) filter (where x.state <> 'failed' and not x.new) - 1,
                      count(*) filter (where not x.new)) as before,
             (array_agg(x.id order by x.pos) filter (where x.new))[1] as newest
        from (select t.id, t.state, t.id = any (failed) as new,
                     row_number() over (order by r.fire_at desc, r.id desc) as pos,
                     row_number() over (partition by t.id = any (failed)
                                        order by r.fire_at desc, r.id desc) as old_pos
                from sked.schedule_runs r
                join sked.tasks t on t.id = r.task_id
               where r.schedule_id = s.id and r.task_id is not null
                 and not sked.state_is_unfinished(t.state)) x) st
   where s.notify is not null
     and jsonb_typeof(s.notify -> 'on_failure') = 'array'
     and s.id in (select r.schedule_id from sked.schedule_runs r where r.task_id = any (failed))
     and st.now_ >= w.want and st.before < w.want
$$;

-- After a statement that ends workflows: `workflow.succeeded` and `workflow.failed` to the
-- targets of their notify.
create or replace function sked.alerts_after_workflow_update() returns trigger
language plpgsql security definer set search_path = pg_catalog, pg_temp as $$
declare
  owners text[];
  rules jsonb[];
  events jsonb[];
begin
  if not exists (select 1 from new_rows where notify is not null) then
    return null;
  end if;
  select array_agg(n.owner), array_agg(n.notify -> h.hook),
         array_agg(jsonb_build_object(
           'event', 'workflow.' || n.state, 'at', statement_timestamp(),
           'workflow', jsonb_build_object('id', n.id, 'owner', n.owner, 'name', n.name,
                                          'state', n.state, 'created_at', n.created_at,
                                          'finished_at', n.finished_at)))
    into owners, rules, events
    from new_rows n
    join old_rows o on o.id = n.id
    cross join lateral (
      select case n.state when 'succeeded' then 'on_success'
                          when 'failed' then 'on_failure' end as hook) h
   where n.state is distinct from o.state
     and jsonb_typeof(n.notify -> h.hook) = 'array';
  if owners is not null then
    perform sked.alerts_deliver(owners, rules, events,
                                array_fill(null::uuid, array[cardinality(owners)]),
                                array_fill(null::integer, array[cardinality(owners)]));
  end if;
  return null;
end
$$;

create or replace trigger workflows_after_update_alerts
  after update on sked.workflows
  referencing old table as old_rows new table as new_rows
  for each statement execute function sked.alerts_after_workflow_update();

-- Creates or replaces an alert target (admins: `sked alert target set`, REST
-- `PUT /api/v1/alert-targets/{name}`). Returns the target's name.
create or replace function sked.alert_target_set(
  p_name text, p_url text, p_secret text, p_queue text default 'default',
  p_max_attempts integer default 10, p_now timestamptz default now())
returns text
language sql as $$
  insert into sked.alert_targets (name, url, secret, queue, max_attempts, created_at, updated_at)
  values (p_name, p_url, p_secret, p_queue, p_max_attempts, p_now, p_now)
  on conflict (name) do update
     set url = excluded.url, secret = excluded.secret, queue = excluded.queue,
         max_attempts = excluded.max_attempts, updated_at = excluded.updated_at
  returning name
$$;

-- Deletes an alert target; true when there was one. Tasks that name it keep their notify;
-- their deliveries to it fail, saying so.
create or replace function sked.alert_target_delete(p_name text) returns boolean
language plpgsql as $$
begin
  delete from sked.alert_targets where name = p_name;
  return found;
end
$$;

-- The alert targets without their secrets, by name.
create or replace function sked.alert_targets_list()
returns table (name text, url text, queue text, max_attempts integer,
               created_at timestamptz, updated_at timestamptz)
language sql stable as $$
  select name, url, queue, max_attempts, created_at, updated_at
    from sked.alert_targets order by name
$$;

-- What a worker needs to deliver a `webhook` task: its target's URL and secret (null when the
-- target no longer exists).
create or replace function sked.alert_target_for_delivery(p_name text)
returns table (url text, secret text)
language sql stable as $$
  select url, secret from sked.alert_targets where name = p_name
$$;

-- A queue's notify: the notify of its tasks that have none (null: none). Returns the queue.
create or replace function sked.queue_set_notify(p_queue text, p_notify jsonb,
                                                 p_now timestamptz default now())
returns text
language plpgsql as $$
begin
  perform sked.queue_name_check(p_queue);
  if p_notify is null then
    -- sked.queues holds only queues with a control: a row left without one goes.
    delete from sked.queues
     where name = p_queue and paused_at is null and max_running is null
       and rate_per_sec is null and retention is null and keep_failed is null;
    update sked.queues set notify = null, updated_at = p_now where name = p_queue;
    return p_queue;
  end if;
  perform sked.alerts_check_new(array[p_notify], '{}');
  insert into sked.queues (name, notify, updated_at)
  values (p_queue, p_notify, p_now)
  on conflict (name) do update set notify = excluded.notify, updated_at = excluded.updated_at;
  return p_queue;
end
$$;
