-- Indexes for the dashboard's reads (docs/api.md): task listings by state and by owner, and
-- the overview's counts of the last hour's finishes and of each owner's pending tasks, so
-- that they answer in milliseconds with a million finished tasks kept. All are partial: a
-- task gets an entry when it is submitted (tasks_pending_by_owner) and when it finishes
-- (tasks_finished, tasks_finished_by_owner), none when it is claimed or its lease renewed,
-- and a task that succeeds at its first attempt never enters tasks_by_state. Their cost on
-- the hot path was measured (bench/README.md, W8).

-- Tasks in the states most tasks never enter, newest first per state: listings by state
-- find them without walking past the succeeded ones (and test owner and queue on the
-- entries), and the overview counts blocked and retry tasks per queue from the index alone.
create index tasks_by_state on sked.tasks (state, id) include (queue, owner, next_run_at)
  where state in ('blocked', 'retry', 'failed', 'cancelled', 'upstream_failed', 'skipped');

-- Finished tasks by the time they finished: the overview's last hour by queue, state and
-- owner from the index alone, and sked.tasks_prune's search for old tasks.
create index tasks_finished on sked.tasks (finished_at) include (queue, state, owner)
  where finished_at is not null;

-- An owner's tasks newest first, in two parts that together with its running tasks (found by
-- tasks_lease) make all of them: the listings of user tokens and of `owner=` (which test
-- state and queue on the entries). The pending part also carries what the overview of one
-- owner counts, from the index alone.
create index tasks_finished_by_owner on sked.tasks (owner, id) include (state, queue)
  where finished_at is not null;
create index tasks_pending_by_owner on sked.tasks (owner, id) include (queue, next_run_at, state)
  where state in ('blocked', 'waiting', 'retry');
