// Tests of schedules: create, list, pause, resume, run now, runs, delete, and their errors.
// Their cron names February 29th at midnight, so no tick fires while a test runs.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import type pg from 'pg';

import {
  awaitTask,
  ConflictError,
  createSchedule,
  deleteSchedule,
  getSchedule,
  getScheduleRuns,
  listSchedules,
  NotFoundError,
  pauseSchedule,
  resumeSchedule,
  runScheduleNow,
  ValidationError,
} from '../src/index.js';
import { connect, TEST_TIMEOUT, unique } from './helpers.js';

const NEVER_DURING_A_TEST = '0 0 29 2 *';

let client: pg.Client;

before(async () => {
  client = await connect();
});

after(async () => {
  await client.end();
});

describe('schedules', { timeout: TEST_TIMEOUT }, () => {
  test('created, listed, paused, resumed, run now and deleted', async () => {
    const name = unique('schedule');
    const id = await createSchedule(client, {
      name,
      cron: NEVER_DURING_A_TEST,
      timeZone: 'Europe/Berlin',
      task: { command: ['sh', '-c', 'echo \'{"scheduled": true}\''], timeout: 60_000 },
      misfireGrace: 30_000,
      overlapPolicy: 'allow',
    });
    try {
      const schedule = await getSchedule(client, id);
      assert.equal(schedule.name, name);
      assert.equal(schedule.cron, NEVER_DURING_A_TEST);
      assert.equal(schedule.timeZone, 'Europe/Berlin');
      assert.equal(schedule.overlapPolicy, 'allow');
      assert.equal(schedule.misfireGrace, 30_000);
      assert.deepEqual(schedule.task, { command: ['sh', '-c', 'echo \'{"scheduled": true}\''], timeout: '60000 milliseconds' });
      assert.equal(schedule.pausedAt, null);
      assert.ok(schedule.nextRunAt instanceof Date && schedule.nextRunAt.getTime() > Date.now());

      const listed = await listSchedules(client, { name });
      assert.deepEqual(
        listed.map((s) => s.id),
        [id],
      );

      await pauseSchedule(client, id);
      assert.ok((await getSchedule(client, id)).pausedAt instanceof Date, 'a paused schedule has paused_at');
      await resumeSchedule(client, id);
      assert.equal((await getSchedule(client, id)).pausedAt, null);

      const taskId = await runScheduleNow(client, id);
      const task = await awaitTask(client, taskId, { timeout: 15_000 });
      assert.equal(task.state, 'succeeded');
      assert.deepEqual(task.output, { scheduled: true });
      const runs = await getScheduleRuns(client, id);
      assert.deepEqual(
        runs.map((r) => [r.outcome, r.taskId]),
        [['manual', taskId]],
      );
    } finally {
      await deleteSchedule(client, id);
    }
    await assert.rejects(getSchedule(client, id), NotFoundError);
    await assert.rejects(deleteSchedule(client, id), NotFoundError);
    await assert.rejects(pauseSchedule(client, id), NotFoundError);
    await assert.rejects(resumeSchedule(client, id), NotFoundError);
    await assert.rejects(runScheduleNow(client, id), NotFoundError);
  });

  test('a schedule created paused', async () => {
    const id = await createSchedule(client, {
      name: unique('paused'),
      cron: NEVER_DURING_A_TEST,
      task: { kind: 'noop' },
      paused: true,
    });
    try {
      assert.ok((await getSchedule(client, id)).pausedAt instanceof Date);
    } finally {
      await deleteSchedule(client, id);
    }
  });

  test('a bad cron expression is a ValidationError naming the rule', async () => {
    await assert.rejects(
      createSchedule(client, { name: unique('bad-cron'), cron: '0 24 * * *', task: { kind: 'noop' } }),
      (err: unknown) => {
        assert.ok(err instanceof ValidationError, `expected a ValidationError, got ${String(err)}`);
        assert.equal(err.constraint, 'schedules_cron_must_be_valid');
        assert.match(err.message, /24 is out of range/);
        return true;
      },
    );
  });

  test('a name used already is a ConflictError', async () => {
    const name = unique('twice');
    const id = await createSchedule(client, { name, cron: NEVER_DURING_A_TEST, task: { kind: 'noop' } });
    try {
      await assert.rejects(
        createSchedule(client, { name, cron: NEVER_DURING_A_TEST, task: { kind: 'noop' } }),
        (err: unknown) => err instanceof ConflictError && err.sqlstate === '23505',
      );
    } finally {
      await deleteSchedule(client, id);
    }
  });
});
