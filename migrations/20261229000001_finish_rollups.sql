-- Finishes are counted as they happen into per-minute and per-hour rollups, so that the
-- dashboard's overview and the history of throughput, failures, lateness and durations read a
-- few rows per minute instead of every task that finished (sql/finishes.sql writes, folds,
-- prunes and reads them; docs/api.md, "History").

-- One finish, or the undoing of one (a finished task reopened or changed): the rows that the
-- statement triggers of sql/finishes.sql hand to sked.finish_deltas_add.
create type sked.finish_change as (
  owner       text,
  queue       text,
  state       text,
  finished_at timestamptz,
  started_at  timestamptz,
  due_at      timestamptz,
  sign        integer
);

-- What one statement that finished tasks added, per owner, queue, minute of finished_at (UTC)
-- and final state: the count and two histograms (sked.histogram_bucket). Insert-only, so that
-- concurrent finishers never wait for each other's row; the background upkeep folds the rows
-- into sked.finish_rollups and deletes them, and readers add those not folded yet.
create table sked.finish_deltas (
  id        bigint generated always as identity primary key,
  owner     text not null,
  queue     text not null,
  minute    timestamptz not null,
  state     text not null,
  tasks     integer not null,
  durations integer[] not null,
  lateness  integer[] not null
);

-- The folded finishes per grain ('minute' or 'hour', UTC), start of the minute or hour,
-- queue, owner and final state. Minute rows serve the last day, hour rows the last week.
create table sked.finish_rollups (
  grain     text not null,
  start     timestamptz not null,
  queue     text not null,
  owner     text not null,
  state     text not null,
  tasks     bigint not null,
  durations integer[] not null,
  lateness  integer[] not null,
  primary key (grain, start, queue, owner, state),
  constraint finish_rollups_grain_is_minute_or_hour check (grain in ('minute', 'hour'))
);

-- Present until sql/finishes.sql has recorded the finishes older than its triggers (once,
-- in the transaction that creates them).
create table sked.finish_backfill (pending boolean primary key default true);
insert into sked.finish_backfill default values;
