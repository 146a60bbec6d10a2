// What every operation shares: running a statement with errors mapped, turning specs into the
// JSON objects sked's functions take, and turning rows into the client's types.

import type { ClientBase } from 'pg';

import { mapError, NotFoundError } from './errors.js';
import type {
  Attempt,
  Duration,
  Json,
  LogLine,
  Schedule,
  ScheduleRun,
  Task,
  TaskSpec,
  Workflow,
  WorkflowSpec,
  WorkflowTaskSpec,
} from './types.js';

/** A row as node-postgres returns it. */
export type Row = Record<string, any>;

/** Runs one statement on `client` and returns its rows; database errors become sked errors. */
export async function query(client: ClientBase, text: string, values: unknown[] = []): Promise<Row[]> {
  try {
    return (await client.query(text, values)).rows as Row[];
  } catch (err) {
    throw mapError(err);
  }
}

/** The first row of `rows`, or a NotFoundError saying `what` was not found. */
export function one(rows: Row[], what: string): Row {
  const row = rows[0];
  if (row === undefined) throw new NotFoundError(`no such ${what}`);
  return row;
}

/** A value that is null means "no such row" for the functions that answer null for it. */
export function found<T>(value: T | null | undefined, what: string): T {
  if (value === null || value === undefined) throw new NotFoundError(`no such ${what}`);
  return value;
}

// ---------------------------------------------------------------------------------------------
// Specs to JSON
// ---------------------------------------------------------------------------------------------

/** The SQL name of each field of a TaskSpec (the fields of `sked.task_fields()`). */
const TASK_FIELDS = {
  command: 'command',
  args: 'args',
  queue: 'queue',
  priority: 'priority',
  input: 'input',
  env: 'env',
  runAt: 'run_at',
  delay: 'delay',
  maxAttempts: 'max_attempts',
  timeout: 'timeout',
  owner: 'owner',
  idempotencyKey: 'idempotency_key',
  labels: 'labels',
  artifactUrl: 'artifact_url',
  artifactSha256: 'artifact_sha256',
  outputPath: 'output_path',
  kind: 'kind',
  backoffBase: 'backoff_base',
  backoffMax: 'backoff_max',
  shards: 'shards',
  broadcast: 'broadcast',
  cpuMillis: 'cpu_millis',
  memoryMb: 'memory_mb',
  maxOutputBytes: 'max_output_bytes',
  runAs: 'run_as',
  replicas: 'replicas',
  restartPolicy: 'restart_policy',
  healthCheck: 'health_check',
  preemptible: 'preemptible',
} as const satisfies Record<Exclude<keyof TaskSpec, 'fields'>, string>;

/** The fields whose values are durations (intervals). */
const DURATION_FIELDS: ReadonlySet<string> = new Set(['delay', 'timeout', 'backoffBase', 'backoffMax']);

/**
 * A duration as PostgreSQL interval text: a number of milliseconds becomes
 * `'<n> milliseconds'`; text is sent as it is.
 */
export function interval(value: Duration): string {
  if (typeof value === 'string') return value;
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    throw new TypeError(`a duration is a finite number of milliseconds or interval text, got ${String(value)}`);
  }
  return `${value} milliseconds`;
}

/** A time as text PostgreSQL reads as a timestamptz. */
function timestamp(value: Date | string): string {
  if (value instanceof Date) {
    if (Number.isNaN(value.getTime())) throw new TypeError('runAt is an invalid Date');
    return value.toISOString();
  }
  return value;
}

/**
 * The JSON object of a task for `sked.tasks_submit` (and a workflow's task, and a schedule's
 * template): each field given under its SQL name, durations as interval text, times as ISO
 * text; `fields` first, so that a field named in the spec wins.
 */
export function taskJson(spec: TaskSpec): Record<string, unknown> {
  const json: Record<string, unknown> = { ...(spec.fields ?? {}) };
  for (const [key, field] of Object.entries(TASK_FIELDS)) {
    const value = (spec as Record<string, unknown>)[key];
    if (value === undefined) continue;
    if (value === null) json[field] = null;
    else if (DURATION_FIELDS.has(key)) json[field] = interval(value as Duration);
    else if (key === 'runAt') json[field] = timestamp(value as Date | string);
    else json[field] = value;
  }
  return json;
}

/** The JSON object of a workflow's task for `sked.workflow_submit`. */
function workflowTaskJson(spec: WorkflowTaskSpec): Record<string, unknown> {
  const json = taskJson(spec);
  json.name = spec.name;
  if (spec.dependsOn !== undefined) json.depends_on = spec.dependsOn;
  if (spec.triggerRule !== undefined) json.trigger_rule = spec.triggerRule;
  return json;
}

/** The JSON spec of a workflow for `sked.workflow_submit`. */
export function workflowJson(spec: WorkflowSpec): Record<string, unknown> {
  const json: Record<string, unknown> = { tasks: spec.tasks.map(workflowTaskJson) };
  if (spec.name !== undefined) json.name = spec.name;
  return json;
}

// ---------------------------------------------------------------------------------------------
// Rows to types
// ---------------------------------------------------------------------------------------------

/** An interval column as a number of milliseconds (null stays null). */
function ms(column: string): string {
  return `(extract(epoch from ${column}) * 1000)::float8`;
}

/** A bigint that node-postgres returns as text, as a number. */
function num(value: unknown): number | null {
  return value === null || value === undefined ? null : Number(value);
}

/** The columns of `sked.tasks` (alias `t`) that toTask reads. */
export const TASK_COLUMNS = `t.id, t.owner, t.queue, t.priority, t.kind, t.command, t.args,
  t.artifact_url, t.artifact_sha256, t.input, t.env, t.labels, t.output_path,
  ${ms('t.timeout')} as timeout, t.max_attempts, ${ms('t.backoff_base')} as backoff_base,
  ${ms('t.backoff_max')} as backoff_max, t.idempotency_key, t.state, t.attempt, t.next_run_at,
  t.worker_id, t.lease_expires_at, t.cancel_requested_at, t.created_at, t.started_at,
  t.finished_at, t.exit_code, t.error, t.stdout_tail, t.stderr_tail, t.output_sha256, t.output,
  t.workflow_id, t.name, t.trigger_rule, t.parents, t.children, t.parents_pending,
  t.shard_total, t.shard_index, t.shard_of, t.broadcast, t.pinned_worker, t.cpu_millis,
  t.memory_mb, t.max_output_bytes, t.run_as, t.replicas, t.restart_policy, t.health_check,
  t.preemptible`;

export function toTask(r: Row): Task {
  return {
    id: r.id,
    owner: r.owner,
    queue: r.queue,
    priority: r.priority,
    kind: r.kind,
    command: r.command,
    args: r.args,
    artifactUrl: r.artifact_url,
    artifactSha256: r.artifact_sha256,
    input: r.input as Json | null,
    env: r.env,
    labels: r.labels,
    outputPath: r.output_path,
    timeout: r.timeout,
    maxAttempts: r.max_attempts,
    backoffBase: r.backoff_base,
    backoffMax: r.backoff_max,
    idempotencyKey: r.idempotency_key,
    state: r.state,
    attempt: r.attempt,
    nextRunAt: r.next_run_at,
    workerId: r.worker_id,
    leaseExpiresAt: r.lease_expires_at,
    cancelRequestedAt: r.cancel_requested_at,
    createdAt: r.created_at,
    startedAt: r.started_at,
    finishedAt: r.finished_at,
    exitCode: r.exit_code,
    error: r.error,
    stdoutTail: r.stdout_tail,
    stderrTail: r.stderr_tail,
    outputSha256: r.output_sha256,
    output: r.output as Json | null,
    workflowId: r.workflow_id,
    name: r.name,
    triggerRule: r.trigger_rule,
    parents: r.parents,
    children: r.children,
    parentsPending: r.parents_pending,
    shardTotal: r.shard_total,
    shardIndex: r.shard_index,
    shardOf: r.shard_of,
    broadcast: r.broadcast,
    pinnedWorker: r.pinned_worker,
    cpuMillis: r.cpu_millis,
    memoryMb: r.memory_mb,
    maxOutputBytes: num(r.max_output_bytes),
    runAs: r.run_as,
    replicas: r.replicas,
    restartPolicy: r.restart_policy,
    healthCheck: r.health_check as Json | null,
    preemptible: r.preemptible,
  };
}

/** The columns of `sked.task_attempt_history` (alias `a`) that toAttempt reads. */
export const ATTEMPT_COLUMNS = `a.task_id, a.attempt, a.worker_id, a.started_at, a.finished_at,
  a.outcome, a.exit_code, a.error, a.stdout_tail, a.stderr_tail`;

export function toAttempt(r: Row): Attempt {
  return {
    taskId: r.task_id,
    attempt: r.attempt,
    workerId: r.worker_id,
    startedAt: r.started_at,
    finishedAt: r.finished_at,
    outcome: r.outcome,
    exitCode: r.exit_code,
    error: r.error,
    stdoutTail: r.stdout_tail,
    stderrTail: r.stderr_tail,
  };
}

/** The columns of `sked.task_logs` (alias `l`) that toLogLine reads. */
export const LOG_COLUMNS = 'l.id, l.task_id, l.attempt, l.stream, l.at, l.data';

export function toLogLine(r: Row): LogLine {
  return {
    id: String(r.id),
    taskId: r.task_id,
    attempt: r.attempt,
    stream: r.stream,
    at: r.at,
    data: r.data,
  };
}

/** The columns of `sked.workflows` (alias `w`) that toWorkflow reads. */
export const WORKFLOW_COLUMNS = 'w.id, w.owner, w.name, w.state, w.created_at, w.finished_at';

export function toWorkflow(r: Row): Workflow {
  return {
    id: r.id,
    owner: r.owner,
    name: r.name,
    state: r.state,
    createdAt: r.created_at,
    finishedAt: r.finished_at,
  };
}

/** The columns of `sked.schedules` (alias `s`) that toSchedule reads. */
export const SCHEDULE_COLUMNS = `s.id, s.owner, s.name, s.cron, s.time_zone, s.task, s.workflow,
  s.misfire_policy, ${ms('s.misfire_grace')} as misfire_grace, s.catch_up_limit,
  s.overlap_policy, ${ms('s.jitter')} as jitter, s.history_limit, s.paused_at, s.next_run_at,
  s.last_fire_at, s.last_task_id, s.last_workflow_id, s.queued_fire_at, s.last_tick_at,
  s.created_at, s.updated_at`;

export function toSchedule(r: Row): Schedule {
  return {
    id: r.id,
    owner: r.owner,
    name: r.name,
    cron: r.cron,
    timeZone: r.time_zone,
    task: r.task,
    workflow: r.workflow,
    misfirePolicy: r.misfire_policy,
    misfireGrace: r.misfire_grace,
    catchUpLimit: r.catch_up_limit,
    overlapPolicy: r.overlap_policy,
    jitter: r.jitter,
    historyLimit: r.history_limit,
    pausedAt: r.paused_at,
    nextRunAt: r.next_run_at,
    lastFireAt: r.last_fire_at,
    lastTaskId: r.last_task_id,
    lastWorkflowId: r.last_workflow_id,
    queuedFireAt: r.queued_fire_at,
    lastTickAt: r.last_tick_at,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  };
}

/** The columns of `sked.schedule_runs` (alias `r`) that toScheduleRun reads. */
export const SCHEDULE_RUN_COLUMNS = `r.id, r.schedule_id, r.fire_at, r.outcome, r.task_id,
  r.workflow_id, r.missed_ticks, r.detail, r.recorded_at`;

export function toScheduleRun(r: Row): ScheduleRun {
  return {
    id: String(r.id),
    scheduleId: r.schedule_id,
    fireAt: r.fire_at,
    outcome: r.outcome,
    taskId: r.task_id,
    workflowId: r.workflow_id,
    missedTicks: r.missed_ticks,
    detail: r.detail,
    recordedAt: r.recorded_at,
  };
}
