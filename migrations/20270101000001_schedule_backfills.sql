-- Backfills (docs/schedules.md, "Backfill"): a schedule run for every tick of a past range,
-- at most max_active occurrences at once, oldest or newest tick first. Each tick it fires is
-- recorded in sked.schedule_runs like a tick of the schedule (keyed by schedule and fire
-- time), so a tick runs once however many backfills cover it. The firing duty steps the
-- running backfills (sked.schedule_backfills_step in sql/schedules.sql).
create table sked.schedule_backfills (
  id           uuid primary key default sked.uuid_v7(),
  schedule_id  uuid not null references sked.schedules on delete cascade,
  from_at      timestamptz not null,
  to_at        timestamptz not null,
  newest_first boolean not null default false,
  max_active   integer not null default 1,
  -- Every tick of the range, in the order they run; next_tick indexes the next one.
  ticks        timestamptz[] not null,
  next_tick    integer not null default 1,
  -- Occurrences started and not yet seen finished (task or workflow ids).
  active       uuid[] not null default '{}',
  -- Ticks fired, found recorded already (not fired again), and occurrences ended.
  fired        integer not null default 0,
  already      integer not null default 0,
  succeeded    integer not null default 0,
  failed       integer not null default 0,
  state        text not null default 'running',
  error        text,
  created_at   timestamptz not null default now(),
  finished_at  timestamptz,
  constraint schedule_backfills_state_is_known
    check (state in ('running', 'succeeded', 'failed', 'cancelled')),
  constraint schedule_backfills_finished_at_is_set_iff_not_running
    check ((state = 'running') = (finished_at is null)),
  constraint schedule_backfills_from_must_not_be_after_to check (from_at <= to_at),
  constraint schedule_backfills_max_active_must_be_1_to_1000 check (max_active between 1 and 1000),
  constraint schedule_backfills_ticks_must_be_1_to_10000
    check (cardinality(ticks) between 1 and 10000),
  constraint schedule_backfills_next_tick_is_within_the_ticks
    check (next_tick between 1 and cardinality(ticks) + 1)
);

comment on table sked.schedule_backfills is
  'Backfills of schedules: every tick of a past range, run at most max_active at once. Start one with sked.schedule_backfill(); see docs/schedules.md.';

-- The firing duty's index: the running backfills.
create index schedule_backfills_running on sked.schedule_backfills (created_at)
  where state = 'running';
create index schedule_backfills_schedule on sked.schedule_backfills (schedule_id, created_at);

-- The backfill that fired a tick. Such runs are kept as long as their backfill (they do not
-- count against the schedule's history_limit), so that a second backfill over the range knows
-- them.
alter table sked.schedule_runs
  add column backfill_id uuid references sked.schedule_backfills on delete set null;
create index schedule_runs_backfill on sked.schedule_runs (backfill_id) where backfill_id is not null;
