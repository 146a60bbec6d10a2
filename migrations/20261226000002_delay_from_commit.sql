-- A submission's `delay` counts from the commit of the transaction that submits the task,
-- when it becomes visible, not from the transaction's start (sql/tasks.sql, "Delays count
-- from the commit"). The submit functions note each delayed task in sked.delays_from_commit,
-- and their transaction once in sked.delays_from_commit_due, whose deferred trigger sets the
-- noted tasks' due times from the clock at commit and deletes the notes: one trigger event per
-- transaction, however many tasks it delays. Rows live only within their transaction:
-- unlogged, nothing of them needs to survive a crash.
create unlogged table sked.delays_from_commit (
  task_id uuid primary key,
  delay   interval not null
);

create unlogged table sked.delays_from_commit_due (
  xact xid8 primary key
);

comment on table sked.delays_from_commit is
  'The delayed tasks the running transaction submitted, whose due time its commit sets (sql/tasks.sql). Empty outside a transaction.';
comment on table sked.delays_from_commit_due is
  'The running transaction, when it noted delays in sked.delays_from_commit: its row''s deferred trigger applies them at commit (sql/tasks.sql).';
