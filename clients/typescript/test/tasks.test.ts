// Tests of submitting and inspecting tasks: transactions, bulk and idempotent submission,
// validation errors, attempts, logs and retry, against a migrated database with a worker.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import type pg from 'pg';

import {
  awaitTask,
  cancelTask,
  ConflictError,
  getLogs,
  getTask,
  NotFoundError,
  retryTask,
  submit,
  submitMany,
  ValidationError,
} from '../src/index.js';
import { connect, delayed, exiting, printing, TEST_TIMEOUT, unique } from './helpers.js';

let client: pg.Client;

before(async () => {
  client = await connect();
});

after(async () => {
  await client.end();
});

describe('submit', { timeout: TEST_TIMEOUT }, () => {
  test('a task submitted in a transaction that rolls back does not exist', async () => {
    await client.query('begin');
    let id: string;
    try {
      ({ id } = await submit(client, printing({ n: 1 })));
    } finally {
      await client.query('rollback');
    }
    await assert.rejects(getTask(client, id), NotFoundError);
  });

  test('a delay counts from the commit of the submitting transaction', async () => {
    // 2 s asked for 1.5 s into a transaction: due 2 s after COMMIT, not 0.5 s.
    await client.query('begin');
    let id: string;
    try {
      await client.query('select pg_sleep(1.5)');
      ({ id } = await submit(client, { command: ['true'], queue: unique('q'), delay: 2000 }));
    } catch (e) {
      await client.query('rollback');
      throw e;
    }
    const clock = async (): Promise<number> =>
      (await client.query<{ t: Date }>('select clock_timestamp() as t')).rows[0]!.t.getTime();
    const before = await clock();
    await client.query('commit');
    const after = await clock();
    const task = await getTask(client, id);
    const due = task.nextRunAt!.getTime();
    assert.ok(
      due >= before + 2000 - 1 && due <= after + 2000 + 1,
      `due ${due - before} ms after the commit began, for a 2 s delay`,
    );
  });

  test('a task submitted in a transaction that commits runs', async () => {
    await client.query('begin');
    let id: string;
    try {
      ({ id } = await submit(client, { command: ['sh', '-c', 'echo "{\\"n\\": 1}"'] }));
      await client.query('commit');
    } catch (err) {
      await client.query('rollback');
      throw err;
    }
    const task = await awaitTask(client, id, { timeout: 15_000 });
    assert.equal(task.state, 'succeeded');
    assert.deepEqual(task.output, { n: 1 }, 'the output is the JSON of the last stdout line');
    assert.equal(task.exitCode, 0);
    assert.ok(task.finishedAt instanceof Date);
  });

  test('fields are sent under their SQL names, durations as milliseconds', async () => {
    const key = unique('fields');
    const runAt = new Date(Date.now() + 24 * 3600 * 1000);
    const { id } = await submit(client, {
      command: ['true'],
      args: ['a', 'b'],
      queue: 'default',
      priority: 7,
      input: { hello: ['world'] },
      env: { GREETING: 'hi' },
      runAt,
      delay: 1500,
      maxAttempts: 5,
      timeout: '2 minutes',
      idempotencyKey: key,
      labels: [],
      backoffBase: 250,
      backoffMax: 60_000,
      fields: { output_path: 'ignored-because-outputPath-wins', run_as: 'nobody' },
      outputPath: 'out.json',
    });
    try {
      const task = await getTask(client, id);
      assert.deepEqual(task.args, ['a', 'b']);
      assert.equal(task.priority, 7);
      assert.deepEqual(task.input, { hello: ['world'] });
      assert.deepEqual(task.env, { GREETING: 'hi' });
      assert.equal(task.nextRunAt.getTime(), runAt.getTime() + 1500, 'next_run_at is run_at plus delay');
      assert.equal(task.maxAttempts, 5);
      assert.equal(task.timeout, 120_000);
      assert.equal(task.backoffBase, 250);
      assert.equal(task.backoffMax, 60_000);
      assert.equal(task.idempotencyKey, key);
      assert.equal(task.outputPath, 'out.json', 'a field named in the spec wins over `fields`');
      assert.equal(task.runAs, 'nobody', 'other fields pass through `fields`');
      assert.equal(task.state, 'waiting');
      assert.deepEqual(task.attempts, []);
    } finally {
      await cancelTask(client, id);
    }
  });

  test('bulk submit returns the ids in input order, all new', async () => {
    const submitted = await submitMany(client, [
      printing({ i: 0 }),
      { kind: 'noop' },
      printing({ i: 2 }),
    ]);
    assert.equal(submitted.length, 3);
    assert.equal(new Set(submitted.map((s) => s.id)).size, 3);
    const tasks = [];
    for (const s of submitted) tasks.push(await getTask(client, s.id));
    assert.deepEqual(
      tasks.map((t) => t.kind),
      ['command', 'noop', 'command'],
    );
    const first = await awaitTask(client, submitted[0]!.id, { timeout: 15_000 });
    const last = await awaitTask(client, submitted[2]!.id, { timeout: 15_000 });
    assert.deepEqual([first.output, last.output], [{ i: 0 }, { i: 2 }]);
  });

  test('bulk submit is all or nothing', async () => {
    const key = unique('bulk');
    await assert.rejects(
      submitMany(client, [printing({ ok: true }, { idempotencyKey: key }), { command: [] }]),
      (err: unknown) => err instanceof ValidationError && err.constraint === 'tasks_command_must_not_be_empty',
    );
    const { rows } = await client.query('select count(*)::int as n from sked.tasks where idempotency_key = $1', [key]);
    assert.equal(rows[0].n, 0, 'a rejected batch inserts nothing');
  });
});

// Idempotency keys (docs/sql.md, "Idempotency keys"): sked.tasks_submit answers a key with
// the task it names, finished or not (`created` false), and refuses another definition
// (23505, tasks_idempotency_key_names_another_definition).
describe('idempotent submit (created)', { timeout: TEST_TIMEOUT }, () => {
  test('tasks without an idempotency key are created', async () => {
    const submitted = await submitMany(client, [{ kind: 'noop' }, { kind: 'noop' }]);
    assert.deepEqual(
      submitted.map((s) => s.created),
      [true, true],
    );
  });

  test('the same key returns the same id, created true then false, also after the task finished', async () => {
    const spec = printing({ once: true }, { idempotencyKey: unique('idem') });
    const first = await submit(client, spec);
    assert.equal(first.created, true, 'the first submission creates the task');
    const again = await submit(client, spec);
    assert.deepEqual(again, { id: first.id, created: false }, 'the same key and definition name the task');

    const task = await awaitTask(client, first.id, { timeout: 15_000 });
    assert.equal(task.state, 'succeeded');
    const afterDone = await submit(client, spec);
    assert.deepEqual(afterDone, { id: first.id, created: false }, 'the key still names the finished task');
  });

  test('the same key with another definition is a ConflictError', async () => {
    const key = unique('idem-conflict');
    const { id } = await submit(client, delayed({ idempotencyKey: key }));
    try {
      const another = delayed({ idempotencyKey: key, command: ['sh', '-c', 'exit 0'] });
      await assert.rejects(submit(client, another), (err: unknown) => {
        assert.ok(err instanceof ConflictError, `expected a ConflictError, got ${String(err)}`);
        assert.equal(err.sqlstate, '23505');
        assert.equal(err.constraint, 'tasks_idempotency_key_names_another_definition');
        return true;
      });
    } finally {
      await cancelTask(client, id);
    }
  });
});

describe('validation', { timeout: TEST_TIMEOUT }, () => {
  test('an empty command is a ValidationError naming the rule', async () => {
    await assert.rejects(submit(client, { command: [] }), (err: unknown) => {
      assert.ok(err instanceof ValidationError, `expected a ValidationError, got ${String(err)}`);
      assert.equal(err.sqlstate, '23514');
      assert.equal(err.constraint, 'tasks_command_must_not_be_empty');
      assert.match(err.message, /command must be a non-empty array/);
      return true;
    });
  });

  test('a check constraint is a ValidationError naming it', async () => {
    await assert.rejects(submit(client, { command: ['true'], maxAttempts: 0 }), (err: unknown) => {
      assert.ok(err instanceof ValidationError);
      assert.equal(err.sqlstate, '23514');
      assert.equal(err.constraint, 'tasks_max_attempts_must_be_at_least_1');
      return true;
    });
  });

  test('a bad interval is a ValidationError', async () => {
    await assert.rejects(submit(client, { command: ['true'], timeout: 'soon' }), (err: unknown) => {
      assert.ok(err instanceof ValidationError);
      assert.match(err.sqlstate ?? '', /^22/);
      return true;
    });
  });

  test('a duration that is not a finite number is refused before it is sent', async () => {
    await assert.rejects(submit(client, { command: ['true'], delay: Number.NaN }), TypeError);
  });
});

describe('inspect and act', { timeout: TEST_TIMEOUT }, () => {
  test('get returns the task with every attempt', async () => {
    const { id } = await submit(client, {
      command: ['sh', '-c', 'if [ "$SKED_ATTEMPT" -ge 2 ]; then echo \'{"attempt": 2}\'; else exit 5; fi'],
      maxAttempts: 3,
      backoffBase: 100,
    });
    const done = await awaitTask(client, id, { timeout: 15_000 });
    assert.equal(done.state, 'succeeded');
    const task = await getTask(client, id);
    assert.equal(task.attempt, 2);
    assert.deepEqual(task.output, { attempt: 2 });
    assert.deepEqual(
      task.attempts.map((a) => [a.attempt, a.outcome, a.exitCode]),
      [
        [1, 'failed', 5],
        [2, 'succeeded', 0],
      ],
    );
    for (const attempt of task.attempts) {
      assert.equal(attempt.taskId, id);
      assert.ok(attempt.startedAt instanceof Date && attempt.finishedAt instanceof Date);
    }
  });

  test('get of a task that does not exist is a NotFoundError', async () => {
    await assert.rejects(getTask(client, '00000000-0000-0000-0000-000000000000'), NotFoundError);
  });

  test('logs are read in order, after a cursor', async () => {
    const { id } = await submit(client, { command: ['sh', '-c', 'echo out1; echo err1 >&2; echo out2'] });
    await awaitTask(client, id, { timeout: 15_000 });
    const logs = await getLogs(client, id);
    const text = (stream: string): string =>
      logs
        .filter((l) => l.stream === stream)
        .map((l) => l.data)
        .join('');
    assert.equal(text('stdout'), 'out1\nout2\n');
    assert.equal(text('stderr'), 'err1\n');
    assert.ok(logs.every((l) => l.taskId === id && l.attempt === 1 && l.at instanceof Date));
    const ids = logs.map((l) => BigInt(l.id));
    assert.deepEqual(
      ids,
      [...ids].sort((a, b) => (a < b ? -1 : 1)),
      'chunks come in the order they were written',
    );
    assert.deepEqual(await getLogs(client, id, { after: logs.at(-1)!.id }), [], 'nothing after the last chunk');
    assert.equal((await getLogs(client, id, { after: logs[0]!.id })).length, logs.length - 1);
  });

  test('retry runs a failed task again', async () => {
    const { id } = await submit(client, exiting(3));
    const failed = await awaitTask(client, id, { timeout: 15_000 });
    assert.equal(failed.state, 'failed');
    assert.equal(failed.exitCode, 3);

    assert.equal(await retryTask(client, id), 'waiting');
    const again = await awaitTask(client, id, { timeout: 15_000 });
    assert.equal(again.state, 'failed');
    const task = await getTask(client, id);
    assert.deepEqual(
      task.attempts.map((a) => [a.attempt, a.outcome, a.exitCode]),
      [
        [1, 'failed', 3],
        [2, 'failed', 3],
      ],
    );
  });

  test('cancel and retry of a task that does not exist are NotFoundErrors', async () => {
    const missing = '00000000-0000-0000-0000-000000000000';
    await assert.rejects(cancelTask(client, missing), NotFoundError);
    await assert.rejects(retryTask(client, missing), NotFoundError);
  });
});
