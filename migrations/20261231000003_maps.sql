-- Maps (docs/workflows.md, "Map"): a workflow task with `map_over: "<parent>.<path>"` runs
-- once per element of the JSON array at that path of its parent's output. It is a sharded
-- task whose number of shards (its instances) is decided when it is released, by the
-- transaction that finishes its last parent.

alter table sked.tasks
  -- On a map and on each of its instances: what it maps over, as submitted ("extract.rows").
  add column map_over text,
  -- On a map: the most instances it may have.
  add column map_max integer,
  -- On a map: the rule across its instances, all_success (every instance must succeed) or
  -- all_done (the map succeeds once every instance finished, however it ended).
  add column map_trigger_rule text;

-- Checked on the rows already there without holding off writers for the scan.
alter table sked.tasks
  add constraint tasks_map_max_must_be_1_to_100000
    check (map_max between 1 and 100000) not valid,
  add constraint tasks_map_trigger_rule_is_known
    check (map_trigger_rule in ('all_success', 'all_done')) not valid,
  -- A map has up to 100,000 instances; other sharded tasks up to 10,000 shards.
  drop constraint tasks_shard_total_must_be_1_to_10000,
  add constraint tasks_shard_total_must_be_1_to_10000
    check (shard_total between 1 and case when map_over is null then 10000 else 100000 end)
    not valid,
  -- The rule of a map across its instances when they may fail: it succeeds once all ended.
  drop constraint tasks_trigger_rule_is_known,
  add constraint tasks_trigger_rule_is_known
    check (trigger_rule in ('all_success', 'all_done', 'one_failed', 'none_failed', 'shards',
                            'map_all_done'))
    not valid,
  -- A map, which never runs, succeeds with its instances (or at once with none).
  drop constraint tasks_unstarted_task_must_not_be_running_retry_succeeded_failed,
  add constraint tasks_unstarted_task_must_not_be_running_retry_succeeded_failed
    check (attempt > 0 or state not in ('running', 'retry', 'succeeded', 'failed')
           or (state = 'succeeded' and trigger_rule in ('shards', 'map_all_done'))
           or (state = 'failed' and pinned_worker is not null))
    not valid;
alter table sked.tasks validate constraint tasks_map_max_must_be_1_to_100000;
alter table sked.tasks validate constraint tasks_map_trigger_rule_is_known;
alter table sked.tasks validate constraint tasks_shard_total_must_be_1_to_10000;
alter table sked.tasks validate constraint tasks_trigger_rule_is_known;
alter table sked.tasks validate constraint tasks_unstarted_task_must_not_be_running_retry_succeeded_failed;
