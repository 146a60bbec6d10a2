// The types of the client: what a submission says (specs, with camelCase names for the fields
// of `sked.task_fields()`) and what reads return (rows of sked's tables and views).
// Timestamps are Dates, ids strings, durations numbers of milliseconds.

/**
 * A duration: a number of milliseconds, or a PostgreSQL interval as text (`'15 minutes'`,
 * `'1 day 02:00:00'`), sent as it is.
 */
export type Duration = number | string;

/** JSON a task reads (`input`) or keeps (`output`). */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** The states of a task (docs/state_machine.md). */
export type TaskState =
  | 'blocked'
  | 'waiting'
  | 'running'
  | 'retry'
  | 'succeeded'
  | 'failed'
  | 'cancelled'
  | 'upstream_failed'
  | 'skipped';

/** The states of a workflow. */
export type WorkflowState = 'running' | 'succeeded' | 'failed' | 'cancelled';

/** The kinds of a task: a command, a service, or the built-ins `noop` and `sleep`. */
export type TaskKind = 'command' | 'service' | 'noop' | 'sleep';

/** The trigger rules of a workflow's task (`on_failure` is an alias of `one_failed`). */
export type TriggerRule = 'all_success' | 'all_done' | 'one_failed' | 'on_failure';

/**
 * A task to submit: the fields of `sked.task_fields()` (docs/sql.md, "Submitting"), each
 * optional except what to run (`command`, or `artifactUrl` with `artifactSha256`, or a
 * built-in `kind`). A field left out or `null` takes the table's default.
 */
export interface TaskSpec {
  /** argv; no shell unless the command is itself `sh -c …`. */
  command?: string[] | null;
  /** Arguments appended to `command` or to the artifact. */
  args?: string[] | null;
  /** 1–64 characters of `[A-Za-z0-9_.:-]`; `default` when left out. */
  queue?: string | null;
  /** Higher runs first; 0 when left out. */
  priority?: number | null;
  /** Written to the process's stdin as one JSON document and a newline. */
  input?: Json | undefined;
  /** The process environment besides `PATH`, `HOME` and `SKED_*`. */
  env?: Record<string, string> | null;
  /** When the task is due (now when left out); `delay` is added to it. */
  runAt?: Date | string | null;
  /** Added to `runAt` (or now). */
  delay?: Duration | null;
  /** At least 1; 3 when left out. */
  maxAttempts?: number | null;
  /** Per attempt. */
  timeout?: Duration | null;
  /** The owner (the connection's role when left out). */
  owner?: string | null;
  /** Unique per owner: a second submission with the same key names the first task. */
  idempotencyKey?: string | null;
  /** The task runs only on a worker that has all of these labels. */
  labels?: string[] | null;
  /** An executable to run instead of `command`: `file:///…`, `http(s)://…` or `pg:<sha256>`. */
  artifactUrl?: string | null;
  /** The artifact's SHA-256, required with `artifactUrl`. */
  artifactSha256?: string | null;
  /** A file beneath the task's directory, stored as the output artifact after success. */
  outputPath?: string | null;
  kind?: TaskKind | null;
  /** Retry delay `least(backoffMax, backoffBase·2^(n−1))` plus jitter; 1 s when left out. */
  backoffBase?: Duration | null;
  /** 1 h when left out. */
  backoffMax?: Duration | null;
  /** Run as that many shard tasks (1–10,000; the column `shard_total`). */
  shards?: number | null;
  /** Run as one shard per live worker that serves the queue and has the labels. */
  broadcast?: boolean | null;
  /** CPU to reserve, in millicores. */
  cpuMillis?: number | null;
  /** Memory to reserve, in MB. */
  memoryMb?: number | null;
  /** The most bytes stdout and stderr may write together. */
  maxOutputBytes?: number | null;
  /** The user the process runs as: a name or a numeric uid. */
  runAs?: string | null;
  /** With kind `service`: copies to keep running. */
  replicas?: number | null;
  /** With kind `service`: `always` or `on_failure`. */
  restartPolicy?: 'always' | 'on_failure' | null;
  /** With kind `service`: `{"command": [...]}` or `{"http": "http://…"}`, and its timings. */
  healthCheck?: Json | undefined;
  /** The task may be stopped while it runs to make room for a copy of a service. */
  preemptible?: boolean | null;
  /**
   * Any other field of `sked.task_fields()`, by its SQL name, sent as it is (a key that is
   * not a field is ignored by sked). A field named above is taken from above.
   */
  fields?: Record<string, unknown>;
}

/** A task of a workflow: a task without idempotency key or service fields, and its place. */
export interface WorkflowTaskSpec
  extends Omit<TaskSpec, 'idempotencyKey' | 'replicas' | 'restartPolicy' | 'healthCheck'> {
  /** Unique in the workflow. */
  name: string;
  /** Names of tasks of this workflow that this one runs after. */
  dependsOn?: string[];
  /** When it runs after them; `all_success` when left out. */
  triggerRule?: TriggerRule;
}

/** A workflow to submit (docs/workflows.md). */
export interface WorkflowSpec {
  name?: string;
  tasks: WorkflowTaskSpec[];
}

/** What a submission returns for each task. */
export interface Submitted {
  /** The task's id: the new task's, or the task its idempotency key named. */
  id: string;
  /**
   * False when the idempotency key named a task that exists already with the same
   * definition (then `id` is that task's id); true for a new task.
   */
  created: boolean;
}

/** A row of `sked.tasks`. */
export interface Task {
  id: string;
  owner: string;
  queue: string;
  priority: number;
  kind: TaskKind;
  command: string[] | null;
  args: string[];
  artifactUrl: string | null;
  artifactSha256: string | null;
  input: Json | null;
  env: Record<string, string>;
  labels: string[];
  outputPath: string | null;
  /** Milliseconds. */
  timeout: number | null;
  maxAttempts: number;
  /** Milliseconds. */
  backoffBase: number;
  /** Milliseconds. */
  backoffMax: number;
  idempotencyKey: string | null;
  state: TaskState;
  /** The number of the latest attempt (0 before the first). */
  attempt: number;
  nextRunAt: Date;
  workerId: string | null;
  leaseExpiresAt: Date | null;
  cancelRequestedAt: Date | null;
  createdAt: Date;
  startedAt: Date | null;
  finishedAt: Date | null;
  exitCode: number | null;
  error: string | null;
  /** The last 4 KiB of stdout of the latest attempt. */
  stdoutTail: string | null;
  stderrTail: string | null;
  outputSha256: string | null;
  /** The JSON output of the last successful attempt (`$SKED_OUTPUT`, or the last stdout line). */
  output: Json | null;
  workflowId: string | null;
  /** The task's name in its workflow. */
  name: string | null;
  /** The trigger rule (`all_success`, `all_done`, `one_failed`), or `shards` for the parent of shards. */
  triggerRule: 'all_success' | 'all_done' | 'one_failed' | 'shards';
  parents: number;
  children: number;
  parentsPending: number;
  shardTotal: number | null;
  shardIndex: number | null;
  shardOf: string | null;
  broadcast: boolean;
  pinnedWorker: string | null;
  cpuMillis: number | null;
  memoryMb: number | null;
  maxOutputBytes: number | null;
  runAs: string | null;
  replicas: number | null;
  restartPolicy: 'always' | 'on_failure' | null;
  healthCheck: Json | null;
  preemptible: boolean;
}

/** How an attempt ended, or `running` while it runs. */
export type AttemptOutcome =
  | 'running'
  | 'succeeded'
  | 'failed'
  | 'timed_out'
  | 'cancelled'
  | 'worker_lost'
  | 'interrupted';

/** A row of `sked.task_attempt_history`: one attempt of a task. */
export interface Attempt {
  taskId: string;
  attempt: number;
  workerId: string | null;
  startedAt: Date;
  /** Null while it runs. */
  finishedAt: Date | null;
  outcome: AttemptOutcome;
  exitCode: number | null;
  error: string | null;
  stdoutTail: string | null;
  stderrTail: string | null;
}

/** A task with its attempts, oldest first. */
export interface TaskWithAttempts extends Task {
  attempts: Attempt[];
}

/** A chunk of a task's stdout or stderr: a row of `sked.task_logs`. */
export interface LogLine {
  /** Increasing; pass the last one seen as `after` to read what follows. */
  id: string;
  taskId: string;
  attempt: number;
  stream: 'stdout' | 'stderr';
  at: Date;
  data: string;
}

/** A row of `sked.workflows`. */
export interface Workflow {
  id: string;
  owner: string;
  name: string;
  state: WorkflowState;
  createdAt: Date;
  finishedAt: Date | null;
}

/** A dependency between two tasks: a row of `sked.task_edges`. */
export interface Edge {
  /** The task that runs after… */
  taskId: string;
  /** …this one. */
  dependsOn: string;
}

/** A workflow with its tasks (in submission order) and the dependencies between them. */
export interface WorkflowWithTasks extends Workflow {
  tasks: Task[];
  edges: Edge[];
}

/** The task template of a schedule: a task without `runAt`, `delay` and `owner`. */
export type ScheduleTaskTemplate = Omit<TaskSpec, 'runAt' | 'delay' | 'owner'>;

/** A schedule to create (docs/schedules.md): exactly one of `task` and `workflow`. */
export interface ScheduleSpec {
  name: string;
  /** A cron expression of 5 or 6 fields, or a macro such as `@daily`. */
  cron: string;
  task?: ScheduleTaskTemplate;
  workflow?: WorkflowSpec;
  /** An IANA time zone; `UTC` when left out. */
  timeZone?: string;
  misfirePolicy?: 'skip' | 'run_once' | 'catch_up';
  misfireGrace?: Duration;
  catchUpLimit?: number;
  overlapPolicy?: 'allow' | 'skip' | 'queue_one' | 'replace';
  jitter?: Duration;
  historyLimit?: number;
  /** Created paused. */
  paused?: boolean;
  owner?: string;
}

/** A row of `sked.schedules`. */
export interface Schedule {
  id: string;
  owner: string;
  name: string;
  cron: string;
  timeZone: string;
  /** The task template as stored (snake_case keys, as sked's functions take them). */
  task: Record<string, Json> | null;
  /** The workflow template as stored. */
  workflow: Record<string, Json> | null;
  misfirePolicy: string;
  /** Milliseconds. */
  misfireGrace: number;
  catchUpLimit: number;
  overlapPolicy: string;
  /** Milliseconds. */
  jitter: number;
  historyLimit: number;
  pausedAt: Date | null;
  nextRunAt: Date | null;
  lastFireAt: Date | null;
  lastTaskId: string | null;
  lastWorkflowId: string | null;
  queuedFireAt: Date | null;
  lastTickAt: Date | null;
  createdAt: Date;
  updatedAt: Date;
}

/** A row of `sked.schedule_runs`: one tick of a schedule, or a manual run. */
export interface ScheduleRun {
  id: string;
  scheduleId: string;
  fireAt: Date;
  outcome: 'fired' | 'queued' | 'skipped' | 'missed' | 'manual';
  taskId: string | null;
  workflowId: string | null;
  missedTicks: number;
  detail: string | null;
  recordedAt: Date;
}
