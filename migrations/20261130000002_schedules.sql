-- Cron schedules: each holds a task (or workflow) template, a cron expression in a time zone,
-- its misfire and overlap policies, and its own next_run_at. Firing a tick inserts an ordinary
-- task (an occurrence) and advances next_run_at in one transaction; sked.schedule_runs keeps
-- one row per tick (fired, skipped, queued, missed), whose key (schedule, fire time) makes each
-- tick happen once. The functions live in sql/schedules.sql.

-- A parsed cron expression (sked.cron_parse): a bit mask per field, the day-of-month and
-- day-of-week specials, and the Vixie cron flags.
create type sked.cron_spec as (
  seconds             bigint,    -- bit v: second v matches (0-59)
  minutes             bigint,    -- 0-59
  hours               bigint,    -- 0-23
  days                bigint,    -- 1-31
  months              bigint,    -- 1-12
  weekdays            bigint,    -- 0-6, Sunday = 0
  day_last            boolean,   -- L: the last day of the month
  day_last_weekday    boolean,   -- LW: the last weekday (Mon-Fri) of the month
  day_nearest_weekday integer[], -- nW: the weekday nearest to day n
  weekday_last        integer[], -- nL: the last weekday n of the month
  weekday_nth         integer[], -- n#k: encoded n * 10 + k
  dom_star            boolean,   -- the day-of-month field starts with * or ?
  dow_star            boolean,   -- the day-of-week field starts with * or ?
  real_time           boolean    -- the minute or hour field starts with *
);

create table sked.schedules (
  id              uuid primary key default sked.uuid_v7(),
  owner           text not null default current_user,
  name            text not null,
  cron            text not null,
  time_zone       text not null default 'UTC',
  -- What a tick runs: a task (an object with the keys of sked.tasks_submit) or a workflow
  -- (a spec for sked.workflow_submit). Exactly one.
  task            jsonb,
  workflow        jsonb,
  -- Ticks missed while nothing fired them (older than misfire_grace when seen).
  misfire_policy  text not null default 'run_once',
  misfire_grace   interval not null default '1 minute',
  catch_up_limit  integer not null default 100,
  -- A tick while the previous occurrence is unfinished.
  overlap_policy  text not null default 'skip',
  jitter          interval not null default '0',
  history_limit   integer not null default 1000,
  paused_at       timestamptz,
  -- Filled by the trigger in sql/schedules.sql: the parsed expression and the next tick.
  spec            sked.cron_spec,
  next_run_at     timestamptz,
  -- The latest occurrence (for the overlap policy) and a tick queued behind it (queue_one).
  last_fire_at    timestamptz,
  last_task_id    uuid,
  last_workflow_id uuid,
  queued_fire_at  timestamptz,
  created_at      timestamptz not null default now(),
  updated_at      timestamptz not null default now(),
  constraint schedules_name_is_unique_per_owner unique (owner, name),
  constraint schedules_name_must_not_be_empty check (name <> ''),
  constraint schedules_owner_must_not_be_empty check (owner <> ''),
  constraint schedules_run_a_task_or_a_workflow
    check ((task is null) <> (workflow is null)),
  constraint schedules_task_must_be_an_object
    check (task is null or jsonb_typeof(task) = 'object'),
  constraint schedules_workflow_must_be_an_object
    check (workflow is null or jsonb_typeof(workflow) = 'object'),
  constraint schedules_misfire_policy_is_skip_run_once_or_catch_up
    check (misfire_policy in ('skip', 'run_once', 'catch_up')),
  constraint schedules_overlap_policy_is_allow_skip_queue_one_or_replace
    check (overlap_policy in ('allow', 'skip', 'queue_one', 'replace')),
  constraint schedules_misfire_grace_must_not_be_negative
    check (misfire_grace >= interval '0'),
  constraint schedules_catch_up_limit_must_be_1_to_10000
    check (catch_up_limit between 1 and 10000),
  constraint schedules_jitter_must_not_be_negative
    check (jitter >= interval '0'),
  constraint schedules_history_limit_must_be_at_least_1
    check (history_limit >= 1),
  constraint schedules_next_run_at_is_set
    check (next_run_at is not null and spec is not null)
);

comment on table sked.schedules is
  'Cron schedules. Insert with INSERT (name, cron, task) or sked.schedule_create(); see docs/schedules.md.';

-- The firing loop's index: the next tick of every active schedule.
create index schedules_due on sked.schedules (next_run_at) where paused_at is null;
-- Schedules with a tick queued behind an unfinished occurrence (overlap policy queue_one).
create index schedules_queued on sked.schedules (queued_fire_at) where queued_fire_at is not null;

-- One row per tick that was due: what happened to it.
--   fired   an occurrence was created (task_id or workflow_id)
--   queued  waiting for the previous occurrence to finish (queue_one); becomes fired
--   skipped not run because the previous occurrence was unfinished (detail says why)
--   missed  not run: ticks missed while nothing fired them (missed_ticks of them, from
--           fire_at on; misfire policy skip or beyond catch_up_limit)
--   manual  "run now", outside the schedule (fire_at is when it was asked for)
create table sked.schedule_runs (
  id           bigint generated always as identity primary key,
  schedule_id  uuid not null references sked.schedules on delete cascade,
  fire_at      timestamptz not null,
  outcome      text not null,
  task_id      uuid,
  workflow_id  uuid,
  missed_ticks integer not null default 0,
  detail       text,
  recorded_at  timestamptz not null default now(),
  constraint schedule_runs_outcome_is_known
    check (outcome in ('fired', 'queued', 'skipped', 'missed', 'manual'))
);
-- Each tick of a schedule happens once; manual runs are outside the ticks.
create unique index schedule_runs_tick on sked.schedule_runs (schedule_id, fire_at)
  where outcome <> 'manual';
