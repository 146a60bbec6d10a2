-- Lease renewals become HOT updates: no index names lease_expires_at any more, so a renewal,
-- which changes nothing else, writes its new row version on the same page and adds no index
-- entry (Postgres cannot update in place while any index key, included column or index
-- predicate names a changed column). The running tasks get one index keyed by worker, which
-- also answers the shard rule's "does this worker run a shard of this parent now?": it
-- replaces tasks_lease (by lease expiry, for the rescue) and tasks_running_shards. The rescue
-- now reads every running task and tests the lease; running tasks are at most the workers'
-- slots, and the rescue runs a few times a lease.
--
-- The batch functions fenced by id write the running state as `lease_expires_at is not null`
-- so that they are never planned through tasks_running (sql/workers.sql, at the top).
--
-- A tenth of each heap page stays free at insert, for the new versions its rows' renewals
-- write. Pages written before this migration keep what they had.
alter table sked.tasks set (fillfactor = 90);
create index tasks_running on sked.tasks (worker_id, shard_of) where state = 'running';
drop index sked.tasks_running_shards;
drop index sked.tasks_lease;
