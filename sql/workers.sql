-- The worker functions of the SQL contract: registry, claim, finish, heartbeat and rescue.
-- Every transition after the claim is fenced by (id, state = 'running', attempt): a worker
-- whose lease was taken over changes nothing, and learns so from the rows not returned. The
-- batch functions write the running state as `lease_expires_at is not null` (the same rows:
-- tasks_lease_is_set_iff_running), which no partial index names: a condition on the state
-- would let the planner walk tasks_running, the index of every running task, once per row of
-- a batch when the statistics say that nothing runs.
--
-- Planner note: the hot-path functions run with `enable_seqscan = off`. Their statements
-- address rows by primary key or walk a partial index, but the statistics of a queue table
-- go stale within seconds (a table analysed while nothing ran says "no task is running"),
-- and a plan built on them may scan the whole table once per row of a batch. Every function
-- that turns sequential scans off also turns JIT compilation off (a test holds them to it): a
-- question that no index answers (is any queue concurrency-limited? which workers have been
-- silent for a day?) is planned as a disabled sequential scan of a small table, whose
-- penalty cost made PostgreSQL compile the statement to machine code on every run: 150 ms
-- for a claim that read sked.queues, 26 ms for a rescue that should take 1 ms. So does the
-- alerts trigger (sql/alerts.sql), which reads sked.queues after any statement that changes
-- tasks, within whatever function made it.

-- Register (or re-register) a worker, with the capacity it advertises: CPU millicores and
-- memory MB (null: it does not say, and claims by slots and labels only).
create or replace function sked.worker_register(
  p_id uuid, p_name text, p_host text, p_pid integer, p_version text, p_queues text[],
  p_labels text[], p_concurrency integer, p_lease interval, p_cpu_millis integer,
  p_memory_mb integer, p_now timestamptz default now())
returns void
language sql as $$
  insert into sked.workers (id, name, host, pid, version, queues, labels, concurrency, lease,
                            cpu_millis, memory_mb, started_at, heartbeat_at)
  values (p_id, p_name, p_host, p_pid, p_version, p_queues, p_labels, p_concurrency, p_lease,
          p_cpu_millis, p_memory_mb, p_now, p_now)
  on conflict (id) do update
     set heartbeat_at = excluded.heartbeat_at, queues = excluded.queues,
         labels = excluded.labels, concurrency = excluded.concurrency, lease = excluded.lease,
         cpu_millis = excluded.cpu_millis, memory_mb = excluded.memory_mb, stopping_at = null
$$;

-- The registration of a worker that advertises no capacity (older callers).
create or replace function sked.worker_register(
  p_id uuid, p_name text, p_host text, p_pid integer, p_version text, p_queues text[],
  p_labels text[], p_concurrency integer, p_lease interval, p_now timestamptz default now())
returns void
language sql as $$
  select sked.worker_register(p_id, p_name, p_host, p_pid, p_version, p_queues, p_labels,
                              p_concurrency, p_lease, null, null, p_now)
$$;

-- A clean exit: the worker has handed back or finished all its tasks.
create or replace function sked.worker_deregister(p_id uuid) returns void
language sql as $$
  delete from sked.workers where id = p_id
$$;

-- A task that has been due this long makes room for itself: see "Placement" below.
create or replace function sked.claim_reserve_after() returns interval
language sql immutable parallel safe as $$
  select interval '30 seconds'
$$;

-- Do requests of (cpu, memory) fit a capacity of (cpu, memory)? A null request asks for
-- nothing and a null capacity is unbounded, in each dimension.
create or replace function sked.task_fits(
  cpu_millis bigint, memory_mb bigint, cap_cpu_millis bigint, cap_memory_mb bigint)
returns boolean
language sql immutable parallel safe as $$
  select (cpu_millis is null or cap_cpu_millis is null or cpu_millis <= cap_cpu_millis)
     and (memory_mb is null or cap_memory_mb is null or memory_mb <= cap_memory_mb)
$$;

-- May worker p_worker pick this due task (its columns) in a claim: it has the task's labels,
-- the shard rules let it (sql/shards.sql), and the task asks for nothing, or its requests fit
-- the free capacity (p_cpu_millis, p_memory_mb), or it is due for more than
-- sked.claim_reserve_after() and fits the worker's whole capacity (p_whole_cpu, p_whole_mem):
-- see "Placement" at sked.tasks_claim. Inlined into the claim's scans: a filter on the row
-- the index scan visits.
create or replace function sked.task_claimable_by(
  labels text[], shard_of uuid, pinned_worker uuid, next_run_at timestamptz,
  cpu_millis integer, memory_mb integer, p_worker uuid, p_labels text[],
  p_cpu_millis integer, p_memory_mb integer, p_whole_cpu integer, p_whole_mem integer,
  p_now timestamptz)
returns boolean
language sql stable as $$
  select (labels = '{}' or labels <@ p_labels)
     and (shard_of is null
          or sked.shard_claimable(shard_of, pinned_worker, next_run_at, p_worker, p_now))
     and (cpu_millis is null and memory_mb is null
          or sked.task_fits(cpu_millis, memory_mb, p_cpu_millis, p_memory_mb)
          or (next_run_at <= p_now - sked.claim_reserve_after()
              and sked.task_fits(cpu_millis, memory_mb, p_whole_cpu, p_whole_mem)))
$$;

-- The pick of a locked row (its columns) for sked.tasks_start, given the worker's free
-- capacity (p_cpu_millis, p_memory_mb): whether it is a new shard, and whether it is locked
-- only to hold the capacity for it (its requests do not fit the free capacity).
create or replace function sked.claim_pick_of(
  id uuid, priority integer, next_run_at timestamptz, shard_of uuid, shard_index integer,
  cpu_millis integer, memory_mb integer, p_cpu_millis integer, p_memory_mb integer,
  p_now timestamptz)
returns sked.claim_pick
language sql stable as $$
  select row(id, priority, next_run_at, shard_of, shard_index, cpu_millis, memory_mb,
             shard_of is not null and sked.shard_is_new(next_run_at, p_now),
             not (cpu_millis is null and memory_mb is null
                  or sked.task_fits(cpu_millis, memory_mb, p_cpu_millis, p_memory_mb)))::sked.claim_pick
$$;

-- Start the rows a claim picked and locked (p_picks, in any order) on worker p_worker: the
-- one statement that moves a task to `running`, for every claim (sked.tasks_claim,
-- sked.copies_claim, sked.copies_claim_preempting). Of the picked rows it starts
--   * those without requests, and the longest prefix in claim order (priority desc,
--     next_run_at, id) of those with requests whose running sums fit the free capacity
--     (p_cpu_millis, p_memory_mb; null: unbounded), stopping at the first one kept in reserve
--     (see "Placement" at sked.tasks_claim);
--   * of the new shards (spread), one per parent: the lowest index;
-- and charges each an attempt under a lease. The rest stay as they were, locked until the
-- claim commits. The prefix and the shards are computed over the picks (hashed subplans, run
-- on first use) only when a pick has requests or is a new shard: starting plain tasks reads
-- each row once, by primary key.
create or replace function sked.tasks_start(
  p_picks sked.claim_pick[], p_worker uuid, p_lease interval, p_cpu_millis integer,
  p_memory_mb integer, p_now timestamptz)
returns setof sked.tasks
-- PL/pgSQL keeps the statement's plan for the session; a SQL function plans it on every call.
language plpgsql
set enable_seqscan = off -- see the note at the top of this file
set jit = off
-- PL/pgSQL keeps the plan only when it chooses a generic one, and here it often did not: a
-- custom plan for every claim, planned again each time (0.15 ms on a quiet machine, a sixth
-- of a one-task claim's time). The generic plan is the same: the picks by primary key.
set plan_cache_mode = force_generic_plan
as $$
begin
  return query
  with picked as materialized (
    select * from unnest(p_picks)
  )
  update sked.tasks t
     set state = 'running', attempt = t.attempt + 1, worker_id = p_worker, started_at = p_now,
         lease_expires_at = p_now + p_lease, exit_code = null, error = null,
         stdout_tail = null, stderr_tail = null, output_sha256 = null
    from picked
   where t.id = picked.id
     and (picked.cpu_millis is null and picked.memory_mb is null
          or picked.id in (select f.id
                             from (select p.id, bool_or(p.reserve) over w as behind_reserve,
                                          sum(p.cpu_millis) over w as cpu, sum(p.memory_mb) over w as mem
                                     from picked p
                                   window w as (order by p.priority desc, p.next_run_at, p.id
                                                rows unbounded preceding)) f
                            where not f.behind_reserve
                              and sked.task_fits(f.cpu, f.mem, p_cpu_millis, p_memory_mb)))
     and (not picked.spread
          or picked.id in (select distinct on (q.shard_of) q.id from picked q
                            where q.spread order by q.shard_of, q.shard_index))
  returning t.*;
end
$$;

-- Claim up to p_limit due tasks of the given queues whose required labels the worker has and
-- whose CPU and memory requests fit its free capacity (p_cpu_millis, p_memory_mb; null:
-- unbounded), under the queues' controls (sql/queues.sql).
--
-- Shape: each branch below only picks and locks rows: a SELECT that walks the partial index
-- tasks_claimable (queue, priority desc, next_run_at, id) in claim order and stops after p_limit
-- rows, with FOR UPDATE SKIP LOCKED, so that concurrent claimers pass over each other's rows
-- instead of waiting and each task is claimed by exactly one of them. The picks feed
-- sked.tasks_start in the same statement, which starts what fits of them; the LIMIT applies
-- to the locked rows, never to a join. One queue gets a plain equality so the planner keeps
-- the ordered index scan (an `= any(array)` scan would sort). What a claim may pick is
-- sked.task_claimable_by, inlined into each scan.
--
-- Shards (docs/shards.md) obey two more rules, which only shard rows pay for: a pinned shard
-- is claimed by its own worker only, and while shards are new (sked.shard_is_new) a worker
-- that runs a shard of the parent passes over its other shards, and one claim takes at most
-- one of them (the lowest index it locked; the others it locked stay as they were). A map's
-- instances are shards without these rules (sked.shard_spread_of).
--
-- Placement (docs/runtime.md), which only tasks with requests pay for: the scan passes over
-- a task whose request exceeds the free capacity, so a big task never blocks smaller ones
-- behind it. Of the locked rows, the claim takes those without requests and the longest
-- prefix (in claim order) of those with requests whose running sums fit the free capacity
-- (sked.tasks_start); the rest stay as they were. Against starvation of big tasks: a task
-- due for more than sked.claim_reserve_after() that fits the worker's whole capacity (its
-- row in sked.workers) but not its free capacity is locked too, and the claim takes no task
-- with requests behind it, so the worker's capacity drains until the big task fits.
--
-- A row with no attempt left (attempt = max_attempts) is passed over: the claim charges an
-- attempt, and one such row would make every claim of its worker fail on a constraint. The
-- schema refuses such rows (tasks_waiting_task_must_have_an_attempt_left); one left from
-- before the rule waits, and sked.task_waiting_reasons says why. The test is a filter on the
-- row the index scan already visits.
--
-- Services first: while a copy of a service of the worker's queues is due, the claim takes
-- the due copies first (sked.copies_claim, sql/services.sql) and returns them alone (the worker claims again
-- at once). When none fits but one would fit the worker's whole capacity, the claim takes
-- only tasks without requests, so the worker's CPU and memory drain until the copy fits.
-- Claims while no copy waits pay one probe of the empty index tasks_waiting_copies.
--
-- Positions: a worker of one queue may give the position in claim order (priority,
-- next_run_at, id) of the last task it took (p_after_*); the claim then scans the queue's
-- higher priorities from their front (a task more urgent than the position), its priority
-- from just after the position, and the lower priorities from their front, each range one
-- descent of tasks_claimable. Without a position it scans from the front. Why: an index
-- entry of a claimed task stays in tasks_claimable until vacuum removes it, and vacuum
-- removes none made dead after the oldest snapshot still open; while a session holds one
-- (idle in transaction, a long report, a backup), a claim from the front walks and checks
-- every task taken since, and claims slow down as the queue flows. From a position they do
-- not. What a claim from a position passes over (a task that became visible behind it: its
-- transaction began before the position's task was due, or it waited locked or too big
-- for the free capacity) waits for the next claim from the front, which the worker makes
-- whenever one costs little and at least every twenty times as long as one takes
-- (worker/src/lib.rs, `Positions`). Workers of several queues, and queues with controls,
-- always claim from the front.
--
-- Queue controls: when a queue of the worker is paused or limited in sked.queues,
-- sked.queues_allowance drops paused queues and gives each queue its allowance (locking the
-- rows of limited ones); one ordered, locked scan per queue, each limited to its allowance,
-- then feeds the same start, and the rate-limited queues' buckets are charged in the same
-- statement. Workers of queues without a row pay one probe of the sked.queues primary key.
create or replace function sked.tasks_claim(
  p_worker uuid, p_queues text[], p_labels text[], p_limit integer, p_lease interval,
  p_cpu_millis integer, p_memory_mb integer, p_after_priority integer,
  p_after_run_at timestamptz, p_after_id uuid, p_now timestamptz default now())
returns setof sked.tasks
language plpgsql
set enable_seqscan = off -- see the note at the top of this file
set jit = off
as $$
declare
  whole_cpu integer := p_cpu_millis;
  whole_mem integer := p_memory_mb;
  queues text[];
  allowances integer[];
  -- The ranges of the claim's scan of one queue, in claim order: priorities from lows to
  -- highs, after the position (next_run_at, id) within it (see "Positions" above).
  highs bigint[] := array[2147483647];
  lows bigint[] := array[-2147483648];
  after_run_at timestamptz[] := array['-infinity'::timestamptz];
  after_id uuid[] := array['00000000-0000-0000-0000-000000000000'::uuid];
begin
  if p_after_id is not null then
    highs := array[2147483647, p_after_priority, p_after_priority::bigint - 1];
    lows := array[p_after_priority::bigint + 1, p_after_priority, -2147483648];
    after_run_at := array['-infinity', p_after_run_at, '-infinity'];
    after_id := array[after_id[1], p_after_id, after_id[1]];
  end if;

  if p_cpu_millis is not null or p_memory_mb is not null then
    select coalesce(w.cpu_millis, p_cpu_millis), coalesce(w.memory_mb, p_memory_mb)
      into whole_cpu, whole_mem
      from sked.workers w where w.id = p_worker;
  end if;

  if exists (select 1 from sked.tasks t
              where t.kind = 'service' and t.shard_of is not null
                and sked.state_is_claimable(t.state) and t.queue = any(p_queues)
                and t.next_run_at <= p_now) then
    return query select * from sked.copies_claim(p_worker, p_queues, p_labels, p_limit, p_lease,
                                                 p_cpu_millis, p_memory_mb, p_now);
    if found then
      return;
    end if;
    if (p_cpu_millis is not null or p_memory_mb is not null)
       and exists (select 1 from sked.tasks t
                    where t.kind = 'service' and t.shard_of is not null
                      and sked.state_is_claimable(t.state) and t.queue = any(p_queues)
                      and t.next_run_at <= p_now
                      and sked.copy_claimable(t.queue, t.labels, t.shard_of, t.pinned_worker,
                                              t.next_run_at, p_worker, p_labels, p_now)
                      and not sked.task_fits(t.cpu_millis, t.memory_mb, p_cpu_millis, p_memory_mb)
                      and sked.task_fits(t.cpu_millis, t.memory_mb, whole_cpu, whole_mem)) then
      -- Hold the capacity for the copy: only tasks without requests fit from here on.
      p_cpu_millis := case when p_cpu_millis is not null then 0 end;
      p_memory_mb := case when p_memory_mb is not null then 0 end;
    end if;
  end if;

  -- A row that holds only a retention (sql/retention.sql) is no control of the claim.
  if exists (select 1 from sked.queues q
              where q.name = any(p_queues)
                and (q.paused_at is not null or q.max_running is not null
                     or q.rate_per_sec is not null)) then
    select coalesce(array_agg(a.queue), '{}'), coalesce(array_agg(a.allowance), '{}')
      into queues, allowances
      from sked.queues_allowance(p_queues, p_limit, p_now) a;
    if cardinality(queues) = 0 then
      return;
    end if;
    return query
    with claimed as (
      select s.* from sked.tasks_start(array(
        select c.pick
          from unnest(queues, allowances) as q(name, allowance)
          cross join lateral (
            select sked.claim_pick_of(t.id, t.priority, t.next_run_at,
                                      sked.shard_spread_of(t.shard_of, t.map_over), t.shard_index,
                                      t.cpu_millis, t.memory_mb, p_cpu_millis, p_memory_mb,
                                      p_now) as pick,
                   t.priority, t.next_run_at, t.id
              from sked.tasks t
             where sked.state_is_claimable(t.state) and t.queue = q.name
               and t.next_run_at <= p_now and t.attempt < t.max_attempts
               and sked.task_claimable_by(t.labels, sked.shard_spread_of(t.shard_of, t.map_over),
                                          t.pinned_worker, t.next_run_at,
                                          t.cpu_millis, t.memory_mb, p_worker, p_labels,
                                          p_cpu_millis, p_memory_mb, whole_cpu, whole_mem, p_now)
             order by t.priority desc, t.next_run_at, t.id
             limit q.allowance
             for update skip locked
          ) c
         order by c.priority desc, c.next_run_at, c.id
         limit p_limit), p_worker, p_lease, p_cpu_millis, p_memory_mb, p_now) s
    ), charged as (
      update sked.queues q
         set tokens = sked.queue_tokens(q.rate_per_sec, q.burst, q.tokens, q.tokens_at, p_now) - n.started,
             tokens_at = greatest(q.tokens_at, p_now)
        from (select c.queue, count(*) as started from claimed c group by c.queue) n
       where q.name = n.queue and q.rate_per_sec is not null
    )
    select * from claimed;
  elsif cardinality(p_queues) = 1 then
    -- One scan per range, in claim order; the outer limit stops the scans once it is met.
    return query
    select * from sked.tasks_start(array(
      select c.pick
        from unnest(highs, lows, after_run_at, after_id) as r(high, low, run_at, id)
        cross join lateral (
          select sked.claim_pick_of(t.id, t.priority, t.next_run_at,
                                    sked.shard_spread_of(t.shard_of, t.map_over), t.shard_index,
                                    t.cpu_millis, t.memory_mb, p_cpu_millis, p_memory_mb,
                                    p_now) as pick
            from sked.tasks t
           where sked.state_is_claimable(t.state) and t.queue = p_queues[1]
             and t.priority <= r.high and t.priority >= r.low
             and (t.next_run_at, t.id) > (r.run_at, r.id)
             and t.next_run_at <= p_now and t.attempt < t.max_attempts
             and sked.task_claimable_by(t.labels, sked.shard_spread_of(t.shard_of, t.map_over),
                                        t.pinned_worker, t.next_run_at,
                                        t.cpu_millis, t.memory_mb, p_worker, p_labels,
                                        p_cpu_millis, p_memory_mb, whole_cpu, whole_mem, p_now)
           order by t.priority desc, t.next_run_at, t.id
           limit p_limit
           for update skip locked
        ) c
       limit p_limit), p_worker, p_lease, p_cpu_millis, p_memory_mb, p_now);
  else
    return query
    select * from sked.tasks_start(array(
      select sked.claim_pick_of(t.id, t.priority, t.next_run_at,
                                sked.shard_spread_of(t.shard_of, t.map_over), t.shard_index,
                                t.cpu_millis, t.memory_mb, p_cpu_millis, p_memory_mb, p_now)
        from sked.tasks t
       where sked.state_is_claimable(t.state) and t.queue = any(p_queues)
         and t.next_run_at <= p_now and t.attempt < t.max_attempts
         and sked.task_claimable_by(t.labels, sked.shard_spread_of(t.shard_of, t.map_over),
                                    t.pinned_worker, t.next_run_at,
                                    t.cpu_millis, t.memory_mb, p_worker, p_labels,
                                    p_cpu_millis, p_memory_mb, whole_cpu, whole_mem, p_now)
       order by t.priority desc, t.next_run_at, t.id
       limit p_limit
       for update skip locked), p_worker, p_lease, p_cpu_millis, p_memory_mb, p_now);
  end if;
end
$$;

-- The claim from the front of the queues (no position).
create or replace function sked.tasks_claim(
  p_worker uuid, p_queues text[], p_labels text[], p_limit integer, p_lease interval,
  p_cpu_millis integer, p_memory_mb integer, p_now timestamptz default now())
returns setof sked.tasks
language sql as $$
  select * from sked.tasks_claim(p_worker, p_queues, p_labels, p_limit, p_lease, p_cpu_millis,
                                 p_memory_mb, null, null, null, p_now)
$$;

-- The claim of a worker that advertises no capacity (older callers): by slots and labels.
create or replace function sked.tasks_claim(
  p_worker uuid, p_queues text[], p_labels text[], p_limit integer, p_lease interval,
  p_now timestamptz default now())
returns setof sked.tasks
language sql as $$
  select * from sked.tasks_claim(p_worker, p_queues, p_labels, p_limit, p_lease, null, null,
                                 null, null, null, p_now)
$$;

-- The earliest next_run_at at or after p_from among claimable tasks of these queues (null
-- when there is none), leaving out paused queues; or, when earlier, the moment a rate-limited
-- queue whose due tasks wait for its bucket can start one again. Reads no clock. A worker asks from the time of its last claim: the
-- tasks due before then were claimed, or are not its to claim (taken by another worker,
-- labels it lacks) and are left to the poll, so the answer is the next moment a claim can
-- find something new, even a task that became due while the question was on its way.
create or replace function sked.tasks_due_from(p_queues text[], p_from timestamptz)
returns timestamptz
language sql stable
set enable_seqscan = off -- see the note at the top of this file
set jit = off
as $$
  -- A loose scan of tasks_claimable (queue, priority desc, next_run_at, id): one index probe
  -- finds each priority of each queue with a task due from p_from, one more that priority's
  -- earliest such task. The probes test next_run_at on the index entries, so the entries of
  -- tasks claimed before p_from (kept while an old snapshot is open) cost no visit of the
  -- table.
  with recursive priorities (queue, priority) as (
    select q.name, f.priority
      from unnest(p_queues) as q(name)
      cross join lateral (
        select t.priority from sked.tasks t
         where sked.state_is_claimable(t.state) and t.queue = q.name and t.next_run_at >= p_from
         order by t.priority desc limit 1
      ) f
    union all
    select p.queue, n.priority
      from priorities p
      cross join lateral (
        select t.priority from sked.tasks t
         where sked.state_is_claimable(t.state) and t.queue = p.queue and t.priority < p.priority
           and t.next_run_at >= p_from
         order by t.priority desc limit 1
      ) n
  )
  select least(
           min(d.next_run_at),
           -- A rate-limited queue with due tasks and an empty bucket: when its next start is.
           (select min(c.tokens_at + (1 - c.tokens) / c.rate_per_sec * interval '1 second')
              from sked.queues c
             where c.name = any(p_queues) and c.rate_per_sec is not null and c.paused_at is null
               and sked.queue_tokens(c.rate_per_sec, c.burst, c.tokens, c.tokens_at, p_from) < 1
               and exists (select 1 from sked.tasks t
                            where sked.state_is_claimable(t.state) and t.queue = c.name
                              and t.next_run_at <= p_from)))
    from priorities p
    cross join lateral (
      select t.next_run_at from sked.tasks t
       where sked.state_is_claimable(t.state) and t.queue = p.queue and t.priority = p.priority
         and t.next_run_at >= p_from
       order by t.next_run_at limit 1
    ) d
   -- A paused queue's tasks wake nobody.
   where not exists (select 1 from sked.queues c where c.name = p.queue and c.paused_at is not null)
$$;

-- Seconds from p_now until the earliest next_run_at among claimable tasks of these queues
-- (null when there is none; zero or negative when one is due), on the database clock.
create or replace function sked.tasks_next_due(p_queues text[], p_now timestamptz default now())
returns double precision
language sql stable
as $$
  select (extract(epoch from sked.tasks_due_from(p_queues, '-infinity'))
          - extract(epoch from p_now))::double precision
$$;

-- The state an attempt's outcome leads to (see tasks_finish).
create or replace function sked.finish_state(
  outcome text, cancel_requested boolean, attempt integer, max_attempts integer)
returns text
language sql immutable parallel safe as $$
  select case
           when outcome = 'succeeded' then 'succeeded'
           when outcome = 'cancelled' or cancel_requested then 'cancelled'
           when outcome = 'interrupted' then 'waiting'
           when attempt >= max_attempts then 'failed'
           else 'retry'
         end
$$;

-- Finish a batch of attempts. Each element names a task, the attempt it ran and its outcome:
--   succeeded          -> succeeded
--   failed, timed_out  -> retry with exponential backoff while attempts remain, else failed
--   cancelled          -> cancelled (the worker killed it on a cancel request)
--   interrupted        -> waiting again (the worker shut down; the attempt is not charged:
--                         max_attempts grows by one so attempt numbers keep growing)
-- A task whose cancel was requested ends cancelled whatever the failure. The backoff before
-- attempt n+1 is least(backoff_max, backoff_base * 2^(n-1)) plus up to 10% jitter.
-- `p_outputs` holds each attempt's JSON output (null for none), kept in the task row.
-- Tasks that end with children or in a workflow are settled in the same transaction: their
-- children are released or end by their trigger rules (sked.tasks_settle).
-- The queues whose tasks became claimable, and the concurrency-limited queues whose tasks
-- ended, get one `sked_tasks` notification.
-- Returns the rows that changed with their new state; an input missing from the result was
-- not running under that attempt any more: its worker lost the lease.
drop function if exists sked.tasks_finish(uuid[], integer[], text[], integer[], text[], text[],
                                          text[], text[], timestamptz);
create or replace function sked.tasks_finish(
  p_ids uuid[], p_attempts integer[], p_outcomes text[], p_exit_codes integer[],
  p_errors text[], p_stdout_tails text[], p_stderr_tails text[], p_output_sha256 text[],
  p_outputs jsonb[], p_now timestamptz default now())
returns table (id uuid, state text)
language plpgsql
set enable_seqscan = off -- see the note at the top of this file
set jit = off
-- A plan for the batch's values trusts the statistics' "no task is running" and loops over
-- the whole batch for each of its rows (0.4 s for 1,000 results, the first five calls of
-- every connection); the generic plan looks the rows up by id.
set plan_cache_mode = force_generic_plan
as $$
declare
  ids uuid[];
  states text[];
  queues text;
  settle uuid[];
  -- Queues with a concurrency limit: their workers may wait for a running task to end.
  limited boolean := exists (select 1 from sked.queues q where q.max_running is not null);
  freed text[];
begin
  with given as (
    select * from unnest(p_ids, p_attempts, p_outcomes, p_exit_codes, p_errors,
                         p_stdout_tails, p_stderr_tails, p_output_sha256, p_outputs)
             as u(id, attempt, outcome, exit_code, error, stdout_tail, stderr_tail, output_sha256,
                  output)
  ), input as (
    -- A branch that succeeded must name its children in its output, or its attempt fails
    -- (sql/workflows.sql, "Branches"): one probe of tasks_branches per result.
    select u.id, u.attempt,
           case when b.error is not null then 'failed' else u.outcome end as outcome,
           u.exit_code, coalesce(b.error, u.error) as error, u.stdout_tail, u.stderr_tail,
           u.output_sha256, u.output
      from given u
      left join lateral (
        select sked.branch_output_error(t.id, u.output) as error
          from sked.tasks t
         where t.id = u.id and t.branch and u.outcome = 'succeeded'
      ) b on true
  ), updated as (
    update sked.tasks t
       set state = sked.finish_state(u.outcome, t.cancel_requested_at is not null, t.attempt, t.max_attempts),
           finished_at = case when sked.finish_state(u.outcome, t.cancel_requested_at is not null,
                                                     t.attempt, t.max_attempts)
                                   in ('succeeded', 'failed', 'cancelled')
                              then p_now end,
           next_run_at = case sked.finish_state(u.outcome, t.cancel_requested_at is not null,
                                                t.attempt, t.max_attempts)
                           when 'retry' then p_now + least(t.backoff_max, t.backoff_base * power(2, t.attempt - 1))
                                                     * (1 + 0.1 * random())
                           when 'waiting' then p_now
                           else t.next_run_at end,
           max_attempts = t.max_attempts + (u.outcome = 'interrupted' and t.cancel_requested_at is null)::integer,
           lease_expires_at = null,
           exit_code = u.exit_code, error = u.error,
           stdout_tail = u.stdout_tail, stderr_tail = u.stderr_tail,
           output_sha256 = u.output_sha256, output = u.output
      from input u
     where t.id = u.id and t.lease_expires_at is not null and t.attempt = u.attempt
    returning t.id, t.state, t.queue, t.worker_id, t.started_at, t.attempt, u.outcome,
              u.exit_code, u.error, u.stdout_tail, u.stderr_tail,
              t.children > 0 or t.workflow_id is not null as settles
  ), history as (
    insert into sked.task_attempts (task_id, attempt, worker_id, started_at, finished_at, outcome,
                                    exit_code, error, stdout_tail, stderr_tail)
    select d.id, d.attempt, d.worker_id, d.started_at, p_now,
           case when d.state = 'cancelled' then 'cancelled' else d.outcome end,
           d.exit_code, d.error, d.stdout_tail, d.stderr_tail
      from updated d where d.state <> 'succeeded'
  )
  select array_agg(d.id), array_agg(d.state),
         string_agg(distinct d.queue, ',') filter (where sked.state_is_claimable(d.state)),
         array_agg(d.id) filter (where d.settles and d.state in ('succeeded', 'failed', 'cancelled')),
         array_agg(distinct d.queue) filter (where limited)
    into ids, states, queues, settle, freed
    from updated d;
  if settle is not null then
    queues := nullif(concat_ws(',', queues, sked.tasks_settle(settle, p_now)), '');
  end if;
  if freed is not null then
    -- A limited queue's ended tasks free room in it: wake its workers.
    queues := nullif(concat_ws(',', queues,
                               (select string_agg(q.name, ',') from sked.queues q
                                 where q.name = any(freed) and q.max_running is not null
                                   and q.paused_at is null)), '');
  end if;
  if queues is not null then
    perform pg_notify('sked_tasks', left(queues, 7000));
  end if;
  return query select * from unnest(ids, states);
end
$$;

-- Refresh a worker's heartbeat; false when its row is gone (it must register again).
create or replace function sked.worker_touch(p_worker uuid, p_now timestamptz default now())
returns boolean
language plpgsql as $$
begin
  update sked.workers set heartbeat_at = p_now where id = p_worker;
  return found;
end
$$;

-- A worker's heartbeat: refreshes it, and answers how many live workers (this one included)
-- serve a queue of this worker: registered, not stopping, and heard from within their lease.
-- They share the work that any one of them may do when nothing is due (the claim's poll and
-- the duties of background upkeep), each doing it that many times less often, so that what
-- idle workers cost the database does not grow with their number. 0 when the worker's row
-- is gone (it must register again).
create or replace function sked.worker_heartbeat(p_worker uuid, p_now timestamptz default now())
returns integer
language plpgsql as $$
declare
  ours text[];
begin
  update sked.workers set heartbeat_at = p_now where id = p_worker returning queues into ours;
  if not found then
    return 0;
  end if;
  return (select count(*) from sked.workers w
           where w.queues && ours and w.stopping_at is null
             and w.heartbeat_at > p_now - w.lease);
end
$$;

-- Renew the leases of a worker's running attempts in one statement. Returns the attempts the
-- worker still holds, and whether a cancel was requested for each. Only a lease that has not
-- expired is extended, fenced by attempt and worker: an attempt missing from the result is no
-- longer the worker's (its lease expired, whether or not the task was rescued yet), and the
-- worker stops it. An expired lease is never revived, because the worker stopped the attempt
-- before it expired, and any worker may rescue the task from that moment on.
create or replace function sked.tasks_renew_leases(
  p_worker uuid, p_ids uuid[], p_attempts integer[], p_lease interval,
  p_now timestamptz default now())
returns table (id uuid, attempt integer, cancel_requested boolean)
language sql
set enable_seqscan = off -- see the note at the top of this file
set jit = off
as $$
  update sked.tasks t set lease_expires_at = p_now + p_lease
    from unnest(p_ids, p_attempts) as u(id, attempt)
   where t.id = u.id and t.attempt = u.attempt and t.lease_expires_at is not null
     and t.worker_id = p_worker
     and t.lease_expires_at > p_now
  returning t.id, t.attempt, t.cancel_requested_at is not null
$$;

-- The attempts the database counts as a worker's: its running tasks. A worker that did not get
-- the answer to a claim (the connection broke, or the claim timed out) compares them with the
-- attempts it holds, and hands back those the lost claim took (see tasks_finish, 'interrupted').
-- They are found by tasks_running (worker_id, …).
create or replace function sked.worker_attempts(p_worker uuid)
returns table (id uuid, attempt integer)
language sql stable
set enable_seqscan = off -- see the note at the top of this file
set jit = off
as $$
  select t.id, t.attempt from sked.tasks t
   where t.state = 'running' and t.worker_id = p_worker
$$;

-- The attempts among those given whose cancel was requested (polled every second while a
-- worker runs tasks; the sked_cancel notification makes it faster).
create or replace function sked.tasks_cancel_requested(p_ids uuid[], p_attempts integer[])
returns table (id uuid, attempt integer)
language sql stable
set enable_seqscan = off -- see the note at the top of this file
set jit = off
as $$
  select t.id, t.attempt from sked.tasks t
    join unnest(p_ids, p_attempts) as u(id, attempt) on t.id = u.id and t.attempt = u.attempt
   where t.lease_expires_at is not null and t.cancel_requested_at is not null
$$;

-- Take back running tasks whose lease expired (their worker died or lost the database).
-- The lost attempt counts as failed ("worker lost"): the task is retried at once while
-- attempts remain, else it fails; a task whose cancel was requested ends cancelled. A pinned
-- shard (of a broadcast) does not move to another worker: it fails at once. Pinned shards
-- still waiting for a worker that is gone fail too (sked.shards_fail_orphaned).
-- Safe to run from any number of processes at once (SKIP LOCKED).
drop function if exists sked.tasks_rescue(timestamptz, integer);
create or replace function sked.tasks_rescue(p_limit integer default 1000, p_now timestamptz default now())
returns table (id uuid, state text)
language plpgsql
set enable_seqscan = off -- see the note at the top of this file
set jit = off
as $$
declare
  ids uuid[];
  states text[];
  queues text;
  settle uuid[];
begin
  with lost as (
    select t.id from sked.tasks t
     where t.state = 'running' and t.lease_expires_at < p_now
     order by t.lease_expires_at
     limit p_limit
     for update skip locked
  ), updated as (
    update sked.tasks t
       set state = sked.finish_state('worker_lost', t.cancel_requested_at is not null, t.attempt,
                                     case when t.pinned_worker is null then t.max_attempts else t.attempt end),
           finished_at = case when t.cancel_requested_at is not null or t.attempt >= t.max_attempts
                                   or t.pinned_worker is not null
                              then p_now end,
           next_run_at = p_now, lease_expires_at = null, exit_code = null,
           error = case when t.pinned_worker is null then 'worker lost: lease expired'
                        else 'worker lost: lease expired; this broadcast shard runs only on its own worker'
                   end,
           stdout_tail = null, stderr_tail = null
      from lost where t.id = lost.id
    returning t.id, t.state, t.queue, t.worker_id, t.started_at, t.attempt, t.error,
              t.children > 0 or t.workflow_id is not null as settles
  ), history as (
    insert into sked.task_attempts (task_id, attempt, worker_id, started_at, finished_at, outcome, error)
    select d.id, d.attempt, d.worker_id, d.started_at, p_now,
           case when d.state = 'cancelled' then 'cancelled' else 'worker_lost' end,
           d.error
      from updated d
  )
  select array_agg(d.id), array_agg(d.state),
         string_agg(distinct d.queue, ',') filter (where d.state = 'retry'),
         array_agg(d.id) filter (where d.settles and d.state in ('failed', 'cancelled'))
    into ids, states, queues, settle
    from updated d;
  -- Tasks lost for good release or end their children, as in tasks_finish.
  if settle is not null then
    queues := nullif(concat_ws(',', queues, sked.tasks_settle(settle, p_now)), '');
  end if;
  queues := nullif(concat_ws(',', queues, sked.shards_fail_orphaned(p_now => p_now)), '');
  if queues is not null then
    perform pg_notify('sked_tasks', left(queues, 7000));
  end if;
  -- Workers silent for a day are gone for good; their tasks were rescued long ago.
  delete from sked.workers w where w.heartbeat_at < p_now - interval '1 day';
  return query select * from unnest(ids, states);
end
$$;
