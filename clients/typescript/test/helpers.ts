// Shared by the tests: connections to the database in DATABASE_URL (migrated, with a worker
// serving the queue `default`), unique names, and the tasks the tests submit.

import { randomUUID } from 'node:crypto';

import pg from 'pg';

import type { TaskSpec } from '../src/index.js';

/** The longest a single test may take, in milliseconds. */
export const TEST_TIMEOUT = 20_000;

/** A new connection to the database in DATABASE_URL. */
export async function connect(): Promise<pg.Client> {
  const url = process.env.DATABASE_URL;
  if (!url) throw new Error('DATABASE_URL must name a migrated sked database with a worker serving `default`');
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  return client;
}

/** A name no other test or run uses. */
export function unique(prefix: string): string {
  return `${prefix}-${randomUUID()}`;
}

/** A task whose output is the JSON document `output`, printed as its last stdout line. */
export function printing(output: unknown, extra: TaskSpec = {}): TaskSpec {
  const line = JSON.stringify(output).replaceAll("'", "'\\''");
  return { command: ['sh', '-c', `echo '${line}'`], ...extra };
}

/** A task that exits with `code`, once (no retries). */
export function exiting(code: number, extra: TaskSpec = {}): TaskSpec {
  return { command: ['sh', '-c', `exit ${code}`], maxAttempts: 1, ...extra };
}

/** A task due in an hour: it stays `waiting` for as long as a test lasts. */
export function delayed(extra: TaskSpec = {}): TaskSpec {
  return { command: ['true'], delay: 60 * 60 * 1000, ...extra };
}

/** Resolves once `check` resolves true, polling every 20 ms, or rejects after `ms`. */
export async function eventually(check: () => Promise<boolean>, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`not true within ${ms} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
