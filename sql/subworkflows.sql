-- Sub-workflows (docs/workflows.md, "Sub-workflows"). A workflow task whose body is
-- `workflow: {...}` (kind `workflow`, its body in sked.tasks.subworkflow) runs another
-- workflow instead of a command: inline, `{"tasks": [...], "params": ..., "notify": ...}`, or a
-- stored definition, `{"definition": "<name>", "version": N, "params": {...}}` (the latest
-- version when none is named). It is never claimed. When its parents release it (or at
-- submission, when it has none), sked.subworkflows_start submits its sub-workflow, a row of
-- sked.workflows whose parent_task_id names the task, in the same transaction; the task is
-- then `blocked` (attempt 1) while the sub-workflow runs, as a map waits for its instances.
-- When the sub-workflow ends, sked.workflows_settle calls sked.subworkflows_end, which ends
-- the task in the sub-workflow's state (succeeded with the outputs of its last tasks) and
-- settles it, so that its children run by their trigger rules. Cancelling the task or its
-- workflow cancels its sub-workflow; running it again after its sub-workflow failed or was
-- cancelled runs that sub-workflow again from where it failed (sked.workflow_retry), so a
-- re-run from failed reaches inside; after it succeeded, a new run of its sub-workflow starts.
-- A running task may add such a task to its own workflow (sked.task_spawn, below).

-- How deep sub-workflows may nest: a workflow submitted on its own is at depth 0, its
-- sub-workflows at 1, theirs at 2; a task that would start one deeper fails.
create or replace function sked.subworkflow_max_depth() returns integer
language sql immutable parallel safe as $$ select 8 $$;

-- The depth of workflow `p_id`: how many sub-workflow tasks lie above it.
create or replace function sked.workflow_depth(p_id uuid) returns integer
language sql stable as $$
  with recursive up (workflow_id, depth) as (
    select p_id, 0
    union all
    select t.workflow_id, u.depth + 1
      from up u
      join sked.workflows w on w.id = u.workflow_id
      join sked.tasks t on t.id = w.parent_task_id
     where u.depth < 1000
  )
  select max(u.depth) from up u
$$;

-- Why `p_body` cannot be the body of a sub-workflow task of `p_owner` (null when it can): an
-- object naming a stored definition of the owner (and a version it has), or listing tasks
-- that make a valid workflow, checked by submitting them in a subtransaction that is always
-- rolled back, so that the inline spec is held to exactly the rules of a workflow. Called
-- after the caller has used the temporary tables of sked.workflow_submit_from, which the
-- trial submission fills again.
create or replace function sked.subworkflow_error(p_body jsonb, p_owner text, p_now timestamptz)
returns text
language plpgsql as $$
declare
  bad text;
begin
  if jsonb_typeof(p_body) is distinct from 'object' then
    return format('must be an object, {"tasks": [...]} or {"definition": "<name>"}, not %s',
                  left(coalesce(p_body::text, 'null'), 200));
  end if;
  select k into bad from jsonb_object_keys(p_body) k
   where k not in ('definition', 'version', 'params', 'name', 'tasks', 'notify') limit 1;
  if bad is not null then
    return format('has the unknown key %L (expected tasks, name, params and notify, or definition, version and params)', bad);
  end if;
  if jsonb_typeof(p_body -> 'params') not in ('object', 'null') then
    return format('params must be an object of names and values, not %s',
                  left((p_body -> 'params')::text, 200));
  end if;
  if p_body ? 'definition' then
    if p_body ?| array['tasks', 'name', 'notify'] then
      return 'names a stored definition and also lists tasks, a name or notify; a sub-workflow is one or the other';
    end if;
    if jsonb_typeof(p_body -> 'definition') is distinct from 'string' then
      return format('definition must be the name of a stored workflow definition, not %s',
                    left((p_body -> 'definition')::text, 200));
    end if;
    if jsonb_typeof(p_body -> 'version') not in ('number', 'null')
       or (jsonb_typeof(p_body -> 'version') = 'number'
           and ((p_body ->> 'version') !~ '^[0-9]{1,9}$' or (p_body ->> 'version')::integer < 1)) then
      return format('version must be a whole number from 1, not %s',
                    left((p_body -> 'version')::text, 200));
    end if;
    if not exists (select 1 from sked.workflow_definitions d
                    where d.owner = p_owner and d.name = p_body ->> 'definition'
                      and (jsonb_typeof(p_body -> 'version') is distinct from 'number'
                           or d.version = (p_body ->> 'version')::integer)) then
      return format('%s has no workflow definition %L%s', p_owner, p_body ->> 'definition',
                    case when jsonb_typeof(p_body -> 'version') = 'number'
                         then format(' of version %s', p_body ->> 'version') else '' end);
    end if;
    return null;
  end if;
  if not p_body ? 'tasks' then
    return 'lists no tasks and names no definition: {"tasks": [...]} or {"definition": "<name>"}';
  end if;
  begin
    perform sked.workflow_submit_from(p_body, p_owner, null::uuid, p_now);
    raise exception using errcode = 'SKD00';
  exception
    when sqlstate 'SKD00' then
      return null; -- valid; the trial workflow is rolled back
    when check_violation or invalid_parameter_value or not_null_violation
         or numeric_value_out_of_range or invalid_text_representation
         or string_data_right_truncation or datetime_field_overflow
         or invalid_datetime_format then
      return regexp_replace(sqlerrm, '^workflow: ', '');
  end;
end
$$;

-- May the caller start the sub-workflow tasks of `p_owner`? Those it may read
-- (sked.caller_may_read), and a worker, whose finishes release them.
create or replace function sked.caller_may_start(p_owner text) returns boolean
language plpgsql stable as $$
begin
  return sked.caller_may_read(p_owner)
      or pg_has_role(coalesce(nullif(current_setting('role', true), 'none'), session_user),
                     'sked_worker', 'usage');
end
$$;

-- Starts the sub-workflows of the tasks `p_ids` that were just released (kind workflow,
-- state waiting): each in a subtransaction of its own, so that one that cannot start (its
-- definition gone, nested too deep, a parameter it cannot fill) fails its own task alone,
-- saying why. A task whose latest sub-workflow failed or was cancelled runs it again from
-- where it failed instead. Returns the tasks that ended at once (the caller settles them).
-- Runs as the owner of the schema, for the submissions at the start of a workflow as for the
-- releases by a finish; it starts only tasks the caller may read (sked.caller_may_read).
create or replace function sked.subworkflows_start(p_ids uuid[], p_now timestamptz)
returns uuid[]
language plpgsql as $$
declare
  r record;
  prior sked.workflows;
  body jsonb;
  params jsonb;
  wf uuid;
  ended uuid[] := '{}';
begin
  for r in
    select t.id, t.owner, t.name, t.subworkflow, t.workflow_id
      from sked.tasks t
     where t.id = any(p_ids) and t.kind = 'workflow' and t.state = 'waiting'
       and sked.caller_may_start(t.owner)
     order by t.id
     for update
  loop
    begin
      select * into prior from sked.workflows w
       where w.parent_task_id = r.id and w.owner = r.owner order by w.id desc limit 1;
      -- The task waits first: a sub-workflow that ends within this call ends it.
      -- (A blocked task keeps an attempt left: max_attempts means nothing to it otherwise.)
      update sked.tasks t
         set state = 'blocked', attempt = t.attempt + 1, started_at = p_now, error = null,
             output = null, max_attempts = greatest(t.max_attempts, t.attempt + 2)
       where t.id = r.id;
      if prior.id is not null and prior.state in ('failed', 'cancelled')
         and coalesce(sked.workflow_retry(prior.id, p_now), 0) > 0 then
        null; -- runs again from where it failed
      else
        if sked.workflow_depth(r.workflow_id) + 1 > sked.subworkflow_max_depth() then
          raise exception 'it would nest sub-workflows deeper than % levels',
            sked.subworkflow_max_depth() using errcode = 'SKD01';
        end if;
        -- String parameters may use the parameters of the task's own workflow.
        params := (select jsonb_object_agg(p.key,
                            case when jsonb_typeof(p.value) = 'string'
                                 then to_jsonb(sked.params_fill(p.value #>> '{}',
                                                                coalesce(w.params, '{}')))
                                 else p.value end)
                     from sked.workflows w, jsonb_each(r.subworkflow -> 'params') p
                    where w.id = r.workflow_id and jsonb_typeof(r.subworkflow -> 'params') = 'object');
        body := r.subworkflow - 'params';
        -- The new workflow row names the task (sked.workflow_submit_from reads the setting
        -- once, at its insert, and clears it; an error rolls it back with the rest).
        perform set_config('sked.subworkflow_of', r.id::text, true);
        if body ? 'definition' then
          wf := sked.workflow_run(body ->> 'definition', (body ->> 'version')::integer, params,
                                  r.owner, p_now);
        else
          wf := sked.workflow_submit_from(
                  body || jsonb_build_object('name', coalesce(body ->> 'name', r.name))
                       || case when params is not null then jsonb_build_object('params', params)
                               else '{}' end,
                  r.owner, null::uuid, p_now);
        end if;
      end if;
    exception
      when deadlock_detected or serialization_failure or lock_not_available then
        raise; -- transient: the caller's transaction is tried again
      when others then
        update sked.tasks t
           set state = 'failed', attempt = t.attempt + 1, started_at = p_now,
               finished_at = p_now, max_attempts = greatest(t.max_attempts, t.attempt + 1),
               error = 'its sub-workflow could not start: '
                       || regexp_replace(sqlerrm, '^(workflow|workflow definition): ', '')
         where t.id = r.id;
        ended := ended || r.id;
    end;
  end loop;
  return ended;
end
$$;

-- sked.subworkflows_start for the tasks of a workflow just submitted that have no parents,
-- which settles those that ended at once (sked.workflow_submit_from calls it, with the
-- submitter's rights; this runs as the owner of the schema).
create or replace function sked.subworkflows_submitted(p_ids uuid[], p_now timestamptz)
returns void
language plpgsql as $$
begin
  perform sked.tasks_settle_notifying(sked.subworkflows_start(p_ids, p_now), p_now);
end
$$;

-- sked.tasks_settle of the tasks `p_ids` (none: nothing), and one notification of the
-- queues that got claimable tasks.
create or replace function sked.tasks_settle_notifying(p_ids uuid[], p_now timestamptz)
returns void
language plpgsql as $$
declare
  queues text;
begin
  if cardinality(p_ids) > 0 then
    queues := sked.tasks_settle(p_ids, p_now);
    if queues is not null then
      perform pg_notify('sked_tasks', left(queues, 7000));
    end if;
  end if;
end
$$;

-- The output of a workflow that succeeded, for the task that ran it: its last tasks' outputs
-- (those no task depends on), by name.
create or replace function sked.workflow_leaves_output(p_id uuid) returns jsonb
language sql stable as $$
  select coalesce(jsonb_object_agg(t.name, t.output), '{}'::jsonb)
    from sked.tasks t
   where t.workflow_id = p_id and t.children = 0 and t.shard_of is null
     and t.state = 'succeeded'
$$;

-- The workflows `p_ids` have just ended: each that is the latest sub-workflow of a task that
-- waits for it (and belongs to the same owner) ends that task in its own state, and the
-- task is settled. Called by sked.workflows_settle.
create or replace function sked.subworkflows_end(p_ids uuid[], p_now timestamptz)
returns void
language plpgsql as $$
declare
  ids uuid[];
begin
  with ended as (
    update sked.tasks t
       set state = w.state, finished_at = p_now,
           output = case when w.state = 'succeeded' then sked.workflow_leaves_output(w.id) end,
           error = case w.state
             when 'succeeded' then null
             when 'cancelled' then format('its sub-workflow %s was cancelled', w.id)
             else format('its sub-workflow %s failed%s', w.id,
                         (select format(': task %L %s%s', f.name, f.state,
                                        coalesce(': ' || left(f.error, 500), ''))
                            from sked.tasks f
                           where f.workflow_id = w.id and f.state in ('failed', 'upstream_failed')
                           order by f.state = 'upstream_failed', f.finished_at, f.id limit 1))
           end
      from sked.workflows w
     where w.id = any(p_ids) and w.parent_task_id is not null and w.state <> 'running'
       and t.id = w.parent_task_id and t.owner = w.owner and t.kind = 'workflow'
       and t.state = 'blocked'
       and w.id = (select x.id from sked.workflows x
                    where x.parent_task_id = t.id and x.owner = t.owner
                    order by x.id desc limit 1)
    returning t.id
  )
  select array_agg(e.id) into ids from ended e;
  perform sked.tasks_settle_notifying(ids, p_now);
end
$$;

-- The tasks `p_ids` were cancelled: their sub-workflows that still run are cancelled too.
create or replace function sked.subworkflows_cancel(p_ids uuid[], p_now timestamptz)
returns void
language plpgsql as $$
declare
  wf uuid;
begin
  for wf in select w.id from sked.workflows w join sked.tasks t on t.id = w.parent_task_id
             where w.parent_task_id = any(p_ids) and w.owner = t.owner and w.state = 'running'
             order by w.id
  loop
    perform sked.workflow_cancel(wf, p_now);
  end loop;
end
$$;

-- Raises check_violation for a broken spawn rule, naming it as the constraint.
create or replace function sked.spawn_rule_raise(rule text, says text) returns void
language plpgsql as $$
begin
  raise exception 'spawn: %', says
    using errcode = 'check_violation', constraint = rule, table = 'tasks', schema = 'sked';
end
$$;

-- Spawn (docs/workflows.md, "Spawning from a running task"): attempt `p_attempt` of the
-- running task `p_task` adds to its own workflow a task of kind workflow that depends on it,
-- whose sub-workflow is `p_body` without its `name` and `wait` (as a sub-workflow task's
-- `workflow`): the spawned tasks run once the spawning task succeeds. With `wait` (the
-- default) the spawning task's children that have not been decided also wait for it, so a
-- join after the spawning task runs after its spawned tasks. `name` defaults to the
-- spawning task's name followed by ".spawned"; a name the workflow has already is refused,
-- unless it names a task this task spawned that has not started, whose body is then replaced
-- (an attempt that failed spawned it, and the next one spawns again). The attempt must be
-- the task's current one, running, with its lease unexpired: checked on the task's row,
-- locked until the transaction ends, so that no finish, rescue or retry passes it; else
-- insufficient_privilege. Returns the spawned task's id.
create or replace function sked.task_spawn(
  p_task uuid, p_attempt integer, p_body jsonb, p_now timestamptz default now())
returns uuid
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  p sked.tasks;
  spawned sked.tasks;
  body jsonb;
  spawned_name text;
  wait boolean;
  problem text;
  made sked.tasks[];
  id_ uuid;
  waiting integer;
begin
  select * into p from sked.tasks t where t.id = p_task for no key update;
  if not found or p.attempt is distinct from p_attempt or p.state <> 'running'
     or p.lease_expires_at <= p_now then
    raise exception 'spawn: attempt % of task % is not running any more (%); a task''s token spawns only while its attempt holds its lease',
      p_attempt, p_task,
      case when not found then 'no such task'
           else format('the task is %s at attempt %s', p.state, p.attempt) end
      using errcode = 'insufficient_privilege', constraint = 'tasks_spawn_needs_its_running_attempt',
            table = 'tasks', schema = 'sked';
  end if;
  if p.workflow_id is null then
    perform sked.spawn_rule_raise('tasks_spawn_needs_a_workflow',
      format('task %s is not part of a workflow; a task spawns into its own workflow only', p.id));
  end if;
  if p.shard_of is not null then
    perform sked.spawn_rule_raise('tasks_spawn_is_not_for_shards',
      format('task %s is a shard (or a map''s instance); its parent''s children are those of the whole sharded task', p.id));
  end if;
  if jsonb_typeof(p_body) is distinct from 'object' then
    perform sked.spawn_rule_raise('tasks_spawn_body_must_be_an_object',
      format('a spawn is an object {"tasks": [...]} or {"definition": "<name>"}, with an optional "name" and "wait", not %s',
             left(coalesce(p_body::text, 'null'), 200)));
  end if;
  if jsonb_typeof(p_body -> 'wait') not in ('boolean', 'null') then
    perform sked.spawn_rule_raise('tasks_spawn_wait_must_be_a_boolean',
      format('wait must be true or false, not %s', left((p_body -> 'wait')::text, 200)));
  end if;
  wait := coalesce((p_body ->> 'wait')::boolean, true);
  if jsonb_typeof(p_body -> 'name') not in ('string', 'null') or p_body ->> 'name' = '' then
    perform sked.spawn_rule_raise('tasks_spawn_name_must_be_a_name',
      format('name must be a non-empty string, not %s', left((p_body -> 'name')::text, 200)));
  end if;
  spawned_name := coalesce(p_body ->> 'name', coalesce(p.name, p.id::text) || '.spawned');
  -- A spawned task's own body: the sub-workflow's tasks go by the task's name.
  body := p_body - 'name' - 'wait';
  if body ? 'tasks' then
    body := body || jsonb_build_object('name', spawned_name);
  end if;
  problem := sked.subworkflow_error(body, p.owner, p_now);
  if problem is not null then
    perform sked.spawn_rule_raise('workflows_subworkflow_must_be_valid',
      format('the spawned sub-workflow: %s', problem));
  end if;

  select * into spawned from sked.tasks t
   where t.workflow_id = p.workflow_id and t.name = spawned_name for update;
  if found then
    if spawned.kind = 'workflow' and spawned.state = 'blocked' and spawned.attempt = 0
       and exists (select 1 from sked.task_edges e
                    where e.task_id = spawned.id and e.depends_on = p.id) then
      update sked.tasks t set subworkflow = body where t.id = spawned.id;
      return spawned.id;
    end if;
    perform sked.spawn_rule_raise('tasks_spawn_name_must_be_new',
      format('the workflow already has a task named %L; give the spawn another "name"',
             spawned_name));
  end if;

  made := sked.tasks_from_json(jsonb_build_array(jsonb_build_object('kind', 'workflow')),
                               p.owner, p_now);
  id_ := sked.uuid_v7();
  made := array[sked.task_placed(made[1],
            id => id_, state => 'blocked', created_at => p_now, workflow_id => p.workflow_id,
            name => spawned_name, trigger_rule => 'all_success', parents => 1, children => 0,
            parents_pending => 1, branch => false, map_over => null, map_max => null,
            map_trigger_rule => null, subworkflow => body)];
  perform sked.tasks_insert(made);
  insert into sked.task_edges (task_id, depends_on) values (id_, p.id);
  update sked.tasks t set children = t.children + 1 where t.id = p.id;
  if wait then
    -- The spawning task's undecided children wait for the spawned task too. Locked in id
    -- order after the spawning task, as its finish locks them.
    with kids as (
      select c.id from sked.tasks c
       where c.id in (select e.task_id from sked.task_edges e where e.depends_on = p.id)
         and c.id <> id_ and c.state = 'blocked'
       order by c.id
       for update
    ), edges as (
      insert into sked.task_edges (task_id, depends_on)
      select k.id, id_ from kids k
    ), raised as (
      update sked.tasks c set parents = c.parents + 1, parents_pending = c.parents_pending + 1
        from kids k where c.id = k.id
      returning c.id
    )
    select count(*)::integer into waiting from raised;
    update sked.tasks t set children = waiting where t.id = id_;
  end if;
  return id_;
end
$$;
