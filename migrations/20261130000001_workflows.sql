-- DAG workflows: a task may depend on other tasks (rows of sked.task_edges) and waits in
-- `blocked` until its parents are done; the tasks submitted together form a workflow (a row
-- of sked.workflows with an aggregate state). Two new final states: `upstream_failed` (a
-- parent failed, so the task can never run) and `skipped` (its trigger rule can no longer be
-- met, such as a clean-up task that runs only when a parent failed, when none did). A task
-- keeps the JSON output of its last successful attempt for its children.

create table sked.workflows (
  id          uuid primary key default sked.uuid_v7(),
  owner       text not null default current_user,
  name        text not null default '',
  state       text not null default 'running',
  created_at  timestamptz not null default now(),
  finished_at timestamptz,
  constraint workflows_state_is_known
    check (state in ('running', 'succeeded', 'failed', 'cancelled')),
  constraint workflows_finished_at_is_set_iff_finished
    check ((state <> 'running') = (finished_at is not null)),
  constraint workflows_owner_must_not_be_empty
    check (owner <> '')
);

comment on table sked.workflows is
  'One row per workflow (a DAG of tasks). Submit with sked.workflow_submit(); see docs/workflows.md.';

-- A user's workflows, newest first (ids are time-ordered).
create index workflows_by_owner on sked.workflows (owner, id);

-- `task_id` runs after `depends_on`. The primary key starts with the parent: releasing the
-- children of a finished task is the hot lookup; the second index serves "parents of".
create table sked.task_edges (
  task_id    uuid not null,
  depends_on uuid not null,
  primary key (depends_on, task_id),
  constraint task_edges_task_must_not_depend_on_itself check (task_id <> depends_on)
);
create index task_edges_by_task on sked.task_edges (task_id);

alter table sked.tasks
  add column workflow_id     uuid,
  add column name            text,
  add column trigger_rule    text not null default 'all_success',
  -- Edges of this task, counted once at submission: the worker fetches parents' outputs and
  -- the finish looks for children only for tasks that have them.
  add column parents         integer not null default 0,
  add column children        integer not null default 0,
  -- Parents not finished yet, kept while the task is `blocked`; at zero the task is released.
  add column parents_pending integer not null default 0,
  -- The JSON output of the last successful attempt (at most 64 KiB; see docs/workflows.md).
  add column output          jsonb;

alter table sked.tasks
  drop constraint tasks_state_is_known,
  add constraint tasks_state_is_known
    check (state in ('blocked', 'waiting', 'running', 'retry', 'succeeded', 'failed', 'cancelled',
                     'upstream_failed', 'skipped')),
  drop constraint tasks_finished_at_is_set_iff_state_is_final,
  add constraint tasks_finished_at_is_set_iff_state_is_final
    check ((state in ('succeeded', 'failed', 'cancelled', 'upstream_failed', 'skipped'))
           = (finished_at is not null)),
  add constraint tasks_trigger_rule_is_known
    check (trigger_rule in ('all_success', 'all_done', 'one_failed')),
  add constraint tasks_parents_pending_must_be_between_0_and_parents
    check (parents_pending between 0 and parents and children >= 0),
  add constraint tasks_blocked_task_must_have_pending_parents
    check (state <> 'blocked' or parents_pending > 0);

-- The rule keeps its expression; its name now says what it allows besides blocked and waiting.
alter table sked.tasks rename constraint tasks_unstarted_task_must_be_blocked_waiting_or_cancelled
  to tasks_unstarted_task_must_not_be_running_retry_succeeded_failed;

-- A workflow's tasks: its page in the API, and "is any task of it unfinished?" when one of
-- them ends (an index probe by state). Tasks outside workflows have no entry.
create index tasks_workflow on sked.tasks (workflow_id, state) where workflow_id is not null;
