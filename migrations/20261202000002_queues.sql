-- Queue-level controls that hold across any number of workers, because the claim enforces
-- them in the database: a paused queue is not claimed, a queue may cap the tasks that run in
-- it at once (cluster-wide) and the tasks that start per second.
--
-- A queue has a row here only while it has a control (sked.queue_pause,
-- sked.queue_set_limits in sql/queues.sql); a queue without one costs the claim one probe of
-- this table's primary key. The claim locks the row of a limited queue, so claimers of that
-- queue take turns while claimers of other queues never wait (docs/runtime.md).

create table sked.queues (
  name         text primary key,
  -- Paused since then: no claim takes its tasks; running tasks go on.
  paused_at    timestamptz,
  -- At most this many of its tasks run at once, over all workers.
  max_running  integer,
  -- At most this many of its tasks start per second, on average, with bursts of up to
  -- `burst` (default: the rate rounded up, at least 1): a token bucket.
  rate_per_sec double precision,
  burst        integer,
  -- The bucket: `tokens` starts were available at `tokens_at`; it fills at rate_per_sec up to
  -- the burst, and each claimed task takes one.
  tokens       double precision not null default 0,
  tokens_at    timestamptz not null default now(),
  updated_at   timestamptz not null default now(),
  constraint queues_name_must_be_1_to_64_word_characters
    check (length(name) between 1 and 64
           and ltrim(name, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-') = ''
           and ltrim(left(name, 1), '_.:-') <> ''),
  constraint queues_max_running_must_be_1_to_1000000
    check (max_running between 1 and 1000000),
  constraint queues_rate_per_sec_must_be_positive_and_at_most_1000000
    check (rate_per_sec > 0 and rate_per_sec <= 1000000),
  constraint queues_burst_must_be_1_to_1000000
    check (burst between 1 and 1000000),
  constraint queues_burst_needs_a_rate
    check (burst is null or rate_per_sec is not null),
  constraint queues_row_has_a_control
    check (paused_at is not null or max_running is not null or rate_per_sec is not null)
);

comment on table sked.queues is
  'Queue controls (pause, concurrency limit, rate limit); a queue without a row has none. See docs/runtime.md.';
