-- Idempotency keys that hold across finished states: the key an owner gave a task names that
-- task for as long as the task is kept, and for a window after it is deleted (retention or
-- sked.tasks_delete), whatever state it ended in (sql/tasks.sql, "Idempotency keys").
--
-- Until now the partial unique index tasks_idempotency_key_unfinished held a key only while
-- its task was unfinished; a finished task's key could be given again. A key now lives in
-- sked.idempotency_keys, one row per (owner, key), naming its task and the digest of the
-- definition it was given with; the task keeps its key in tasks.idempotency_key (a field of
-- the task, shown with it).
create table sked.idempotency_keys (
  owner      text not null,
  key        text not null,
  task_id    uuid not null,
  -- sked.task_definition of the task the key was given with.
  definition uuid not null,
  created_at timestamptz not null default now(),
  -- Null while the task is kept; once it is deleted, when the key may be given again.
  forget_at  timestamptz,
  primary key (owner, key)
);

create index idempotency_keys_forget_at on sked.idempotency_keys (forget_at)
  where forget_at is not null;

comment on table sked.idempotency_keys is
  'The idempotency key of each owner and the task it names, kept while the task is and for retention_settings.keep_keys after. See docs/sql.md, "Idempotency keys".';

-- How long a key outlives its task.
alter table sked.retention_settings
  add column keep_keys interval not null default '1 day',
  add constraint retention_settings_keep_keys_must_be_1_hour_to_36500_days
    check (keep_keys between interval '1 hour' and interval '36500 days');

-- What a task is, for telling whether a second submission with its key asks for the same
-- task: the digest of its fields that differ from the table's defaults, but for its owner,
-- its key and when it runs (run_at, delay). A field left out and a field given its default
-- are the same definition, and a field added to the table later (with a default) changes no
-- stored digest. Here rather than in sql/ because stored digests depend on it: a change of
-- it is a migration that recomputes them.
create function sked.task_definition(t sked.tasks) returns uuid
language plpgsql volatile as $$
declare
  defaults constant jsonb := to_jsonb(sked.task_new());
begin
  return md5(coalesce(
    (select jsonb_object_agg(e.key, e.value)
       from jsonb_each(to_jsonb(t) - array_remove(sked.task_nonfield_columns(), 'shard_total')
                                  - '{owner, idempotency_key}'::text[]) e
      where e.value is distinct from defaults -> e.key),
    '{}')::text)::uuid;
end
$$;

-- The keys of the tasks kept: where an owner's key names several tasks (finished ones and at
-- most one unfinished), the unfinished one, else the newest.
insert into sked.idempotency_keys (owner, key, task_id, definition, created_at)
select distinct on (t.owner, t.idempotency_key)
       t.owner, t.idempotency_key, t.id, sked.task_definition(t), t.created_at
  from sked.tasks t
 where t.idempotency_key is not null
 order by t.owner, t.idempotency_key,
          t.state in ('blocked', 'waiting', 'running', 'retry') desc, t.created_at desc;

-- A schedule's occurrences are new tasks: one key would name only the first. Templates no
-- longer take a key (sked.schedule_check_template). Only the key goes: the template was
-- checked when it was written, and a check now (a broadcast, say, while no worker is alive)
-- must not stop the migration.
do $$
begin
  if exists (select 1 from sked.schedules where task ? 'idempotency_key') then
    alter table sked.schedules disable trigger user;
    update sked.schedules set task = task - 'idempotency_key' where task ? 'idempotency_key';
    alter table sked.schedules enable trigger user;
  end if;
end
$$;

drop index sked.tasks_idempotency_key_unfinished;
