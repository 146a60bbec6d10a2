-- The service functions of the SQL contract: long-running services. See docs/services.md.
--
-- A service is a task of kind `service` with `replicas` N. It is a sharded task
-- (sql/shards.sql) whose shards are its copies: the insert trigger below sets
-- `shard_total = replicas`, the shard trigger makes the copies, and the DAG machinery settles
-- the service when its copies end. Stopping a service is cancelling it (sked.task_cancel).
-- What is added here:
--   * the checks of a service's fields, and the copies' retry policy: a copy is never given
--     up because workers die (a huge max_attempts, so a lost lease always retries at once);
--   * what the worker that owns a copy records while it supervises it: starts, health,
--     exits with their backoff (sked.service_copy_started, _healthy, _exited);
--   * sked.service_update, which changes a service's definition or its replicas, and
--     sked.services_reconcile, which scales and rolls the copies over one at a time.
--
-- Attached and detached copies. A copy that counts for its service has an edge
-- (service, copy) in sked.task_edges, like every shard. The reconciler retires a copy by
-- deleting its edge (and adjusting the service's counters) before stopping it, so that its
-- end does not settle the service; it keeps `shard_of` and shows as a retired copy.

-- The first problem with a health check, as a sentence, or null when it has none.
create or replace function sked.service_health_check_problem(hc jsonb) returns text
language sql immutable as $$
  select case
    when hc is null then null
    when jsonb_typeof(hc) <> 'object' then 'health_check must be a JSON object'
    when exists (select 1 from jsonb_object_keys(hc) k
                  where k not in ('command', 'http', 'interval_secs', 'timeout_secs', 'failures'))
      then format('health_check has unknown keys: %s (known: command, http, interval_secs, timeout_secs, failures)',
                  (select string_agg(k, ', ' order by k) from jsonb_object_keys(hc) k
                    where k not in ('command', 'http', 'interval_secs', 'timeout_secs', 'failures')))
    when (hc ? 'command') = (hc ? 'http')
      then 'health_check needs exactly one of "command" (an array of strings) or "http" (a URL)'
    when hc ? 'command'
         and (jsonb_typeof(hc -> 'command') <> 'array' or jsonb_array_length(hc -> 'command') = 0
              or exists (select 1 from jsonb_array_elements(hc -> 'command') e
                          where jsonb_typeof(e) <> 'string')
              or hc -> 'command' ->> 0 = '')
      then 'health_check.command must be a non-empty array of strings whose first element (the program) is not empty'
    when hc ? 'http'
         and (jsonb_typeof(hc -> 'http') <> 'string' or hc ->> 'http' !~ '^http://[^/\s]+(/\S*)?$')
      then 'health_check.http must be a URL starting with http:// (for example http://127.0.0.1:8080/health)'
    when hc ? 'interval_secs'
         and (jsonb_typeof(hc -> 'interval_secs') <> 'number'
              or (hc ->> 'interval_secs')::numeric not between 0.1 and 3600)
      then 'health_check.interval_secs must be a number from 0.1 to 3600'
    when hc ? 'timeout_secs'
         and (jsonb_typeof(hc -> 'timeout_secs') <> 'number'
              or (hc ->> 'timeout_secs')::numeric not between 0.1 and 3600)
      then 'health_check.timeout_secs must be a number from 0.1 to 3600'
    when hc ? 'failures'
         and (jsonb_typeof(hc -> 'failures') <> 'number'
              or (hc ->> 'failures')::numeric not between 1 and 100
              or (hc ->> 'failures')::numeric <> trunc((hc ->> 'failures')::numeric))
      then 'health_check.failures must be a whole number from 1 to 100'
  end
$$;

-- Raises check_violation for a broken service rule, naming it as the constraint, with a
-- sentence for people after "service: ".
create or replace function sked.service_rule_raise(rule text, says text) returns void
language plpgsql as $$
begin
  raise exception 'service: %', says
    using errcode = 'check_violation', constraint = rule, table = 'tasks', schema = 'sked';
end
$$;

-- The most attempts a copy has: its attempts end only by a lost lease (retried at once on
-- another worker), a shutdown of its worker (not charged) or a stop, never because the
-- process failed (the worker restarts it in place), so a copy must never run out of them.
create or replace function sked.service_copy_max_attempts() returns integer
language sql immutable parallel safe as $$ select 1000000000 $$;

-- Completes a service row before it is inserted, and a copy from its service: a service
-- gets `shard_total = replicas` (default 1), restart policy `always` and generation 1; a
-- copy takes its service's restart policy, health check and generation unless given, never
-- runs out of attempts and counts restarts from 0. Rejects services that cannot hold
-- together. Only rows of kind `service` pay for it (the WHEN clause).
create or replace function sked.tasks_before_insert_service() returns trigger
language plpgsql as $$
declare
  problem text;
  parent record;
begin
  if new.shard_of is null then
    if new.broadcast then
      perform sked.service_rule_raise('services_are_not_broadcast',
        'a service runs `replicas` copies; it cannot be a broadcast');
    end if;
    if new.shard_total is not null and new.replicas is not null and new.shard_total <> new.replicas then
      perform sked.service_rule_raise('services_replicas_are_their_shards',
        'a service takes `replicas`; `shards` must be absent or equal to it');
    end if;
    if new.workflow_id is not null then
      perform sked.service_rule_raise('services_are_not_workflow_tasks',
        'a service cannot be a task of a workflow: it never finishes, so its children would never run');
    end if;
    if new.timeout is not null then
      perform sked.service_rule_raise('services_have_no_timeout',
        'a service runs until it is stopped: it takes no timeout');
    end if;
    problem := sked.service_health_check_problem(new.health_check);
    if problem is not null then
      perform sked.service_rule_raise('services_health_check_must_be_valid', problem);
    end if;
    new.replicas := coalesce(new.replicas, new.shard_total, 1);
    new.shard_total := new.replicas;
    new.restart_policy := coalesce(new.restart_policy, 'always');
    new.generation := coalesce(new.generation, 1);
  else
    if new.restart_policy is null or new.generation is null then
      select p.restart_policy, p.health_check, p.generation into parent
        from sked.tasks p where p.id = new.shard_of;
      new.restart_policy := coalesce(new.restart_policy, parent.restart_policy, 'always');
      new.health_check := coalesce(new.health_check, parent.health_check);
      new.generation := coalesce(new.generation, parent.generation, 1);
    end if;
    new.max_attempts := sked.service_copy_max_attempts();
    new.restarts := coalesce(new.restarts, 0);
  end if;
  return new;
end
$$;

create or replace trigger tasks_before_insert_service
  before insert on sked.tasks
  for each row
  when (new.kind = 'service')
  execute function sked.tasks_before_insert_service();

-- A health check changed by a plain UPDATE is checked like one inserted.
create or replace function sked.tasks_before_update_health_check() returns trigger
language plpgsql as $$
declare
  problem text := sked.service_health_check_problem(new.health_check);
begin
  if problem is not null then
    perform sked.service_rule_raise('services_health_check_must_be_valid', problem);
  end if;
  return new;
end
$$;

create or replace trigger tasks_before_update_health_check
  before update of health_check on sked.tasks
  for each row
  when (new.health_check is not null)
  execute function sked.tasks_before_update_health_check();

-- The worker that runs attempt `p_attempt` of copy `p_id` started its process at `p_now`.
-- False when the attempt is no longer the worker's (the lease was lost).
create or replace function sked.service_copy_started(p_id uuid, p_attempt integer, p_now timestamptz default now())
returns boolean
language plpgsql as $$
begin
  update sked.tasks
     set up_since = p_now, healthy_at = null, backoff_until = null
   where id = p_id and state = 'running' and attempt = p_attempt and kind = 'service';
  return found;
end
$$;

-- The copy's current process passed its health check (the first pass is kept).
create or replace function sked.service_copy_healthy(p_id uuid, p_attempt integer, p_now timestamptz default now())
returns boolean
language plpgsql as $$
begin
  update sked.tasks
     set healthy_at = coalesce(healthy_at, p_now)
   where id = p_id and state = 'running' and attempt = p_attempt and kind = 'service';
  return found;
end
$$;

-- The copy's process exited at `p_exited_at` (with an exit code or by a signal; `p_error`
-- says how as people read it). With `p_restart_at` the worker starts it again then: the
-- restart is counted and the copy shows as backing off until that time. The exit is kept in
-- sked.service_exits with the copy's last 20. False when the attempt is no longer the
-- worker's.
create or replace function sked.service_copy_exited(
  p_id uuid, p_attempt integer, p_exited_at timestamptz, p_exit_code integer, p_signal integer,
  p_error text, p_restart_at timestamptz)
returns boolean
language plpgsql as $$
begin
  update sked.tasks
     set up_since = null, healthy_at = null, backoff_until = p_restart_at,
         restarts = coalesce(restarts, 0) + (p_restart_at is not null)::integer
   where id = p_id and state = 'running' and attempt = p_attempt and kind = 'service';
  if not found then
    return false;
  end if;
  insert into sked.service_exits (task_id, attempt, exited_at, exit_code, signal, error, restart_at)
  values (p_id, p_attempt, p_exited_at, p_exit_code, p_signal, p_error, p_restart_at);
  delete from sked.service_exits x
   where x.task_id = p_id
     and x.id < (select min(k.id) from (select y.id from sked.service_exits y
                                         where y.task_id = p_id order by y.id desc limit 20) k);
  return true;
end
$$;

-- Is the copy's process up? It runs, and its process started in the current attempt (a
-- copy taken over from a dead worker keeps the old attempt's start until its new worker
-- starts it: the claim, `started_at`, comes first).
create or replace function sked.service_copy_up(
  state text, up_since timestamptz, started_at timestamptz)
returns boolean
language sql immutable parallel safe as $$
  select state = 'running' and coalesce(up_since >= started_at, false)
$$;

-- Is this copy ready to take over from the copy it replaces? Its process is up, has been
-- for `p_ready`, and passed its health check when it has one.
drop function if exists sked.service_copy_ready(text, timestamptz, timestamptz, jsonb, interval,
                                                timestamptz);
create or replace function sked.service_copy_ready(
  state text, up_since timestamptz, started_at timestamptz, healthy_at timestamptz,
  health_check jsonb, p_ready interval, p_now timestamptz)
returns boolean
language sql immutable parallel safe as $$
  select sked.service_copy_up(state, up_since, started_at) and up_since <= p_now - p_ready
     and (health_check is null or healthy_at >= up_since)
$$;

-- Makes a copy of service `p_service` (locked by the caller) at `p_index`, from its current
-- definition (its fields, sked.task_copy) and generation, attached to it. Returns its id.
create or replace function sked.service_copy_add(p_service uuid, p_index integer, p_now timestamptz)
returns uuid
language plpgsql as $$
declare
  made uuid := sked.uuid_v7();
begin
  perform sked.tasks_insert(array[sked.task_copy(s, jsonb_build_object(
            'id', made, 'idempotency_key', null, 'replicas', null,
            'max_attempts', sked.service_copy_max_attempts(), 'next_run_at', p_now,
            'created_at', p_now, 'name', s.name || '[' || p_index || ']', 'children', 1,
            'shard_total', s.replicas, 'shard_index', p_index, 'shard_of', s.id,
            'generation', s.generation))], whole => true)
    from sked.tasks s where s.id = p_service;
  insert into sked.task_edges (task_id, depends_on) values (p_service, made);
  update sked.tasks s
     set parents = s.parents + 1, parents_pending = s.parents_pending + 1
   where s.id = p_service;
  return made;
end
$$;

-- Retires copy `p_copy` of service `p_service` (both locked by the caller): it no longer
-- counts for the service (its edge is deleted, the service's counters follow), then it is
-- stopped: a running copy gets a cancel request (its worker stops it: SIGTERM, grace,
-- SIGKILL), one that has not started ends cancelled. Returns the copy's state before, or null
-- when it was not retired: it is not attached, or it is the service's last unfinished copy
-- (a service waits on at least one).
create or replace function sked.service_copy_retire(
  p_service uuid, p_copy uuid, p_why text, p_now timestamptz)
returns text
language plpgsql as $$
declare
  copy_state text;
  unfinished boolean;
begin
  select c.state into copy_state from sked.tasks c where c.id = p_copy;
  unfinished := sked.state_is_unfinished(copy_state);
  if unfinished and (select s.parents_pending from sked.tasks s where s.id = p_service) <= 1 then
    return null;
  end if;
  delete from sked.task_edges e where e.task_id = p_service and e.depends_on = p_copy;
  if not found then
    return null;
  end if;
  update sked.tasks s
     set parents = s.parents - 1, parents_pending = s.parents_pending - unfinished::integer
   where s.id = p_service;
  update sked.tasks c
     set children = 0,
         state = case when sked.state_waits_to_run(c.state) then 'cancelled' else c.state end,
         finished_at = case when sked.state_waits_to_run(c.state) then p_now else c.finished_at end,
         error = case when sked.state_waits_to_run(c.state) then p_why else c.error end,
         cancel_requested_at = case when c.state = 'running'
                                    then coalesce(c.cancel_requested_at, p_now)
                                    else c.cancel_requested_at end
   where c.id = p_copy;
  return copy_state;
end
$$;

-- One reconciling step for service `p_id`: the service and the copies it touches are
-- locked with SKIP LOCKED (a row busy elsewhere waits for the next call, so reconcilers,
-- finishes, renewals and cancels never wait for each other, and never deadlock). In order:
--   1. scale up: an index below replicas with no attached copy gets a new copy;
--   2. scale down: attached copies at an index >= replicas are retired, all at once;
--   3. roll: while attached copies are of an older generation, one index at a time gets a
--      new-generation copy next to the old one (a surge: N+1 copies while it starts); once
--      the new copy is ready (sked.service_copy_ready), the old one is retired, and the next
--      index follows at a later call. An old copy that is not running is replaced at once.
-- Returns what it did: (action, copy) rows, action one of added, retired, surged, replaced.
drop function if exists sked.service_reconcile(uuid, timestamptz, interval);
create or replace function sked.service_reconcile(
  p_id uuid, p_ready interval default '2 seconds', p_now timestamptz default now())
returns table (action text, copy_id uuid)
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  s sked.tasks;
  old_id uuid;
  old_index integer;
  old_state text;
  surge sked.tasks;
  tell text[] := '{}';
  made uuid;
  idx integer;
  gone uuid;
  retired text;
  wake boolean := false;
begin
  select t.* into s from sked.tasks t
   where t.id = p_id and t.kind = 'service' and t.shard_of is null and t.state = 'blocked'
   for update skip locked;
  if not found then
    return;
  end if;

  -- 1. Scale up (and any index left without a copy).
  for idx in
    select g.i from generate_series(0, s.replicas - 1) as g(i)
     where not exists (select 1 from sked.tasks x
                         join sked.task_edges e on e.task_id = s.id and e.depends_on = x.id
                        where x.shard_of = s.id and x.shard_index = g.i)
  loop
    made := sked.service_copy_add(s.id, idx, p_now);
    wake := true;
    action := 'added'; copy_id := made;
    return next;
  end loop;

  -- 2. Scale down.
  for gone in
    select x.id from sked.tasks x
      join sked.task_edges e on e.task_id = s.id and e.depends_on = x.id
     where x.shard_of = s.id and x.shard_index >= s.replicas
       and sked.state_is_unfinished(x.state)
     order by x.shard_index
     for update of x skip locked
  loop
    retired := sked.service_copy_retire(s.id, gone, 'stopped: the service was scaled down', p_now);
    if retired is not null then
      if retired = 'running' then
        tell := tell || gone::text;
      end if;
      action := 'retired'; copy_id := gone;
      return next;
    end if;
  end loop;
  -- Copies see the number of replicas at their next start.
  update sked.tasks x set shard_total = s.replicas
   where x.id in (select y.id from sked.tasks y
                   where y.shard_of = s.id and y.shard_total <> s.replicas
                     and y.shard_index < s.replicas
                     and sked.state_is_unfinished(y.state)
                   for update skip locked);

  -- 3. Roll, one index at a time: the lowest index with an old attached copy.
  select x.id, x.shard_index, x.state into old_id, old_index, old_state from sked.tasks x
    join sked.task_edges e on e.task_id = s.id and e.depends_on = x.id
   where x.shard_of = s.id and x.generation < s.generation and x.shard_index < s.replicas
     and sked.state_is_unfinished(x.state)
   order by x.shard_index
   limit 1;
  if found then
    select x.* into surge from sked.tasks x
      join sked.task_edges e on e.task_id = s.id and e.depends_on = x.id
     where x.shard_of = s.id and x.generation = s.generation and x.shard_index = old_index
       and sked.state_is_unfinished(x.state)
     limit 1;
    if not found then
      perform 1 from sked.tasks x where x.id = old_id for update skip locked;
      if found then
        if old_state <> 'running' then
          -- Nothing runs at this index to keep available: the new copy takes its place now.
          made := sked.service_copy_add(s.id, old_index, p_now);
          action := 'replaced'; copy_id := made;
          return next;
          perform sked.service_copy_retire(s.id, old_id, 'replaced by a rolling update', p_now);
          action := 'retired'; copy_id := old_id;
          return next;
          wake := true;
        else
          made := sked.service_copy_add(s.id, old_index, p_now);
          action := 'surged'; copy_id := made;
          return next;
          wake := true;
        end if;
      end if;
    elsif sked.service_copy_ready(surge.state, surge.up_since, surge.started_at, surge.healthy_at,
                                  surge.health_check, p_ready, p_now) then
      perform 1 from sked.tasks x where x.id = old_id for update skip locked;
      if found then
        retired := sked.service_copy_retire(s.id, old_id, 'replaced by a rolling update', p_now);
        if retired is not null then
          if retired = 'running' then
            tell := tell || old_id::text;
          end if;
          action := 'retired'; copy_id := old_id;
          return next;
        end if;
      end if;
    end if;
  end if;

  -- One notification each: copies to stop, and copies to claim (the insert trigger does not
  -- announce shards).
  if cardinality(tell) > 0 then
    perform pg_notify('sked_cancel', left(array_to_string(tell, ','), 7992));
  end if;
  if wake then
    perform pg_notify('sked_tasks', s.queue);
  end if;
end
$$;

drop function if exists sked.service_needs_reconcile(uuid, integer, integer);

-- Reconciles the running services that need it (at most `p_limit` per call), each by one
-- step of sked.service_reconcile, and stops the copies that no longer count: those of
-- services that have ended (a copy cancelled on its own ends its service upstream_failed),
-- and retired copies that run again (sked.task_retry of the service re-runs all its
-- cancelled copies): a running copy gets a cancel request, one that has not started ends
-- cancelled. Workers call it in
-- their background upkeep, every poll interval; any number of callers at once is safe (SKIP LOCKED). Returns what was
-- done (action `stopped` for an ended service's copy).
drop function if exists sked.services_reconcile(timestamptz, interval, integer);
create or replace function sked.services_reconcile(
  p_ready interval default '2 seconds', p_limit integer default 100, p_now timestamptz default now())
returns table (service_id uuid, action text, copy_id uuid)
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  services uuid[];
  ids uuid[];
  running text;
begin
  -- The services that need a step, read without locks (so that reconcilers lock, and so
  -- write, only those): some index below `replicas` has no attached copy, or an attached
  -- copy that has not ended is at an index >= replicas, of an older generation, or sees
  -- another number of replicas. One pass over each service's edges.
  return query
  select s.id, r.action, r.copy_id
    from (select t.id from sked.tasks t
            left join lateral (
              select count(distinct x.shard_index) filter (where x.shard_index < t.replicas) as have,
                     bool_or(sked.state_is_unfinished(x.state)
                             and (x.shard_index >= t.replicas or x.generation < t.generation
                                  or x.shard_total <> t.replicas)) as off
                from sked.task_edges e join sked.tasks x on x.id = e.depends_on
               where e.task_id = t.id) c on true
           where t.kind = 'service' and t.shard_of is null and t.state = 'blocked'
             and (coalesce(c.have, 0) < t.replicas or c.off)
           order by t.id limit p_limit) s
   cross join lateral sked.service_reconcile(s.id, p_ready, p_now) r;

  with orphans as (
    select c.id from sked.tasks c
     where c.kind = 'service' and c.shard_of is not null
       and sked.state_is_unfinished(c.state)
       and (c.state <> 'running' or c.cancel_requested_at is null)
       and (exists (select 1 from sked.tasks p where p.id = c.shard_of and p.state <> 'blocked')
            or not exists (select 1 from sked.task_edges e
                            where e.depends_on = c.id and e.task_id = c.shard_of))
     limit p_limit
     for update of c skip locked
  ), stopped as (
    update sked.tasks c
       set state = case when c.state = 'running' then c.state else 'cancelled' end,
           finished_at = case when c.state = 'running' then null else p_now end,
           error = case when c.state = 'running' then c.error else 'stopped: its service ended' end,
           cancel_requested_at = case when c.state = 'running'
                                      then coalesce(c.cancel_requested_at, p_now) end
      from orphans o
     where c.id = o.id
    returning c.shard_of, c.id, c.state = 'running' as running
  )
  select array_agg(st.shard_of), array_agg(st.id),
         string_agg(st.id::text, ',') filter (where st.running)
    into services, ids, running
    from stopped st;
  if running is not null then
    perform pg_notify('sked_cancel', left(running, 7992));
  end if;
  return query select u.s, 'stopped'::text, u.c from unnest(services, ids) as u(s, c);
end
$$;

-- Changes service `p_id` (one that runs) with the JSON object `p_changes`. Definition keys:
-- command, args, env, input, artifact_url, artifact_sha256, labels, cpu_millis, memory_mb,
-- max_output_bytes, run_as, restart_policy, health_check (null removes the optional ones);
-- a change to any of them bumps the generation, and the copies roll over to it one at a
-- time. `replicas` scales. Keys left out keep their values. Bad input raises with a
-- sentence and changes nothing. Returns the service's generation after the change, or null
-- when there is no such task. The first reconciling step is taken at once.
create or replace function sked.service_update(
  p_id uuid, p_changes jsonb, p_now timestamptz default now())
returns integer
language plpgsql as $$
declare
  s sked.tasks;
  n sked.tasks;
  bad text;
  next_generation integer;
begin
  if p_changes is null or jsonb_typeof(p_changes) <> 'object' then
    perform sked.service_rule_raise('services_update_must_be_an_object',
      'the changes must be a JSON object');
  end if;
  select string_agg(k, ', ' order by k) into bad from jsonb_object_keys(p_changes) k
   where k not in ('command', 'args', 'env', 'input', 'artifact_url', 'artifact_sha256',
                   'labels', 'cpu_millis', 'memory_mb', 'max_output_bytes', 'run_as',
                   'restart_policy', 'health_check', 'replicas');
  if bad is not null then
    perform sked.service_rule_raise('services_update_keys_must_be_known',
      format('unknown or unchangeable keys: %s (changeable: command, args, env, input, artifact_url, artifact_sha256, labels, cpu_millis, memory_mb, max_output_bytes, run_as, restart_policy, health_check, replicas)', bad));
  end if;
  select string_agg(k, ', ' order by k) into bad from jsonb_each(p_changes) e(k, v)
   where k in ('args', 'env', 'labels', 'restart_policy', 'replicas') and jsonb_typeof(v) = 'null';
  if bad is not null then
    perform sked.service_rule_raise('services_update_values_must_not_be_null',
      format('these keys cannot be null: %s', bad));
  end if;
  select t.* into s from sked.tasks t where t.id = p_id for update;
  if not found then
    return null;
  end if;
  if s.kind <> 'service' or s.shard_of is not null then
    perform sked.service_rule_raise('services_update_needs_a_service',
      format('task %s is not a service', p_id));
  end if;
  if s.state <> 'blocked' then
    perform sked.service_rule_raise('services_update_needs_a_running_service',
      format('service %s has ended (%s): submit it again', p_id, s.state));
  end if;
  n := jsonb_populate_record(s, p_changes);
  next_generation := s.generation
    + ((n.command, n.args, n.env, n.input, n.artifact_url, n.artifact_sha256, n.labels,
        n.cpu_millis, n.memory_mb, n.max_output_bytes, n.run_as, n.restart_policy,
        n.health_check)
       is distinct from
       (s.command, s.args, s.env, s.input, s.artifact_url, s.artifact_sha256, s.labels,
        s.cpu_millis, s.memory_mb, s.max_output_bytes, s.run_as, s.restart_policy,
        s.health_check))::integer;
  update sked.tasks t
     set command = n.command, args = n.args, env = n.env, input = n.input,
         artifact_url = n.artifact_url, artifact_sha256 = n.artifact_sha256, labels = n.labels,
         cpu_millis = n.cpu_millis, memory_mb = n.memory_mb,
         max_output_bytes = n.max_output_bytes, run_as = n.run_as,
         restart_policy = n.restart_policy, health_check = n.health_check,
         replicas = n.replicas, shard_total = n.replicas, generation = next_generation
   where t.id = p_id;
  perform sked.service_reconcile(p_id, p_now => p_now);
  return next_generation;
end
$$;

-- Services first (docs/runtime.md, "Services first"). The copies of services come before
-- every other task: each claim first takes the due copies of its queues (this pass), and a
-- worker that cannot fit a due copy yet holds its CPU and memory for it (tasks_claim). When
-- no worker has room for a copy for sked.preempt_after(), a worker running preemptible tasks
-- claims it and stops some of them to make room (sked.copies_claim_preempting).

-- How long a copy of a service waits for a worker with room before preemptible tasks are
-- stopped for it: time for the workers with room to claim it first.
create or replace function sked.preempt_after() returns interval
language sql immutable parallel safe as $$
  select interval '2 seconds'
$$;

-- Is this due copy of a service (its columns) one that worker p_worker may claim, apart from
-- its capacity: its queue is not paused, the worker has its labels, and the shard rules
-- (pinning, spreading copies over workers) let it.
create or replace function sked.copy_claimable(
  p_queue text, p_labels text[], p_shard_of uuid, p_pinned_worker uuid,
  p_next_run_at timestamptz, p_worker uuid, p_worker_labels text[], p_now timestamptz)
returns boolean
language sql stable as $$
  select (p_labels = '{}' or p_labels <@ p_worker_labels)
     and sked.shard_claimable(p_shard_of, p_pinned_worker, p_next_run_at, p_worker, p_now)
     and not exists (select 1 from sked.queues q where q.name = p_queue and q.paused_at is not null)
$$;

-- The first pass of a claim: up to p_limit due copies of services of these queues that fit
-- the free capacity (the longest prefix in claim order whose running sums fit, as for
-- other tasks), one copy of a service per claim while copies are new. Queue limits
-- (max_running, rate) hold back other tasks, not copies: a service's replicas are its own
-- limit, and its copies count towards the queue's running tasks. A paused queue starts no
-- copy. Walks the index tasks_waiting_copies, which holds the waiting copies only.
create or replace function sked.copies_claim(
  p_worker uuid, p_queues text[], p_labels text[], p_limit integer, p_lease interval,
  p_cpu_millis integer, p_memory_mb integer, p_now timestamptz)
returns setof sked.tasks
-- PL/pgSQL keeps the statement's plan for the session; a SQL function plans it on every call.
language plpgsql
set enable_seqscan = off -- see the note at the top of sql/workers.sql
set jit = off
as $$
begin
  return query
  select * from sked.tasks_start(array(
    select sked.claim_pick_of(t.id, t.priority, t.next_run_at, t.shard_of, t.shard_index,
                              t.cpu_millis, t.memory_mb, p_cpu_millis, p_memory_mb, p_now)
      from sked.tasks t
     where t.kind = 'service' and t.shard_of is not null and sked.state_is_claimable(t.state)
       and t.queue = any(p_queues) and t.next_run_at <= p_now and t.attempt < t.max_attempts
       and sked.copy_claimable(t.queue, t.labels, t.shard_of, t.pinned_worker, t.next_run_at,
                               p_worker, p_labels, p_now)
       and sked.task_fits(t.cpu_millis, t.memory_mb, p_cpu_millis, p_memory_mb)
     order by t.priority desc, t.next_run_at
     limit p_limit
     for update of t skip locked), p_worker, p_lease, p_cpu_millis, p_memory_mb, p_now);
end
$$;

-- Preemption: claims the copy of a service that has waited longest (of the highest
-- priority) for more than sked.preempt_after() and fits p_cpu_millis and p_memory_mb, the
-- worker's free capacity plus what its running preemptible attempts hold. The worker then
-- stops as few of those attempts as make room (lowest priority first, then the most recently
-- started), and starts the copy once they have ended; each ends `interrupted` (not charged)
-- and waits again. A worker calls this only while it runs preemptible attempts.
create or replace function sked.copies_claim_preempting(
  p_worker uuid, p_queues text[], p_labels text[], p_lease interval,
  p_cpu_millis integer, p_memory_mb integer, p_now timestamptz default now())
returns setof sked.tasks
language sql
set enable_seqscan = off -- see the note at the top of sql/workers.sql
set jit = off
as $$
  -- Started whatever the free capacity: the worker makes the room (null: unbounded).
  select * from sked.tasks_start(array(
    select sked.claim_pick_of(t.id, t.priority, t.next_run_at, t.shard_of, t.shard_index,
                              t.cpu_millis, t.memory_mb, null, null, p_now)
      from sked.tasks t
     where t.kind = 'service' and t.shard_of is not null and sked.state_is_claimable(t.state)
       and t.queue = any(p_queues) and t.next_run_at <= p_now - sked.preempt_after()
       and t.attempt < t.max_attempts
       and sked.copy_claimable(t.queue, t.labels, t.shard_of, t.pinned_worker, t.next_run_at,
                               p_worker, p_labels, p_now)
       and sked.task_fits(t.cpu_millis, t.memory_mb, p_cpu_millis, p_memory_mb)
     order by t.priority desc, t.next_run_at
     limit 1
     for update of t skip locked), p_worker, p_lease, null, null, p_now)
$$;
