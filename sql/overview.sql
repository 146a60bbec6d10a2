-- Read functions of the dashboard's overview (GET /api/v1/overview, GET /api/v1/queues; see
-- docs/api.md): the unfinished tasks of each queue and the tasks finished in the last hour.
-- They count exactly, reading partial indexes only (tasks_claimable, tasks_by_state,
-- tasks_running, tasks_finished), so their cost follows the unfinished tasks and the last
-- hour's finishes, never the finished history. `p_owner` limits the counts to one owner's
-- tasks (null: every owner's); `p_now` is the moment counted at.

-- Start of "the last hour" at p_now: the start of the minute 59 minutes before p_now's
-- minute, so that the last hour is 60 whole minutes, the last of them p_now's own.
-- (`date_trunc` reads the session's time zone, whose offset is a whole number of minutes
-- for any date since 1972, so minutes start at the same instants in every zone.)
create or replace function sked.overview_since(p_now timestamptz)
returns timestamptz
language sql stable parallel safe as $$
  select date_trunc('minute', p_now) - interval '59 minutes'
$$;

-- Unfinished tasks per queue: blocked, waiting due by p_now, waiting delayed past it, running,
-- retry, and the next_run_at of the oldest due task (waiting or retry). Queues without an
-- unfinished task are left out.
create or replace function sked.queues_unfinished(p_owner text default null,
                                                  p_now timestamptz default now())
returns table (queue text, blocked bigint, waiting_due bigint, waiting_delayed bigint,
               running bigint, retry bigint, oldest_due_at timestamptz)
language sql stable as $$
  with claimable as (
    -- tasks_claimable holds exactly the waiting and retry tasks, with their queue and due
    -- time; for every owner this is an index-only scan.
    select t.queue,
           count(*) filter (where t.next_run_at <= p_now) as due,
           count(*) filter (where t.next_run_at > p_now) as delayed,
           min(t.next_run_at) filter (where t.next_run_at <= p_now) as oldest_due_at
      from sked.tasks t
     where sked.state_is_claimable(t.state) and (p_owner is null or t.owner = p_owner)
     group by t.queue
  ), held as (
    -- tasks_by_state: blocked and retry, which waiting is told apart from.
    select t.queue,
           count(*) filter (where t.state = 'blocked') as blocked,
           count(*) filter (where t.state = 'retry') as retry,
           count(*) filter (where t.state = 'retry' and t.next_run_at <= p_now) as retry_due
      from sked.tasks t
     where t.state in ('blocked', 'retry') and (p_owner is null or t.owner = p_owner)
     group by t.queue
  ), running as (
    select t.queue, count(*) as running
      from sked.tasks t
     where t.state = 'running'
       and (p_owner is null or t.owner = p_owner)
     group by t.queue
  )
  select q.queue,
         coalesce(h.blocked, 0),
         coalesce(c.due, 0) - coalesce(h.retry_due, 0),
         coalesce(c.delayed, 0) - (coalesce(h.retry, 0) - coalesce(h.retry_due, 0)),
         coalesce(r.running, 0),
         coalesce(h.retry, 0),
         c.oldest_due_at
    from (select claimable.queue from claimable
          union select held.queue from held
          union select running.queue from running) q
    left join claimable c on c.queue = q.queue
    left join held h on h.queue = q.queue
    left join running r on r.queue = q.queue
   order by q.queue
$$;

-- Tasks finished in the last hour (from sked.overview_since(p_now) to p_now), per queue,
-- minute (its start) and final state, in no particular order. The whole minutes before
-- p_now's come from the rollups (sked.finishes_by_minute, sql/finishes.sql): a few rows per
-- minute, whatever the finishes in it (the scan of every finish of the hour that this replaced
-- took 140 ms at 80,000 finishes). p_now's own minute, up to p_now, is read from the index
-- tasks_finished: at most a minute of finishes, and exact for a p_now in the past too.
create or replace function sked.tasks_finished_by_minute(p_owner text default null,
                                                         p_now timestamptz default now())
returns table (queue text, minute timestamptz, state text, tasks bigint)
language sql stable as $$
  select f.queue, f.minute, f.state, f.tasks
    from sked.finishes_by_minute(p_owner, sked.overview_since(p_now),
                                 date_trunc('minute', p_now)) f
  union all
  select t.queue, date_trunc('minute', t.finished_at), t.state, count(*)
    from sked.tasks t
   where t.finished_at >= date_trunc('minute', p_now) and t.finished_at <= p_now
     and (p_owner is null or t.owner = p_owner)
   group by 1, 2, 3
$$;
