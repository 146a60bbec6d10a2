// Tests of awaiting tasks: success, failure, cancel, timeout (listeners and LISTENs left
// behind none), renewal of the registration, and the errors of a misused await.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import type pg from 'pg';

import {
  AwaitInTransactionError,
  AwaitTimeoutError,
  awaitTask,
  cancelTask,
  NotFoundError,
  submit,
} from '../src/index.js';
import { connect, delayed, eventually, exiting, printing, TEST_TIMEOUT } from './helpers.js';

let client: pg.Client;
let other: pg.Client;

before(async () => {
  client = await connect();
  other = await connect();
});

after(async () => {
  await client.end();
  await other.end();
});

/** The channels `c`'s session LISTENs on. */
async function listening(c: pg.Client): Promise<string[]> {
  const { rows } = await c.query('select pg_listening_channels() as channel');
  return rows.map((r) => r.channel as string);
}

describe('awaitTask', { timeout: TEST_TIMEOUT }, () => {
  test('a task that succeeds returns its output, leaving no listener or LISTEN behind', async () => {
    const listeners = client.listenerCount('notification');
    const { id } = await submit(client, printing({ answer: 42 }));
    const task = await awaitTask(client, id, { timeout: 15_000 });
    assert.equal(task.id, id);
    assert.equal(task.state, 'succeeded');
    assert.deepEqual(task.output, { answer: 42 });
    assert.equal(client.listenerCount('notification'), listeners);
    assert.deepEqual(await listening(client), []);
  });

  test('a task that fails is returned with its exit code', async () => {
    const { id } = await submit(client, exiting(3));
    const task = await awaitTask(client, id, { timeout: 15_000 });
    assert.equal(task.state, 'failed');
    assert.equal(task.exitCode, 3);
    assert.equal(task.output, null);
  });

  test('a task cancelled while awaited wakes the waiter', async () => {
    const { id } = await submit(client, delayed());
    const awaited = awaitTask(client, id, { timeout: 15_000 });
    // Once the wait is registered, cancel the task from another session.
    await eventually(async () => (await other.query('select 1 from sked.awaits where id = $1', [id])).rowCount === 1);
    assert.equal(await cancelTask(other, id), 'cancelled');
    const task = await awaited;
    assert.equal(task.state, 'cancelled');
    assert.deepEqual(await listening(client), []);
  });

  test('an already finished task returns at once', async () => {
    const { id } = await submit(client, delayed());
    await cancelTask(client, id);
    const task = await awaitTask(client, id, { timeout: 1000 });
    assert.equal(task.state, 'cancelled');
  });

  test('a timeout rejects with AwaitTimeoutError and UNLISTENs', async () => {
    const listeners = client.listenerCount('notification');
    const { id } = await submit(client, delayed());
    try {
      const started = Date.now();
      await assert.rejects(awaitTask(client, id, { timeout: 300 }), (err: unknown) => {
        assert.ok(err instanceof AwaitTimeoutError, `expected an AwaitTimeoutError, got ${String(err)}`);
        assert.equal(err.id, id);
        assert.equal(err.kind, 'task');
        assert.equal(err.state, 'waiting');
        assert.equal(err.timeout, 300);
        return true;
      });
      assert.ok(Date.now() - started >= 290, 'the await lasted its timeout');
      await assert.rejects(awaitTask(client, id, { timeout: 0 }), AwaitTimeoutError, 'a timeout of 0 reads once');
      assert.equal(client.listenerCount('notification'), listeners, 'the listener is removed');
      assert.deepEqual(await listening(client), [], 'the channel is UNLISTENed');
    } finally {
      await cancelTask(client, id);
    }
  });

  test('a wait longer than its registration registers again', async () => {
    const { id } = await submit(client, { command: ['sh', '-c', 'sleep 2; echo \'{"slept": 2}\''] });
    const task = await awaitTask(client, id, { timeout: 15_000, registerFor: 600 });
    assert.equal(task.state, 'succeeded');
    assert.deepEqual(task.output, { slept: 2 });
  });

  test('an abort signal ends the wait', async () => {
    const { id } = await submit(client, delayed());
    try {
      const controller = new AbortController();
      const awaited = awaitTask(client, id, { signal: controller.signal });
      setTimeout(() => controller.abort(new Error('stop waiting')), 100);
      await assert.rejects(awaited, /stop waiting/);
      assert.deepEqual(await listening(client), []);
    } finally {
      await cancelTask(client, id);
    }
  });

  test('a task that does not exist is a NotFoundError (P0002)', async () => {
    await assert.rejects(awaitTask(client, '00000000-0000-0000-0000-000000000000'), (err: unknown) => {
      assert.ok(err instanceof NotFoundError);
      assert.equal(err.sqlstate, 'P0002');
      return true;
    });
  });

  test('awaiting inside a transaction is refused', async () => {
    const { id } = await submit(client, delayed());
    await client.query('begin');
    try {
      await assert.rejects(awaitTask(client, id, { timeout: 1000 }), AwaitInTransactionError);
    } finally {
      await client.query('rollback');
      await cancelTask(client, id);
    }
  });
});
