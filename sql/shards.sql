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

-- The parent whose shards the claim spreads over workers (sked.shard_claimable, the spread of
-- sked.tasks_start): a shard's parent, but not a map's (a map's instances, whose number a
-- parent's output decides, are claimed as fast as workers take them; see "Maps" below).
-- Inlined into the claim's scans: the claim asks it with the row's columns.
create or replace function sked.shard_spread_of(shard_of uuid, map_over text) returns uuid
language sql immutable parallel safe as $$
  select case when map_over is null then shard_of end
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

-- sked.shards_insert(p_parents, p_ids, p_indexes, p_totals, p_pinned, p_inputs): inserts the
-- shards these arrays describe, one per element, in their order. A shard is its parent's row
-- (every column; any new field comes along) with its own id, name (`<parent name>[index]`),
-- state (blocked while the parent has unfinished DAG parents, else waiting), place under the
-- parent (children 1, shard_of, shard_total, shard_index) and pinned worker, without the
-- parent's idempotency key and replicas. A shard given an input (p_inputs, null for none: an
-- instance of a map, with its element) has it instead of the parent's, and no DAG parents. Its insert is made here from the table's columns, at every
-- migrate: a statement that names each column, far cheaper per shard than a row rewritten
-- through JSON, and in PL/pgSQL, which keeps its plan for the session.
do $do$
declare
  own constant text[] := array['id', 'name', 'state', 'children', 'shard_of', 'shard_total',
                               'shard_index', 'pinned_worker', 'idempotency_key', 'replicas',
                               'input', 'parents'];
  -- The other columns, in the table's order: the parent's.
  rest constant text[] := array(
    select a.attname::text from pg_attribute a
     where a.attrelid = 'sked.tasks'::regclass and a.attnum > 0 and not a.attisdropped
       and a.attname::text <> all (own)
     order by a.attnum);
begin
  drop function if exists sked.shards_insert(uuid[], uuid[], integer[], integer[], uuid[]);
  execute format($f$
    create or replace function sked.shards_insert(
      p_parents uuid[], p_ids uuid[], p_indexes integer[], p_totals integer[],
      p_pinned uuid[], p_inputs jsonb[])
    returns void
    language plpgsql volatile as $b$
    begin
      with parent as materialized (
        select * from sked.tasks p where p.id = any(p_parents)
      )
      insert into sked.tasks (%s)
      select s.id, p.name || '[' || s.idx || ']',
             case when p.parents_pending > 0 then 'blocked' else 'waiting' end, 1, p.id,
             s.total, s.idx, s.pinned, null, null, coalesce(s.input, p.input),
             case when s.input is null then p.parents else 0 end, %s
        from unnest(p_parents, p_ids, p_indexes, p_totals, p_pinned, p_inputs) with ordinality
               as s(parent, id, idx, total, pinned, input, ord)
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
                             shard_pins, null);

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

-- Maps (docs/workflows.md, "Map"). A workflow task with `map_over` ("<parent>.<path>") is a
-- sharded task whose number of shards, its instances, is the length of the JSON array at
-- that path of its parent's output: decided when the map is released (becomes waiting), in
-- the transaction that finishes its last parent, by sked.maps_expand. An instance has its
-- element as input (stdin; the worker also sets SKED_MAP_ITEM and SKED_MAP_INDEX) and no DAG
-- parents; the map waits for its instances with the trigger rule `shards` (all must succeed)
-- or `map_all_done` (all must finish), and then takes their outputs (sked.shards_output).
-- Instances are claimed like any task: the claim's spread of new shards over workers
-- (sked.shard_claimable) is for sharded and broadcast work, not for a map's instances.

-- The most instances a map may have when its map_max does not say.
create or replace function sked.map_max_default() returns integer
language sql immutable parallel safe as $$
  select 10000
$$;

-- The most instances a map may have, whatever its map_max says.
create or replace function sked.map_max_limit() returns integer
language sql immutable parallel safe as $$
  select 100000
$$;

-- The largest element, as JSON text, that an instance gets (it is also in its environment).
create or replace function sked.map_item_max_bytes() returns integer
language sql immutable parallel safe as $$
  select 65536
$$;

-- Why the map over `map_over` cannot expand (null when it can): its parent `parent` (null:
-- no task it depends on is named so), which ended `parent_state`, has `items` at the path,
-- and the map may have `map_max` instances. Every case ends the map upstream_failed with
-- this as its error; the elements' sizes are checked by sked.maps_expand.
create or replace function sked.map_items_error(
  map_over text, parent text, parent_state text, parent_output jsonb, items jsonb,
  map_max integer)
returns text
language sql immutable parallel safe as $$
  select case
    when parent is null then
      'not run: the map over ' || quote_literal(map_over) || ' depends on no task of that name'
    when parent_state <> 'succeeded' then
      'not run: the map over ' || quote_literal(map_over) || ' needs the output of '
      || quote_literal(parent) || ', which ended ' || parent_state
    when parent_output is null then
      'not run: the map over ' || quote_literal(map_over) || ' needs an array, but '
      || quote_literal(parent) || ' wrote no output'
    when items is null then
      'not run: the map over ' || quote_literal(map_over) || ' needs an array, but the output of '
      || quote_literal(parent) || ' has nothing at that path'
    when jsonb_typeof(items) <> 'array' then
      'not run: the map over ' || quote_literal(map_over) || ' needs an array, but the output of '
      || quote_literal(parent) || ' has ' || case jsonb_typeof(items) when 'object' then 'an object'
                                                else 'a ' || jsonb_typeof(items) end
      || ' there: ' || left(items::text, 200)
    when jsonb_array_length(items) > map_max then
      'not run: the map over ' || quote_literal(map_over) || ' has '
      || jsonb_array_length(items) || ' elements, more than its cap (map_max ' || map_max || ')'
  end
$$;

-- Expands the maps `p_ids` that were just released (state waiting, not expanded yet), set-
-- based over all of them: each gets one instance per element of its array, inserted by
-- sked.shards_insert, and waits for them (blocked, trigger rule `shards` or `map_all_done`).
-- A map whose array is empty succeeds at once with the output []; one whose array cannot be
-- taken (sked.map_items_error, or an element over sked.map_item_max_bytes()) ends
-- upstream_failed saying why. Only these maps change: an output a task wrote fails its own
-- map, never the statement. Returns the maps that ended (the caller settles them).
create or replace function sked.maps_expand(p_ids uuid[], p_now timestamptz)
returns uuid[]
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  ended uuid[];
  expanding uuid[];
  totals integer[];
  i_parents uuid[];
  i_ids uuid[];
  i_indexes integer[];
  i_totals integer[];
  i_inputs jsonb[];
begin
  create temp table if not exists map_plan (
    id uuid primary key, items jsonb, error text, total integer
  ) on commit drop;
  truncate map_plan;
  -- The map's parent is the task it depends on whose name is the longest that map_over is,
  -- or begins with followed by a dot; the rest, split at dots, is the path.
  insert into map_plan (id, items, error, total)
  select m.id, j.items, j.error,
         case when j.error is null then jsonb_array_length(j.items) end
    from sked.tasks m
    left join lateral (
      select p.name, p.state, p.output from sked.task_edges e
        join sked.tasks p on p.id = e.depends_on
       where e.task_id = m.id
         and (m.map_over = p.name or starts_with(m.map_over, p.name || '.'))
       order by length(p.name) desc limit 1
    ) p on true
    cross join lateral (
      select case when m.map_over = p.name then p.output
                  else p.output #> string_to_array(substr(m.map_over, length(p.name) + 2), '.')
             end as items
    ) x
    cross join lateral (
      select x.items,
             sked.map_items_error(m.map_over, p.name, p.state, p.output, x.items,
                                  coalesce(m.map_max, sked.map_max_default())) as error
    ) j
   where m.id = any(p_ids) and m.state = 'waiting' and m.map_over is not null
     and m.shard_of is null;
  -- An element too large for an instance fails the map too.
  update map_plan l
     set error = 'not run: element ' || (b.i - 1) || ' of the map over '
                 || quote_literal(b.map_over) || ' takes ' || b.size
                 || ' bytes as JSON, more than an instance takes ('
                 || sked.map_item_max_bytes() || ')',
         total = null
    from (select k.id, m.map_over, x.i, x.size
            from map_plan k
            join sked.tasks m on m.id = k.id
            cross join lateral (
              select e.i, octet_length(e.v::text) as size
                from jsonb_array_elements(k.items) with ordinality as e(v, i)
               where octet_length(e.v::text) > sked.map_item_max_bytes()
               order by e.i limit 1) x
           where k.error is null) b
   where l.id = b.id;

  -- Ended at once: refused (upstream_failed), or no element (succeeded with []).
  with ended_maps as (
    update sked.tasks m
       set state = case when l.error is null then 'succeeded' else 'upstream_failed' end,
           trigger_rule = case when l.error is not null then m.trigger_rule
                               when m.map_trigger_rule = 'all_done' then 'map_all_done'
                               else 'shards' end,
           finished_at = p_now, error = l.error,
           output = case when l.error is null then '[]'::jsonb end
      from map_plan l
     where m.id = l.id and m.state = 'waiting' and (l.error is not null or l.total = 0)
    returning m.id
  )
  select array_agg(e.id) into ended from ended_maps e;

  select array_agg(l.id order by l.id), array_agg(l.total order by l.id)
    into expanding, totals
    from map_plan l where l.error is null and l.total > 0;
  if expanding is null then
    return coalesce(ended, '{}');
  end if;
  select array_agg(l.id order by l.id, e.i), array_agg((e.i - 1)::integer order by l.id, e.i),
         array_agg(l.total order by l.id, e.i), array_agg(e.v order by l.id, e.i)
    into i_parents, i_indexes, i_totals, i_inputs
    from map_plan l cross join lateral jsonb_array_elements(l.items) with ordinality as e(v, i)
   where l.id = any(expanding);
  -- Ids in ascending order, so that a map's instances sort by id in the order of their
  -- elements (time-ordered ids made in the same millisecond are not ordered).
  i_ids := array(select u.id from (select sked.uuid_v7() as id
                                     from generate_series(1, cardinality(i_parents))) u
                  order by u.id);
  perform sked.shards_insert(i_parents, i_ids, i_indexes, i_totals,
                             array_fill(null::uuid, array[cardinality(i_ids)]), i_inputs);
  insert into sked.task_edges (task_id, depends_on)
  select p, i from unnest(i_parents, i_ids) as x(p, i);
  -- The maps wait for their instances (their own DAG parents are all done).
  update sked.tasks m
     set state = 'blocked', shard_total = c.total,
         trigger_rule = case when m.map_trigger_rule = 'all_done' then 'map_all_done'
                             else 'shards' end,
         parents = m.parents + c.total, parents_pending = c.total
    from unnest(expanding, totals) as c(id, total)
   where m.id = c.id and m.state = 'waiting';
  return coalesce(ended, '{}');
end
$$;
