-- Live events: what changed, recorded for the servers that feed dashboards
-- (server/src/events.rs; the protocol is in docs/events.md).
--
-- Every trigger here is a statement trigger that records at most one row per statement in
-- sked.event_outbox, never one per row: its kind and the ids it changed, never row data.
--
--   t  tasks inserted, or whose state or cancel request changed
--   l  tasks with new log chunks
--   f  workflows inserted or whose state changed
--   s  schedules inserted or changed, or fired (a schedule run)
--   w  a worker registered, began stopping, or deregistered (no ids)
--
-- A statement that changed more than 150 rows, or deleted rows (which cannot be looked up any
-- more), records no ids: readers refetch everything. Statements that change no row record
-- nothing, and nothing is recorded at all while no server has clients for its live events (no
-- unexpired row in sked.event_listeners): then a statement pays for its transition tables and
-- one index probe. Recording takes no lock another writer waits for (see the migration
-- 20261201000004_events_outbox.sql for why this is not a NOTIFY).

drop function if exists sked.event_payload(text, uuid[]);
drop function if exists sked.events_bulk();
drop function if exists sked.events_bulk_count();

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
-- Tasks
-- ---------------------------------------------------------------------------------------------

create or replace function sked.tasks_after_insert_event() returns trigger
language plpgsql as $$
declare
  ids uuid[];
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select array_agg(c.id), count(*) into ids, n
    from (select r.id from new_rows r limit 151) c;
  if n > 0 then
    perform sked.events_record('t', case when n <= 150 then ids end);
  end if;
  return null;
end
$$;

create or replace trigger tasks_after_insert_event
  after insert on sked.tasks
  referencing new table as new_rows
  for each statement execute function sked.tasks_after_insert_event();

-- Only a change of state or of the cancel request is news: lease renewals, the DAG counters
-- and everything else an update may touch record nothing. (A trigger with transition tables
-- cannot name columns, so it compares the rows before and after.)
--
-- The join is planned once per session, for the size of the first statement's transition
-- tables: after a one-row update it would stay a nested loop, and a later claim or finish of
-- 2,000 tasks would compare every pair (78 ms instead of 1). Without nested loops it is a
-- hash join whatever size it was planned for.
create or replace function sked.tasks_after_update_event() returns trigger
language plpgsql
set enable_nestloop = off
as $$
declare
  ids uuid[];
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select array_agg(c.id), count(*) into ids, n
    from (select r.id from new_rows r join old_rows o on o.id = r.id
           where r.state is distinct from o.state
              or r.cancel_requested_at is distinct from o.cancel_requested_at
           limit 151) c;
  if n > 0 then
    perform sked.events_record('t', case when n <= 150 then ids end);
  end if;
  return null;
end
$$;

create or replace trigger tasks_after_update_event
  after update on sked.tasks
  referencing old table as old_rows new table as new_rows
  for each statement execute function sked.tasks_after_update_event();

-- A deleted task cannot be looked up any more, so its id would tell a listener nothing it can
-- act on: deletions (retention) and TRUNCATE ask for a refetch.
create or replace function sked.tasks_after_delete_event() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from sked.event_listeners where expires_at > now())
     and exists (select 1 from old_rows) then
    perform sked.events_record('t', null);
  end if;
  return null;
end
$$;

create or replace trigger tasks_after_delete_event
  after delete on sked.tasks
  referencing old table as old_rows
  for each statement execute function sked.tasks_after_delete_event();

create or replace function sked.tasks_after_truncate_event() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from sked.event_listeners where expires_at > now()) then
    perform sked.events_record('t', null);
  end if;
  return null;
end
$$;

create or replace trigger tasks_after_truncate_event
  after truncate on sked.tasks
  for each statement execute function sked.tasks_after_truncate_event();

-- ---------------------------------------------------------------------------------------------
-- Task logs
-- ---------------------------------------------------------------------------------------------

create or replace function sked.task_logs_after_insert_event() returns trigger
language plpgsql as $$
declare
  ids uuid[];
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select array_agg(c.task_id), count(*) into ids, n
    from (select distinct r.task_id from new_rows r limit 151) c;
  if n > 0 then
    perform sked.events_record('l', case when n <= 150 then ids end);
  end if;
  return null;
end
$$;

create or replace trigger task_logs_after_insert_event
  after insert on sked.task_logs
  referencing new table as new_rows
  for each statement execute function sked.task_logs_after_insert_event();

-- ---------------------------------------------------------------------------------------------
-- Workflows
-- ---------------------------------------------------------------------------------------------

create or replace function sked.workflows_after_insert_event() returns trigger
language plpgsql as $$
declare
  ids uuid[];
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select array_agg(c.id), count(*) into ids, n
    from (select r.id from new_rows r limit 151) c;
  if n > 0 then
    perform sked.events_record('f', case when n <= 150 then ids end);
  end if;
  return null;
end
$$;

create or replace trigger workflows_after_insert_event
  after insert on sked.workflows
  referencing new table as new_rows
  for each statement execute function sked.workflows_after_insert_event();

-- Planned without nested loops, as sked.tasks_after_update_event.
create or replace function sked.workflows_after_update_event() returns trigger
language plpgsql
set enable_nestloop = off
as $$
declare
  ids uuid[];
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select array_agg(c.id), count(*) into ids, n
    from (select r.id from new_rows r join old_rows o on o.id = r.id
           where r.state is distinct from o.state
           limit 151) c;
  if n > 0 then
    perform sked.events_record('f', case when n <= 150 then ids end);
  end if;
  return null;
end
$$;

create or replace trigger workflows_after_update_event
  after update on sked.workflows
  referencing old table as old_rows new table as new_rows
  for each statement execute function sked.workflows_after_update_event();

create or replace function sked.workflows_after_delete_event() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from sked.event_listeners where expires_at > now())
     and exists (select 1 from old_rows) then
    perform sked.events_record('f', null);
  end if;
  return null;
end
$$;

create or replace trigger workflows_after_delete_event
  after delete on sked.workflows
  referencing old table as old_rows
  for each statement execute function sked.workflows_after_delete_event();

-- ---------------------------------------------------------------------------------------------
-- Schedules and their runs
-- ---------------------------------------------------------------------------------------------

-- Every change of a schedule shows (its next tick, paused, its latest occurrence), so every
-- inserted or updated row is named.
create or replace function sked.schedules_after_write_event() returns trigger
language plpgsql as $$
declare
  ids uuid[];
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select array_agg(c.id), count(*) into ids, n
    from (select r.id from new_rows r limit 151) c;
  if n > 0 then
    perform sked.events_record('s', case when n <= 150 then ids end);
  end if;
  return null;
end
$$;

create or replace trigger schedules_after_insert_event
  after insert on sked.schedules
  referencing new table as new_rows
  for each statement execute function sked.schedules_after_write_event();

create or replace trigger schedules_after_update_event
  after update on sked.schedules
  referencing new table as new_rows
  for each statement execute function sked.schedules_after_write_event();

create or replace function sked.schedules_after_delete_event() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from sked.event_listeners where expires_at > now())
     and exists (select 1 from old_rows) then
    perform sked.events_record('s', null);
  end if;
  return null;
end
$$;

create or replace trigger schedules_after_delete_event
  after delete on sked.schedules
  referencing old table as old_rows
  for each statement execute function sked.schedules_after_delete_event();

create or replace function sked.schedule_runs_after_insert_event() returns trigger
language plpgsql as $$
declare
  ids uuid[];
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select array_agg(c.schedule_id), count(*) into ids, n
    from (select distinct r.schedule_id from new_rows r limit 151) c;
  if n > 0 then
    perform sked.events_record('s', case when n <= 150 then ids end);
  end if;
  return null;
end
$$;

create or replace trigger schedule_runs_after_insert_event
  after insert on sked.schedule_runs
  referencing new table as new_rows
  for each statement execute function sked.schedule_runs_after_insert_event();

-- ---------------------------------------------------------------------------------------------
-- Workers
-- ---------------------------------------------------------------------------------------------

-- Registering and deregistering; heartbeats (which update heartbeat_at) record nothing, and
-- neither does the rescue's clean-up of long-dead workers when it deletes none.
create or replace function sked.workers_after_insert_event() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from sked.event_listeners where expires_at > now())
     and exists (select 1 from new_rows) then
    perform sked.events_record('w', null);
  end if;
  return null;
end
$$;

create or replace trigger workers_after_insert_event
  after insert on sked.workers
  referencing new table as new_rows
  for each statement execute function sked.workers_after_insert_event();

create or replace function sked.workers_after_delete_event() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from sked.event_listeners where expires_at > now())
     and exists (select 1 from old_rows) then
    perform sked.events_record('w', null);
  end if;
  return null;
end
$$;

create or replace trigger workers_after_delete_event
  after delete on sked.workers
  referencing old table as old_rows
  for each statement execute function sked.workers_after_delete_event();

-- A worker that begins stopping (or registers again) changes stopping_at.
create or replace function sked.workers_after_stopping_event() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from sked.event_listeners where expires_at > now()) then
    perform sked.events_record('w', null);
  end if;
  return null;
end
$$;

create or replace trigger workers_after_stopping_event
  after update of stopping_at on sked.workers
  for each statement execute function sked.workers_after_stopping_event();

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
