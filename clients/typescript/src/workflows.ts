// Workflows: submit (`sked.workflow_submit`), read a workflow with its tasks and edges
// (`sked.workflows`, `sked.tasks`, `sked.task_edges`), cancel and re-run from failed
// (`sked.workflow_cancel`, `sked.workflow_retry`).

import type { ClientBase } from 'pg';

import { found, one, query, TASK_COLUMNS, toTask, toWorkflow, WORKFLOW_COLUMNS, workflowJson } from './db.js';
import type { SubmitOptions } from './tasks.js';
import type { Workflow, WorkflowSpec, WorkflowState, WorkflowWithTasks } from './types.js';

/**
 * Submits a workflow: its tasks and the dependencies between them, all or nothing
 * (`sked.workflow_submit`). Returns the workflow's id.
 */
export async function submitWorkflow(
  client: ClientBase,
  spec: WorkflowSpec,
  options: SubmitOptions = {},
): Promise<string> {
  const json = JSON.stringify(workflowJson(spec));
  const rows =
    options.owner === undefined
      ? await query(client, 'select sked.workflow_submit($1::jsonb) as id', [json])
      : await query(client, 'select sked.workflow_submit($1::jsonb, $2) as id', [json, options.owner]);
  return rows[0]!.id;
}

/** The row of workflow `id` (`sked.workflows`); a NotFoundError when absent. */
export async function getWorkflowRow(client: ClientBase, id: string): Promise<Workflow> {
  const rows = await query(client, `select ${WORKFLOW_COLUMNS} from sked.workflows w where w.id = $1`, [id]);
  return toWorkflow(one(rows, `workflow: ${id}`));
}

/**
 * Workflow `id` with its tasks in submission order and the dependencies between them;
 * a NotFoundError when absent.
 */
export async function getWorkflow(client: ClientBase, id: string): Promise<WorkflowWithTasks> {
  const workflow = await getWorkflowRow(client, id);
  const tasks = await query(
    client,
    `select ${TASK_COLUMNS} from sked.tasks t where t.workflow_id = $1 order by t.id`,
    [id],
  );
  const edges = await query(
    client,
    `select e.task_id, e.depends_on from sked.task_edges e
       join sked.tasks t on t.id = e.task_id
      where t.workflow_id = $1
      order by e.task_id, e.depends_on`,
    [id],
  );
  return {
    ...workflow,
    tasks: tasks.map(toTask),
    edges: edges.map((r) => ({ taskId: r.task_id, dependsOn: r.depends_on })),
  };
}

/**
 * Cancels workflow `id` (`sked.workflow_cancel`): its tasks that have not started end
 * `cancelled`, running ones get a cancel request. Returns the workflow's state after the call;
 * a NotFoundError when absent.
 */
export async function cancelWorkflow(client: ClientBase, id: string): Promise<WorkflowState> {
  const rows = await query(client, 'select sked.workflow_cancel($1) as state', [id]);
  return found(rows[0]?.state, `workflow: ${id}`);
}

/**
 * Re-runs workflow `id` from where it failed (`sked.workflow_retry`): its failed and
 * cancelled tasks run again. Returns how many (0: nothing to re-run); a NotFoundError when
 * absent.
 */
export async function retryWorkflow(client: ClientBase, id: string): Promise<number> {
  const rows = await query(client, 'select sked.workflow_retry($1) as n', [id]);
  return found(rows[0]?.n, `workflow: ${id}`);
}
