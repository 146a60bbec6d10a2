// Awaiting a task or a workflow without polling (docs/sql.md, "Awaiting a result"):
// `sked.task_await` / `sked.workflow_await` read the state and, while it is not final,
// register the wait and LISTEN on the id's channel (`sked.task_channel`,
// `sked.workflow_channel`) in this session; the client then waits for the notification,
// calling the function again before the registration lapses, and UNLISTENs at the end.
//
// The connection must not be inside a transaction: the registration and the LISTEN take
// effect at commit, and a transaction held open while waiting would hold back vacuum. Use a
// connection of its own (a Client, or a PoolClient kept for the wait), in autocommit.

import type { ClientBase, Notification } from 'pg';

import { interval, query } from './db.js';
import { AwaitInTransactionError, AwaitTimeoutError, mapError, SkedError } from './errors.js';
import { getTaskRow } from './tasks.js';
import type { Task, Workflow } from './types.js';
import { getWorkflowRow } from './workflows.js';

/** Options of awaitTask and awaitWorkflow. */
export interface AwaitOptions {
  /**
   * The most milliseconds to wait; past it the promise rejects with an AwaitTimeoutError.
   * Without it, the wait lasts until the task or workflow finishes.
   */
  timeout?: number;
  /** Aborts the wait: the promise rejects with the signal's reason. */
  signal?: AbortSignal;
  /**
   * How long each registration of the wait lasts, in milliseconds (the `for` of
   * `sked.task_await`: more than 0, at most a day); the client registers again when half of
   * it has passed, which also reads the state again. 10 minutes when left out.
   */
  registerFor?: number;
}

const DEFAULT_REGISTER_FOR = 10 * 60 * 1000;

/** The statement that registers a wait and names its channel, for each kind. */
const AWAIT_SQL = {
  task: `select a.state, a.finished, sked.task_channel($1::uuid) as channel
           from sked.task_await($1::uuid, true, $2::interval) a`,
  workflow: `select a.state, a.finished, sked.workflow_channel($1::uuid) as channel
               from sked.workflow_await($1::uuid, true, $2::interval) a`,
} as const;

/**
 * Waits until task `id` reaches a final state (`succeeded`, `failed`, `cancelled`,
 * `upstream_failed`, `skipped`) and returns its row: a failed task is returned, not thrown.
 * Rejects with an AwaitTimeoutError when `timeout` passes first, a NotFoundError when there is
 * no such task, and an AwaitInTransactionError when `client` is inside a transaction.
 */
export async function awaitTask(client: ClientBase, id: string, options: AwaitOptions = {}): Promise<Task> {
  await awaitFinal(client, 'task', id, options);
  return getTaskRow(client, id);
}

/**
 * Waits until workflow `id` reaches a final state (`succeeded`, `failed`, `cancelled`) and
 * returns its row (getWorkflow reads its tasks). Rejects as awaitTask does.
 */
export async function awaitWorkflow(client: ClientBase, id: string, options: AwaitOptions = {}): Promise<Workflow> {
  await awaitFinal(client, 'workflow', id, options);
  return getWorkflowRow(client, id);
}

/** Returns once `id` is in a final state, having UNLISTENed and removed its listeners. */
async function awaitFinal(
  client: ClientBase,
  kind: 'task' | 'workflow',
  id: string,
  options: AwaitOptions,
): Promise<void> {
  const status = typeof client.getTransactionStatus === 'function' ? client.getTransactionStatus() : null;
  if (status === 'T' || status === 'E') {
    throw new AwaitInTransactionError(
      `awaiting ${kind} ${id} needs a connection that is not inside a transaction ` +
        '(the wait is registered and LISTENed on at commit); await on a connection of its own, in autocommit',
    );
  }
  const { timeout, signal } = options;
  if (timeout !== undefined && !(Number.isFinite(timeout) && timeout >= 0)) {
    throw new TypeError(`timeout must be a finite number of milliseconds, at least 0, got ${String(timeout)}`);
  }
  const registerFor = options.registerFor ?? DEFAULT_REGISTER_FOR;
  signal?.throwIfAborted();
  const deadline = timeout === undefined ? Infinity : Date.now() + timeout;

  // Notifications are collected from before the first call, so that one delivered while a
  // call runs is not missed; the channel's name is known once the first call answered.
  const received = new Set<string>();
  let channel: string | undefined;
  let wake: (() => void) | undefined;
  const onNotification = (message: Notification): void => {
    received.add(message.channel);
    wake?.();
  };
  client.on('notification', onNotification);

  let listening = false;
  let failed = false;
  let state: string | undefined;
  try {
    for (;;) {
      // Registered for a little longer than the wait can last, so that it never lapses first.
      const registered = Math.min(registerFor, Math.max(0, deadline - Date.now()) + 1000);
      const rows = await query(client, AWAIT_SQL[kind], [id, interval(registered)]);
      const row = rows[0]!;
      state = row.state;
      channel = row.channel as string;
      if (row.finished) return;
      listening = true;
      if (Date.now() >= deadline) throw new AwaitTimeoutError(kind, id, state, timeout!);
      if (received.delete(channel)) continue;
      // Until the notification, the renewal of the registration, or the deadline.
      await sleepUntilWoken(client, Math.min(registered / 2, deadline - Date.now()), signal, (wakeUp) => {
        wake = () => {
          if (received.has(channel!)) wakeUp();
        };
      });
      wake = undefined;
      received.delete(channel);
    }
  } catch (err) {
    failed = true;
    throw err;
  } finally {
    wake = undefined;
    client.removeListener('notification', onNotification);
    if (listening && channel !== undefined) {
      try {
        await client.query(`unlisten ${client.escapeIdentifier(channel)}`);
      } catch (err) {
        if (!failed) throw mapError(err);
      }
    }
  }
}

/**
 * Resolves after `ms` milliseconds or when `arm`'s wake-up is called; rejects when `signal`
 * aborts or the connection ends or fails meanwhile.
 */
function sleepUntilWoken(
  client: ClientBase,
  ms: number,
  signal: AbortSignal | undefined,
  arm: (wakeUp: () => void) => void,
): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const finish = (err?: unknown): void => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      client.removeListener('error', onError);
      client.removeListener('end', onEnd);
      if (err === undefined) resolve();
      else reject(err);
    };
    const onAbort = (): void => finish(signal!.reason);
    const onError = (err: Error): void => finish(err);
    const onEnd = (): void => finish(new SkedError('the connection ended while awaiting'));
    const timer = setTimeout(() => finish(), Math.max(0, ms));
    if (signal?.aborted) return finish(signal.reason);
    signal?.addEventListener('abort', onAbort, { once: true });
    client.on('error', onError);
    client.on('end', onEnd);
    arm(() => finish());
  });
}
