-- The claim's index gains the id as its last key, so that a position in claim order
-- (priority desc, next_run_at, id) names one entry: a worker's claim can start right after
-- the last task it took instead of walking from the front of its queue past every entry of
-- a task claimed since the oldest open snapshot began (sked.tasks_claim, "Positions").
drop index sked.tasks_claimable;
create index tasks_claimable on sked.tasks (queue, priority desc, next_run_at, id)
  where state in ('waiting', 'retry');
