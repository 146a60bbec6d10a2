-- Long-running services: a task of kind `service` keeps `replicas` copies running on workers.
-- The service row is the parent of its copies as a sharded task is of its shards
-- (docs/shards.md): `shard_total` follows `replicas`, and each copy is a shard of kind
-- `service` made from the definition of one `generation` of the service. The worker that
-- owns a copy restarts it in place when it exits (restart policy, backoff), records the
-- restarts and the last exits, and probes an optional health check; a reconciler
-- (sked.services_reconcile) scales and rolls copies over when the definition changes.
-- The functions live in sql/services.sql; docs/services.md describes the behaviour.

alter table sked.tasks
  -- On a service: how many copies to keep running (1 to 1000).
  add column replicas       integer,
  -- On a service and its copies: restart a copy that exits `always`, or only `on_failure`.
  add column restart_policy text,
  -- On a service and its copies: {"command": [...]} or {"http": "http://…"}, with
  -- interval_secs, timeout_secs and failures; checked by sked.service_health_check_problem.
  add column health_check   jsonb,
  -- On a service: its definition's version, bumped by sked.service_update. On a copy: the
  -- version it was made from.
  add column generation     integer,
  -- On a copy, written by its worker: how often it was restarted, when its process started
  -- (null while backing off), when the current process first passed its health check, and
  -- when the next start is due while it backs off.
  add column restarts       integer,
  add column up_since       timestamptz,
  add column healthy_at     timestamptz,
  add column backoff_until  timestamptz;

alter table sked.tasks
  drop constraint tasks_kind_is_known,
  add constraint tasks_kind_is_known
    check (kind in ('command', 'noop', 'sleep', 'service')),
  drop constraint tasks_command_or_artifact_is_required,
  add constraint tasks_command_or_artifact_is_required
    check (kind not in ('command', 'service') or command is not null or artifact_url is not null),
  add constraint tasks_replicas_must_be_1_to_1000
    check (replicas between 1 and 1000),
  add constraint tasks_replicas_are_only_for_services
    check (replicas is null or (kind = 'service' and shard_of is null)),
  add constraint tasks_restart_policy_must_be_always_or_on_failure
    check (restart_policy in ('always', 'on_failure')),
  add constraint tasks_restart_policy_is_only_for_services
    check (restart_policy is null or kind = 'service'),
  add constraint tasks_health_check_is_only_for_services
    check (health_check is null or kind = 'service');

-- The last exits of each copy (about twenty are kept per copy): when, how (exit code or
-- signal), the error as people read it, and when the worker planned the next start.
create table sked.service_exits (
  id         bigint generated always as identity primary key,
  task_id    uuid not null,
  attempt    integer not null,
  exited_at  timestamptz not null,
  exit_code  integer,
  signal     integer,
  error      text not null,
  restart_at timestamptz
);
create index service_exits_by_task on sked.service_exits (task_id, id);

-- The services that run (their copies may need scaling or rolling), and the copies that
-- have not ended (those of an ended service are stopped), for the reconciler. Other tasks
-- have no entry in either.
create index tasks_services on sked.tasks (id)
  where kind = 'service' and shard_of is null and state = 'blocked';
create index tasks_live_copies on sked.tasks (shard_of)
  where kind = 'service' and shard_of is not null
    and state in ('blocked', 'waiting', 'running', 'retry');
