-- Sharded and broadcast tasks: a task submitted with `shard_total = N` (or `broadcast`) becomes
-- a parent that runs nothing itself; it waits `blocked` on N shard tasks through rows of
-- sked.task_edges, like any DAG node, and succeeds when they all have. Shards are ordinary
-- tasks that also know their index, the total and their parent; a broadcast shard is pinned to
-- one worker. The functions live in sql/shards.sql; docs/shards.md describes the behaviour.

alter table sked.tasks
  -- On a parent and on each of its shards: how many shards the job has.
  add column shard_total   integer,
  -- On a shard: its position, 0 to shard_total - 1, and its parent.
  add column shard_index   integer,
  add column shard_of      uuid,
  -- On a broadcast parent and its shards: one shard per live worker.
  add column broadcast     boolean not null default false,
  -- On a broadcast shard: the only worker that may claim it.
  add column pinned_worker uuid;

alter table sked.tasks
  add constraint tasks_shard_total_must_be_1_to_10000
    check (shard_total between 1 and 10000),
  add constraint tasks_shard_has_an_index_below_its_total
    check (case when shard_of is null then shard_index is null
                else coalesce(shard_index >= 0 and shard_index < shard_total, false) end),
  add constraint tasks_pinned_worker_is_only_for_shards
    check (pinned_worker is null or shard_of is not null),
  -- A parent is released by the trigger rule `shards`: it succeeds when every shard has.
  drop constraint tasks_trigger_rule_is_known,
  add constraint tasks_trigger_rule_is_known
    check (trigger_rule in ('all_success', 'all_done', 'one_failed', 'shards')),
  -- Two tasks end without an attempt: a parent, which never runs, succeeds with its shards;
  -- a broadcast shard whose worker went away before it ran fails.
  drop constraint tasks_unstarted_task_must_not_be_running_retry_succeeded_failed,
  add constraint tasks_unstarted_task_must_not_be_running_retry_succeeded_failed
    check (attempt > 0 or state not in ('running', 'retry', 'succeeded', 'failed')
           or (state = 'succeeded' and trigger_rule = 'shards')
           or (state = 'failed' and pinned_worker is not null));

-- A parent's shards in index order (listing, outputs, cancel, re-run). Other tasks have no
-- entry, here or in the two indexes below.
create index tasks_shards on sked.tasks (shard_of, shard_index) where shard_of is not null;
-- "Does this worker run a shard of this parent now?", asked by the claim while a shard is
-- new (see sked.tasks_claim).
create index tasks_running_shards on sked.tasks (worker_id, shard_of)
  where shard_of is not null and state = 'running';
-- Pinned shards waiting for their worker, checked for workers that are gone.
create index tasks_pinned on sked.tasks (pinned_worker)
  where pinned_worker is not null and state in ('waiting', 'retry');
