-- Awaiting a task or a workflow without polling (docs/sql.md, "Awaiting a result").
--
-- A waiter registers the id it waits for with sked.task_await or sked.workflow_await, which
-- LISTENs on the id's channel (sked_task_<id>, sked_workflow_<id>) in the caller's session
-- and returns the current state. When a registered task or workflow reaches a final state,
-- the statement that ended it sends one notification on that channel, at its commit:
--
--   sked_task_<id>       {"task_id": "<id>", "state": "succeeded", "workflow_id": null}
--   sked_workflow_<id>   {"workflow_id": "<id>", "state": "failed"}
--
-- and forgets the registration. Only registered ids are notified, so a statement that ends
-- tasks nobody waits for pays one probe of an empty table, and the server's notification
-- queue (shared by every listener of the cluster) carries only what someone waits for.
--
-- No lost wake-up: the registration reads the row FOR SHARE. A transaction that is ending the
-- task holds its row lock until it commits, so the registration waits for it and then reads
-- the final state; and a transaction that ends the task after the registration waits for the
-- registration to commit (with its LISTEN) before its update, so its statement sees the
-- registration and its notification reaches the waiter.
--
-- Waiting happens between transactions: a waiter holds no snapshot and no transaction open
-- while it waits for the notification (pg_stat_activity.backend_xmin stays null).

-- The channel on which a task's final state is announced to those awaiting it. Quote it in
-- LISTEN: LISTEN "sked_task_0190…".
create or replace function sked.task_channel(p_id uuid) returns text
language sql immutable parallel safe as $$
  select 'sked_task_' || p_id::text
$$;

-- The channel on which a workflow's final state is announced to those awaiting it.
create or replace function sked.workflow_channel(p_id uuid) returns text
language sql immutable parallel safe as $$
  select 'sked_workflow_' || p_id::text
$$;

-- Inside a function that runs with its owner's rights: may the role that called it read the
-- rows of `p_owner`, as row-level security decides for a plain SELECT (sql/roles.sql)? The
-- caller is the role the session SET ROLE to, or else the session's user. Its owner's rows
-- for a submitter; every row for the server, the table's owner and a role that bypasses
-- row-level security; none for any other role.
create or replace function sked.caller_may_read(p_owner text) returns boolean
language plpgsql stable as $$
declare
  caller name := coalesce(nullif(current_setting('role', true), 'none'), session_user);
begin
  return exists (select 1 from pg_roles r where r.rolname = caller
                   and (r.rolsuper or r.rolbypassrls))
      or pg_has_role(caller, (select c.relowner from pg_class c
                               where c.oid = 'sked.tasks'::regclass), 'usage')
      or pg_has_role(caller, 'sked_server', 'usage')
      or (pg_has_role(caller, 'sked_submitter', 'usage') and caller = p_owner);
end
$$;

-- Expired registrations, a few at a time (each registration removes some).
create or replace function sked.awaits_forget_expired(p_now timestamptz) returns void
language sql as $$
  delete from sked.awaits a
   where a.id in (select e.id from sked.awaits e where e.expires_at < p_now
                   order by e.expires_at limit 100 for update skip locked)
$$;

-- What sked.task_await and sked.workflow_await share, after each has read its row FOR SHARE:
-- the row's `p_owner` must be readable by the caller (else `p_missing`, the same error as for
-- a missing row); when `p_unfinished`, the wait on `p_channel` is registered for `p_for` and,
-- unless `p_listen` is false, LISTENed on.
create or replace function sked.awaits_register(
  p_function text, p_id uuid, p_found boolean, p_owner text, p_missing text,
  p_unfinished boolean, p_channel text, p_listen boolean, p_for interval)
returns void
language plpgsql as $$
begin
  if p_for is null or p_for <= interval '0' or p_for > interval '1 day' then
    raise exception '%: p_for must be more than 0 and at most 1 day, got %', p_function, p_for
      using errcode = 'invalid_parameter_value';
  end if;
  if not p_found or not sked.caller_may_read(p_owner) then
    raise exception '%: %', p_missing, p_id using errcode = 'no_data_found';
  end if;
  if p_unfinished then
    perform sked.awaits_forget_expired(now());
    insert into sked.awaits (id, expires_at) values (p_id, now() + p_for)
    on conflict (id) do update set expires_at = greatest(sked.awaits.expires_at, excluded.expires_at);
    if coalesce(p_listen, true) then
      execute format('listen %I', p_channel);
    end if;
  end if;
end
$$;

-- Registers a wait for task `p_id` for `p_for` (more than 0, at most a day; call again
-- before then to wait longer) and, unless `p_listen` is false, LISTENs on its channel in this
-- session (effective at commit, with the registration). Returns its state and whether that
-- state is final; a final state registers nothing. A task that does not exist, or that the
-- caller may not read, is an error (no_data_found, "no such task"), the same for both.
create or replace function sked.task_await(
  p_id uuid, p_listen boolean default true, p_for interval default interval '10 minutes')
returns table (state text, finished boolean)
language plpgsql as $$
declare
  t record;
begin
  select s.state, s.owner into t from sked.tasks s where s.id = p_id for share;
  perform sked.awaits_register('sked.task_await', p_id, found, t.owner, 'no such task',
                               sked.state_is_unfinished(t.state), sked.task_channel(p_id),
                               p_listen, p_for);
  return query select t.state, not sked.state_is_unfinished(t.state);
end
$$;

-- sked.task_await for a workflow: its states are running and the final succeeded, failed and
-- cancelled.
create or replace function sked.workflow_await(
  p_id uuid, p_listen boolean default true, p_for interval default interval '10 minutes')
returns table (state text, finished boolean)
language plpgsql as $$
declare
  w record;
begin
  select s.state, s.owner into w from sked.workflows s where s.id = p_id for share;
  perform sked.awaits_register('sked.workflow_await', p_id, found, w.owner, 'no such workflow',
                               w.state = 'running', sked.workflow_channel(p_id), p_listen,
                               p_for);
  return query select w.state, w.state <> 'running';
end
$$;

-- The statement trigger of sked.tasks and sked.workflows updates: notifies the registered
-- rows that the statement left in a final state, and forgets their registrations. Without
-- registrations it costs one probe of sked.awaits.
create or replace function sked.awaits_after_update() returns trigger
language plpgsql as $$
declare
  r record;
begin
  if not exists (select 1 from sked.awaits) then
    return null;
  end if;
  if TG_TABLE_NAME = 'tasks' then
    for r in
      with ended as (
        delete from sked.awaits a using new_rows n
         where a.id = n.id and not sked.state_is_unfinished(n.state)
        returning n.id, n.state, n.workflow_id
      )
      select * from ended
    loop
      perform pg_notify(sked.task_channel(r.id),
                        jsonb_build_object('task_id', r.id, 'state', r.state,
                                          'workflow_id', r.workflow_id)::text);
    end loop;
  else
    for r in
      with ended as (
        delete from sked.awaits a using new_rows n
         where a.id = n.id and n.state <> 'running'
        returning n.id, n.state
      )
      select * from ended
    loop
      perform pg_notify(sked.workflow_channel(r.id),
                        jsonb_build_object('workflow_id', r.id, 'state', r.state)::text);
    end loop;
  end if;
  return null;
end
$$;

create or replace trigger tasks_after_update_awaits
  after update on sked.tasks referencing new table as new_rows
  for each statement execute function sked.awaits_after_update();
create or replace trigger workflows_after_update_awaits
  after update on sked.workflows referencing new table as new_rows
  for each statement execute function sked.awaits_after_update();
