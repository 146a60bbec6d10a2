// Tests of workflows: submit, await success and failure, read with tasks and edges, re-run
// and cancel.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import type pg from 'pg';

import {
  awaitWorkflow,
  cancelWorkflow,
  getWorkflow,
  NotFoundError,
  retryWorkflow,
  submitWorkflow,
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

describe('workflows', { timeout: TEST_TIMEOUT }, () => {
  test('a workflow that succeeds, with its tasks and edges', async () => {
    const name = unique('wf-ok');
    const id = await submitWorkflow(client, {
      name,
      tasks: [
        { name: 'extract', ...printing({ rows: 3 }) },
        {
          name: 'load',
          command: ['sh', '-c', 'cat "$SKED_PARENT_OUTPUTS"'],
          dependsOn: ['extract'],
        },
      ],
    });
    const workflow = await awaitWorkflow(client, id, { timeout: 15_000 });
    assert.equal(workflow.id, id);
    assert.equal(workflow.name, name);
    assert.equal(workflow.state, 'succeeded');
    assert.ok(workflow.finishedAt instanceof Date);

    const full = await getWorkflow(client, id);
    assert.deepEqual(
      full.tasks.map((t) => [t.name, t.state]),
      [
        ['extract', 'succeeded'],
        ['load', 'succeeded'],
      ],
    );
    const [extract, load] = full.tasks;
    assert.deepEqual(full.edges, [{ taskId: load!.id, dependsOn: extract!.id }]);
    assert.deepEqual(load!.output, { extract: { rows: 3 } }, 'a child reads its parents outputs');
  });

  test('a workflow whose task fails ends failed, and re-runs from failed', async () => {
    const id = await submitWorkflow(client, {
      name: unique('wf-fail'),
      tasks: [
        { name: 'first', ...exiting(1) },
        { name: 'second', ...printing({}), dependsOn: ['first'] },
        { name: 'alert', ...printing({ alerted: true }), dependsOn: ['first'], triggerRule: 'on_failure' },
      ],
    });
    const workflow = await awaitWorkflow(client, id, { timeout: 15_000 });
    assert.equal(workflow.state, 'failed');
    const full = await getWorkflow(client, id);
    assert.deepEqual(
      full.tasks.map((t) => [t.name, t.state]),
      [
        ['first', 'failed'],
        ['second', 'upstream_failed'],
        ['alert', 'succeeded'],
      ],
    );

    assert.equal(await retryWorkflow(client, id), 1, 'the failed task runs again');
    const again = await awaitWorkflow(client, id, { timeout: 15_000 });
    assert.equal(again.state, 'failed');
  });

  test('cancel ends a workflow cancelled', async () => {
    const id = await submitWorkflow(client, {
      name: unique('wf-cancel'),
      tasks: [
        { name: 'later', ...delayed() },
        { name: 'after', command: ['true'], dependsOn: ['later'] },
      ],
    });
    assert.equal(await cancelWorkflow(client, id), 'cancelled');
    const workflow = await awaitWorkflow(client, id, { timeout: 1000 });
    assert.equal(workflow.state, 'cancelled');
  });

  test('a cycle is a ValidationError naming the rule', async () => {
    await assert.rejects(
      submitWorkflow(client, {
        tasks: [
          { name: 'a', command: ['true'], dependsOn: ['b'] },
          { name: 'b', command: ['true'], dependsOn: ['a'] },
        ],
      }),
      (err: unknown) => err instanceof ValidationError && err.constraint === 'workflows_tasks_must_not_form_a_cycle',
    );
  });

  test('a workflow that does not exist is a NotFoundError', async () => {
    const missing = '00000000-0000-0000-0000-000000000000';
    await assert.rejects(getWorkflow(client, missing), NotFoundError);
    await assert.rejects(awaitWorkflow(client, missing), NotFoundError);
    await assert.rejects(cancelWorkflow(client, missing), NotFoundError);
    await assert.rejects(retryWorkflow(client, missing), NotFoundError);
  });
});
