-- Least privilege: the tables that hold one owner's tasks (tasks, their workflows, edges,
-- attempts and logs) get row-level security, so that a database role granted sked_submitter
-- sees and inserts only rows of its own name. The policies, the group roles and every grant
-- live in sql/roles.sql, re-applied by every `sked migrate`. The table owner (the account
-- that migrates) is not subject to these policies, and neither are the SECURITY DEFINER
-- functions that workers and servers call, which run as that owner.

alter table sked.tasks enable row level security;
alter table sked.workflows enable row level security;
alter table sked.task_edges enable row level security;
alter table sked.task_attempts enable row level security;
alter table sked.task_logs enable row level security;
