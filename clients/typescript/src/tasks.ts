// Tasks: submit one or many (`sked.tasks_submit`), read a task with its attempts
// (`sked.tasks`, `sked.task_attempt_history`) and its logs (`sked.task_logs`), cancel, retry
// and resubmit it (`sked.task_cancel`, `sked.task_retry`, `sked.task_resubmit`).
// Each function takes the caller's connection: a submission joins the caller's transaction.

import type { ClientBase } from 'pg';

import {
  ATTEMPT_COLUMNS,
  found,
  LOG_COLUMNS,
  one,
  query,
  TASK_COLUMNS,
  taskJson,
  toAttempt,
  toLogLine,
  toTask,
} from './db.js';
import type { LogLine, Submitted, Task, TaskSpec, TaskState, TaskWithAttempts } from './types.js';

/** Options of a submission. */
export interface SubmitOptions {
  /** The owner of tasks whose spec names none (`owner_`); the connection's role when left out. */
  owner?: string;
}

/**
 * Submits one task (`sked.tasks_submit`). Returns its id and whether it is new: with an
 * idempotency key that names a task with the same definition, that task's id and `created`
 * false; with one that names a task with another definition, a ConflictError.
 */
export async function submit(client: ClientBase, spec: TaskSpec, options: SubmitOptions = {}): Promise<Submitted> {
  const [submitted] = await submitMany(client, [spec], options);
  return submitted!;
}

/**
 * Submits many tasks in one statement, all or nothing (`sked.tasks_submit`). Returns their
 * ids and whether each is new, in the order of `specs`.
 */
export async function submitMany(
  client: ClientBase,
  specs: TaskSpec[],
  options: SubmitOptions = {},
): Promise<Submitted[]> {
  const tasks = JSON.stringify(specs.map(taskJson));
  const rows =
    options.owner === undefined
      ? await query(client, 'select s.id, s.created from sked.tasks_submit($1::jsonb) s', [tasks])
      : await query(client, 'select s.id, s.created from sked.tasks_submit($1::jsonb, $2) s', [
          tasks,
          options.owner,
        ]);
  return rows.map((r) => ({ id: r.id, created: r.created }));
}

/** The row of task `id` (`sked.tasks`), without its attempts; a NotFoundError when absent. */
export async function getTaskRow(client: ClientBase, id: string): Promise<Task> {
  const rows = await query(client, `select ${TASK_COLUMNS} from sked.tasks t where t.id = $1`, [id]);
  return toTask(one(rows, `task: ${id}`));
}

/**
 * Task `id` (`sked.tasks`) with every attempt, oldest first (`sked.task_attempt_history`);
 * a NotFoundError when absent.
 */
export async function getTask(client: ClientBase, id: string): Promise<TaskWithAttempts> {
  const task = await getTaskRow(client, id);
  const rows = await query(
    client,
    `select ${ATTEMPT_COLUMNS} from sked.task_attempt_history a where a.task_id = $1 order by a.attempt`,
    [id],
  );
  return { ...task, attempts: rows.map(toAttempt) };
}

/** Options of getLogs. */
export interface LogsOptions {
  /** Only chunks after this one (the `id` of the last LogLine read). */
  after?: string | number | bigint;
  /** Only chunks of this attempt. */
  attempt?: number;
  /** At most this many chunks; 1000 when left out. */
  limit?: number;
}

/**
 * The stdout and stderr of task `id` in chunks, in the order they were written
 * (`sked.task_logs`). Pass the last chunk's id as `after` to read what follows.
 */
export async function getLogs(client: ClientBase, id: string, options: LogsOptions = {}): Promise<LogLine[]> {
  const rows = await query(
    client,
    `select ${LOG_COLUMNS} from sked.task_logs l
      where l.task_id = $1 and ($2::bigint is null or l.id > $2::bigint)
        and ($3::integer is null or l.attempt = $3::integer)
      order by l.id limit $4`,
    [id, options.after === undefined ? null : String(options.after), options.attempt ?? null, options.limit ?? 1000],
  );
  return rows.map(toLogLine);
}

/**
 * Cancels task `id` (`sked.task_cancel`): a task that has not started ends `cancelled` at
 * once; a running one gets a cancel request (its worker stops it within a second). Returns
 * the state after the call (`cancelled`, `running`, or the final state it already had); a
 * NotFoundError when absent.
 */
export async function cancelTask(client: ClientBase, id: string): Promise<TaskState> {
  const rows = await query(client, 'select sked.task_cancel($1) as state', [id]);
  return found(rows[0]?.state, `task: ${id}`);
}

/**
 * Runs finished task `id` again (`sked.task_retry`). Returns its new state (`waiting`, or
 * `blocked` in a workflow), or the unchanged state of an unfinished task; a NotFoundError when
 * absent.
 */
export async function retryTask(client: ClientBase, id: string): Promise<TaskState> {
  const rows = await query(client, 'select sked.task_retry($1) as state', [id]);
  return found(rows[0]?.state, `task: ${id}`);
}

/**
 * Submits a new task with the definition of task `id` (`sked.task_resubmit`), for `owner`
 * (the connection's role when left out). Returns the new task's id; a NotFoundError when
 * absent.
 */
export async function resubmitTask(client: ClientBase, id: string, options: SubmitOptions = {}): Promise<string> {
  const rows =
    options.owner === undefined
      ? await query(client, 'select sked.task_resubmit($1) as id', [id])
      : await query(client, 'select sked.task_resubmit($1, $2) as id', [id, options.owner]);
  return found(rows[0]?.id, `task: ${id}`);
}
