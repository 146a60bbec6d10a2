-- The core schema: tasks, the history of their attempts, their logs, the worker registry,
-- API tokens and stored artifacts. The functions over these tables (the SQL contract) live in
-- sql/ and are re-applied on every `sked migrate`; this file only creates what holds data.

create schema if not exists sked;

-- Time-ordered UUIDs (version 7): the primary key doubles as "newest first" for keyset
-- pagination, and new rows land at the right edge of the index instead of at random pages.
create function sked.uuid_v7() returns uuid
language sql volatile parallel safe as $$
  select encode(
    set_bit(set_bit(
      overlay(uuid_send(gen_random_uuid())
              placing substring(int8send((extract(epoch from clock_timestamp()) * 1000)::bigint) from 3)
              from 1 for 6),
      52, 1), 53, 1), 'hex')::uuid
$$;

-- True when `env` is a JSON object whose values are all strings (the process environment).
create function sked.env_is_valid(env jsonb) returns boolean
language sql immutable parallel safe as $$
  select jsonb_typeof(env) = 'object'
     and not exists (select 1 from jsonb_each(env) e where jsonb_typeof(e.value) <> 'string'
                                                       or e.key = '' or position('=' in e.key) > 0)
$$;

create table sked.tasks (
  id                  uuid primary key default sked.uuid_v7(),
  owner               text not null default current_user,
  queue               text not null default 'default',
  priority            integer not null default 0,
  kind                text not null default 'command',

  -- What to run: argv (`command` followed by `args`), or a stored executable followed by `args`.
  command             text[],
  args                text[] not null default '{}',
  artifact_url        text,
  artifact_sha256     text,
  input               jsonb,
  env                 jsonb not null default '{}',
  labels              text[] not null default '{}',
  output_path         text,
  timeout             interval,

  -- Retry policy.
  max_attempts        integer not null default 3,
  backoff_base        interval not null default '1 second',
  backoff_max         interval not null default '1 hour',
  idempotency_key     text,

  -- State machine (docs/state_machine.md).
  state               text not null default 'waiting',
  attempt             integer not null default 0,
  next_run_at         timestamptz not null default now(),
  worker_id           uuid,
  lease_expires_at    timestamptz,
  cancel_requested_at timestamptz,
  created_at          timestamptz not null default now(),
  started_at          timestamptz,
  finished_at         timestamptz,

  -- Result of the latest attempt.
  exit_code           integer,
  error               text,
  stdout_tail         text,
  stderr_tail         text,
  output_sha256       text,

  -- Rules on what to run (command, args, artifact, env, labels, queue) are checked by the
  -- triggers in sql/tasks.sql (sked.task_rule_broken) when rows are inserted or those
  -- columns change: a CHECK constraint is evaluated on every update of the row, and the
  -- claim and finish of every task would pay for rules on columns they never touch.
  constraint tasks_state_is_known
    check (state in ('blocked', 'waiting', 'running', 'retry', 'succeeded', 'failed', 'cancelled')),
  constraint tasks_kind_is_known
    check (kind in ('command', 'noop', 'sleep')),
  constraint tasks_command_or_artifact_is_required
    check (kind <> 'command' or command is not null or artifact_url is not null),
  constraint tasks_command_and_artifact_are_exclusive
    check (command is null or artifact_url is null),
  constraint tasks_artifact_requires_sha256
    check (artifact_url is null or artifact_sha256 is not null),
  constraint tasks_owner_must_not_be_empty
    check (owner <> ''),
  constraint tasks_output_path_must_not_be_empty
    check (output_path is null or output_path <> ''),
  constraint tasks_timeout_must_be_positive
    check (timeout is null or timeout > interval '0'),
  constraint tasks_max_attempts_must_be_at_least_1
    check (max_attempts >= 1),
  constraint tasks_backoff_must_be_positive
    check (backoff_base > interval '0' and backoff_max >= backoff_base),
  constraint tasks_attempt_must_be_between_0_and_max_attempts
    check (attempt >= 0 and attempt <= max_attempts),
  constraint tasks_idempotency_key_must_not_be_empty
    check (idempotency_key is null or idempotency_key <> ''),
  -- State and columns agree: a running task has a worker and a lease, a task is finished
  -- exactly when its state is final, and a task that never ran has no attempts.
  constraint tasks_running_requires_worker_and_lease
    check (state <> 'running' or (worker_id is not null and lease_expires_at is not null
                                  and started_at is not null and attempt >= 1)),
  constraint tasks_lease_is_set_iff_running
    check ((state = 'running') = (lease_expires_at is not null)),
  constraint tasks_finished_at_is_set_iff_state_is_final
    check ((state in ('succeeded', 'failed', 'cancelled')) = (finished_at is not null)),
  constraint tasks_unstarted_task_must_be_blocked_waiting_or_cancelled
    check (attempt > 0 or state not in ('running', 'retry', 'succeeded', 'failed'))
);

comment on table sked.tasks is
  'One row per task. Submit with INSERT (only command is required) or sked.task_submit(); see docs/sql.md.';

-- The claim's index: only claimable rows, in claim order. Finished rows never enter it. It
-- also answers "when is the next task of a queue due?" (sked.tasks_next_due), so that an
-- insert adds one entry less than with a second index on (queue, next_run_at).
create index tasks_claimable on sked.tasks (queue, priority desc, next_run_at)
  where state in ('waiting', 'retry');
-- Rescue of tasks whose worker stopped renewing its lease. A lease exists exactly while a
-- task runs (tasks_lease_is_set_iff_running); the predicate names the lease rather than the
-- state so that fenced updates by id (`… and state = 'running'`) are never planned through
-- this index, which would walk every running task for each row of a batch.
create index tasks_lease on sked.tasks (lease_expires_at)
  where lease_expires_at is not null;
-- An idempotency key names at most one unfinished task per owner.
create unique index tasks_idempotency_key_unfinished on sked.tasks (owner, idempotency_key)
  where idempotency_key is not null and state in ('blocked', 'waiting', 'running', 'retry');

alter table sked.tasks set (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

-- The history of attempts. An attempt is written here when it ends, except a successful
-- attempt: its record is the task row itself until the task is run again (which moves it
-- here). The view sked.task_attempt_history joins both; the hot path saves one insert.
create table sked.task_attempts (
  task_id     uuid not null,
  attempt     integer not null,
  worker_id   uuid,
  started_at  timestamptz not null,
  finished_at timestamptz not null,
  outcome     text not null,
  exit_code   integer,
  error       text,
  stdout_tail text,
  stderr_tail text,
  primary key (task_id, attempt),
  constraint task_attempts_outcome_is_known
    check (outcome in ('succeeded', 'failed', 'timed_out', 'cancelled', 'worker_lost', 'interrupted'))
);

-- stdout/stderr of every attempt, in chunks written at least once a second while it runs.
create table sked.task_logs (
  id      bigint generated always as identity primary key,
  task_id uuid not null,
  attempt integer not null,
  stream  text not null,
  at      timestamptz not null default now(),
  data    text not null,
  constraint task_logs_stream_is_stdout_or_stderr check (stream in ('stdout', 'stderr'))
);
create index task_logs_by_task on sked.task_logs (task_id, id);

-- The worker registry. A worker inserts its row at start, renews heartbeat_at, and deletes
-- the row on a clean exit; a row whose heartbeat is older than its lease is a dead worker.
create table sked.workers (
  id           uuid primary key,
  name         text not null,
  host         text not null,
  pid          integer,
  version      text not null,
  queues       text[] not null,
  labels       text[] not null default '{}',
  concurrency  integer not null,
  lease        interval not null,
  started_at   timestamptz not null default now(),
  heartbeat_at timestamptz not null default now(),
  stopping_at  timestamptz,
  constraint workers_concurrency_must_be_at_least_1 check (concurrency >= 1),
  constraint workers_lease_must_be_positive check (lease > interval '0')
);

-- API tokens: only the SHA-256 of a token is stored. A token belongs to an owner; a `user`
-- sees and acts on that owner's tasks, an `admin` on all tasks.
create table sked.api_tokens (
  id           uuid primary key default gen_random_uuid(),
  token_sha256 bytea not null unique,
  owner        text not null,
  role         text not null,
  name         text not null default '',
  created_at   timestamptz not null default now(),
  revoked_at   timestamptz,
  constraint api_tokens_role_is_admin_or_user check (role in ('admin', 'user')),
  constraint api_tokens_owner_must_not_be_empty check (owner <> '')
);

-- Executables and output files kept in Postgres, addressed by their SHA-256.
create table sked.artifacts (
  sha256     text primary key,
  content    bytea not null,
  created_at timestamptz not null default now(),
  constraint artifacts_sha256_must_match_content check (sha256 = encode(sha256(content), 'hex'))
);
