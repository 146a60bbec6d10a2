-- A row a claim picked and locked, as the claim's one start statement (sked.tasks_start,
-- sql/workers.sql) needs it: the columns that decide which picked rows start (claim order,
-- shards, requests), and two flags the picking scan computed for the worker that claims.

create type sked.claim_pick as (
  id          uuid,
  priority    integer,
  next_run_at timestamptz,
  shard_of    uuid,
  shard_index integer,
  cpu_millis  integer,
  memory_mb   integer,
  -- A new shard (sked.shard_is_new): one per parent starts in a claim.
  spread      boolean,
  -- Locked to hold the worker's capacity for it (it fits only the worker's whole capacity):
  -- no task with requests behind it starts.
  reserve     boolean
);

comment on type sked.claim_pick is
  'A row a claim picked and locked, handed to sked.tasks_start: see sql/workers.sql.';
