-- The task state machine (docs/state_machine.md) as data: the states a claim takes, the
-- states that wait to run, and every change of state the functions of the contract make.

-- Is a task in this state claimable once due? The claim takes `waiting` and `retry` rows.
-- The planner inlines the call into `state = any('{waiting,retry}')`, the predicate of the
-- partial indexes of claimable tasks (tasks_claimable, tasks_waiting_copies, tasks_pinned),
-- so statements that test it are planned through them.
create or replace function sked.state_is_claimable(p_state text) returns boolean
language sql immutable parallel safe as $$
  select p_state in ('waiting', 'retry')
$$;

-- Does a task in this state wait to run: blocked on its DAG parents, or claimable? Such a
-- task has an attempt left (tasks_waiting_task_must_have_an_attempt_left), and a cancel ends
-- it at once. Inlined like sked.state_is_claimable.
create or replace function sked.state_waits_to_run(p_state text) returns boolean
language sql immutable parallel safe as $$
  select p_state = 'blocked' or sked.state_is_claimable(p_state)
$$;

-- Is a task in this state unfinished: waiting to run or running? Inlined like
-- sked.state_is_claimable.
create or replace function sked.state_is_unfinished(p_state text) returns boolean
language sql immutable parallel safe as $$
  select p_state = 'running' or sked.state_waits_to_run(p_state)
$$;

-- Every change of a task's state: from (null: the row is inserted), to, and what makes it.
-- docs/state_machine.md, "Transitions", shows the same pairs, and the tests hold the two
-- equal and drive tasks through the contract's functions, finding no change that is not
-- here. No statement reads it: the functions make the transitions, this says which they are.
create or replace view sked.task_transitions (from_state, to_state, made_by) as
values
  (null, 'waiting', 'submit'),
  (null, 'blocked', 'submit: a task with DAG parents, the parent of shards'),
  ('blocked', 'waiting', 'tasks_settle'),
  ('blocked', 'upstream_failed', 'tasks_settle'),
  ('blocked', 'skipped', 'tasks_settle'),
  ('blocked', 'succeeded', 'tasks_settle: the parent of shards'),
  ('waiting', 'running', 'tasks_claim'),
  ('retry', 'running', 'tasks_claim'),
  ('running', 'succeeded', 'tasks_finish'),
  ('running', 'retry', 'tasks_finish, tasks_rescue'),
  ('running', 'failed', 'tasks_finish, tasks_rescue'),
  ('running', 'cancelled', 'tasks_finish, tasks_rescue'),
  ('running', 'waiting', 'tasks_finish: interrupted'),
  ('waiting', 'failed', 'tasks_rescue: a pinned shard whose worker is gone'),
  ('retry', 'failed', 'tasks_rescue: a pinned shard whose worker is gone'),
  ('blocked', 'cancelled', 'task_cancel, workflow_cancel, a service stopped'),
  ('waiting', 'cancelled', 'task_cancel, workflow_cancel, a service stopped'),
  ('retry', 'cancelled', 'task_cancel, workflow_cancel, a service stopped'),
  ('failed', 'waiting', 'task_retry, workflow_retry'),
  ('failed', 'blocked', 'task_retry, workflow_retry'),
  ('failed', 'upstream_failed', 'task_retry, workflow_retry'),
  ('failed', 'skipped', 'task_retry, workflow_retry'),
  ('cancelled', 'waiting', 'task_retry, workflow_retry'),
  ('cancelled', 'blocked', 'task_retry, workflow_retry'),
  ('cancelled', 'upstream_failed', 'task_retry, workflow_retry'),
  ('cancelled', 'skipped', 'task_retry, workflow_retry'),
  ('succeeded', 'waiting', 'task_retry'),
  ('succeeded', 'blocked', 'task_retry'),
  ('succeeded', 'upstream_failed', 'task_retry'),
  ('succeeded', 'skipped', 'task_retry'),
  ('upstream_failed', 'blocked', 'tasks_rerun: the retry of an ancestor'),
  ('upstream_failed', 'skipped', 'tasks_rerun: the retry of an ancestor'),
  ('skipped', 'blocked', 'tasks_rerun: the retry of an ancestor'),
  ('skipped', 'waiting', 'tasks_rerun: the retry of an ancestor'),
  ('skipped', 'upstream_failed', 'tasks_rerun: the retry of an ancestor');
