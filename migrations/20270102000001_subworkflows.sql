-- Sub-workflows (docs/workflows.md, "Sub-workflows"): a workflow task of kind `workflow` runs
-- another workflow, given inline or as a stored definition, instead of a command. When it is
-- released its sub-workflow is submitted (a row of sked.workflows naming the task), the task
-- waits `blocked` while it runs (as a map waits for its instances), and it ends with the
-- sub-workflow's state. A running task may also add such a task to its own workflow
-- (sked.task_spawn).

alter table sked.tasks
  -- On a task of kind `workflow`: what it runs, `{"tasks": [...], "params": ...}` or
  -- `{"definition": "<name>", "version": N, "params": ...}`.
  add column subworkflow jsonb;

alter table sked.workflows
  -- The task of kind `workflow` that runs this workflow as its sub-workflow (null: submitted).
  add column parent_task_id uuid;

-- A task's sub-workflows, newest first; only sub-workflows are in it.
create index workflows_by_parent_task on sked.workflows (parent_task_id, id)
  where parent_task_id is not null;

-- Checked on the rows already there without holding off writers for the scan.
alter table sked.tasks
  drop constraint tasks_kind_is_known,
  add constraint tasks_kind_is_known
    check (kind in ('command', 'noop', 'sleep', 'service', 'webhook', 'workflow')) not valid,
  -- A task of kind `workflow` says what it runs, in a workflow; no other task does.
  add constraint tasks_subworkflow_iff_kind_workflow
    check ((kind = 'workflow') = (subworkflow is not null)) not valid,
  add constraint tasks_subworkflow_needs_a_workflow
    check (subworkflow is null or workflow_id is not null) not valid,
  -- A sub-workflow task that started waits for its sub-workflow, not for parents.
  drop constraint tasks_blocked_task_must_have_pending_parents,
  add constraint tasks_blocked_task_must_have_pending_parents
    check (state <> 'blocked' or parents_pending > 0 or (kind = 'workflow' and attempt > 0))
    not valid;
alter table sked.tasks validate constraint tasks_kind_is_known;
alter table sked.tasks validate constraint tasks_subworkflow_iff_kind_workflow;
alter table sked.tasks validate constraint tasks_subworkflow_needs_a_workflow;
alter table sked.tasks validate constraint tasks_blocked_task_must_have_pending_parents;
alter table sked.tasks
  add constraint tasks_subworkflow_must_be_an_object
    check (jsonb_typeof(subworkflow) = 'object') not valid;
alter table sked.tasks validate constraint tasks_subworkflow_must_be_an_object;
