-- Least privilege: the database roles of sked, what each may do, and the row-level security
-- that confines a submitter to its own tasks (docs/security.md, "Database roles").
--
-- Three group roles (NOLOGIN), created here when missing; an operator grants them to login
-- roles:
--   sked_submitter  submits tasks and workflows (plain INSERT or the submit functions) under
--                   its own name, and reads its own tasks, workflows, attempts and logs;
--   sked_worker     calls the worker's functions and nothing else, no table (it reads the key
--                   of task tokens only);
--   sked_server     what the REST API needs: it reads everything, submits for any owner and
--                   changes state through the contract's functions (it enforces owners with
--                   API tokens itself), and never writes tokens, artifacts or task state;
--                   it reaches the owners' quotas (owner_quota) through owner_quota_take
--                   only, deletes finished tasks through tasks_prune and
--                   tasks_prune_expired only and artifacts through artifacts_prune only
--                   (the retention of its background upkeep, db/src/upkeep.rs), and
--                   changes retention through retention_set and queue_set_retention.
-- The account that migrates owns the schema and everything in it; it is the administrator
-- and is not subject to the policies below.
--
-- This file runs last on every `sked migrate`, after the other files have (re)created their
-- functions: CREATE OR REPLACE FUNCTION resets SECURITY DEFINER and SET clauses, and new
-- functions are executable by PUBLIC until revoked here. Every privilege of the three roles
-- on the schema is revoked and granted again from the lists below, so the lists are the
-- whole truth; a new function a role must call is added to its list here.

-- ---------------------------------------------------------------------------------------------
-- The roles
-- ---------------------------------------------------------------------------------------------

-- Roles belong to the cluster, not the database: every sked database of a cluster shares
-- them, and migrates of two databases may race to create one (the loser finds it made).
do $$
declare
  r text;
begin
  foreach r in array array['sked_submitter', 'sked_worker', 'sked_server'] loop
    if not exists (select 1 from pg_roles where rolname = r) then
      begin
        execute format('create role %I nologin', r);
      exception
        when duplicate_object or unique_violation then
          null;
        when insufficient_privilege then
          raise exception 'sked migrate: the role % does not exist and % may not create roles', r, current_user
            using errcode = 'insufficient_privilege',
                  hint = format('Ask an administrator to run CREATE ROLE %I NOLOGIN (and the same for sked_submitter, sked_worker and sked_server), then migrate again.', r);
      end;
    end if;
  end loop;
end
$$;

-- ---------------------------------------------------------------------------------------------
-- Row-level security (enabled on these tables by migrations/20261216000001_roles.sql)
-- ---------------------------------------------------------------------------------------------

-- True when task `p_task` or `p_depends_on` exists and belongs to an owner other than
-- `p_owner`. It runs with the owner's rights so that it sees every task: an edge may name a
-- task inserted by the same statement (sked.workflow_submit inserts tasks and edges in one),
-- which the submitter's own view of the table does not show yet.
create or replace function sked.task_edge_crosses_owners(p_task uuid, p_depends_on uuid, p_owner text)
returns boolean
language sql stable security definer set search_path = sked, pg_temp as $$
  select exists (select 1 from sked.tasks t
                  where t.id in (p_task, p_depends_on) and t.owner is distinct from p_owner)
$$;

-- A submitter sees and inserts only tasks of its own name (`current_user`: the login role,
-- or the role it SET ROLE to), placed only in workflows it owns. Policies are dropped and
-- created again so that they are always the ones written here.
drop policy if exists tasks_submitter_reads_its_own on sked.tasks;
create policy tasks_submitter_reads_its_own on sked.tasks
  for select to sked_submitter using (owner = current_user);
drop policy if exists tasks_submitter_inserts_its_own on sked.tasks;
create policy tasks_submitter_inserts_its_own on sked.tasks
  for insert to sked_submitter
  with check (owner = current_user
              and (workflow_id is null
                   or exists (select 1 from sked.workflows w where w.id = workflow_id)));

drop policy if exists workflows_submitter_reads_its_own on sked.workflows;
create policy workflows_submitter_reads_its_own on sked.workflows
  for select to sked_submitter using (owner = current_user);
drop policy if exists workflows_submitter_inserts_its_own on sked.workflows;
create policy workflows_submitter_inserts_its_own on sked.workflows
  for insert to sked_submitter
  with check (owner = current_user
              and (definition_id is null
                   or exists (select 1 from sked.workflow_definitions d
                               where d.id = definition_id))
              -- A sub-workflow of its own sub-workflow task only (sql/subworkflows.sql).
              and (parent_task_id is null
                   or exists (select 1 from sked.tasks t
                               where t.id = parent_task_id and t.kind = 'workflow')));

-- Stored workflow definitions: a submitter reads and adds its own.
drop policy if exists workflow_definitions_submitter_reads_its_own on sked.workflow_definitions;
create policy workflow_definitions_submitter_reads_its_own on sked.workflow_definitions
  for select to sked_submitter using (owner = current_user);
drop policy if exists workflow_definitions_submitter_inserts_its_own on sked.workflow_definitions;
create policy workflow_definitions_submitter_inserts_its_own on sked.workflow_definitions
  for insert to sked_submitter with check (owner = current_user);

-- An edge is the submitter's when its child is (the subquery sees its own tasks only); it
-- may insert edges that join no task of another owner.
drop policy if exists task_edges_submitter_inserts_its_own on sked.task_edges;
create policy task_edges_submitter_inserts_its_own on sked.task_edges
  for insert to sked_submitter
  with check (not sked.task_edge_crosses_owners(task_id, depends_on, current_user));

-- The rows of a task (its edges, attempts and logs) are the submitter's to read when the task
-- is (the subquery sees its own tasks only). The server may do anything with every table
-- under row-level security.
do $$
declare
  t text;
begin
  foreach t in array array['task_edges', 'task_attempts', 'task_logs'] loop
    execute format('drop policy if exists %I on sked.%I', t || '_submitter_reads_its_own', t);
    execute format('create policy %I on sked.%I for select to sked_submitter '
                   'using (exists (select 1 from sked.tasks t where t.id = task_id))',
                   t || '_submitter_reads_its_own', t);
  end loop;
  foreach t in array array['tasks', 'workflows', 'task_edges', 'task_attempts', 'task_logs',
                           'workflow_definitions'] loop
    execute format('drop policy if exists %I on sked.%I', t || '_server_all', t);
    execute format('create policy %I on sked.%I for all to sked_server using (true) '
                   'with check (true)', t || '_server_all', t);
  end loop;
end
$$;

-- ---------------------------------------------------------------------------------------------
-- Privileges
-- ---------------------------------------------------------------------------------------------

do $$
declare
  -- The worker's functions (worker/ and the duties of its background upkeep,
  -- db/src/upkeep.rs, call nothing else). They run as the owner.
  worker_calls text[] := array[
    'worker_register', 'worker_deregister', 'worker_touch', 'worker_heartbeat', 'worker_stopping',
    'tasks_claim', 'copies_claim_preempting', 'task_parent_outputs', 'workflow_params',
    'tasks_finish',
    'tasks_renew_leases', 'tasks_cancel_requested', 'worker_attempts', 'tasks_rescue',
    'tasks_due_from', 'tasks_next_due', 'task_logs_append', 'artifact_get', 'artifact_put',
    'service_copy_spec', 'service_copy_started', 'service_copy_healthy',
    'service_copy_exited', 'services_reconcile', 'schedules_fire', 'schedules_next_due',
    'schedule_runs_prune', 'alert_target_for_delivery', 'finishes_fold',
    'finish_rollups_prune'];
  -- The server's functions that change state or read across owners. They run as the owner.
  server_calls text[] := array[
    'task_cancel', 'task_retry', 'workflow_cancel', 'workflow_retry',
    'schedule_create', 'schedule_pause', 'schedule_resume', 'schedule_run_now',
    'schedule_backfill', 'schedule_backfill_cancel', 'schedule_runs_prune', 'schedules_fire', 'schedules_next_due', 'cron_next_times',
    'queue_pause', 'queue_resume', 'queue_set_limits', 'task_waiting_reasons',
    'service_update', 'overview_since', 'queues_unfinished', 'tasks_finished_by_minute',
    'tasks_summary', 'events_listen', 'events_unlisten', 'events_read', 'events_prune',
    'events_running', 'events_ended', 'owner_quota_take', 'tasks_prune',
    'tasks_prune_expired', 'artifacts_prune', 'retention_set', 'queue_set_retention',
    'idempotency_keys_prune', 'alert_target_set', 'alert_target_delete', 'alert_targets_list',
    'queue_set_notify', 'finishes_fold', 'finish_rollups_prune', 'finishes_history',
    'finishes_queues', 'task_search_estimate', 'task_spawn'];
  -- Functions a submitter and the server call that run as the owner: they check themselves
  -- that the caller may read the rows they name (sked.caller_may_read), as they lock them:
  -- awaiting, the idempotency keys a submission takes (called by sked.tasks_insert) and the
  -- delays it notes (by sked.tasks_from_json and sked.task_submit), of new tasks only.
  -- And the start of the sub-workflows of a workflow just submitted (sql/subworkflows.sql).
  await_calls text[] := array['task_await', 'workflow_await', 'idempotency_keys_claim',
                              'delays_from_commit_note', 'subworkflows_submitted'];
  -- Functions that run with the caller's rights, so that row-level security forces a
  -- submitter's owner: the submit functions and what they call.
  submit_calls text[] := array[
    'task_submit', 'tasks_submit', 'workflow_submit', 'workflow_submit_from', 'tasks_from_json',
    'tasks_insert',
    'task_copy', 'task_fields', 'task_nonfield_columns', 'task_submitted_columns',
    'task_new', 'task_placed', 'task_boolean_refuse', 'task_json_refuse', 'workflow_task_keys',
    'workflow_rule_raise', 'uuid_v7', 'task_edge_crosses_owners', 'json_numbers_fit_doubles',
    'task_channel', 'workflow_channel', 'params_placeholder', 'params_used', 'params_fill',
    'params_fill_array', 'params_apply', 'map_max_default', 'map_max_limit',
    'workflow_define', 'workflow_run', 'definition_rule_raise', 'subworkflow_error'];
  -- The server's functions that run with its rights: resubmitting (it names the owner) and
  -- pure helpers it calls within queries, which must stay inlinable.
  server_own_rights text[] := array['task_resubmit', 'task_resubmittable', 'queue_burst',
                                    'service_copy_up', 'state_is_claimable',
                                    'state_waits_to_run', 'state_is_unfinished',
                                    'artifact_grace', 'task_search_text'];
  -- Columns of sked.tasks that a submission sets (those of its fields and of its place, see
  -- sql/tasks.sql). The state columns that record running and finishing (worker_id,
  -- lease_expires_at, attempt, finished_at, results) and a shard's or a copy's place are
  -- never a submitter's, and the table's constraints refuse a new row in any state but
  -- blocked or waiting without them.
  task_columns text := array_to_string(sked.task_submitted_columns(), ', ');
  roles text := 'sked_submitter, sked_worker, sked_server';
  name text;
  f regprocedure;
  migrations regclass := to_regclass('_sqlx_migrations');
begin
  execute 'revoke all on schema sked from public, ' || roles;
  execute 'revoke all on all tables in schema sked from public, ' || roles;
  execute 'revoke all on all sequences in schema sked from public, ' || roles;
  execute 'revoke all on all functions in schema sked from public, ' || roles;
  execute 'grant usage on schema sked to ' || roles;
  -- Workers and servers check the schema's version at start.
  if migrations is not null then
    execute format('grant select on %s to %s', migrations, roles);
  end if;

  -- Every trigger function and every function of the worker's and server's lists runs with
  -- its owner's rights, on a search path that a caller cannot change: a submitter's INSERT
  -- fires triggers that record live events, expand shards and check services in tables it
  -- may not touch itself.
  for f in
    select p.oid::regprocedure from pg_proc p
     where p.pronamespace = 'sked'::regnamespace
       and (p.prorettype = 'trigger'::regtype
            or p.proname = any (worker_calls || server_calls || await_calls))
  loop
    execute format('alter function %s security definer set search_path = sked, pg_temp', f);
  end loop;

  foreach name in array worker_calls || server_calls || await_calls || submit_calls
                        || server_own_rights loop
    if not exists (select 1 from pg_proc p
                    where p.pronamespace = 'sked'::regnamespace and p.proname = name) then
      raise exception 'sql/roles.sql grants sked.%, which does not exist: update its lists', name;
    end if;
  end loop;
  for f, name in
    select p.oid::regprocedure, r.role
      from pg_proc p
      join (select unnest(worker_calls), 'sked_worker'
            union all select unnest(server_calls || server_own_rights || submit_calls
                                    || await_calls), 'sked_server'
            union all select unnest(submit_calls || await_calls), 'sked_submitter') r(proname, role)
        on r.proname = p.proname
     where p.pronamespace = 'sked'::regnamespace
  loop
    execute format('grant execute on function %s to %I', f, name);
  end loop;

  -- The submitter: its own rows (the policies above), submitted through the submit functions
  -- or a plain INSERT, nothing else.
  execute format('grant select, insert (%s) on sked.tasks to sked_submitter', task_columns);
  grant select, insert (id, owner, name, created_at, notify, params, definition_id,
                        parent_task_id)
    on sked.workflows to sked_submitter;
  grant select, insert (owner, name, version, spec, created_at) on sked.workflow_definitions
    to sked_submitter;
  grant select, insert on sked.task_edges to sked_submitter;
  grant select on sked.task_attempts, sked.task_logs to sked_submitter;
  -- The view of every attempt, where it reads with the reader's rights (sql/views.sql).
  if exists (select 1 from pg_class c
              where c.oid = 'sked.task_attempt_history'::regclass
                and 'security_invoker=true' = any (c.reloptions)) then
    grant select on sked.task_attempt_history to sked_submitter;
  end if;

  -- The server: reads for the API and the live events, submissions for any owner, the
  -- schedules it edits in place, and the queue row it locks (SELECT … FOR UPDATE) before
  -- changing a queue's limits. Tokens are read to authenticate, never written (`sked token`
  -- runs as the owner); artifacts are the worker's. No role gets sked.owner_quota: the
  -- server takes from it through sked.owner_quota_take, which runs as the owner.
  grant select on sked.tasks, sked.workflows, sked.task_edges, sked.task_attempts,
                  sked.task_logs, sked.workers, sked.api_tokens, sked.schedules,
                  sked.schedule_runs, sked.schedule_backfills, sked.schedule_ticks, sked.queues,
                  sked.workflow_definitions,
                  sked.retention_settings, sked.service_exits, sked.event_changes,
                  sked.event_outbox, sked.task_attempt_history, sked.queue_counts,
                  sked.worker_status
     to sked_server;
  execute format('grant insert (%s) on sked.tasks to sked_server', task_columns);
  grant insert on sked.workflows, sked.task_edges, sked.workflow_definitions to sked_server;
  grant update, delete on sked.schedules to sked_server;
  grant update on sked.queues to sked_server;

  -- The key of task tokens (db/src/task_token.rs): workers mint them, servers check them.
  grant select on sked.task_token_key to sked_worker, sked_server;
end
$$;
