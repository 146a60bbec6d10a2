-- Awaiting a task or a workflow: the ids someone waits for, so that reaching a final state
-- notifies only those (sql/awaits.sql). A row lives until its notification is sent or it
-- expires; a waiter renews it while it waits.
--
-- Unlogged: after a crash (or on a standby after a failover) the rows are gone, and so are the
-- waiters' connections; a waiter that connects again registers again.
create unlogged table sked.awaits (
  -- A task's or a workflow's id (both are sked.uuid_v7, never equal).
  id         uuid primary key,
  expires_at timestamptz not null
);

create index awaits_expires_at on sked.awaits (expires_at);
