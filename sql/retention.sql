-- Retention: how long finished tasks are kept, and the deletion of those past it and of
-- stored artifacts nothing refers to any more. See README.md, "Retention", and docs/sql.md.
--
-- The cluster's settings are the one row of sked.retention_settings (enabled, retention 7
-- days, keep_failed 30 days by default); a queue may override either in its row of
-- sked.queues (migrations/20261222000001_retention.sql). A finished task goes once it has
-- been finished longer than its retention: its queue's, else the cluster's; a failed task
-- (failed or upstream_failed) the longer of that and its keep-failed retention. Every server's
-- background upkeep (db/src/upkeep.rs) calls sked.tasks_prune_expired and
-- sked.artifacts_prune in short batches; any number of servers may, and they agree because
-- the settings are rows, not flags.
--
-- Both deleting functions plan with `enable_seqscan = off` (see the planner note at the top
-- of sql/workers.sql): each batch walks one index range, never the table.

-- Raises check_violation, naming the rule `<table>_<field>_must_be_1_hour_to_36500_days`,
-- unless p_value is null or between an hour (a finished task stays long enough to be read by
-- whoever waits for it) and 100 years of 365 days: the rule of the columns' constraints.
create or replace function sked.retention_check(p_table text, p_field text, p_value interval)
returns void
language plpgsql as $$
begin
  if p_value is not null
     and not (p_value between interval '1 hour' and interval '36500 days') then
    raise exception 'sked.%: % must be between 1 hour and 36500 days, got %', p_table, p_field, p_value
      using errcode = 'check_violation',
            constraint = format('%s_%s_must_be_1_hour_to_36500_days', p_table, p_field),
            table = p_table, schema = 'sked';
  end if;
end
$$;

-- sked.retention_settings keeps its one row: every server reads it, and none should have to
-- guess what a missing row means. Retention is turned off by sked.retention_set.
create or replace function sked.retention_settings_keep_row() returns trigger
language plpgsql as $$
begin
  raise exception 'sked.retention_settings keeps its one row; turn retention off with sked.retention_set(p_enabled => false)'
    using errcode = 'check_violation', constraint = 'retention_settings_has_one_row',
          table = 'retention_settings', schema = 'sked';
end
$$;
create or replace trigger retention_settings_keep_row
  before delete on sked.retention_settings
  for each row execute function sked.retention_settings_keep_row();
create or replace trigger retention_settings_keep_row_on_truncate
  before truncate on sked.retention_settings
  for each statement execute function sked.retention_settings_keep_row();

-- Changes the cluster's retention: a null argument keeps its setting. p_enabled false turns
-- retention off entirely (nothing is deleted, whatever the queues say); p_retention is how
-- long finished tasks are kept, p_keep_failed how long failed ones are (at least as long as
-- the retention), p_keep_keys how long an idempotency key outlives the task it
-- names (sql/tasks.sql, "Idempotency keys"): each 1 hour to 36500 days. A bad value raises
-- check_violation naming the rule, and changes nothing. Returns the settings.
drop function if exists sked.retention_set(boolean, interval, interval, timestamptz);
create or replace function sked.retention_set(
  p_enabled boolean default null, p_retention interval default null,
  p_keep_failed interval default null, p_keep_keys interval default null,
  p_now timestamptz default now())
returns sked.retention_settings
language plpgsql as $$
declare
  r sked.retention_settings;
begin
  perform sked.retention_check('retention_settings', 'retention', p_retention);
  perform sked.retention_check('retention_settings', 'keep_failed', p_keep_failed);
  perform sked.retention_check('retention_settings', 'keep_keys',
                               p_keep_keys);
  update sked.retention_settings s
     set enabled = coalesce(p_enabled, s.enabled),
         retention = coalesce(p_retention, s.retention),
         keep_failed = coalesce(p_keep_failed, s.keep_failed),
         keep_keys = coalesce(p_keep_keys, s.keep_keys),
         updated_at = p_now
  returning * into r;
  return r;
end
$$;

-- Sets (or, with null, removes) a queue's own retention and keep-failed retention, both
-- together as sked.queue_set_limits sets its limits: null means the cluster's. Each 1 hour to
-- 36500 days; a bad value raises check_violation naming the rule and changes nothing. A queue
-- left without any control loses its row. Returns the queue's controls.
create or replace function sked.queue_set_retention(
  p_name text, p_retention interval, p_keep_failed interval, p_now timestamptz default now())
returns sked.queues
language plpgsql as $$
declare
  r sked.queues;
begin
  perform sked.queue_name_check(p_name);
  perform sked.retention_check('queues', 'retention', p_retention);
  perform sked.retention_check('queues', 'keep_failed', p_keep_failed);
  -- Locked first, as in sked.queue_resume.
  perform 1 from sked.queues q where q.name = p_name for update;
  if p_retention is null and p_keep_failed is null then
    delete from sked.queues q
     where q.name = p_name and q.paused_at is null and q.max_running is null
       and q.rate_per_sec is null;
  else
    insert into sked.queues (name, retention, keep_failed, tokens_at, updated_at)
    values (p_name, p_retention, p_keep_failed, p_now, p_now)
    on conflict (name) do nothing;
  end if;
  update sked.queues q
     set retention = p_retention, keep_failed = p_keep_failed, updated_at = p_now
   where q.name = p_name
  returning * into r;
  r.name := p_name;
  return r;
end
$$;

-- How long a task in `state` is kept once finished: its queue's retention, else the
-- cluster's; for a failed task (failed, upstream_failed), the longer of that and the
-- keep-failed retention (its queue's, else the cluster's).
create or replace function sked.task_retention(
  state text, queue_retention interval, queue_keep_failed interval,
  retention interval, keep_failed interval)
returns interval
language sql immutable parallel safe as $$
  select case when state in ('failed', 'upstream_failed')
              then greatest(coalesce(queue_retention, retention),
                            coalesce(queue_keep_failed, keep_failed))
              else coalesce(queue_retention, retention)
         end
$$;

-- One batch of retention: deletes the finished tasks past their retention at p_now (see
-- sked.task_retention) among the next p_limit tasks, in the order they finished, that
-- finished after p_after (and those that finished at the same time as the last of them), with
-- their attempts, logs, service exits, edges and workflows left without tasks
-- (sked.tasks_delete), at most p_limit of them. A workflow's tasks go only once the workflow,
-- too, finished longer ago than their retention. Returns the tasks deleted and
-- `examined_to`, where the next batch starts, or null when no finished task after p_after is
-- old enough for any retention: a run calls it from '-infinity' until then.
-- Nothing is deleted while retention is off (sked.retention_settings.enabled).
--
-- The batch walks the index tasks_finished from p_after: a run reads each finished task that
-- is older than the shortest retention once (a failed one kept longer is read, not deleted),
-- and never reads the newer ones. Each batch is one short transaction under the advisory lock
-- of sked.tasks_prune, so concurrent runs of several servers take turns batch by batch.
create or replace function sked.tasks_prune_expired(
  p_after timestamptz, p_limit integer default 1000, p_now timestamptz default now())
returns table (deleted integer, examined_to timestamptz)
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  s sked.retention_settings;
  newest timestamptz;
  upto timestamptz;
  ids uuid[];
  first_deleted timestamptz;
begin
  deleted := 0;
  select * into s from sked.retention_settings;
  if not found or not s.enabled then
    return next;
    return;
  end if;
  -- Nothing that finished after this is past any retention.
  newest := p_now - least(s.retention, (select min(q.retention) from sked.queues q));
  select max(x.finished_at) into upto
    from (select t.finished_at from sked.tasks t
           where t.finished_at > p_after and t.finished_at < newest
           order by t.finished_at
           limit p_limit) x;
  if upto is null then
    return next;
    return;
  end if;

  perform pg_advisory_xact_lock(8316852618927437166);
  select array_agg(d.id), min(d.finished_at) into ids, first_deleted
    from (select t.id, t.finished_at
            from sked.tasks t
            left join sked.queues q on q.name = t.queue
           cross join lateral (
             select p_now - sked.task_retention(t.state, q.retention, q.keep_failed,
                                                s.retention, s.keep_failed) as cutoff) c
           where t.finished_at > p_after and t.finished_at <= upto
             and t.finished_at < c.cutoff
             and t.state in ('succeeded', 'failed', 'cancelled', 'upstream_failed', 'skipped')
             and (t.workflow_id is null
                  or exists (select 1 from sked.workflows w
                              where w.id = t.workflow_id and w.finished_at < c.cutoff))
           limit p_limit
           for update of t skip locked) d;
  deleted := sked.tasks_delete(coalesce(ids, '{}'));
  -- A batch that deleted its limit may have left deletable tasks in its range (those that
  -- finished at the same time as the last it examined): the next starts just before the
  -- first it deleted, past those it examined and kept.
  examined_to := case when deleted >= p_limit then first_deleted - interval '1 microsecond'
                      else upto end;
  return next;
end
$$;

-- An artifact nothing refers to is deleted once it is this old: an artifact stored for a
-- task not yet submitted, or an output a worker stored before it records its result, stays.
-- Storing an artifact again (sked.artifact_put) renews it.
create or replace function sked.artifact_grace() returns interval
language sql immutable parallel safe as $$
  select interval '1 day'
$$;

-- One batch of the artifacts' collection: deletes, among the next p_limit artifacts stored
-- more than sked.artifact_grace() before p_now, in the order (created_at, sha256) after
-- (p_after_created_at, p_after_sha256), those no task refers to (as `artifact_sha256`, which
-- a `pg:` artifact_url names, or as `output_sha256`) and no schedule's template names (an
-- `artifact_sha256` key anywhere in its task or workflow). Returns the artifacts deleted and
-- the last one examined, where the next batch starts; null when none was left: a run calls it
-- from ('-infinity', '') until then. Nothing is deleted while retention is off.
-- The batch walks the index artifacts_by_age and asks tasks_artifact_sha256 and
-- tasks_output_sha256 about each artifact; schedules are few and read once per batch.
create or replace function sked.artifacts_prune(
  p_after_created_at timestamptz, p_after_sha256 text, p_limit integer default 1000,
  p_now timestamptz default now())
returns table (deleted integer, last_created_at timestamptz, last_sha256 text)
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  scheduled text[];
begin
  deleted := 0;
  if not coalesce((select s.enabled from sked.retention_settings s), false) then
    return next;
    return;
  end if;
  select x.created_at, x.sha256 into last_created_at, last_sha256
    from (select a.created_at, a.sha256 from sked.artifacts a
           where (a.created_at, a.sha256) > (p_after_created_at, p_after_sha256)
             and a.created_at < p_now - sked.artifact_grace()
           order by a.created_at, a.sha256
           limit p_limit) x
   order by x.created_at desc, x.sha256 desc
   limit 1;
  if last_sha256 is null then
    return next;
    return;
  end if;

  select coalesce(array_agg(distinct r #>> '{}'), '{}') into scheduled
    from sked.schedules sc
   cross join lateral jsonb_path_query(coalesce(sc.task, sc.workflow), 'lax $.**.artifact_sha256') r
   where jsonb_typeof(r) = 'string';
  with doomed as (
    select a.sha256 from sked.artifacts a
     where (a.created_at, a.sha256) > (p_after_created_at, p_after_sha256)
       and (a.created_at, a.sha256) <= (last_created_at, last_sha256)
       and a.created_at < p_now - sked.artifact_grace()
       and not exists (select 1 from sked.tasks t where t.artifact_sha256 = a.sha256)
       and not exists (select 1 from sked.tasks t where t.output_sha256 = a.sha256)
       and a.sha256 <> all (scheduled)
     for update skip locked
  )
  delete from sked.artifacts a using doomed d where a.sha256 = d.sha256;
  get diagnostics deleted = row_count;
  return next;
end
$$;
