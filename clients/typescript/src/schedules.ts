// Cron schedules (docs/schedules.md): create (`sked.schedule_create`), read
// (`sked.schedules`, `sked.schedule_runs`), pause, resume, run now (`sked.schedule_pause`,
// `sked.schedule_resume`, `sked.schedule_run_now`) and delete (a row of `sked.schedules`,
// whose runs go with it).

import type { ClientBase } from 'pg';

import {
  found,
  interval,
  one,
  query,
  SCHEDULE_COLUMNS,
  SCHEDULE_RUN_COLUMNS,
  taskJson,
  toSchedule,
  toScheduleRun,
  workflowJson,
} from './db.js';
import { NotFoundError } from './errors.js';
import type { Schedule, ScheduleRun, ScheduleSpec } from './types.js';

/**
 * Creates a schedule (`sked.schedule_create`) and returns its id. An option left out takes
 * the function's default; a bad expression, zone or template is a ValidationError naming the
 * rule, a name the owner uses already a ConflictError.
 */
export async function createSchedule(client: ClientBase, spec: ScheduleSpec): Promise<string> {
  const args: string[] = [];
  const values: unknown[] = [];
  const arg = (name: string, value: unknown, type: string): void => {
    if (value === undefined) return;
    values.push(value);
    args.push(`${name} => $${values.length}::${type}`);
  };
  arg('name', spec.name, 'text');
  arg('cron', spec.cron, 'text');
  arg('task', spec.task === undefined ? undefined : JSON.stringify(taskJson(spec.task)), 'jsonb');
  arg('workflow', spec.workflow === undefined ? undefined : JSON.stringify(workflowJson(spec.workflow)), 'jsonb');
  arg('time_zone', spec.timeZone, 'text');
  arg('misfire_policy', spec.misfirePolicy, 'text');
  arg('misfire_grace', spec.misfireGrace === undefined ? undefined : interval(spec.misfireGrace), 'interval');
  arg('catch_up_limit', spec.catchUpLimit, 'integer');
  arg('overlap_policy', spec.overlapPolicy, 'text');
  arg('jitter', spec.jitter === undefined ? undefined : interval(spec.jitter), 'interval');
  arg('history_limit', spec.historyLimit, 'integer');
  arg('paused', spec.paused, 'boolean');
  arg('owner', spec.owner, 'text');
  const rows = await query(client, `select sked.schedule_create(${args.join(', ')}) as id`, values);
  return rows[0]!.id;
}

/** Schedule `id` (`sked.schedules`); a NotFoundError when absent. */
export async function getSchedule(client: ClientBase, id: string): Promise<Schedule> {
  const rows = await query(client, `select ${SCHEDULE_COLUMNS} from sked.schedules s where s.id = $1`, [id]);
  return toSchedule(one(rows, `schedule: ${id}`));
}

/** Options of listSchedules. */
export interface ListSchedulesOptions {
  /** Only this owner's schedules. */
  owner?: string;
  /** Only the schedules of this name (one per owner). */
  name?: string;
  /** Only schedules after this id (the last one of the previous page). */
  after?: string;
  /** At most this many; 100 when left out. */
  limit?: number;
}

/** Schedules in the order they were created (by id), a page at a time. */
export async function listSchedules(client: ClientBase, options: ListSchedulesOptions = {}): Promise<Schedule[]> {
  const rows = await query(
    client,
    `select ${SCHEDULE_COLUMNS} from sked.schedules s
      where ($1::text is null or s.owner = $1::text) and ($2::text is null or s.name = $2::text)
        and ($3::uuid is null or s.id > $3::uuid)
      order by s.id limit $4`,
    [options.owner ?? null, options.name ?? null, options.after ?? null, options.limit ?? 100],
  );
  return rows.map(toSchedule);
}

/** The runs of schedule `id` (`sked.schedule_runs`), newest first; `limit` 50 when left out. */
export async function getScheduleRuns(
  client: ClientBase,
  id: string,
  options: { limit?: number } = {},
): Promise<ScheduleRun[]> {
  const rows = await query(
    client,
    `select ${SCHEDULE_RUN_COLUMNS} from sked.schedule_runs r
      where r.schedule_id = $1 order by r.fire_at desc, r.id desc limit $2`,
    [id, options.limit ?? 50],
  );
  return rows.map(toScheduleRun);
}

/** Pauses schedule `id` (`sked.schedule_pause`): nothing fires; a NotFoundError when absent. */
export async function pauseSchedule(client: ClientBase, id: string): Promise<void> {
  const rows = await query(client, 'select sked.schedule_pause($1) as found', [id]);
  if (!rows[0]?.found) throw new NotFoundError(`no such schedule: ${id}`);
}

/**
 * Resumes schedule `id` at its next future tick (`sked.schedule_resume`); a NotFoundError when
 * absent.
 */
export async function resumeSchedule(client: ClientBase, id: string): Promise<void> {
  const rows = await query(client, 'select sked.schedule_resume($1) as found', [id]);
  if (!rows[0]?.found) throw new NotFoundError(`no such schedule: ${id}`);
}

/**
 * Submits an occurrence of schedule `id` now, whatever its overlap policy
 * (`sked.schedule_run_now`), and returns the id of the task or workflow submitted; a
 * NotFoundError when absent.
 */
export async function runScheduleNow(client: ClientBase, id: string): Promise<string> {
  const rows = await query(client, 'select sked.schedule_run_now($1) as id', [id]);
  return found(rows[0]?.id, `schedule: ${id}`);
}

/** Deletes schedule `id` with its runs (its occurrences stay); a NotFoundError when absent. */
export async function deleteSchedule(client: ClientBase, id: string): Promise<void> {
  const rows = await query(client, 'delete from sked.schedules s where s.id = $1 returning s.id', [id]);
  one(rows, `schedule: ${id}`);
}
