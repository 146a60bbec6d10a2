-- Live events: what changed, recorded for the servers that feed dashboards
-- (server/src/events.rs; the protocol is in docs/events.md).
--
-- Every trigger here is a statement trigger of one function, sked.events_after_statement, that
-- records at most one row per statement in sked.event_outbox, never one per row: its kind and
-- the ids it changed, never row data.
--
--   t  tasks inserted, or whose state or cancel request changed
--   l  tasks with new log chunks
--   f  workflows inserted or whose state changed
--   s  schedules inserted or changed, or fired (a schedule run), and their backfills
--   w  a worker registered, began stopping, or deregistered (no ids)
--
-- A statement that changed more rows than sked.events_ids_max(), or deleted rows (which cannot
-- be looked up any more), records no ids: readers refetch everything. Statements that change
-- no row record nothing, and nothing is recorded at all while no server has clients for its
-- live events (no unexpired row in sked.event_listeners): then a statement pays for its
-- transition tables and one index probe, never for work per row. Recording takes no lock
-- another writer waits for (see the migration 20261201000004_events_outbox.sql for why this
-- is not a NOTIFY).

-- Records one statement's change: takes the first counter of sked.event_changes that no other
-- transaction holds (when all 64 are held, waits for one) and adds the row it numbers.
create or replace function sked.events_record(p_kind text, p_ids uuid[]) returns void
language plpgsql as $$
declare
  s integer;
  v bigint;
begin
  update sked.event_changes set n = n + 1
   where slot = (select c.slot from sked.event_changes c order by c.slot limit 1
                   for update skip locked)
  returning slot, n into s, v;
  if s is null then
    update sked.event_changes set n = n + 1 where slot = floor(random() * 64)::integer
    returning slot, n into s, v;
  end if;
  insert into sked.event_outbox (slot, n, kind, ids) values (s, v, p_kind, p_ids);
end
$$;

-- What was recorded after `p_seen` (the counter last seen of each slot, by slot + 1; missing
-- means 0): first every counter (kind null), then the rows numbered after what was seen, up to
-- the counters, all read in one snapshot. A slot whose rows are fewer than its counter moved
-- lost some (pruned, or a crash emptied the table).
create or replace function sked.events_read(p_seen bigint[]) returns table (
  slot integer, n bigint, kind text, ids uuid[])
language sql stable as $$
  select c.slot, c.n, null::text, null::uuid[] from sked.event_changes c
  union all
  select o.slot, o.n, o.kind, o.ids
    from sked.event_changes c
    join sked.event_outbox o
      on o.slot = c.slot and o.n > coalesce(p_seen[c.slot + 1], 0) and o.n <= c.n
$$;

-- Deletes the rows recorded before `p_before`; returns how many.
create or replace function sked.events_prune(p_before timestamptz) returns integer
language sql as $$
  with gone as (delete from sked.event_outbox where at < p_before returning 1)
  select count(*)::integer from gone
$$;

-- ---------------------------------------------------------------------------------------------
-- Who listens
-- ---------------------------------------------------------------------------------------------

-- Marks the server `p_id` as having clients until `p_ttl` from now (it calls this again
-- before then while they stay).
create or replace function sked.events_listen(p_id uuid, p_ttl interval) returns void
language sql as $$
  insert into sked.event_listeners (id, expires_at) values (p_id, now() + p_ttl)
  on conflict (id) do update set expires_at = excluded.expires_at
$$;

-- The server `p_id` has no clients any more.
create or replace function sked.events_unlisten(p_id uuid) returns void
language sql as $$
  delete from sked.event_listeners where id = p_id
$$;

-- A server whose row was just written must not greet its first clients while a transaction
-- whose trigger looked for rows before that one was there may still commit: its changes
-- would reach nobody. sked.events_running() names the transactions of this database that
-- may have (those holding a transaction id or a snapshot, as `pid:xid:xmin`), and
-- sked.events_ended(those) is true once none of them is still the same transaction. (A
-- statement that begins after the row was written sees it.)
create or replace function sked.events_running() returns text[]
language sql volatile as $$
  select coalesce(array_agg(a.pid || ':' || coalesce(a.backend_xid::text, '') || ':'
                            || coalesce(a.backend_xmin::text, '')), '{}')
    from pg_stat_activity a
   where a.datname = current_database() and a.pid <> pg_backend_pid()
     and (a.backend_xid is not null or a.backend_xmin is not null)
$$;

create or replace function sked.events_ended(p_running text[]) returns boolean
language sql volatile as $$
  select not exists (
    select 1 from pg_stat_activity a
     where a.datname = current_database()
       and a.pid || ':' || coalesce(a.backend_xid::text, '') || ':'
           || coalesce(a.backend_xmin::text, '') = any(p_running))
$$;

-- ---------------------------------------------------------------------------------------------
-- The triggers
-- ---------------------------------------------------------------------------------------------

-- The most ids one recorded change names; a statement that changed more records none.
create or replace function sked.events_ids_max() returns integer
language sql immutable parallel safe as $$
  select 150
$$;

-- The one trigger function of the live events. Each trigger below gives it the kind to record
-- (TG_ARGV[0]) and, when the change names ids, which (TG_ARGV[1]):
--
--   id                          every new row's id
--   task_id, schedule_id        the distinct values of that column of the new rows
--   state                       the rows whose state changed (updates: new rows against old)
--   state, cancel_requested_at  the rows whose state or cancel request changed
--
-- A trigger with no second argument records no ids: for an insert or a delete when its
-- transition table holds a row, for an update of the named column or a truncate always.
--
-- PL/pgSQL compiles a trigger function once per trigger, so each trigger keeps the plans of
-- its own branch. Those plans are made once per session, for the size of the first
-- statement's transition tables: after a one-row update a join of old and new rows would stay
-- a nested loop, and a later claim or finish of 2,000 tasks would compare every pair (78 ms
-- instead of 1). Without nested loops it is a hash join whatever size it was planned for; the
-- other branches join nothing.
create or replace function sked.events_after_statement() returns trigger
language plpgsql
set enable_nestloop = off
as $$
declare
  ids uuid[];
  touched boolean := true;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  if TG_NARGS = 1 then
    -- Each test is a query of its own: a query naming a transition table the trigger lacks
    -- fails.
    case TG_OP
      when 'INSERT' then touched := exists (select 1 from new_rows);
      when 'DELETE' then touched := exists (select 1 from old_rows);
      else null;
    end case;
    if touched then
      perform sked.events_record(TG_ARGV[0], null);
    end if;
    return null;
  end if;
  case TG_ARGV[1]
    when 'id' then
      ids := array(select r.id from new_rows r limit sked.events_ids_max() + 1);
    when 'task_id' then
      ids := array(select distinct r.task_id from new_rows r limit sked.events_ids_max() + 1);
    when 'schedule_id' then
      ids := array(select distinct r.schedule_id from new_rows r
                    limit sked.events_ids_max() + 1);
    when 'state' then
      ids := array(select r.id from new_rows r join old_rows o on o.id = r.id
                    where r.state is distinct from o.state
                    limit sked.events_ids_max() + 1);
    when 'state, cancel_requested_at' then
      ids := array(select r.id from new_rows r join old_rows o on o.id = r.id
                    where r.state is distinct from o.state
                       or r.cancel_requested_at is distinct from o.cancel_requested_at
                    limit sked.events_ids_max() + 1);
    else
      raise exception 'sked.events_after_statement: unknown second argument %', TG_ARGV[1];
  end case;
  if cardinality(ids) > 0 then
    perform sked.events_record(
      TG_ARGV[0], case when cardinality(ids) <= sked.events_ids_max() then ids end);
  end if;
  return null;
end
$$;

-- The triggers, one row each: the table, the trigger's event, the kind of event it records
-- and how it names the changed rows (the second argument of sked.events_after_statement; none:
-- it names no rows). The transition tables follow: an insert keeps its new rows, a delete its
-- old ones, an update whose rows are compared both, one that names every row its new ones.
--
-- Tasks: only a change of state or of the cancel request is news; lease renewals, the DAG
-- counters and everything else an update may touch record nothing. (A trigger with
-- transition tables cannot name columns, so the rows before and after are compared.) A
-- deleted task cannot be looked up any more, so its id would tell a listener nothing it can
-- act on: deletions (retention) and TRUNCATE ask for a refetch.
-- Task logs: the tasks that got chunks. Workflows: submitted, their state changed, deleted.
-- Schedules, their runs and their backfills: every change of a schedule shows (its next tick,
-- paused, its latest occurrence; a backfill's progress), so every inserted or updated row is
-- named.
-- Workers: registering and deregistering, and a worker that begins stopping (or registers
-- again) changes stopping_at. Heartbeats (which update heartbeat_at) record nothing, and
-- neither does the rescue's clean-up of long-dead workers when it deletes none.
do $$
declare
  e record;
begin
  for e in
    select * from (values
      ('tasks', 'insert', 't', 'id'),
      ('tasks', 'update', 't', 'state, cancel_requested_at'),
      ('tasks', 'delete', 't', null),
      ('tasks', 'truncate', 't', null),
      ('task_logs', 'insert', 'l', 'task_id'),
      ('workflows', 'insert', 'f', 'id'),
      ('workflows', 'update', 'f', 'state'),
      ('workflows', 'delete', 'f', null),
      ('schedules', 'insert', 's', 'id'),
      ('schedules', 'update', 's', 'id'),
      ('schedules', 'delete', 's', null),
      ('schedule_runs', 'insert', 's', 'schedule_id'),
      ('schedule_backfills', 'insert', 's', 'schedule_id'),
      ('schedule_backfills', 'update', 's', 'schedule_id'),
      ('workers', 'insert', 'w', null),
      ('workers', 'delete', 'w', null),
      ('workers', 'update of stopping_at', 'w', null)
    ) as t(tbl, event, kind, names)
  loop
    execute format(
      'create or replace trigger %I after %s on sked.%I %s for each statement '
      'execute function sked.events_after_statement(%s)',
      e.tbl || '_after_' || case when e.event like 'update of %' then 'stopping'
                                 else e.event end || '_event',
      e.event, e.tbl,
      case
        when e.event = 'insert' then 'referencing new table as new_rows'
        when e.event = 'delete' then 'referencing old table as old_rows'
        when e.event = 'update' and e.names = 'id' then 'referencing new table as new_rows'
        when e.event = 'update' then 'referencing old table as old_rows new table as new_rows'
        else ''
      end,
      concat_ws(', ', quote_literal(e.kind), quote_literal(e.names)));
  end loop;
end
$$;

-- Functions of earlier versions (among them a trigger function per trigger), dropped once no
-- trigger uses them.
drop function if exists
  sked.event_payload(text, uuid[]), sked.events_bulk(), sked.events_bulk_count(),
  sked.tasks_after_insert_event(), sked.tasks_after_update_event(),
  sked.tasks_after_delete_event(), sked.tasks_after_truncate_event(),
  sked.task_logs_after_insert_event(), sked.workflows_after_insert_event(),
  sked.workflows_after_update_event(), sked.workflows_after_delete_event(),
  sked.schedules_after_write_event(), sked.schedules_after_delete_event(),
  sked.schedule_runs_after_insert_event(), sked.workers_after_insert_event(),
  sked.workers_after_delete_event(), sked.workers_after_stopping_event();

-- ---------------------------------------------------------------------------------------------
-- Reading what changed
-- ---------------------------------------------------------------------------------------------

-- What a task list shows of these tasks (the `TaskSummary` of the live events), with their
-- owners; ids of tasks that no longer exist are left out. `argv` is the command and its
-- arguments, or the artifact's URL followed by the arguments.
create or replace function sked.tasks_summary(p_ids uuid[])
returns table (
  id uuid, owner text, queue text, priority integer, kind text, argv text[], state text,
  attempt integer, max_attempts integer, next_run_at timestamptz, created_at timestamptz,
  started_at timestamptz, finished_at timestamptz, exit_code integer, worker_id uuid,
  cancel_requested boolean, workflow_id uuid, name text, shard_of uuid)
language sql stable
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
  select t.id, t.owner, t.queue, t.priority, t.kind,
         coalesce(t.command, case when t.artifact_url is not null then array[t.artifact_url] end,
                  '{}') || t.args,
         t.state, t.attempt, t.max_attempts, t.next_run_at, t.created_at, t.started_at,
         t.finished_at, t.exit_code, t.worker_id, t.cancel_requested_at is not null,
         t.workflow_id, t.name, t.shard_of
    from sked.tasks t
   where t.id = any(p_ids)
$$;
