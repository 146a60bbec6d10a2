-- The task state machine (docs/state_machine.md): the states a claim takes and the states
-- that wait to run.

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
