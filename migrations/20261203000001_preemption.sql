-- Services first: a worker claims the due copies of services before any other task of its
-- queues, holds its CPU and memory for a due copy that does not fit yet, and may stop
-- preemptible tasks to make room for one (sked.tasks_claim, sked.copies_claim_preempting;
-- the rule is in docs/runtime.md, "Services first").
--
-- A task marked preemptible may be stopped while it runs to make room for a copy of a
-- service: its attempt ends `interrupted` (not charged) and the task waits again, so it
-- suits short batch tasks that can start over. Services themselves are never preemptible.

alter table sked.tasks
  add column preemptible boolean not null default false;

alter table sked.tasks
  add constraint tasks_services_are_not_preemptible
    check (not (preemptible and kind = 'service'));

-- The due copies of services, in claim order, for the first pass of every claim: an index
-- that is empty while every copy runs, so the pass costs one probe.
create index tasks_waiting_copies on sked.tasks (queue, priority desc, next_run_at)
  where kind = 'service' and shard_of is not null and state in ('waiting', 'retry');
