-- Queue controls and the question "why does this task wait?". See docs/runtime.md.
--
-- A queue's controls live in its row of sked.queues (migrations/20261202000002_queues.sql):
-- paused, a cluster-wide concurrency limit (`max_running`) and a rate limit (`rate_per_sec`
-- tasks started per second, in bursts of up to `burst`). The claim (sked.tasks_claim in
-- sql/workers.sql) enforces them; the functions here change them and explain a waiting task.
-- The row also holds the queue's retention (sql/retention.sql), so a function here that
-- removes a row without controls keeps one that still has a retention.
--
-- Functions here that plan with `enable_seqscan = off` (see the planner note at the top of
-- sql/workers.sql) also turn JIT compilation off, as in sql/shards.sql.

-- Raises check_violation for a bad control value, naming the rule as the constraint, so that
-- clients read the rule from the constraint and people from the message.
create or replace function sked.queue_rule_raise(rule text, says text) returns void
language plpgsql as $$
begin
  raise exception 'sked.queues: %', says
    using errcode = 'check_violation', constraint = rule, table = 'queues', schema = 'sked';
end
$$;

-- Checks a queue name by the rule task queues follow (tasks_queue_name_must_be_1_to_64_word_characters).
create or replace function sked.queue_name_check(p_name text) returns void
language plpgsql as $$
begin
  if p_name is null or not (length(p_name) between 1 and 64
       and ltrim(p_name, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-') = ''
       and ltrim(left(p_name, 1), '_.:-') <> '') then
    perform sked.queue_rule_raise('queues_name_must_be_1_to_64_word_characters',
      format('queue %L must be 1 to 64 characters of A-Z, a-z, 0-9, _ . : - starting with a letter or digit',
             p_name));
  end if;
end
$$;

-- The burst of a rate limit: as set, else the rate rounded up (at least 1).
create or replace function sked.queue_burst(rate_per_sec double precision, burst integer)
returns integer
language sql immutable parallel safe as $$
  select coalesce(burst, greatest(1, ceil(rate_per_sec))::integer)
$$;

-- The starts a rate-limited queue's bucket holds at p_now: what it held at tokens_at, plus
-- rate_per_sec for every second since, up to the burst. Null without a rate limit.
create or replace function sked.queue_tokens(
  rate_per_sec double precision, burst integer, tokens double precision, tokens_at timestamptz,
  p_now timestamptz)
returns double precision
language sql immutable parallel safe as $$
  select least(sked.queue_burst(rate_per_sec, burst)::double precision,
               tokens + rate_per_sec * greatest(0, extract(epoch from p_now - tokens_at))::double precision)
$$;

-- How many tasks of each of p_queues one claim may take at p_now (at most p_limit each);
-- paused queues and queues with nothing to spare are left out. Called by sked.tasks_claim
-- only when one of the queues is paused or limited.
--
-- The rows of the limited queues are locked (FOR UPDATE, in name order so that claimers
-- never deadlock) until the claim commits: claimers of a limited queue take turns, and the
-- running tasks are counted by a later statement, whose snapshot therefore holds every
-- claim committed before the lock was granted. Claimers of unlimited queues lock nothing.
-- The count reads the index tasks_running (every running task), so it costs in proportion to
-- the tasks running in the whole cluster, and only claims of concurrency-limited queues pay it.
create or replace function sked.queues_allowance(p_queues text[], p_limit integer, p_now timestamptz)
returns table (queue text, allowance integer)
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
-- Its statements find rows by primary key and one index; planning them anew for every claim
-- (PostgreSQL's custom plans for the first calls, and whenever they look cheaper) cost more
-- than running them.
set plan_cache_mode = force_generic_plan
as $$
begin
  perform 1 from sked.queues q
    where q.name = any(p_queues) and q.paused_at is null
      and (q.max_running is not null or q.rate_per_sec is not null)
    order by q.name
    for update;
  return query
  select a.queue, a.allowance from (
  select u.name as queue,
         least(p_limit,
               case when q.max_running is null then p_limit
                    else q.max_running - (select count(*) from sked.tasks t
                                           where t.state = 'running' and t.queue = u.name)::integer
               end,
               case when q.rate_per_sec is null then p_limit
                    else floor(sked.queue_tokens(q.rate_per_sec, q.burst, q.tokens, q.tokens_at, p_now)
                               + 1e-9)::integer
               end) as allowance
    from (select distinct x.name from unnest(p_queues) as x(name)) u
    left join sked.queues q on q.name = u.name
   where q.paused_at is null
  ) a
  where a.allowance > 0;
end
$$;

-- Pause a queue: no claim takes its tasks from now on (tasks already running go on).
-- Idempotent: pausing a paused queue keeps the time it was first paused. Returns the queue's
-- controls.
create or replace function sked.queue_pause(p_name text, p_now timestamptz default now())
returns sked.queues
language plpgsql as $$
declare
  r sked.queues;
begin
  perform sked.queue_name_check(p_name);
  insert into sked.queues as q (name, paused_at, tokens_at, updated_at)
  values (p_name, p_now, p_now, p_now)
  on conflict (name) do update
     set paused_at = coalesce(q.paused_at, excluded.paused_at), updated_at = excluded.updated_at
  returning * into r;
  return r;
end
$$;

-- Resume a paused queue, and wake its workers (`sked_tasks`). Idempotent. A queue left
-- without any control loses its row. Returns the queue's controls (all null but the name
-- when it has none).
create or replace function sked.queue_resume(p_name text, p_now timestamptz default now())
returns sked.queues
language plpgsql as $$
declare
  r sked.queues;
begin
  perform sked.queue_name_check(p_name);
  -- The row is locked first, so that the statements below read its latest controls: a change
  -- committed meanwhile (its limits removed) cannot leave it with no control at all.
  perform 1 from sked.queues q where q.name = p_name for update;
  delete from sked.queues q
   where q.name = p_name and q.max_running is null and q.rate_per_sec is null
     and q.retention is null and q.keep_failed is null;
  update sked.queues q set paused_at = null, updated_at = p_now
   where q.name = p_name
  returning * into r;
  r.name := p_name;
  perform pg_notify('sked_tasks', p_name);
  return r;
end
$$;

-- Set (or, with null, remove) a queue's concurrency limit (tasks running at once over all
-- workers, 1 to 1,000,000), its rate limit (tasks started per second, more than 0 and at
-- most 1,000,000; fractions allowed: 0.5 is one start every two seconds) and the burst of
-- the rate limit (1 to 1,000,000 starts at once; default the rate rounded up). All three are
-- set together: null removes a limit. Bad values raise check_violation naming the rule, and
-- change nothing. A new rate limit starts with a full bucket; a changed one keeps what its
-- bucket holds (up to the new burst). Wakes the queue's workers. Returns the controls.
create or replace function sked.queue_set_limits(
  p_name text, p_max_running integer, p_rate_per_sec double precision, p_burst integer default null,
  p_now timestamptz default now())
returns sked.queues
language plpgsql as $$
declare
  r sked.queues;
begin
  perform sked.queue_name_check(p_name);
  if p_max_running is not null and not p_max_running between 1 and 1000000 then
    perform sked.queue_rule_raise('queues_max_running_must_be_1_to_1000000',
      format('max_running must be between 1 and 1000000 (null: no limit), got %s', p_max_running));
  end if;
  if p_rate_per_sec is not null
     and (p_rate_per_sec = 'NaN'::double precision or not (p_rate_per_sec > 0 and p_rate_per_sec <= 1000000)) then
    perform sked.queue_rule_raise('queues_rate_per_sec_must_be_positive_and_at_most_1000000',
      format('rate_per_sec must be more than 0 and at most 1000000 tasks per second (null: no limit), got %s',
             p_rate_per_sec));
  end if;
  if p_burst is not null and not p_burst between 1 and 1000000 then
    perform sked.queue_rule_raise('queues_burst_must_be_1_to_1000000',
      format('burst must be between 1 and 1000000 starts, got %s', p_burst));
  end if;
  if p_burst is not null and p_rate_per_sec is null then
    perform sked.queue_rule_raise('queues_burst_needs_a_rate',
      'burst needs rate_per_sec: it is the size of the rate limit''s bucket');
  end if;

  -- Locked first, as in sked.queue_resume.
  perform 1 from sked.queues q where q.name = p_name for update;
  if p_max_running is null and p_rate_per_sec is null then
    delete from sked.queues q
     where q.name = p_name and q.paused_at is null
       and q.retention is null and q.keep_failed is null;
  end if;
  update sked.queues q
     set max_running = p_max_running, rate_per_sec = p_rate_per_sec, burst = p_burst,
         tokens = case when p_rate_per_sec is null then 0
                       when q.rate_per_sec is null then sked.queue_burst(p_rate_per_sec, p_burst)
                       else least(sked.queue_burst(p_rate_per_sec, p_burst),
                                  sked.queue_tokens(q.rate_per_sec, q.burst, q.tokens, q.tokens_at, p_now))
                  end,
         tokens_at = p_now, updated_at = p_now
   where q.name = p_name
  returning * into r;
  if not found and (p_max_running is not null or p_rate_per_sec is not null) then
    insert into sked.queues (name, max_running, rate_per_sec, burst, tokens, tokens_at, updated_at)
    values (p_name, p_max_running, p_rate_per_sec, p_burst,
            coalesce(sked.queue_burst(p_rate_per_sec, p_burst), 0), p_now, p_now)
    on conflict (name) do update
       set max_running = excluded.max_running, rate_per_sec = excluded.rate_per_sec,
           burst = excluded.burst, tokens = excluded.tokens, tokens_at = excluded.tokens_at,
           updated_at = excluded.updated_at
    returning * into r;
  end if;
  r.name := p_name;
  perform pg_notify('sked_tasks', p_name);
  return r;
end
$$;

-- Why a task that has not started waits, at p_now: every reason that applies, most decisive
-- first, each as a stable code and a sentence. Nothing for a task that is running or
-- finished (or does not exist). Codes:
--   parents_pending  blocked: its DAG parents (or its shards) are not finished
--   due_later        next_run_at is after p_now (a delay, a schedule tick, a retry's backoff)
--   queue_paused     its queue is paused
--   no_worker        no live worker serves its queue (or its pinned worker is gone)
--   missing_labels   live workers serve the queue, none has all its labels (the message
--                    names the labels no worker has)
--   too_big          it needs more CPU or memory than the largest live worker of its queue
--                    with its labels advertises (the message says both)
--   queue_at_limit   its queue runs as many tasks as its concurrency limit allows
--   rate_limited     its queue's rate limit has no start left until the time given
--   workers_busy     it fits live workers of its queue, all of which are full
--   ready            a live worker has room for it: it starts at that worker's next claim
-- The last two come only when nothing before them applies; they count the tasks ahead of it
-- in its queue (up to 10,000).
create or replace function sked.task_waiting_reasons(p_id uuid, p_now timestamptz default now())
returns table (code text, message text)
language plpgsql stable
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  t sked.tasks;
  q sked.queues;
  serving uuid[];
  labelled uuid[];
  fitting uuid[];
  missing text[];
  max_cpu integer;
  max_mem integer;
  cpu_unbounded boolean;
  mem_unbounded boolean;
  running bigint;
  tokens double precision;
  ahead bigint;
  roomy integer;
  blocking boolean := false;
  copy boolean;
  copies bigint;
begin
  select * into t from sked.tasks x where x.id = p_id;
  copy := t.kind = 'service' and t.shard_of is not null;
  if not found or not sked.state_waits_to_run(t.state) then
    return;
  end if;
  if t.state = 'blocked' then
    code := 'parents_pending';
    message := case when t.shard_total is not null and t.shard_of is null
                    then format('waits for %s of its %s shards to finish', t.parents_pending, t.shard_total)
                    else format('waits for %s of its %s parents to finish', t.parents_pending, t.parents)
               end;
    return next;
    return;
  end if;

  -- A row from before tasks_waiting_task_must_have_an_attempt_left: no claim takes it.
  if t.attempt >= t.max_attempts then
    code := 'no_attempt_left';
    message := format('no claim takes it: it has used %s of its %s attempts '
                      '(raise max_attempts above %s to run it again)',
                      t.attempt, t.max_attempts, t.attempt);
    return next;
    return;
  end if;

  if t.next_run_at > p_now then
    code := 'due_later';
    message := format('%s at %s (in %s s)',
                      case when t.state = 'retry' then 'retries after its backoff' else 'due' end,
                      to_char(t.next_run_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                      round(extract(epoch from t.next_run_at - p_now)::numeric, 1));
    return next;
    blocking := true;
  end if;

  select * into q from sked.queues x where x.name = t.queue;
  if q.paused_at is not null then
    code := 'queue_paused';
    message := format('queue %s is paused (since %s)', t.queue,
                      to_char(q.paused_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'));
    return next;
    blocking := true;
  end if;

  -- The live workers that serve the queue (only its own worker for a pinned shard), those of
  -- them with the task's labels, and those of these whose capacity holds its requests.
  select coalesce(array_agg(w.id), '{}'),
         coalesce(array_agg(w.id) filter (where t.labels <@ w.labels), '{}'),
         coalesce(array_agg(w.id) filter (
           where t.labels <@ w.labels
             and (t.cpu_millis is null or w.cpu_millis is null or w.cpu_millis >= t.cpu_millis)
             and (t.memory_mb is null or w.memory_mb is null or w.memory_mb >= t.memory_mb)), '{}'),
         max(w.cpu_millis) filter (where t.labels <@ w.labels),
         max(w.memory_mb) filter (where t.labels <@ w.labels),
         coalesce(bool_or(w.cpu_millis is null) filter (where t.labels <@ w.labels), false),
         coalesce(bool_or(w.memory_mb is null) filter (where t.labels <@ w.labels), false)
    into serving, labelled, fitting, max_cpu, max_mem, cpu_unbounded, mem_unbounded
    from sked.workers w
   where sked.worker_is_live(w.heartbeat_at, w.lease, w.stopping_at, p_now)
     and t.queue = any(w.queues)
     and (t.pinned_worker is null or w.id = t.pinned_worker);

  if cardinality(serving) = 0 then
    code := 'no_worker';
    message := case when t.pinned_worker is not null
                    then format('runs only on worker %s, which is not live', t.pinned_worker)
                    else format('no live worker serves queue %s', t.queue) end;
    return next;
    blocking := true;
  elsif cardinality(labelled) = 0 then
    select coalesce(array_agg(l order by l), '{}') into missing
      from unnest(t.labels) as l
     where not exists (select 1 from sked.workers w
                        where w.id = any(serving) and l = any(w.labels));
    code := 'missing_labels';
    message := format('no live worker of queue %s has all its labels (%s)', t.queue,
                      array_to_string(t.labels, ', '))
               || case when cardinality(missing) > 0
                       then format('; none has %s', array_to_string(missing, ', ')) else '' end;
    return next;
    blocking := true;
  elsif cardinality(fitting) = 0 then
    code := 'too_big';
    message := concat_ws('; ',
      case when t.memory_mb is not null and not mem_unbounded and t.memory_mb > max_mem
           then format('needs %s MB of memory and the largest live worker of queue %s%s has %s MB',
                       t.memory_mb, t.queue,
                       case when cardinality(t.labels) > 0 then ' with its labels' else '' end, max_mem)
      end,
      case when t.cpu_millis is not null and not cpu_unbounded and t.cpu_millis > max_cpu
           then format('needs %s millicores of CPU and the largest live worker of queue %s%s has %s',
                       t.cpu_millis, t.queue,
                       case when cardinality(t.labels) > 0 then ' with its labels' else '' end, max_cpu)
      end);
    if message = '' then
      message := format('needs %s millicores of CPU and %s MB of memory on one worker; no live worker of queue %s has both',
                        t.cpu_millis, t.memory_mb, t.queue);
    end if;
    return next;
    blocking := true;
  end if;

  -- Queue limits hold back other tasks, not the copies of services (services first).
  if q.max_running is not null and not copy then
    select count(*) into running from sked.tasks x
     where x.state = 'running' and x.queue = t.queue;
    if running >= q.max_running then
      code := 'queue_at_limit';
      message := format('queue %s runs %s tasks, its concurrency limit (max_running %s)',
                        t.queue, running, q.max_running);
      return next;
      blocking := true;
    end if;
  end if;

  if q.rate_per_sec is not null and not copy then
    tokens := sked.queue_tokens(q.rate_per_sec, q.burst, q.tokens, q.tokens_at, p_now);
    if tokens < 1 - 1e-9 then
      code := 'rate_limited';
      message := format('queue %s starts at most %s tasks per second; the next start is possible in %s s',
                        t.queue, q.rate_per_sec,
                        round(((1 - tokens) / q.rate_per_sec)::numeric, 3));
      return next;
      blocking := true;
    end if;
  end if;

  if blocking then
    return;
  end if;

  -- Nothing stops it: it waits for room on a worker that fits it, behind the tasks ahead
  -- (for a copy of a service, only the copies ahead: services first).
  select count(*) into ahead
    from (select 1 from sked.tasks a
           where sked.state_is_claimable(a.state) and a.queue = t.queue and a.next_run_at <= p_now
             and (a.priority > t.priority or (a.priority = t.priority and a.next_run_at < t.next_run_at))
             and (not copy or (a.kind = 'service' and a.shard_of is not null))
           limit 10000) x;
  -- The due copies of services of its queue that wait for room: workers hold their CPU and
  -- memory for them.
  select count(*) into copies
    from sked.tasks c
   where c.kind = 'service' and c.shard_of is not null and sked.state_is_claimable(c.state)
     and c.queue = t.queue and c.next_run_at <= p_now and c.id <> t.id
     and (c.cpu_millis is not null or c.memory_mb is not null);
  select count(*) into roomy
    from sked.workers w
    left join lateral (
      select count(*) as n, sum(r.cpu_millis) as cpu, sum(r.memory_mb) as mem
        from sked.tasks r
       where r.state = 'running' and r.worker_id = w.id
    ) used on true
   where w.id = any(fitting)
     and used.n < w.concurrency
     and (t.cpu_millis is null or w.cpu_millis is null
          or w.cpu_millis - coalesce(used.cpu, 0) >= t.cpu_millis)
     and (t.memory_mb is null or w.memory_mb is null
          or w.memory_mb - coalesce(used.mem, 0) >= t.memory_mb);
  if roomy > 0 then
    code := 'ready';
    message := format('%s live worker%s of queue %s %s room for it: it starts at the next claim',
                      roomy, case when roomy = 1 then '' else 's' end, t.queue,
                      case when roomy = 1 then 'has' else 'have' end);
  else
    code := 'workers_busy';
    message := format('fits %s live worker%s of queue %s, all busy (slots, CPU or memory in use)',
                      cardinality(fitting), case when cardinality(fitting) = 1 then '' else 's' end,
                      t.queue);
  end if;
  if ahead > 0 then
    message := message || format('; %s%s task%s ahead of it in the queue',
                                 ahead, case when ahead >= 10000 then '+' else '' end,
                                 case when ahead = 1 then ' is' else 's are' end);
  end if;
  if copy then
    message := message || format('; a copy of a service: it goes before other tasks, workers that could hold it keep their CPU and memory for it, and after %s s without room a worker stops preemptible tasks for it',
                                 extract(epoch from sked.preempt_after())::integer);
  elsif copies > 0 and (t.cpu_millis is not null or t.memory_mb is not null) then
    message := message || format('; %s cop%s of services wait%s for room, and the workers that could hold %s claim no task with requests until %s started (services first)',
                                 copies, case when copies = 1 then 'y' else 'ies' end,
                                 case when copies = 1 then 's' else '' end,
                                 case when copies = 1 then 'it' else 'them' end,
                                 case when copies = 1 then 'it has' else 'they have' end);
  end if;
  if (t.cpu_millis is not null or t.memory_mb is not null)
     and t.next_run_at <= p_now - sked.claim_reserve_after() then
    message := message || format('; due for over %s s, so the workers that could hold it claim no other task with requests behind it',
                                 extract(epoch from sked.claim_reserve_after())::integer);
  end if;
  return next;
end
$$;
