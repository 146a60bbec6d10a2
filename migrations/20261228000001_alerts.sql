-- Alerts: a task's success, failure or retry, and a workflow's success or failure, can
-- notify (docs/operations.md, "Alerts"). A task's `notify` (or, when it has none, its
-- queue's) and a workflow's name, per event, alert targets —
-- webhooks that operators define, with the secret their deliveries are signed with — and
-- follow-up tasks. Each notification is a task of its own, inserted in the transaction that
-- changes the state: a `webhook` task (run by a worker, retried with backoff like any task)
-- or the follow-up task. Only sked itself inserts `webhook` tasks (sql/alerts.sql), so that
-- no submitter can have a worker sign a body of its choosing.
create table sked.alert_targets (
  name         text primary key,
  url          text not null,
  -- The HMAC-SHA256 key of the signature of each delivery (X-Sked-Signature).
  secret       text not null,
  -- The queue of its deliveries (a worker must serve it) and their attempts.
  queue        text not null default 'default',
  max_attempts integer not null default 10,
  created_at   timestamptz not null default now(),
  updated_at   timestamptz not null default now(),
  constraint alert_targets_name_must_be_1_to_64_word_characters
    check (length(name) between 1 and 64
           and ltrim(name, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-') = ''
           and ltrim(left(name, 1), '_.:-') <> ''),
  constraint alert_targets_url_must_be_http_or_https
    check (url ~ '^https?://[^[:space:]/?#]+([/?#][^[:space:]]*)?$' and length(url) <= 2048),
  constraint alert_targets_secret_must_be_16_to_512_characters
    check (length(secret) between 16 and 512),
  constraint alert_targets_queue_name_must_be_1_to_64_word_characters
    check (length(queue) between 1 and 64
           and ltrim(queue, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-') = ''
           and ltrim(left(queue, 1), '_.:-') <> ''),
  constraint alert_targets_max_attempts_must_be_1_to_100
    check (max_attempts between 1 and 100)
);

-- The webhook tasks sked is inserting, in the transaction that inserts them: a submitter
-- cannot write here, so a webhook task without its row is refused (sql/alerts.sql).
create unlogged table sked.alert_deliveries_allowed (
  task_id uuid primary key
);

comment on table sked.alert_targets is
  'Webhooks that notifications are delivered to, defined by operators (sql/alerts.sql, docs/operations.md). Secrets: only sked reads them.';

alter table sked.tasks add column notify jsonb;
alter table sked.queues add column notify jsonb;
alter table sked.workflows add column notify jsonb;
alter table sked.schedules add column notify jsonb;

-- The statement trigger after updates of tasks asks whether any schedule has a notify, and a
-- failed task's run, by an index each.
create index schedules_notified on sked.schedules (id) where notify is not null;
create index schedule_runs_by_task on sked.schedule_runs (task_id) where task_id is not null;

comment on column sked.tasks.notify is
  'Who is told when the task succeeds, fails or is retried: {"on_success"|"on_failure"|"on_retry": [target name | {"task": {...}}, ...]} (docs/operations.md). Null: its queue''s.';
comment on column sked.workflows.notify is
  'Who is told when the workflow succeeds or fails: {"on_success"|"on_failure": [...]}, as a task''s notify.';
comment on column sked.schedules.notify is
  'Who is told of missed ticks and of occurrences failing in a row: {"on_missed": [...], "on_failure": [...], "failures_in_a_row": N}.';
comment on column sked.queues.notify is
  'The notify of the queue''s tasks that have none of their own.';

alter table sked.tasks
  drop constraint tasks_kind_is_known,
  add constraint tasks_kind_is_known
    check (kind in ('command', 'noop', 'sleep', 'service', 'webhook'));

alter table sked.queues
  drop constraint queues_row_has_a_control,
  add constraint queues_row_has_a_control
    check (paused_at is not null or max_running is not null or rate_per_sec is not null
           or retention is not null or keep_failed is not null or notify is not null);
