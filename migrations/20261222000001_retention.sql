-- Retention built in: finished tasks are deleted once they are older than a retention (7 days
-- by default; failed ones kept 30 days), set once for every process in sked.retention_settings
-- and per queue in sked.queues, and stored artifacts no task or schedule refers to are deleted
-- after a grace period. Every server's background upkeep applies them (sked.tasks_prune_expired
-- and sked.artifacts_prune in sql/tasks.sql); the indexes below let both find what they delete
-- without walking what they keep.

-- The cluster's retention: one row, read by every server, so that servers never disagree.
-- `enabled = false` turns retention off entirely (no task and no artifact is deleted, whatever
-- the queues say). A failed task (state failed or upstream_failed) is kept for the longer of
-- `retention` and `keep_failed`.
create table sked.retention_settings (
  id          boolean primary key default true,
  enabled     boolean not null default true,
  retention   interval not null default '7 days',
  keep_failed interval not null default '30 days',
  updated_at  timestamptz not null default now(),
  constraint retention_settings_has_one_row check (id),
  constraint retention_settings_retention_must_be_1_hour_to_36500_days
    check (retention between interval '1 hour' and interval '36500 days'),
  constraint retention_settings_keep_failed_must_be_1_hour_to_36500_days
    check (keep_failed between interval '1 hour' and interval '36500 days')
);
insert into sked.retention_settings default values;

comment on table sked.retention_settings is
  'How long finished tasks are kept (one row; sked.retention_set). Queues override it in sked.queues. See README.md, "Retention".';

-- A queue's own retention and keep-failed retention (null: the cluster's, from
-- sked.retention_settings). A queue row may now exist for these alone.
alter table sked.queues
  add column retention   interval,
  add column keep_failed interval,
  add constraint queues_retention_must_be_1_hour_to_36500_days
    check (retention between interval '1 hour' and interval '36500 days'),
  add constraint queues_keep_failed_must_be_1_hour_to_36500_days
    check (keep_failed between interval '1 hour' and interval '36500 days'),
  drop constraint queues_row_has_a_control,
  add constraint queues_row_has_a_control
    check (paused_at is not null or max_running is not null or rate_per_sec is not null
           or retention is not null or keep_failed is not null);

comment on table sked.queues is
  'Queue controls (pause, concurrency limit, rate limit, retention); a queue without a row has none. See docs/runtime.md.';

-- The artifacts' collection looks for artifacts older than the grace period in age order,
-- from where its previous batch stopped, and for each asks whether a task still refers to it
-- (as its executable or as its output). The task indexes are partial: a task without an
-- artifact or an output file, nearly every task, gets no entry.
create index artifacts_by_age on sked.artifacts (created_at, sha256);
create index tasks_artifact_sha256 on sked.tasks (artifact_sha256)
  where artifact_sha256 is not null;
create index tasks_output_sha256 on sked.tasks (output_sha256)
  where output_sha256 is not null;
