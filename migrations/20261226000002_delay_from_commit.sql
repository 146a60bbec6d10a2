-- A submission's `delay` counts from the commit of the transaction that submits the task,
-- when it becomes visible, not from the transaction's start (sql/tasks.sql, "Delays count
-- from the commit"). The submit functions note each delayed task here; at commit a deferred
-- trigger sets its due time from the clock and deletes the note. A row lives only within its
-- transaction: unlogged, nothing of it needs to survive a crash.
create unlogged table sked.delays_from_commit (
  task_id uuid primary key,
  delay   interval not null
);

comment on table sked.delays_from_commit is
  'The delayed tasks the running transaction submitted, whose due time its commit sets (sql/tasks.sql). Empty outside a transaction.';
