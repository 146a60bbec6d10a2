-- The workflow functions of the SQL contract: DAG submission, release of children, outputs,
-- workflow cancel and re-run. See docs/workflows.md.
--
-- The release mechanism is general: any task with rows in sked.task_edges waits in `blocked`
-- until its parents are done, whatever workflow (if any) the tasks belong to. Every function
-- that moves a task with children or a workflow into a final state calls sked.tasks_settle
-- in the same transaction, which releases children level by level (one set-based statement
-- per level of the DAG, never one per task) and settles the workflows involved.

-- What a blocked task becomes, from its trigger rule and its parents:
--   pending  parents not finished yet;
--   failed   some parent ended failed, cancelled or upstream_failed;
--   skipped  some parent ended skipped.
--   all_success  runs when every parent succeeded; upstream_failed as soon as one failed,
--                skipped as soon as one was skipped (a failure wins in the same batch).
--   all_done     runs when every parent is finished, however it ended.
--   one_failed   runs as soon as one parent failed; skipped when all finished and none did.
--   none_failed  runs when every parent is finished and none failed (skipped ones count as
--                done: the join after a branch); upstream_failed as soon as one failed.
--   shards       the parent of a sharded task (docs/shards.md), whose parents are its
--                shards: as all_success, but it runs nothing, so it succeeds instead of
--                running when every shard succeeded.
--   map_all_done a map whose instances may fail (map_trigger_rule all_done; see "Maps" in
--                sql/shards.sql): as all_done, but it succeeds instead of running.
-- Returns 'blocked' while the rule cannot be decided yet.
create or replace function sked.task_trigger_state(
  trigger_rule text, pending integer, failed boolean, skipped boolean)
returns text
language sql immutable parallel safe as $$
  select case trigger_rule
    when 'all_success' then
      case when failed then 'upstream_failed' when skipped then 'skipped'
           when pending > 0 then 'blocked' else 'waiting' end
    when 'all_done' then
      case when pending > 0 then 'blocked' else 'waiting' end
    when 'one_failed' then
      case when failed then 'waiting' when pending > 0 then 'blocked' else 'skipped' end
    when 'none_failed' then
      case when failed then 'upstream_failed' when pending > 0 then 'blocked' else 'waiting' end
    when 'shards' then
      case when failed then 'upstream_failed' when skipped then 'skipped'
           when pending > 0 then 'blocked' else 'succeeded' end
    when 'map_all_done' then
      case when pending > 0 then 'blocked' else 'succeeded' end
  end
$$;

-- The error a task gets when its trigger rule ends it without running.
create or replace function sked.task_trigger_error(state text, trigger_rule text) returns text
language sql immutable parallel safe as $$
  select case state
    when 'upstream_failed' then 'not run: a task it depends on failed or was cancelled'
    when 'skipped' then
      case trigger_rule
        when 'one_failed' then 'skipped: no task it depends on failed (trigger rule one_failed)'
        when 'shards' then 'skipped: its shards were skipped'
        else 'skipped: a task it depends on was skipped' end
  end
$$;

-- Branches (docs/workflows.md, "Branches"). A task submitted with `branch: true` chooses by
-- its output which of its direct children run: {"next": ["name", ...]} (or one name as a
-- string). When it succeeds, a child it did not choose ends `skipped` whatever its trigger
-- rule, and the skip propagates by the rules. An output that does not name its children
-- fails the attempt (sked.tasks_finish), saying why.

-- The names a branch's output chooses; null when the output is not of that shape.
create or replace function sked.branch_next(output jsonb) returns text[]
language sql immutable parallel safe as $$
  select case
    when jsonb_typeof(output) is distinct from 'object' then null
    when jsonb_typeof(output -> 'next') = 'string' then array[output ->> 'next']
    when jsonb_typeof(output -> 'next') = 'array'
         and not exists (select 1 from jsonb_array_elements(output -> 'next') n
                          where jsonb_typeof(n) <> 'string')
      then array(select jsonb_array_elements_text(output -> 'next'))
  end
$$;

-- Did the branch `p_branch` choose its child `p_child`? Asked by id, so that the statements
-- that ask it for the edges of a branch do not carry the parents' outputs along every edge.
drop function if exists sked.branch_chose(jsonb, uuid);
create or replace function sked.branch_chose(p_branch uuid, p_child uuid) returns boolean
language sql stable as $$
  select coalesce((select c.name from sked.tasks c where c.id = p_child)
                  = any (sked.branch_next((select b.output from sked.tasks b where b.id = p_branch))),
                  false)
$$;

-- Why the output of branch `p_id` cannot be taken (null when it can): it must be an object
-- whose `next` names direct children of the branch.
create or replace function sked.branch_output_error(p_id uuid, output jsonb) returns text
language sql stable as $$
  with children as (
    select c.name from sked.task_edges e join sked.tasks c on c.id = e.task_id
     where e.depends_on = p_id
  )
  select case
    when sked.branch_next(output) is null then
      format('a branch''s output must be {"next": [names of the tasks that depend on it]}, not %s',
             left(coalesce(output::text, 'null'), 200))
    else (select format('the branch chose %L, which does not depend on it (the tasks that do: %s)',
                        n, (select string_agg(format('%L', c.name), ', ' order by c.name)
                              from children c))
            from unnest(sked.branch_next(output)) n
           where not exists (select 1 from children c where c.name = n)
           limit 1)
  end
$$;

-- What a blocked task becomes (sked.task_trigger_state), when `unchosen_by` (the name of a
-- branch parent that did not choose it, or null) may end it `skipped` first.
create or replace function sked.task_child_state(
  trigger_rule text, pending integer, failed boolean, skipped boolean, unchosen_by text)
returns text
language sql immutable parallel safe as $$
  select case when unchosen_by is not null then 'skipped'
              else sked.task_trigger_state(trigger_rule, pending, failed, skipped) end
$$;

-- The error of a task that sked.task_child_state ended without running. (Immutable
-- functions only, so that it is inlined into the statements that set it on thousands of rows:
-- format() is stable.)
create or replace function sked.task_child_error(state text, trigger_rule text, unchosen_by text)
returns text
language sql immutable parallel safe as $$
  select case when unchosen_by is not null
              then 'skipped: the branch ' || quote_literal(unchosen_by) || ' did not choose it'
              else sked.task_trigger_error(state, trigger_rule) end
$$;

-- The outputs of a task's parents as one JSON object: parent name (its id when it has no
-- name) -> output (null when it wrote none). The worker hands it to the task.
-- Volatile, so that it reads with a snapshot of its own: the claim calls it beside
-- sked.tasks_claim, whose statements see parents that finished after the claim's statement
-- began (and the children they released); a stable function would read those parents as the
-- statement's snapshot has them, without their outputs.
create or replace function sked.task_parent_outputs(p_id uuid) returns jsonb
language sql volatile as $$
  select coalesce(jsonb_object_agg(coalesce(p.name, p.id::text), p.output), '{}'::jsonb)
    from sked.task_edges e join sked.tasks p on p.id = e.depends_on
   where e.task_id = p_id
$$;

-- Tasks `p_ids` have just reached a final state: release or end their blocked children,
-- then their children's children, level by level, and settle the workflows involved. A
-- parent of shards that is released succeeds at once with its shards' outputs, and one that
-- ends upstream_failed names the shard that failed. Called
-- by every function that finishes such tasks, in the same transaction. Returns the queues
-- that got claimable tasks (comma-separated, or null): the caller includes them in its one
-- notification.
create or replace function sked.tasks_settle(p_ids uuid[], p_now timestamptz default now())
returns text
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  done uuid[] := p_ids;
  workflows uuid[];
  level_workflows uuid[];
  level_queues text;
  queues text;
  succeeded uuid[];
  maps uuid[];
  subs uuid[];
begin
  select array_agg(distinct t.workflow_id) into workflows
    from sked.tasks t where t.id = any(p_ids) and t.workflow_id is not null;
  while cardinality(done) > 0 loop
    with finished as (
      select t.id, t.state, t.shard_index, t.shard_total, t.error, t.branch, t.name
        from sked.tasks t where t.id = any(done) and t.children > 0
    ), per_child as (
      select e.task_id as id, count(*)::integer as n,
             bool_or(f.state in ('failed', 'cancelled', 'upstream_failed')) as failed,
             bool_or(f.state = 'skipped') as skipped,
             min(f.name) filter (where f.branch and f.state = 'succeeded'
                                   and not sked.branch_chose(f.id, e.task_id)) as unchosen_by,
             (array_agg(format('shard %s of %s %s: %s', f.shard_index, f.shard_total, f.state, f.error)
                        order by f.shard_index)
                filter (where f.shard_index is not null
                          and f.state in ('failed', 'cancelled', 'upstream_failed')))[1] as failed_shard
        from finished f join sked.task_edges e on e.depends_on = f.id
       group by e.task_id
    ), locked as (
      -- Children are locked in id order, so that two finishes sharing children never
      -- deadlock; a child's counter is then decremented on its latest version.
      select t.id from sked.tasks t
       where t.id in (select c.id from per_child c) and t.state = 'blocked'
       order by t.id
       for update
    ), changed as (
      update sked.tasks t
         set parents_pending = t.parents_pending - c.n,
             state = sked.task_child_state(t.trigger_rule, t.parents_pending - c.n, c.failed,
                                           c.skipped, c.unchosen_by),
             finished_at = case when sked.task_child_state(t.trigger_rule, t.parents_pending - c.n,
                                                           c.failed, c.skipped, c.unchosen_by)
                                     not in ('blocked', 'waiting') then p_now end,
             next_run_at = greatest(t.next_run_at, p_now),
             error = coalesce(case when t.trigger_rule = 'shards' then c.failed_shard end,
                              sked.task_child_error(
                       sked.task_child_state(t.trigger_rule, t.parents_pending - c.n, c.failed,
                                             c.skipped, c.unchosen_by),
                       t.trigger_rule, c.unchosen_by))
        from per_child c join locked l on l.id = c.id
       where t.id = c.id and t.state = 'blocked'
      returning t.id, t.state, t.queue, t.workflow_id, t.map_over, t.shard_of, t.kind
    )
    select array_agg(d.id) filter (where d.state not in ('blocked', 'waiting')),
           string_agg(distinct d.queue, ',') filter (where d.state = 'waiting'),
           array_agg(distinct d.workflow_id) filter (where d.workflow_id is not null
                                                      and d.state not in ('blocked', 'waiting')),
           array_agg(d.id) filter (where d.state = 'succeeded'),
           array_agg(d.id) filter (where d.state = 'waiting' and d.map_over is not null
                                     and d.shard_of is null),
           array_agg(d.id) filter (where d.state = 'waiting' and d.kind = 'workflow')
      into done, level_queues, level_workflows, succeeded, maps, subs
      from changed d;
    -- Maps released here expand into their instances (sql/shards.sql, "Maps"); those that
    -- end at once (no element, or an array that cannot be taken) settle with this level.
    if maps is not null then
      maps := sked.maps_expand(maps, p_now);
      done := array_cat(done, maps);
      level_workflows := array_cat(level_workflows, array(
        select t.workflow_id from sked.tasks t
         where t.id = any(maps) and t.workflow_id is not null));
    end if;
    -- Sub-workflow tasks released here start their sub-workflows (sql/subworkflows.sql);
    -- those that cannot start fail and settle with this level.
    if subs is not null then
      subs := sked.subworkflows_start(subs, p_now);
      done := array_cat(done, subs);
      level_workflows := array_cat(level_workflows, array(
        select t.workflow_id from sked.tasks t where t.id = any(subs)));
    end if;
    -- Parents of shards that succeeded take their shards' outputs. Read by a later statement
    -- than the one that locked them: its snapshot includes the outputs of shards finished by
    -- transactions that committed while this one waited for the lock.
    if succeeded is not null then
      update sked.tasks t set output = sked.shards_output(t.id) where t.id = any(succeeded);
    end if;
    queues := concat_ws(',', queues, level_queues);
    workflows := array_cat(workflows, level_workflows);
  end loop;
  perform sked.workflows_settle(workflows, p_now);
  return nullif(queues, '');
end
$$;

-- Workflows among `p_ids` whose tasks are all finished get their final state: cancelled when
-- a task was cancelled, else failed when a task failed or could not run, else succeeded.
-- The rows are locked first and the tasks read by a later statement, so that of two
-- transactions finishing a workflow's last tasks at once the second sees the first's.
create or replace function sked.workflows_settle(p_ids uuid[], p_now timestamptz default now())
returns void
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  subs uuid[];
begin
  if coalesce(cardinality(p_ids), 0) = 0 then
    return;
  end if;
  perform 1 from sked.workflows w
   where w.id = any(p_ids) and w.state = 'running'
   order by w.id
   for update;
  with ended as (
  update sked.workflows w
     set finished_at = p_now,
         state = case
           when exists (select 1 from sked.tasks t where t.workflow_id = w.id and t.state = 'cancelled')
             then 'cancelled'
           when exists (select 1 from sked.tasks t
                         where t.workflow_id = w.id and t.state in ('failed', 'upstream_failed'))
             then 'failed'
           else 'succeeded' end
   where w.id = any(p_ids) and w.state = 'running'
     and not exists (select 1 from sked.tasks t
                      where t.workflow_id = w.id and sked.state_is_unfinished(t.state))
  returning w.id, w.parent_task_id
  )
  select array_agg(e.id) filter (where e.parent_task_id is not null) into subs from ended e;
  -- A sub-workflow that ended ends the task that ran it (sql/subworkflows.sql).
  if subs is not null then
    perform sked.subworkflows_end(subs, p_now);
  end if;
end
$$;

-- Run tasks `p_ids` again (the caller has checked and locked them: they are finished), with
-- their descendants that ended upstream_failed or skipped. Each of them gets the state its
-- trigger rule gives with the parents as they are now, counting the tasks run again as
-- pending: `waiting` (no parents, or all done), `blocked`, or at once upstream_failed or
-- skipped when a parent outside the re-run still decides so. Attempt numbers keep growing
-- (max_attempts is raised to allow one more) and a successful attempt is moved to the
-- history first (a parent of shards never ran and has none). Their workflows run again.
-- Returns the queues that got claimable tasks.
--
-- Lock order. The parents of the tasks run again are locked (FOR SHARE, in id order) before
-- they are counted and before any task or workflow is changed. A parent's finish locks the
-- parent, then its blocked children, then its workflow; its settle passes over a child that
-- is not blocked yet. Without the lock, a parent finishing while this function ran was
-- counted as pending by one side and its finish missed by the other, and the child stayed
-- blocked for ever. With it, the count waits for a finish in flight and reads its result,
-- and a finish that comes later waits for this transaction and then finds the child blocked.
-- Callers lock nothing a finish waits for before calling (the finished tasks they re-run,
-- never a workflow row). Should a finish of several of these parents in one batch lock them
-- in the other order, PostgreSQL ends one side with a deadlock error, which is transient:
-- the worker writes its batch again.
create or replace function sked.tasks_rerun(p_ids uuid[], p_now timestamptz default now())
returns text
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  ids uuid[];
  ended uuid[];
  queues text;
  more text;
  maps uuid[];
  subs uuid[];
begin
  with recursive closure (id) as (
    select unnest(p_ids)
    union
    select e.task_id
      from closure c
      join sked.task_edges e on e.depends_on = c.id
      join sked.tasks t on t.id = e.task_id
     where t.state in ('upstream_failed', 'skipped')
  )
  select array_agg(c.id order by c.id) into ids from closure c;

  -- By primary key, from the array of parents: a semi-join was planned (generic plan) as a
  -- walk of every task probing its edges, 4 ms a retry with 3,000 tasks in the table.
  perform 1 from sked.tasks p
   where p.id = any (array(select e.depends_on from sked.task_edges e where e.task_id = any(ids)))
   order by p.id
   for share;

  insert into sked.task_attempts (task_id, attempt, worker_id, started_at, finished_at, outcome,
                                  exit_code, error, stdout_tail, stderr_tail)
  select t.id, t.attempt, t.worker_id, t.started_at, t.finished_at, 'succeeded', t.exit_code,
         t.error, t.stdout_tail, t.stderr_tail
    from sked.tasks t
   where t.id = any(ids) and t.state = 'succeeded' and t.attempt > 0
  on conflict do nothing;

  update sked.workflows w set state = 'running', finished_at = null
   where w.id in (select t.workflow_id from sked.tasks t where t.id = any(ids))
     and w.state <> 'running';

  with parents as (
    select r.id,
           count(p.id) filter (where p.id = any(ids)
                                  or sked.state_is_unfinished(p.state))::integer as pending,
           coalesce(bool_or(p.state in ('failed', 'cancelled', 'upstream_failed')
                            and not p.id = any(ids)), false) as failed,
           coalesce(bool_or(p.state = 'skipped' and not p.id = any(ids)), false) as skipped,
           -- `is true`: a task without parents has no p, and a null would not stop the AND
           -- before it asks sked.branch_chose.
           min(p.name) filter (where p.branch is true and p.state = 'succeeded'
                                 and not p.id = any(ids)
                                 and not sked.branch_chose(p.id, r.id)) as unchosen_by
      from unnest(ids) as r(id)
      left join sked.task_edges e on e.task_id = r.id
      left join sked.tasks p on p.id = e.depends_on
     group by r.id
  ), changed as (
    update sked.tasks t
       set state = sked.task_child_state(t.trigger_rule, p.pending, p.failed, p.skipped,
                                         p.unchosen_by),
           parents_pending = p.pending,
           finished_at = case when sked.task_child_state(t.trigger_rule, p.pending, p.failed,
                                                         p.skipped, p.unchosen_by)
                                   not in ('blocked', 'waiting') then p_now end,
           next_run_at = p_now, cancel_requested_at = null, lease_expires_at = null,
           max_attempts = greatest(t.max_attempts, t.attempt + 1),
           exit_code = null, stdout_tail = null, stderr_tail = null, output_sha256 = null,
           output = case when sked.task_child_state(t.trigger_rule, p.pending, p.failed,
                                                    p.skipped, p.unchosen_by)
                              = 'succeeded' then sked.shards_output(t.id) end,
           error = sked.task_child_error(
                     sked.task_child_state(t.trigger_rule, p.pending, p.failed, p.skipped,
                                           p.unchosen_by),
                     t.trigger_rule, p.unchosen_by)
      from parents p
     where t.id = p.id
       and t.state in ('succeeded', 'failed', 'cancelled', 'upstream_failed', 'skipped')
    returning t.id, t.state, t.queue, t.map_over, t.shard_of, t.kind
  )
  select array_agg(d.id) filter (where d.state not in ('blocked', 'waiting')),
         string_agg(distinct d.queue, ',') filter (where d.state = 'waiting'),
         array_agg(d.id) filter (where d.state = 'waiting' and d.map_over is not null
                                   and d.shard_of is null),
         array_agg(d.id) filter (where d.state = 'waiting' and d.kind = 'workflow')
    into ended, queues, maps, subs
    from changed d;
  -- A map that has not expanded and runs again expands now, its parents being done.
  if maps is not null then
    ended := array_cat(ended, sked.maps_expand(maps, p_now));
  end if;
  -- A sub-workflow task runs its sub-workflow again: from where it failed, when it failed
  -- or was cancelled (sql/subworkflows.sql).
  if subs is not null then
    ended := array_cat(ended, sked.subworkflows_start(subs, p_now));
  end if;
  if ended is not null then
    more := sked.tasks_settle(ended, p_now);
    queues := concat_ws(',', queues, more);
  end if;
  return nullif(queues, '');
end
$$;

-- The keys of a workflow's task: the fields of a task (sked.task_fields()) but an
-- idempotency key (a workflow is submitted once, whole) and those of a service (which never
-- finishes, so its children would never run), and its place: name, depends_on, trigger_rule,
-- branch, for a map map_over, map_max and map_trigger_rule, and for a sub-workflow task its
-- workflow (sql/subworkflows.sql).
create or replace function sked.workflow_task_keys() returns text[]
language sql immutable parallel safe as $$
  select array(select f from unnest(sked.task_fields()) f
                where f not in ('idempotency_key', 'replicas', 'restart_policy', 'health_check'))
         || array['name', 'depends_on', 'trigger_rule', 'branch', 'map_over', 'map_max',
                  'map_trigger_rule', 'workflow']
$$;

-- Parameters (docs/workflows.md, "Parameters"). A workflow's `params` object (kept once, on
-- its row) is given by the worker to each of its commands in the environment variable
-- SKED_PARAMS (as JSON; sked.workflow_params, beside the claim), and a placeholder
-- {{ params.NAME }} in an element of a task's `command` or `args` is replaced by the value
-- (a string as it is, any other JSON value as JSON), in that element only: never through a
-- shell, and a value that holds a placeholder is not read again.

-- The pattern of a placeholder; its group is the parameter's name.
create or replace function sked.params_placeholder() returns text
language sql immutable parallel safe as $$
  select '\{\{\s*params\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}'
$$;

-- The names of the parameters that the placeholders of `s` use, in order.
create or replace function sked.params_used(s text) returns text[]
language sql immutable parallel safe as $$
  select array(select m[1] from regexp_matches(s, sked.params_placeholder(), 'g') as m)
$$;

-- `s` with each placeholder replaced by its parameter's value from `params` (every name
-- used is one of `params`: sked.workflow_submit checked), in one pass.
create or replace function sked.params_fill(s text, params jsonb) returns text
language sql immutable parallel safe as $$
  select case when s !~ sked.params_placeholder() then s else
    (select string_agg(p.piece || coalesce(
              (select case jsonb_typeof(v) when 'string' then v #>> '{}' else v::text end
                 from (select params -> (sked.params_used(s))[p.i]) as x(v)), ''),
                       '' order by p.i)
       from unnest(regexp_split_to_array(s, sked.params_placeholder()))
              with ordinality as p(piece, i))
  end
$$;

-- The parameters of workflow `p_id` (null when it has none). Volatile, so that it reads with
-- a snapshot of its own, as sked.task_parent_outputs does: the claim's statements see tasks
-- submitted after the claim's statement began, and a stable function would read their
-- workflow as that statement's snapshot has it, not there yet.
create or replace function sked.workflow_params(p_id uuid) returns jsonb
language sql volatile as $$
  select w.params from sked.workflows w where w.id = p_id
$$;

-- The JSON array `arr` with the placeholders of its strings filled from `params`.
create or replace function sked.params_fill_array(arr jsonb, params jsonb) returns jsonb
language sql immutable parallel safe as $$
  select jsonb_agg(case when jsonb_typeof(e) = 'string'
                        then to_jsonb(sked.params_fill(e #>> '{}', params)) else e end
                   order by i)
    from jsonb_array_elements(arr) with ordinality as a(e, i)
$$;

-- The task `task` (a JSON object of a workflow's spec) with its command's and arguments'
-- placeholders filled from `params`. An empty or missing array is left as it is, for the
-- task's own rules.
create or replace function sked.params_apply(task jsonb, params jsonb) returns jsonb
language sql immutable parallel safe as $$
  select task || coalesce((
    select jsonb_object_agg(k, sked.params_fill_array(task -> k, params))
      from unnest(array['command', 'args']) as k
     where jsonb_typeof(task -> k) = 'array' and jsonb_array_length(task -> k) > 0), '{}')
$$;

-- Submit a workflow: tasks and the edges between them, in one call, all or nothing. `spec`
-- is an object {"name": "...", "tasks": [...]}; each task is an object with the keys of
-- sked.tasks_submit plus `name` (required, unique in the workflow), `depends_on` (names of
-- tasks of this workflow), `trigger_rule` (all_success, the default; all_done;
-- one_failed, alias on_failure; none_failed; for a sharded task, with `shards` or
-- `broadcast`, it applies to its shards: see docs/shards.md) and `branch` (true: its output
-- chooses which of the tasks that depend on it run; see "Branches" above). Tasks without
-- parents are `waiting` at once, the others `blocked`. Unknown keys, a missing or repeated name, a dependency on a task not in the
-- workflow or on itself, and cycles are rejected with check_violation naming the rule, and
-- nothing is inserted. Every task belongs to `owner_`. Returns the workflow's id.
drop function if exists sked.workflow_submit(jsonb, text, timestamptz, uuid);
create or replace function sked.workflow_submit(
  spec jsonb, owner_ text default current_user, p_now timestamptz default now())
returns uuid
language plpgsql as $$
begin
  return sked.workflow_submit_from(spec, owner_, null::uuid, p_now);
end
$$;

-- sked.workflow_submit of a spec that came from the stored definition `p_definition`
-- (sked.workflow_run, sql/definitions.sql), which the workflow names; null for none.
create or replace function sked.workflow_submit_from(
  spec jsonb, owner_ text, p_definition uuid, p_now timestamptz default now())
returns uuid
language plpgsql as $$
declare
  wf uuid := sked.uuid_v7();
  params jsonb;
  n integer;
  bad record;
  visited integer;
  frontier integer[];
  made sked.tasks[];
  ids uuid[];
  sub_names text[];
  sub_bodies jsonb[];
  roots uuid[];
  problem text;
  i integer;
  has_subs boolean;
begin
  if jsonb_typeof(spec) is distinct from 'object'
     or jsonb_typeof(spec -> 'tasks') is distinct from 'array'
     or jsonb_array_length(spec -> 'tasks') = 0 then
    perform sked.workflow_rule_raise('workflows_spec_must_have_tasks',
      'a workflow is an object {"name": ..., "tasks": [...]} with at least one task');
  end if;
  select k into bad from jsonb_object_keys(spec) k
   where k not in ('name', 'tasks', 'notify', 'params') limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_spec_keys_must_be_known',
      format('unknown key %L in the workflow (expected name, tasks, notify and params)', bad.k));
  end if;
  if jsonb_typeof(spec -> 'params') not in ('object', 'null') then
    perform sked.workflow_rule_raise('workflows_params_must_be_an_object',
      format('the workflow''s params must be an object of names and values, not %s',
             left((spec -> 'params')::text, 200)));
  end if;
  params := case when jsonb_typeof(spec -> 'params') = 'object' then spec -> 'params' end;
  if octet_length(params::text) > 65536 then
    perform sked.workflow_rule_raise('workflows_params_must_be_at_most_64_kib',
      format('the workflow''s params take %s bytes as JSON; at most 65536', octet_length(params::text)));
  end if;
  select k into bad from jsonb_object_keys(coalesce(params, '{}')) k
   where k !~ '^[A-Za-z_][A-Za-z0-9_]*$' limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_param_names_must_be_identifiers',
      format('the parameter name %L is not a letter or _ followed by letters, digits and _', bad.k));
  end if;
  -- Every placeholder names a parameter, which its task then gets.
  select t.elem ->> 'name' as task, u.name into bad
    from jsonb_array_elements(spec -> 'tasks') as t(elem)
    cross join lateral (
      select e #>> '{}' as arg from jsonb_array_elements(
        case when jsonb_typeof(t.elem -> 'command') = 'array' then t.elem -> 'command' else '[]' end
        || case when jsonb_typeof(t.elem -> 'args') = 'array' then t.elem -> 'args' else '[]' end) e
       where jsonb_typeof(e) = 'string'
      union all
      -- A sub-workflow's string parameters (sql/subworkflows.sql).
      select p.value #>> '{}' from jsonb_each(
        case when jsonb_typeof(t.elem -> 'workflow' -> 'params') = 'object'
             then t.elem -> 'workflow' -> 'params' end) p
       where jsonb_typeof(p.value) = 'string') a
    cross join lateral unnest(sked.params_used(a.arg)) as u(name)
   where not coalesce(params ? u.name, false)
   limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_placeholders_must_name_parameters',
      format('task %L uses {{ params.%s }}, but the workflow has no parameter %L (its parameters: %s)',
             bad.task, bad.name, bad.name,
             coalesce((select string_agg(format('%L', k), ', ' order by k)
                         from jsonb_object_keys(params) k), 'none')));
  end if;
  if jsonb_typeof(spec -> 'name') not in ('string', 'null') then
    perform sked.workflow_rule_raise('workflows_name_must_be_a_string', 'the workflow name must be a string');
  end if;

  -- One row per task with its position, name, parents' names and rule, checked before
  -- anything is inserted.
  create temp table if not exists workflow_nodes (
    ord integer primary key, name text, named boolean, unknown_key text, depends_on text[],
    depends_on_ok boolean, trigger_rule text, other_owner boolean, branch jsonb,
    sharded boolean, kind text, map_over jsonb, map_max jsonb, map_trigger_rule jsonb,
    map_parent text, subworkflow jsonb, other_keys text, indegree integer not null default 0,
    children integer not null default 0
  ) on commit drop;
  create temp table if not exists workflow_arcs (parent integer, child integer) on commit drop;
  create index if not exists workflow_arcs_by_parent on workflow_arcs (parent);
  -- Emptied by a delete while they are small: a truncate makes new files for them, which
  -- cost a workflow of one task most of its submission, and the tables go at commit anyway.
  if pg_relation_size('workflow_nodes') + pg_relation_size('workflow_arcs') > 1048576 then
    truncate workflow_nodes, workflow_arcs;
  else
    delete from workflow_nodes;
    delete from workflow_arcs;
  end if;
  insert into workflow_nodes (ord, name, named, unknown_key, depends_on, depends_on_ok,
                              trigger_rule, other_owner, branch, sharded, kind, map_over,
                              map_max, map_trigger_rule, subworkflow, other_keys)
  select r.ord, r.elem ->> 'name',
         jsonb_typeof(r.elem) = 'object' and jsonb_typeof(r.elem -> 'name') = 'string'
           and r.elem ->> 'name' <> '',
         case when jsonb_typeof(r.elem) = 'object' then
           (select k from jsonb_object_keys(r.elem) k
             where k <> all (sked.workflow_task_keys())
             limit 1) end,
         case jsonb_typeof(r.elem -> 'depends_on')
           when 'array' then array(select jsonb_array_elements_text(r.elem -> 'depends_on'))
           else '{}' end,
         case jsonb_typeof(r.elem -> 'depends_on')
           when 'array' then not exists (select 1 from jsonb_array_elements(r.elem -> 'depends_on') d
                                          where jsonb_typeof(d) <> 'string')
           when 'null' then true
           else r.elem -> 'depends_on' is null end,
         case coalesce(r.elem ->> 'trigger_rule', 'all_success')
           when 'on_failure' then 'one_failed'
           else coalesce(r.elem ->> 'trigger_rule', 'all_success') end,
         r.elem -> 'owner' is distinct from to_jsonb(owner_) and r.elem ? 'owner',
         coalesce(r.elem -> 'branch', 'false'),
         jsonb_typeof(r.elem -> 'shards') = 'number' or r.elem -> 'broadcast' = 'true',
         coalesce(r.elem ->> 'kind', 'command'),
         nullif(r.elem -> 'map_over', 'null'), nullif(r.elem -> 'map_max', 'null'),
         nullif(r.elem -> 'map_trigger_rule', 'null'), nullif(r.elem -> 'workflow', 'null'),
         case when jsonb_typeof(r.elem) = 'object' and r.elem ? 'workflow' then
           (select string_agg(format('%L', k), ', ' order by k) from jsonb_object_keys(r.elem) k
             where k not in ('name', 'depends_on', 'trigger_rule', 'workflow')) end
    from jsonb_array_elements(spec -> 'tasks') with ordinality as r(elem, ord);
  get diagnostics n = row_count;
  analyze workflow_nodes;
  -- Whether any task runs a sub-workflow: the steps for them are skipped when none does.
  has_subs := exists (select 1 from workflow_nodes w where w.subworkflow is not null);

  select w.ord into bad from workflow_nodes w where w.named is not true order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_tasks_must_have_names',
      format('task %s of the workflow needs a non-empty "name"', bad.ord));
  end if;
  select w.name, w.unknown_key into bad from workflow_nodes w
   where w.unknown_key is not null order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_task_keys_must_be_known',
      format('task %L has the unknown key %L', bad.name, bad.unknown_key));
  end if;
  select w.name into bad from workflow_nodes w group by w.name having count(*) > 1 limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_task_names_must_be_unique',
      format('two tasks of the workflow are named %L', bad.name));
  end if;
  select w.name into bad from workflow_nodes w where w.depends_on_ok is not true order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_depends_on_must_list_task_names',
      format('depends_on of task %L must be a list of task names', bad.name));
  end if;
  select w.name, w.trigger_rule into bad from workflow_nodes w
   where w.trigger_rule not in ('all_success', 'all_done', 'one_failed', 'none_failed')
   order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_trigger_rule_is_known',
      format('task %L has the trigger rule %L (expected all_success, all_done, one_failed or on_failure, or none_failed)',
             bad.name, bad.trigger_rule));
  end if;
  select w.name, w.branch into bad from workflow_nodes w
   where w.branch not in ('true', 'false', 'null') order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_branch_must_be_a_boolean',
      format('branch of task %L must be true or false, not %s', bad.name, bad.branch));
  end if;
  select w.name, w.kind into bad from workflow_nodes w
   where w.branch = 'true' and w.kind <> 'command' order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_branch_must_be_a_command',
      format('task %L is a branch, but a %s task writes no output to choose with', bad.name, bad.kind));
  end if;
  select w.name into bad from workflow_nodes w
   where w.branch = 'true' and w.sharded order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_branch_must_not_be_sharded',
      format('task %L is a branch and sharded; a branch is one task, whose output chooses its children',
             bad.name));
  end if;
  -- Maps (sql/shards.sql, "Maps"): map_over names a task it depends on, the longest name
  -- that map_over is or begins with followed by a dot.
  update workflow_nodes w
     set map_parent = (select d from unnest(w.depends_on) d
                        where w.map_over #>> '{}' = d or starts_with(w.map_over #>> '{}', d || '.')
                        order by length(d) desc limit 1)
   where jsonb_typeof(w.map_over) = 'string';
  select w.name, w.map_over into bad from workflow_nodes w
   where w.map_over is not null and w.map_parent is null order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_map_over_must_name_a_parent',
      case when jsonb_typeof(bad.map_over) <> 'string' then
        format('map_over of task %L must be a string, "<task>" or "<task>.<key>...", naming a task it depends on, not %s',
               bad.name, left(bad.map_over::text, 200))
      else format('task %L maps over %s, which does not begin with the name of a task it depends on (it depends on: %s)',
                  bad.name, left(bad.map_over::text, 200),
                  coalesce((select string_agg(format('%L', d), ', ' order by d)
                              from workflow_nodes x cross join unnest(x.depends_on) d
                             where x.name = bad.name), 'none'))
      end);
  end if;
  select w.name into bad from workflow_nodes w
   where w.map_over is null and (w.map_max is not null or w.map_trigger_rule is not null)
   order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_map_settings_need_map_over',
      format('task %L has map_max or map_trigger_rule but no map_over', bad.name));
  end if;
  select w.name, w.map_max into bad from workflow_nodes w
   where w.map_max is not null
     and not (jsonb_typeof(w.map_max) = 'number' and (w.map_max #>> '{}') ~ '^[0-9]{1,6}$'
              and (w.map_max #>> '{}')::integer between 1 and sked.map_max_limit())
   order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_map_max_must_be_1_to_100000',
      format('map_max of task %L must be a whole number from 1 to %s, not %s',
             bad.name, sked.map_max_limit(), left(bad.map_max::text, 200)));
  end if;
  select w.name, w.map_trigger_rule into bad from workflow_nodes w
   where w.map_trigger_rule is not null
     and w.map_trigger_rule not in ('"all_success"', '"all_done"')
   order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_map_trigger_rule_is_known',
      format('task %L has the map_trigger_rule %s (expected all_success or all_done)',
             bad.name, left(bad.map_trigger_rule::text, 200)));
  end if;
  select w.name, w.sharded into bad from workflow_nodes w
   where w.map_over is not null and (w.sharded or w.branch = 'true') order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_map_must_not_be_sharded_or_a_branch',
      format('task %L maps over an array and is %s; a map''s instances are its shards, one per element',
             bad.name, case when bad.sharded then 'sharded (shards or broadcast)' else 'a branch' end));
  end if;
  -- Sub-workflow tasks (sql/subworkflows.sql) run their workflow and nothing else; their
  -- bodies are checked once the tasks are in (sked.subworkflow_error).
  select w.name, w.other_keys into bad from workflow_nodes w
   where has_subs and w.subworkflow is not null and w.other_keys is not null
   order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_subworkflow_task_takes_only_its_place',
      format('task %L runs a sub-workflow; it takes name, depends_on, trigger_rule and workflow only, not %s',
             bad.name, bad.other_keys));
  end if;
  select w.name, w.subworkflow into bad from workflow_nodes w
   where has_subs and jsonb_typeof(w.subworkflow) <> 'object' order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_subworkflow_must_be_valid',
      format('the sub-workflow of task %L: %s', bad.name, sked.subworkflow_error(bad.subworkflow, owner_, p_now)));
  end if;
  select w.name into bad from workflow_nodes w where w.name = any(w.depends_on) order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_task_must_not_depend_on_itself',
      format('task %L depends on itself', bad.name));
  end if;
  select w.name, d.parent into bad
    from workflow_nodes w cross join lateral unnest(w.depends_on) as d(parent)
   where not exists (select 1 from workflow_nodes p where p.name = d.parent)
   order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_depends_on_must_name_a_task_of_the_workflow',
      format('task %L depends on %L, which is not a task of this workflow', bad.name, bad.parent));
  end if;
  select w.name into bad from workflow_nodes w where w.other_owner order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_tasks_belong_to_the_workflow_owner',
      format('task %L names another owner; every task of a workflow belongs to its owner', bad.name));
  end if;

  -- Edges by position (a name listed twice counts once), then Kahn's algorithm one level at
  -- a time: the tasks whose parents were all removed form the next level. Tasks never
  -- removed lie on a cycle or after one.
  insert into workflow_arcs (parent, child)
  select distinct p.ord, w.ord
    from workflow_nodes w
    cross join lateral unnest(w.depends_on) as d(parent)
    join workflow_nodes p on p.name = d.parent;
  analyze workflow_arcs;
  update workflow_nodes w set indegree = a.parents
    from (select a.child, count(*)::integer as parents from workflow_arcs a group by a.child) a
   where w.ord = a.child;
  update workflow_nodes w set children = a.children
    from (select a.parent, count(*)::integer as children from workflow_arcs a group by a.parent) a
   where w.ord = a.parent;
  select w.name into bad from workflow_nodes w
   where w.branch = 'true' and w.children = 0 order by w.ord limit 1;
  if found then
    perform sked.workflow_rule_raise('workflows_branch_must_have_children',
      format('task %L is a branch, but no task depends on it', bad.name));
  end if;
  select array_agg(w.ord) into frontier from workflow_nodes w where w.indegree = 0;
  visited := 0;
  while cardinality(frontier) > 0 loop
    visited := visited + cardinality(frontier);
    with removed as (
      select a.child, count(*)::integer as k from workflow_arcs a
       where a.parent = any(frontier) group by a.child
    ), lowered as (
      update workflow_nodes w set indegree = w.indegree - r.k
        from removed r where w.ord = r.child
      returning w.ord, w.indegree
    )
    select array_agg(l.ord) into frontier from lowered l where l.indegree = 0;
  end loop;
  if visited < n then
    select string_agg(format('%L', c.name), ', ' order by c.ord) as names into bad
      from (select w.name, w.ord from workflow_nodes w where w.indegree > 0 order by w.ord limit 5) c;
    perform sked.workflow_rule_raise('workflows_tasks_must_not_form_a_cycle',
      format('the dependencies form a cycle (tasks on or after it: %s)', bad.names));
  end if;

  -- Its notify is checked by sked.workflows_before_insert_notify (sql/alerts.sql).
  -- A sub-workflow names its task (set by sked.subworkflows_start for this insert only).
  insert into sked.workflows (id, owner, name, created_at, notify, params, definition_id,
                              parent_task_id)
  values (wf, owner_, coalesce(spec ->> 'name', ''), p_now,
          case when jsonb_typeof(spec -> 'notify') is distinct from 'null' then spec -> 'notify' end,
          params, p_definition, nullif(current_setting('sked.subworkflow_of', true), '')::uuid);
  perform set_config('sked.subworkflow_of', '', true);

  -- The tasks, read as sked.tasks_submit reads them, placed in the workflow. The new ids
  -- are handed out in ascending order, so that the tasks sort by id in the order they were
  -- given (time-ordered ids made in the same millisecond are not ordered): the task at `ord`
  -- gets ids[ord]. The edges go in first, by id: a sharded task moves its own to its shards
  -- when it is inserted. (Set-returning functions of a select list run in step: `ord` is
  -- each task's place in `made`.)
  made := sked.tasks_from_json(
    case when params is null and not has_subs
         then spec -> 'tasks'
         else (select jsonb_agg(case when w.subworkflow is not null
                                     then jsonb_build_object('kind', 'workflow')
                                     when params is null then t.elem
                                     else sked.params_apply(t.elem, params) end order by t.ord)
                 from jsonb_array_elements(spec -> 'tasks') with ordinality as t(elem, ord)
                 join workflow_nodes w on w.ord = t.ord) end,
    owner_, p_now);
  ids := array(select t.id from unnest(made) t order by t.id);
  insert into sked.task_edges (task_id, depends_on)
  select ids[a.child], ids[a.parent] from workflow_arcs a;
  select array_agg(sked.task_placed(g.task,
           id => ids[g.ord], state => case when a.parents > 0 then 'blocked' else 'waiting' end,
           created_at => p_now, workflow_id => wf, name => w.name,
           trigger_rule => w.trigger_rule, parents => coalesce(a.parents, 0),
           children => w.children, parents_pending => coalesce(a.parents, 0),
           branch => w.branch = 'true', map_over => w.map_over #>> '{}',
           map_max => case when w.map_over is not null
                           then coalesce((w.map_max #>> '{}')::integer, sked.map_max_default()) end,
           map_trigger_rule => case when w.map_over is not null
                                    then coalesce(w.map_trigger_rule #>> '{}', 'all_success') end,
           subworkflow => w.subworkflow)
         order by g.ord)
    into made
    from (select unnest(made) as task, generate_series(1, cardinality(made)) as ord) g
    join workflow_nodes w on w.ord = g.ord
    left join (select a.child, count(*)::integer as parents from workflow_arcs a
                group by a.child) a on a.child = g.ord;
  perform sked.tasks_insert(made);

  -- Sub-workflow tasks: each body is checked once however many tasks run it (a trial
  -- submission, which fills the temporary tables again: read them first), then those
  -- without parents start.
  select array_agg(b.name order by b.ord), array_agg(b.subworkflow order by b.ord)
    into sub_names, sub_bodies
    from (select distinct on (w.subworkflow) w.name, w.subworkflow, w.ord
            from workflow_nodes w where has_subs and w.subworkflow is not null
           order by w.subworkflow, w.ord) b;
  select array_agg(ids[w.ord] order by w.ord) into roots
    from workflow_nodes w
   where has_subs and w.subworkflow is not null and w.depends_on = '{}';
  for i in 1 .. coalesce(cardinality(sub_bodies), 0) loop
    problem := sked.subworkflow_error(sub_bodies[i], owner_, p_now);
    if problem is not null then
      perform sked.workflow_rule_raise('workflows_subworkflow_must_be_valid',
        format('the sub-workflow of task %L: %s', sub_names[i], problem));
    end if;
  end loop;
  if roots is not null then
    perform sked.subworkflows_submitted(roots, p_now);
  end if;
  return wf;
end
$$;

-- Raises check_violation for a broken workflow rule, naming it as the constraint.
create or replace function sked.workflow_rule_raise(rule text, says text) returns void
language plpgsql as $$
begin
  raise exception 'workflow: %', says
    using errcode = 'check_violation', constraint = rule, table = 'workflows', schema = 'sked';
end
$$;

-- Cancel a workflow: its tasks that have not started end `cancelled` at once, its running
-- tasks get a cancel request (their workers stop them within a second, as with
-- sked.task_cancel). Returns the workflow's state after the call ('cancelled', or 'running'
-- while cancelled tasks are still being stopped, or the final state it already had); null
-- when there is no such workflow.
create or replace function sked.workflow_cancel(p_id uuid, p_now timestamptz default now())
returns text
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  ended uuid[];
  subs uuid[];
  running text;
  result text;
begin
  with cancelled as (
    update sked.tasks t
       set state = 'cancelled', finished_at = p_now, error = 'cancelled with its workflow'
     where t.workflow_id = p_id and sked.state_waits_to_run(t.state)
    returning t.id, t.kind
  )
  select array_agg(c.id), array_agg(c.id) filter (where c.kind = 'workflow')
    into ended, subs from cancelled c;
  -- The sub-workflows of its sub-workflow tasks are cancelled with it.
  if subs is not null then
    perform sked.subworkflows_cancel(subs, p_now);
  end if;
  with requested as (
    update sked.tasks t set cancel_requested_at = coalesce(t.cancel_requested_at, p_now)
     where t.workflow_id = p_id and t.state = 'running'
    returning t.id
  )
  select string_agg(r.id::text, ',') into running from requested r;
  if running is not null then
    -- Ids of the tasks whose cancel was requested; a longer list is cut (workers also poll).
    perform pg_notify('sked_cancel', left(running, 7992));
  end if;
  -- Children outside the workflow released by these cancels wait for the workers' poll:
  -- this statement's one notification is the cancel request.
  perform sked.tasks_settle(coalesce(ended, '{}'), p_now);
  perform sked.workflows_settle(array[p_id], p_now);
  select w.state into result from sked.workflows w where w.id = p_id;
  return result;
end
$$;

-- Re-run a workflow from where it failed: its failed and cancelled tasks run again, and the
-- tasks after them that ended upstream_failed or skipped wait for them again (see
-- sked.tasks_rerun). Returns how many failed or cancelled tasks run again (0: nothing to
-- re-run), or null when there is no such workflow. The workflow's row is not locked first:
-- its failed and cancelled tasks are, and sked.tasks_rerun then locks the workflow after the
-- tasks, in the order a finish takes them. A sub-workflow whose task ended with it is re-run
-- through the workflow above (the count is then that workflow's).
create or replace function sked.workflow_retry(p_id uuid, p_now timestamptz default now())
returns integer
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  ids uuid[];
  queues text;
  top uuid;
begin
  perform 1 from sked.workflows w where w.id = p_id;
  if not found then
    return null;
  end if;
  -- A sub-workflow whose task has ended (failed or cancelled with it) runs again through the
  -- workflow above, whose re-run reaches back into it (sql/subworkflows.sql): from the
  -- highest workflow whose sub-workflow task ended with the one below.
  with recursive up (id, depth) as (
    select p_id, 0
    union all
    select t.workflow_id, u.depth + 1
      from up u
      join sked.workflows w on w.id = u.id
      join sked.tasks t on t.id = w.parent_task_id and t.owner = w.owner
     where t.kind = 'workflow' and t.state in ('failed', 'cancelled') and u.depth < 100
       and w.id = (select x.id from sked.workflows x
                    where x.parent_task_id = t.id and x.owner = t.owner
                    order by x.id desc limit 1)
  )
  select u.id into top from up u order by u.depth desc limit 1;
  if top <> p_id then
    return sked.workflow_retry(top, p_now);
  end if;
  select array_agg(t.id order by t.id) into ids
    from (select t.id from sked.tasks t
           where t.workflow_id = p_id and t.state in ('failed', 'cancelled')
           order by t.id for update) t;
  if ids is null then
    return 0;
  end if;
  queues := sked.tasks_rerun(ids, p_now);
  if queues is not null then
    perform pg_notify('sked_tasks', left(queues, 7000));
  end if;
  return cardinality(ids);
end
$$;
