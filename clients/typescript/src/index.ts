// @sked/client: a typed layer over sked's SQL contract (docs/sql.md) for node-postgres.
// Every function takes a connection (a pg Client or PoolClient) and runs one documented SQL
// function or one query on a documented table or view; it maps types and errors only.

export {
  submit,
  submitMany,
  getTask,
  getTaskRow,
  getLogs,
  cancelTask,
  retryTask,
  resubmitTask,
} from './tasks.js';
export type { SubmitOptions, LogsOptions } from './tasks.js';

export { submitWorkflow, getWorkflow, getWorkflowRow, cancelWorkflow, retryWorkflow } from './workflows.js';

export { awaitTask, awaitWorkflow } from './await.js';
export type { AwaitOptions } from './await.js';

export {
  createSchedule,
  getSchedule,
  listSchedules,
  getScheduleRuns,
  pauseSchedule,
  resumeSchedule,
  runScheduleNow,
  deleteSchedule,
} from './schedules.js';
export type { ListSchedulesOptions } from './schedules.js';

export {
  SkedError,
  NotFoundError,
  ValidationError,
  ConflictError,
  PermissionDeniedError,
  AwaitTimeoutError,
  AwaitInTransactionError,
  mapError,
} from './errors.js';
export type { SkedErrorFields } from './errors.js';

export type {
  Attempt,
  AttemptOutcome,
  Duration,
  Edge,
  Json,
  LogLine,
  Schedule,
  ScheduleRun,
  ScheduleSpec,
  ScheduleTaskTemplate,
  Submitted,
  Task,
  TaskKind,
  TaskSpec,
  TaskState,
  TaskWithAttempts,
  TriggerRule,
  Workflow,
  WorkflowSpec,
  WorkflowState,
  WorkflowTaskSpec,
  WorkflowWithTasks,
} from './types.js';
