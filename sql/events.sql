-- Live events: what changed, announced on the channel `sked_events` for the servers that feed
-- dashboards (server/src/events.rs; the protocol is in docs/events.md).
--
-- Every trigger here is a statement trigger that sends at most one notification per
-- statement, never one per row (a per-row NOTIFY serialises commits and caps throughput). A
-- payload names what changed, never row data: a kind letter, then `:` and up to 150 ids
-- separated by commas, so it always stays far below PostgreSQL's 8000-byte limit:
--
--   t:<task ids>      tasks inserted, or whose state or cancel request changed
--   l:<task ids>      tasks with new log chunks
--   f:<workflow ids>  workflows inserted or whose state changed
--   s:<schedule ids>  schedules inserted or changed, or fired (a schedule run)
--   w                 a worker registered, began stopping, or deregistered
--
-- A statement that changed more than 150 rows, or deleted rows (which cannot be looked up
-- any more), sends nothing: it bumps a counter of sked.event_changes (sked.events_bulk), which
-- the listening servers poll; they tell their clients to refetch everything. Bulk claims and
-- finishes thus never hold the lock a NOTIFY takes at commit (see the migration).
--
-- Statements that change no row send nothing, and nothing is sent at all while no server has
-- clients for its live events (no unexpired row in sked.event_listeners): then a statement
-- pays for its transition tables and one index probe, not for building and queueing a
-- notification. Notifications are hints: a listener that misses some (it was disconnected)
-- refetches what it shows.

drop function if exists sked.event_payload(text, uuid[]);

-- Records that a statement changed more rows than a notification names, or deleted rows: one
-- counter of sked.event_changes goes up, the first one no other transaction holds (a
-- transaction that finds all 64 held notifies `*` instead).
create or replace function sked.events_bulk() returns void
language plpgsql as $$
begin
  update sked.event_changes set n = n + 1
   where slot = (select c.slot from sked.event_changes c order by c.slot limit 1
                   for update skip locked);
  if not found then
    perform pg_notify('sked_events', '*');
  end if;
end
$$;

-- The sum of the counters: it moves whenever a bulk change has committed.
create or replace function sked.events_bulk_count() returns bigint
language sql stable as $$
  select coalesce(sum(n), 0)::bigint from sked.event_changes
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
  ids text;
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select string_agg(c.id::text, ','), count(*) into ids, n
    from (select r.id from new_rows r limit 151) c;
  if n > 0 then
    if n > 150 then
      perform sked.events_bulk();
    else
      perform pg_notify('sked_events', 't:' || ids);
    end if;
  end if;
  return null;
end
$$;

create or replace trigger tasks_after_insert_event
  after insert on sked.tasks
  referencing new table as new_rows
  for each statement execute function sked.tasks_after_insert_event();

-- Only a change of state or of the cancel request is news: lease renewals, the DAG counters
-- and everything else an update may touch send nothing. (A trigger with transition tables
-- cannot name columns, so it compares the rows before and after.)
create or replace function sked.tasks_after_update_event() returns trigger
language plpgsql as $$
declare
  ids text;
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select string_agg(c.id::text, ','), count(*) into ids, n
    from (select r.id from new_rows r join old_rows o on o.id = r.id
           where r.state is distinct from o.state
              or r.cancel_requested_at is distinct from o.cancel_requested_at
           limit 151) c;
  if n > 0 then
    if n > 150 then
      perform sked.events_bulk();
    else
      perform pg_notify('sked_events', 't:' || ids);
    end if;
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
    perform sked.events_bulk();
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
    perform sked.events_bulk();
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
  ids text;
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select string_agg(c.task_id::text, ','), count(*) into ids, n
    from (select distinct r.task_id from new_rows r limit 151) c;
  if n > 0 then
    if n > 150 then
      perform sked.events_bulk();
    else
      perform pg_notify('sked_events', 'l:' || ids);
    end if;
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
  ids text;
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select string_agg(c.id::text, ','), count(*) into ids, n
    from (select r.id from new_rows r limit 151) c;
  if n > 0 then
    if n > 150 then
      perform sked.events_bulk();
    else
      perform pg_notify('sked_events', 'f:' || ids);
    end if;
  end if;
  return null;
end
$$;

create or replace trigger workflows_after_insert_event
  after insert on sked.workflows
  referencing new table as new_rows
  for each statement execute function sked.workflows_after_insert_event();

create or replace function sked.workflows_after_update_event() returns trigger
language plpgsql as $$
declare
  ids text;
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select string_agg(c.id::text, ','), count(*) into ids, n
    from (select r.id from new_rows r join old_rows o on o.id = r.id
           where r.state is distinct from o.state
           limit 151) c;
  if n > 0 then
    if n > 150 then
      perform sked.events_bulk();
    else
      perform pg_notify('sked_events', 'f:' || ids);
    end if;
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
    perform sked.events_bulk();
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
  ids text;
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select string_agg(c.id::text, ','), count(*) into ids, n
    from (select r.id from new_rows r limit 151) c;
  if n > 0 then
    if n > 150 then
      perform sked.events_bulk();
    else
      perform pg_notify('sked_events', 's:' || ids);
    end if;
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
    perform sked.events_bulk();
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
  ids text;
  n bigint;
begin
  if not exists (select 1 from sked.event_listeners where expires_at > now()) then
    return null;
  end if;
  select string_agg(c.schedule_id::text, ','), count(*) into ids, n
    from (select distinct r.schedule_id from new_rows r limit 151) c;
  if n > 0 then
    if n > 150 then
      perform sked.events_bulk();
    else
      perform pg_notify('sked_events', 's:' || ids);
    end if;
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

-- Registering and deregistering; heartbeats (which update heartbeat_at) send nothing, and
-- neither does the rescue's clean-up of long-dead workers when it deletes none.
create or replace function sked.workers_after_insert_event() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from sked.event_listeners where expires_at > now())
     and exists (select 1 from new_rows) then
    perform pg_notify('sked_events', 'w');
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
    perform pg_notify('sked_events', 'w');
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
    perform pg_notify('sked_events', 'w');
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
