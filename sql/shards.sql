-- The shard functions of the SQL contract: sharded and broadcast tasks. See docs/shards.md.
--
-- A task submitted with `shard_total = N` (key `shards` of the submit functions) or with
-- `broadcast` is a parent: an insert trigger gives it N shard tasks (for a broadcast, one per
-- live worker, each pinned to its worker) and makes it wait `blocked` on them through rows of
-- sked.task_edges, with the trigger rule `shards`. From there on the DAG machinery of
-- sql/workflows.sql does the rest: a shard that ends settles the parent, which succeeds (with
-- the shards' outputs) when all have succeeded and ends upstream_failed when one failed or was
-- cancelled. The hooks elsewhere: the claim spreads new shards over workers and honours pins
-- (sked.tasks_claim), the rescue fails pinned shards instead of moving them
-- (sked.tasks_rescue), cancel and retry of a parent act on its shards (sked.task_cancel,
-- sked.task_retry).
--
-- Functions here that plan with `enable_seqscan = off` (see the planner note at the top of
-- sql/workers.sql) also turn JIT compilation off: a plan that must scan a small table without
-- an index (sked.workers) carries the planner's penalty for a disabled scan in its cost, which
-- would make PostgreSQL compile the statement to machine code, a second or more each time.

-- A worker is live while its heartbeat is younger than its lease and it is not stopping.
create or replace function sked.worker_is_live(
  heartbeat_at timestamptz, lease interval, stopping_at timestamptz, p_now timestamptz)
returns boolean
language sql immutable parallel safe as $$
  select stopping_at is null and heartbeat_at + lease > p_now
$$;

-- A shard is new during the first second after it became due. While it is new, a claim takes
-- at most one shard of its parent, and a worker that already runs a shard of the parent passes
-- over it, so that idle workers get the shards first; afterwards shards are claimed like any
-- task, so a lone worker still runs them all.
create or replace function sked.shard_is_new(next_run_at timestamptz, p_now timestamptz)
returns boolean
language sql immutable parallel safe as $$
  select next_run_at > p_now - interval '1 second'
$$;

-- May worker `p_worker` claim this due shard now? Only its own worker may claim a pinned
-- shard; a new shard is passed over by a worker that runs another shard of the same parent.
-- The claim asks this only for shard rows.
create or replace function sked.shard_claimable(
  p_shard_of uuid, p_pinned_worker uuid, p_next_run_at timestamptz, p_worker uuid,
  p_now timestamptz)
returns boolean
language sql stable as $$
  select (p_pinned_worker is null or p_pinned_worker = p_worker)
     and (not sked.shard_is_new(p_next_run_at, p_now)
          or not exists (select 1 from sked.tasks r
                          where r.worker_id = p_worker and r.shard_of = p_shard_of
                            and r.state = 'running'))
$$;

-- Raises check_violation for a broken shard rule, naming it as the constraint.
create or replace function sked.shard_rule_raise(rule text, says text) returns void
language plpgsql as $$
begin
  raise exception 'sked.tasks: %', says
    using errcode = 'check_violation', constraint = rule, table = 'tasks', schema = 'sked';
end
$$;

-- sked.shards_insert(p_parents, p_ids, p_indexes, p_totals, p_pinned): inserts the shards these arrays
-- describe, one per element, in their order. A shard is its parent's row (every column; any
-- new field comes along) with its own id, name (`<parent name>[index]`), state (blocked
-- while the parent has unfinished DAG parents, else waiting), place under the parent
-- (children 1, shard_of, shard_total, shard_index) and pinned worker, without the parent's
-- idempotency key and replicas. Its insert is made here from the table's columns, at every
-- migrate: a statement that names each column, far cheaper per shard than a row rewritten
-- through JSON, and in PL/pgSQL, which keeps its plan for the session.
do $do$
declare
  own constant text[] := array['id', 'name', 'state', 'children', 'shard_of', 'shard_total',
                               'shard_index', 'pinned_worker', 'idempotency_key', 'replicas'];
  -- The other columns, in the table's order: the parent's.
  rest constant text[] := array(
    select a.attname::text from pg_attribute a
     where a.attrelid = 'sked.tasks'::regclass and a.attnum > 0 and not a.attisdropped
       and a.attname::text <> all (own)
     order by a.attnum);
begin
  execute format($f$
    create or replace function sked.shards_insert(
      p_parents uuid[], p_ids uuid[], p_indexes integer[], p_totals integer[],
      p_pinned uuid[])
    returns void
    language plpgsql volatile as $b$
    begin
      with parent as materialized (
        select * from sked.tasks p where p.id = any(p_parents)
      )
      insert into sked.tasks (%s)
      select s.id, p.name || '[' || s.idx || ']',
             case when p.parents_pending > 0 then 'blocked' else 'waiting' end, 1, p.id,
             s.total, s.idx, s.pinned, null, null, %s
        from unnest(p_parents, p_ids, p_indexes, p_totals, p_pinned) with ordinality
               as s(parent, id, idx, total, pinned, ord)
        join parent p on p.id = s.parent
       order by s.ord;
    end
    $b$
  $f$,
  array_to_string(own || rest, ', '),
  (select string_agg(format('p.%I', r.name), ', ' order by r.i)
     from unnest(rest) with ordinality as r(name, i)));
end
$do$;

-- Gives the parents `p_ids` (just inserted, shard_total or broadcast set, no shards yet) their
-- shards, set-based over all of them. A shard is a copy of its parent's row (every field:
-- command, args, input, env, queue, priority, labels, timeout, retry policy, output_path,
-- resource requests and limits, preemptible, owner, and any other; its workflow and start
-- time) with its own id, name, index and state, without the parent's idempotency key or
-- replicas; it takes over the parent's own DAG parents (with its trigger rule): the parent
-- then depends on its shards only, with the rule `shards`. A broadcast gets one shard per
-- live worker (sked.worker_is_live at the parent's created_at) that serves its queue and has
-- its labels, pinned to that worker; with no such worker the submission is rejected.
create or replace function sked.shards_create(p_ids uuid[])
returns void
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  bad record;
  parent_ids uuid[];
  shard_totals integer[];
  shard_parents uuid[];
  shard_ids uuid[];
  shard_indexes integer[];
  shard_totals_each integer[];
  shard_pins uuid[];
  moved_child uuid[];
  moved_from uuid[];
begin
  select p.id into bad from sked.tasks p
   where p.id = any(p_ids) and p.broadcast and p.shard_total is not null limit 1;
  if found then
    perform sked.shard_rule_raise('tasks_shards_and_broadcast_are_exclusive',
      'a task has either shards (a number) or broadcast, not both');
  end if;
  select p.queue, p.labels into bad from sked.tasks p
   where p.id = any(p_ids) and p.broadcast
     and not exists (select 1 from sked.workers w
                      where sked.worker_is_live(w.heartbeat_at, w.lease, w.stopping_at, p.created_at)
                        and p.queue = any(w.queues) and p.labels <@ w.labels)
   limit 1;
  if found then
    perform sked.shard_rule_raise('tasks_broadcast_needs_a_live_worker',
      format('broadcast: no live worker serves queue %L%s', bad.queue,
             case when cardinality(bad.labels) > 0
                  then format(' with the labels %s', array_to_string(bad.labels, ', ')) else '' end));
  end if;

  -- One row per shard (index, total, pinned worker, new id), inserted by
  -- sked.shards_insert; the parents' DAG parents move to their shards.
  with parent as materialized (
    select p.id, p.shard_total, p.broadcast, p.queue, p.labels, p.created_at
      from sked.tasks p where p.id = any(p_ids)
  ), planned as (
    select p.id as parent, g.idx, p.shard_total as total, null::uuid as pinned
      from parent p cross join lateral generate_series(0, p.shard_total - 1) as g(idx)
     where not p.broadcast
    union all
    select p.id, (row_number() over (partition by p.id order by w.id))::integer - 1,
           (count(*) over (partition by p.id))::integer, w.id
      from parent p
      join sked.workers w
        on sked.worker_is_live(w.heartbeat_at, w.lease, w.stopping_at, p.created_at)
       and p.queue = any(w.queues) and p.labels <@ w.labels
     where p.broadcast
  )
  select array_agg(l.parent order by l.parent, l.idx), array_agg(sked.uuid_v7()),
         array_agg(l.idx order by l.parent, l.idx), array_agg(l.total order by l.parent, l.idx),
         array_agg(l.pinned order by l.parent, l.idx)
    into shard_parents, shard_ids, shard_indexes, shard_totals_each, shard_pins
    from planned l;
  perform sked.shards_insert(shard_parents, shard_ids, shard_indexes, shard_totals_each,
                             shard_pins);

  with plan as (
    select * from unnest(shard_parents, shard_ids) as s(parent, id)
  ), upstream as (
    delete from sked.task_edges e where e.task_id = any(p_ids)
    returning e.task_id, e.depends_on
  ), edges as (
    insert into sked.task_edges (task_id, depends_on)
    select s.parent, s.id from plan s
    union all
    select s.id, u.depends_on from plan s join upstream u on u.task_id = s.parent
  )
  select array_agg(c.parent), array_agg(c.total),
         (select array_agg(u.task_id) from upstream u), (select array_agg(u.depends_on) from upstream u)
    into parent_ids, shard_totals, moved_child, moved_from
    from (select s.parent, count(*)::integer as total from plan s group by s.parent) c;

  -- The parents wait for their shards; a parent's former DAG parents now have its shards as
  -- children instead of it.
  update sked.tasks p
     set state = 'blocked', shard_total = c.total, trigger_rule = 'shards',
         parents = c.total, parents_pending = c.total
    from unnest(parent_ids, shard_totals) as c(id, total)
   where p.id = c.id;
  update sked.tasks x
     set children = x.children + d.more
    from (select u.depends_on, sum(c.total - 1)::integer as more
            from unnest(moved_child, moved_from) as u(parent, depends_on)
            join unnest(parent_ids, shard_totals) as c(id, total) on c.id = u.parent
           group by u.depends_on) d
   where x.id = d.depends_on;
end
$$;

-- Expands the sharded and broadcast tasks of an inserting statement into their shards: a row
-- trigger that fires only for parents (the WHEN clause costs other rows nothing), and
-- expands every parent of the statement at its first call, set-based; its later calls find
-- their row expanded already. It fires after the whole statement, so the DAG edges that
-- sked.workflow_submit inserts with its tasks are there.
create or replace function sked.tasks_after_insert_shard() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from sked.tasks s where s.shard_of = new.id) then
    return null;
  end if;
  perform sked.shards_create(array(
    select n.id from new_rows n
     where n.shard_of is null and (n.shard_total is not null or n.broadcast)));
  return null;
end
$$;

create or replace trigger tasks_after_insert_shard
  after insert on sked.tasks
  referencing new table as new_rows
  for each row
  when (new.shard_of is null and (new.shard_total is not null or new.broadcast))
  execute function sked.tasks_after_insert_shard();

-- A parent's output: the JSON array of its shards' outputs by index (null for a shard that
-- wrote none), or null when they are more than 16 MiB together.
create or replace function sked.shards_output(p_id uuid) returns jsonb
language sql stable
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
  select case
    when (select coalesce(sum(pg_column_size(s.output)), 0) from sked.tasks s where s.shard_of = p_id)
         <= 16 * 1024 * 1024
    then (select jsonb_agg(s.output order by s.shard_index) from sked.tasks s where s.shard_of = p_id)
  end
$$;

-- The parent `p_id` was cancelled: its shards that have not started end cancelled, running
-- ones get a cancel request. Returns the ids of those (comma-separated, or null) for the
-- caller's sked_cancel notification.
create or replace function sked.shards_cancel(p_id uuid, p_now timestamptz) returns text
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  running text;
begin
  update sked.tasks t
     set state = 'cancelled', finished_at = p_now, error = 'cancelled with its sharded task'
   where t.shard_of = p_id and sked.state_waits_to_run(t.state);
  with requested as (
    update sked.tasks t set cancel_requested_at = coalesce(t.cancel_requested_at, p_now)
     where t.shard_of = p_id and t.state = 'running'
    returning t.id
  )
  select string_agg(r.id::text, ',') into running from requested r;
  return left(running, 7992);
end
$$;

-- What runs again when the finished parent `p_id` is retried: the parent itself with its
-- shards that did not succeed, or with all of them when they all succeeded.
create or replace function sked.shards_to_rerun(p_id uuid) returns uuid[]
language sql stable
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
  select p_id || coalesce(
    (select array_agg(s.id order by s.id) from sked.tasks s
      where s.shard_of = p_id and s.state in ('failed', 'cancelled', 'upstream_failed', 'skipped')),
    (select array_agg(s.id order by s.id) from sked.tasks s
      where s.shard_of = p_id and s.state = 'succeeded'),
    '{}')
$$;

-- Pinned shards waiting for a worker that is gone (no longer registered, silent for longer
-- than its lease, or stopping) can never run: they fail, saying so, and settle their parents.
-- Called by sked.tasks_rescue. Returns the queues that got claimable tasks by the settling.
drop function if exists sked.shards_fail_orphaned(timestamptz, integer);
create or replace function sked.shards_fail_orphaned(p_limit integer default 1000, p_now timestamptz default now())
returns text
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  ended uuid[];
begin
  with orphaned as (
    select t.id from sked.tasks t
     where t.pinned_worker is not null and sked.state_is_claimable(t.state)
       and not exists (select 1 from sked.workers w
                        where w.id = t.pinned_worker
                          and sked.worker_is_live(w.heartbeat_at, w.lease, w.stopping_at, p_now))
     limit p_limit
     for update skip locked
  ), failed as (
    update sked.tasks t
       set state = 'failed', finished_at = p_now,
           error = format('worker gone: this broadcast shard runs only on worker %s, which is no longer live',
                          t.pinned_worker)
      from orphaned o
     where t.id = o.id
    returning t.id
  )
  select array_agg(f.id) into ended from failed f;
  if ended is null then
    return null;
  end if;
  return sked.tasks_settle(ended, p_now);
end
$$;
