// The errors of the client: a database error is mapped by its SQLSTATE class to a typed
// error that keeps the SQLSTATE, the constraint (sked names each rule as the constraint of
// the error it raises) and the message; awaiting adds its own timeout and misuse errors.

/** The fields of a PostgreSQL error that a sked error carries. */
export interface SkedErrorFields {
  /** The SQLSTATE, e.g. `23514`; undefined for an error the client raises itself. */
  sqlstate?: string | undefined;
  /** The constraint, which names the rule broken, e.g. `tasks_command_must_not_be_empty`. */
  constraint?: string | undefined;
  detail?: string | undefined;
  hint?: string | undefined;
  schema?: string | undefined;
  table?: string | undefined;
  column?: string | undefined;
  cause?: unknown;
}

/** The base class of every error this client throws about sked. */
export class SkedError extends Error {
  readonly sqlstate: string | undefined;
  readonly constraint: string | undefined;
  readonly detail: string | undefined;
  readonly hint: string | undefined;
  readonly schema: string | undefined;
  readonly table: string | undefined;
  readonly column: string | undefined;

  constructor(message: string, fields: SkedErrorFields = {}) {
    super(message, fields.cause === undefined ? undefined : { cause: fields.cause });
    this.name = new.target.name;
    this.sqlstate = fields.sqlstate;
    this.constraint = fields.constraint;
    this.detail = fields.detail;
    this.hint = fields.hint;
    this.schema = fields.schema;
    this.table = fields.table;
    this.column = fields.column;
  }
}

/**
 * No such task, workflow or schedule: SQLSTATE `P0002` (`no_data_found`, raised by
 * `sked.task_await` and `sked.workflow_await`), or a function or query that found no row
 * (then `sqlstate` is undefined).
 */
export class NotFoundError extends SkedError {}

/**
 * A value sked refuses: SQLSTATE class `22` (data exception, e.g. `22023`
 * `invalid_parameter_value`) and class `23` (integrity constraint violation, e.g. `23514`
 * `check_violation`) except `23505`. `constraint` names the rule.
 */
export class ValidationError extends SkedError {}

/**
 * A conflict with what the database holds: SQLSTATE `23505` (`unique_violation`), e.g. an
 * idempotency key that names a task with another definition
 * (`tasks_idempotency_key_names_another_definition`), or `23P01` (`exclusion_violation`).
 */
export class ConflictError extends SkedError {}

/** Refused by the database's rights or row-level security: SQLSTATE `42501`. */
export class PermissionDeniedError extends SkedError {}

/** An await whose timeout passed before the task or workflow reached a final state. */
export class AwaitTimeoutError extends SkedError {
  /** `task` or `workflow`. */
  readonly kind: 'task' | 'workflow';
  readonly id: string;
  /** The state last read, which is not final. */
  readonly state: string | undefined;
  /** The timeout, in milliseconds. */
  readonly timeout: number;

  constructor(kind: 'task' | 'workflow', id: string, state: string | undefined, timeout: number) {
    super(`${kind} ${id} did not finish within ${timeout} ms (last state: ${state ?? 'unknown'})`);
    this.kind = kind;
    this.id = id;
    this.state = state;
    this.timeout = timeout;
  }
}

/**
 * An await on a connection that is inside a transaction: the wait is registered and
 * LISTENed on only when the transaction commits, and a transaction held open while waiting
 * would hold back vacuum. Await on a connection of its own, in autocommit.
 */
export class AwaitInTransactionError extends SkedError {}

/** Whether `err` is an error PostgreSQL sent (node-postgres' DatabaseError). */
function isDatabaseError(err: unknown): err is Error & {
  code: string;
  severity?: string;
  constraint?: string;
  detail?: string;
  hint?: string;
  schema?: string;
  table?: string;
  column?: string;
} {
  if (!(err instanceof Error)) return false;
  const { code, severity } = err as { code?: unknown; severity?: unknown };
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) && typeof severity === 'string';
}

/** The error class of a SQLSTATE. */
function errorClass(sqlstate: string): typeof SkedError {
  if (sqlstate === 'P0002') return NotFoundError;
  if (sqlstate === '23505' || sqlstate === '23P01') return ConflictError;
  if (sqlstate.startsWith('22') || sqlstate.startsWith('23')) return ValidationError;
  if (sqlstate === '42501') return PermissionDeniedError;
  return SkedError;
}

/**
 * Maps an error PostgreSQL sent to the sked error of its SQLSTATE class, keeping it as the
 * cause; any other error (a lost connection, a programming error) is returned as it is.
 */
export function mapError(err: unknown): unknown {
  if (!isDatabaseError(err)) return err;
  const Class = errorClass(err.code);
  return new Class(err.message, {
    sqlstate: err.code,
    constraint: err.constraint,
    detail: err.detail,
    hint: err.hint,
    schema: err.schema,
    table: err.table,
    column: err.column,
    cause: err,
  });
}
