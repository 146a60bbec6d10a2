-- Rollups of finishes (tables in migrations/20261229000001_finish_rollups.sql): per owner,
-- queue, minute (and hour) of finished_at and final state, the tasks that finished and
-- histograms of their attempts' durations and lateness. The overview (sql/overview.sql) and
-- the history (GET /api/v1/history, docs/api.md) read them instead of the task table, so
-- their cost follows the minutes shown, not the finishes in them.
--
-- Write path. A statement trigger on sked.tasks (after INSERT and after UPDATE, with
-- transition tables) inserts one row per (owner, queue, minute, state) that the statement
-- changed into sked.finish_deltas: one small insert per finishing statement, and no row that
-- two finishers both lock (an upsert into the rollups would make concurrent finishers of the
-- same queue and minute wait for each other's commits). A rolled-back statement leaves no
-- delta, because its delta is rolled back with it.
--
-- What is counted: a task counts in the minute of its finished_at, under its final state.
-- A finished task that is reopened or changed (a retry, a rerun of an ancestor that turns
-- upstream_failed into blocked, succeeded into upstream_failed) writes a delta of -1 for what
-- it was, and +1 for what it is if it is still finished, so the rollups always agree with the
-- finished rows of sked.tasks. Deleting a task (retention, sked.tasks_prune) takes nothing
-- away: the rollups are the history of finishes, kept longer than the tasks may be.
--
-- Histograms (sked.histogram_bucket): of a finished task that has started (started_at set),
--   duration = finished_at - started_at, the last attempt's run (for a task cancelled while it
--              waited for a retry, up to the cancel);
--   lateness = started_at - next_run_at, how late the last attempt started after it was due.
-- The claim leaves next_run_at as it was (sked.tasks_start sets started_at only), and a
-- final state keeps it, so the finished row still holds the due time of its last attempt:
-- this is the same lateness as the worker's sked_task_lateness_seconds (claim time − due
-- time, worker/src/lib.rs), measured with the database's claim time.
--
-- Fold: sked.finishes_fold, a duty of every server's and worker's background upkeep
-- (db/src/upkeep.rs) every few seconds, moves the deltas into sked.finish_rollups and deletes
-- them in one transaction, under a transaction-scoped advisory lock that the other folders
-- skip, so any number of them may run: a reader's snapshot sees each finish either as a delta
-- or folded, never both, and readers add the deltas, so their answers are exact whenever the
-- fold last ran.
--
-- Grains: each delta is folded into its minute (the overview's last hour), its 5 minutes (the
-- history's 24-hour view) and its hour (the 7-day view). sked.finish_rollups_prune deletes
-- minute and 5-minute rows after two days and hour rows after eight: a week of minute rows
-- would be 10,080 per queue, owner and state, and a day of them cost the 24-hour view 150 ms
-- to add up at a million finishes a day (W8, bench/README.md).
--
-- Levels: each key is also folded with '' for its queue, its owner or both ('' is never a
-- queue's or an owner's name), so a reader of every queue or every owner reads the rows
-- already summed for it: a step of every queue is one row per final state, whatever the
-- queues and owners (W8 has 90 keys a minute). The readers below never mix levels.

-- Histograms: integer arrays of sked.histogram_buckets() counts. Bucket 1 holds values under
-- 1 ms; bucket i (2 ≤ i < 56) holds [2^((i-2)/2) ms, 2^((i-1)/2) ms), two buckets per
-- doubling (a percentile read from them lies in the true value's bucket, so it is off by
-- less than a factor of √2); bucket 56 holds 2^27 ms (37 hours) and more. 56 four-byte
-- counts per histogram keep a rollup row near 500 bytes.
create or replace function sked.histogram_buckets()
returns integer
language sql immutable parallel safe as $$ select 56 $$;

-- The bucket of a value in seconds (null for null; negative values go to bucket 1).
create or replace function sked.histogram_bucket(p_secs double precision)
returns integer
language sql immutable parallel safe as $$
  select case when p_secs is null then null
              when p_secs < 0.001 then 1
              else least(sked.histogram_buckets(),
                         2 + floor(2 * ln(p_secs * 1000) / ln(2))::integer) end
$$;

-- The lower bound in seconds of bucket p_i.
create or replace function sked.histogram_bucket_low(p_i integer)
returns double precision
language sql immutable parallel safe as $$
  -- (In double precision: numeric's power costs the history's percentiles most of their time.)
  select case when p_i <= 1 then 0::float8
              else 0.001::float8 * power(2::float8, (p_i - 2) / 2::float8) end
$$;

-- The quantiles p_qs (each 0 to 1, ascending) in seconds of the histogram that counts
-- p_counts[k] in bucket p_buckets[k] (buckets ascending, each once), each interpolated within
-- its bucket on a log scale (linearly in bucket 1; the last bucket answers its lower bound);
-- nulls when it counts nothing. One pass for all of them: a call per quantile cost the
-- history's 24-hour view a third of its time.
create or replace function sked.histogram_quantiles(p_buckets integer[], p_counts bigint[],
                                                    p_qs double precision[])
returns double precision[]
language plpgsql immutable parallel safe as $$
declare
  total bigint := 0;
  cum bigint := 0;
  rank double precision;
  lo double precision;
  b integer;
  n bigint;
  q integer := 1;
  last integer := sked.histogram_buckets();
  answers double precision[] := array_fill(null::double precision, array[cardinality(p_qs)]);
begin
  for k in 1..coalesce(cardinality(p_counts), 0) loop
    total := total + p_counts[k];
  end loop;
  if total <= 0 then
    return answers;
  end if;
  for k in 1..cardinality(p_counts) loop
    b := p_buckets[k];
    n := p_counts[k];
    while q <= cardinality(p_qs) loop
      rank := greatest(p_qs[q], 0) * total;
      exit when n <= 0 or cum + n < rank;
      if b = 1 then
        answers[q] := 0.001 * (rank - cum) / n;
      elsif b >= last then
        answers[q] := sked.histogram_bucket_low(b);
      else
        lo := sked.histogram_bucket_low(b);
        answers[q] := lo * power(sked.histogram_bucket_low(b + 1) / lo, (rank - cum) / n);
      end if;
      q := q + 1;
    end loop;
    cum := cum + n;
  end loop;
  -- Rounding left a quantile past the last count: the last bucket's lower bound.
  while q <= cardinality(p_qs) loop
    answers[q] := sked.histogram_bucket_low(b);
    q := q + 1;
  end loop;
  return answers;
end
$$;

-- Records finishes (sign 1) and their undoing (sign -1) as deltas, one row per owner, queue,
-- minute and state of p_changes, in one insert. The changes are grouped by key and by their
-- pair of buckets in one query, and the histograms filled in by a loop over its groups (tens
-- of them for a batch of thousands of finishes that ran alike): building each histogram with
-- a query of its own cost 3 ms per 2,000 finishes, and a row per bucket twice as much.
create or replace function sked.finish_deltas_add(p_changes sked.finish_change[])
returns void
language plpgsql as $$
declare
  r record;
  empty integer[] := array_fill(0, array[sked.histogram_buckets()]);
  deltas sked.finish_deltas[] := '{}';
  cur sked.finish_deltas;
begin
  for r in
    -- (date_trunc without a time zone: minutes start at the same instants in every zone, see
    -- sked.overview_since, and naming one costs ten times as much.)
    select c.owner, c.queue, date_trunc('minute', c.finished_at) as minute, c.state,
           sked.histogram_bucket(date_part('epoch', c.finished_at - c.started_at)) as d,
           sked.histogram_bucket(date_part('epoch', c.started_at - c.due_at)) as l,
           sum(c.sign)::integer as n
      from unnest(p_changes) c
     group by 1, 2, 3, 4, 5, 6
     order by 1, 2, 3, 4
  loop
    if cur.owner is distinct from r.owner or cur.queue is distinct from r.queue
       or cur.minute is distinct from r.minute or cur.state is distinct from r.state then
      if cur.owner is not null then
        deltas := deltas || cur;
      end if;
      cur := row(null, r.owner, r.queue, r.minute, r.state, 0, empty, empty);
    end if;
    cur.tasks := cur.tasks + r.n;
    if r.d is not null then
      cur.durations[r.d] := cur.durations[r.d] + r.n;
      cur.lateness[r.l] := cur.lateness[r.l] + r.n;
    end if;
  end loop;
  if cur.owner is not null then
    deltas := deltas || cur;
  end if;
  insert into sked.finish_deltas (owner, queue, minute, state, tasks, durations, lateness)
  select d.owner, d.queue, d.minute, d.state, d.tasks, d.durations, d.lateness
    from unnest(deltas) d;
end
$$;

-- After a statement that inserted tasks: those inserted finished (a plain INSERT may).
create or replace function sked.finishes_after_insert() returns trigger
language plpgsql as $$
begin
  if exists (select 1 from new_rows where finished_at is not null) then
    perform sked.finish_deltas_add(array(
      select row(n.owner, n.queue, n.state, n.finished_at, n.started_at, n.next_run_at,
                 1)::sked.finish_change
        from new_rows n where n.finished_at is not null));
  end if;
  return null;
end
$$;

create or replace trigger tasks_after_insert_finishes
  after insert on sked.tasks
  referencing new table as new_rows
  for each statement execute function sked.finishes_after_insert();

-- After a statement that updated tasks: the finishes it made, and the finishes it undid or
-- changed. A statement that neither reads nor writes a finished row (a claim, a lease
-- renewal, a retry's backoff) costs a look at its rows that finds none; one that only
-- finishes tasks (none of its rows was finished before) needs no join of old and new rows.
create or replace function sked.finishes_after_update() returns trigger
language plpgsql as $$
begin
  if not exists (select 1 from old_rows where finished_at is not null) then
    if exists (select 1 from new_rows where finished_at is not null) then
      perform sked.finish_deltas_add(array(
        select row(n.owner, n.queue, n.state, n.finished_at, n.started_at, n.next_run_at,
                   1)::sked.finish_change
          from new_rows n where n.finished_at is not null));
    end if;
    return null;
  end if;
  perform sked.finish_deltas_add(array(
    select row(o.owner, o.queue, o.state, o.finished_at, o.started_at, o.next_run_at,
               -1)::sked.finish_change
      from old_rows o join new_rows n on n.id = o.id
     where o.finished_at is not null
       and (o.owner, o.queue, o.state, o.finished_at, o.started_at, o.next_run_at)
           is distinct from (n.owner, n.queue, n.state, n.finished_at, n.started_at,
                             n.next_run_at)
    union all
    select row(n.owner, n.queue, n.state, n.finished_at, n.started_at, n.next_run_at,
               1)::sked.finish_change
      from old_rows o join new_rows n on n.id = o.id
     where n.finished_at is not null
       and (o.owner, o.queue, o.state, o.finished_at, o.started_at, o.next_run_at)
           is distinct from (n.owner, n.queue, n.state, n.finished_at, n.started_at,
                             n.next_run_at)));
  return null;
end
$$;

-- (A trigger with transition tables cannot name columns: it fires for every update.)
create or replace trigger tasks_after_update_finishes
  after update on sked.tasks
  referencing old table as old_rows new table as new_rows
  for each statement execute function sked.finishes_after_update();

-- Once, in the transaction that first creates the triggers above: the finishes of the
-- rollups' lifetime that are older than the triggers. The triggers exist already, and
-- creating them locked sked.tasks against writes until this transaction commits, so every
-- finish is counted once.
do $$
declare
  day0 timestamptz := date_trunc('day', now(), 'UTC');
begin
  if exists (select 1 from sked.finish_backfill) then
    -- A day at a time (today's window also takes finished_at in the future).
    for d in 0..8 loop
      perform sked.finish_deltas_add(array(
        select row(t.owner, t.queue, t.state, t.finished_at, t.started_at, t.next_run_at,
                   1)::sked.finish_change
          from sked.tasks t
         where t.finished_at >= day0 - d * interval '1 day'
           and (d = 0 or t.finished_at < day0 - (d - 1) * interval '1 day')));
    end loop;
    delete from sked.finish_backfill;
  end if;
end
$$;

-- The element-wise sum of two histograms (a missing element counts 0). A loop: twice as
-- fast as an SQL function that unnests them (8 µs against 16 µs a call).
create or replace function sked.histogram_add(p_a integer[], p_b integer[])
returns integer[]
language plpgsql immutable parallel safe as $$
declare
  r integer[] := p_a;
begin
  if coalesce(cardinality(p_a), 0) = 0 then
    return p_b;
  end if;
  for i in 1..greatest(cardinality(p_a), cardinality(p_b)) loop
    r[i] := coalesce(p_a[i], 0) + coalesce(p_b[i], 0);
  end loop;
  return r;
end
$$;

create or replace aggregate sked.histogram_sum(integer[]) (
  sfunc = sked.histogram_add,
  stype = integer[],
  initcond = '{}'
);

-- The start of the p_grain ('minute', '5min' or 'hour', UTC) that minute p_minute is in.
create or replace function sked.finish_grain_start(p_grain text, p_minute timestamptz)
returns timestamptz
language sql immutable parallel safe as $$
  select case p_grain
           when 'hour' then date_trunc('hour', p_minute, 'UTC')
           when '5min' then date_bin('5 minutes', p_minute, timestamptz '2000-01-01 00:00:00+00')
           else p_minute end
$$;

-- Folds up to p_limit of the oldest deltas into the rollups (their rows of every grain and
-- level) and deletes them; returns how many it folded (0 also when another fold holds the
-- lock: the caller tries again at its next run).
create or replace function sked.finishes_fold(p_limit integer default 10000)
returns integer
language plpgsql as $$
declare
  folded integer;
begin
  -- One fold at a time; the others return at once instead of waiting ('sked' 'fold').
  if not pg_try_advisory_xact_lock(1936418148, 1718578276) then
    return 0;
  end if;
  with taken as (
    delete from sked.finish_deltas d
     where d.id in (select x.id from sked.finish_deltas x order by x.id limit p_limit)
    returning d.*
  ), summed as (
    -- Each delta counts in its minute and its hour, and at each level of the rollups: its
    -- queue and owner, every queue of its owner, every owner of its queue, everything.
    select g.grain, sked.finish_grain_start(g.grain, t.minute) as start, v.queue, v.owner,
           t.state, sum(t.tasks) as tasks, sked.histogram_sum(t.durations) as durations,
           sked.histogram_sum(t.lateness) as lateness
      from taken t
     cross join (values ('minute'), ('5min'), ('hour')) g(grain)
     cross join lateral (values (t.queue, t.owner), ('', t.owner), (t.queue, ''), ('', ''))
                v(queue, owner)
     group by 1, 2, 3, 4, 5
  ), upserted as (
    insert into sked.finish_rollups as r
           (grain, start, queue, owner, state, tasks, durations, lateness)
    select * from summed order by grain, start, queue, owner, state
    on conflict (grain, start, queue, owner, state) do update
       set tasks = r.tasks + excluded.tasks,
           durations = sked.histogram_add(r.durations, excluded.durations),
           lateness = sked.histogram_add(r.lateness, excluded.lateness)
  )
  select count(*) into folded from taken;
  return folded;
end
$$;

-- How long rollup rows of each grain are kept after their start.
create or replace function sked.finish_rollups_keep(p_grain text)
returns interval
language sql immutable parallel safe as $$
  select case p_grain when 'hour' then interval '8 days' else interval '2 days' end
$$;

-- Deletes the rollup rows past sked.finish_rollups_keep at p_now; returns how many.
create or replace function sked.finish_rollups_prune(p_now timestamptz default now())
returns integer
language plpgsql as $$
declare
  deleted integer;
begin
  delete from sked.finish_rollups r
   where (r.grain = 'minute' and r.start < p_now - sked.finish_rollups_keep('minute'))
      or (r.grain = '5min' and r.start < p_now - sked.finish_rollups_keep('5min'))
      or (r.grain = 'hour' and r.start < p_now - sked.finish_rollups_keep('hour'));
  get diagnostics deleted = row_count;
  return deleted;
end
$$;

-- The finished tasks per minute, queue and state (minute rows and unfolded deltas) of the
-- minutes from p_from to p_to (excluded), of owner p_owner's tasks (null: every owner's).
create or replace function sked.finishes_by_minute(p_owner text, p_from timestamptz,
                                                   p_to timestamptz)
returns table (queue text, minute timestamptz, state text, tasks bigint)
language sql stable as $$
  select f.queue, f.minute, f.state, sum(f.tasks)::bigint
    from (select r.queue, r.start as minute, r.state, r.tasks
            from sked.finish_rollups r
           where r.grain = 'minute' and r.start >= p_from and r.start < p_to
             and r.owner = coalesce(p_owner, '') and r.queue <> ''
          union all
          select d.queue, d.minute, d.state, d.tasks
            from sked.finish_deltas d
           where d.minute >= p_from and d.minute < p_to
             and (p_owner is null or d.owner = p_owner)) f
   group by 1, 2, 3
  having sum(f.tasks) <> 0
$$;

-- The history of finishes from p_from to p_to (excluded) in steps of p_step, read from the
-- rollup rows of grain p_grain ('minute', '5min' or 'hour'; p_from and p_step whole ones of
-- it) and the unfolded deltas, of owner p_owner's tasks (null: every owner's) in queue p_queue (null:
-- every queue): per step, from its start, the tasks finished in each final state and the
-- 50th, 90th and 99th percentiles of their durations and lateness, in seconds (null when no
-- task of the step had started).
create or replace function sked.finishes_history_steps(
  p_owner text, p_queue text, p_from timestamptz, p_to timestamptz, p_step interval,
  p_grain text)
returns table (start timestamptz, succeeded bigint, failed bigint, cancelled bigint,
               upstream_failed bigint, skipped bigint,
               duration_p50 double precision, duration_p90 double precision,
               duration_p99 double precision, lateness_p50 double precision,
               lateness_p90 double precision, lateness_p99 double precision)
language sql stable as $$
  with rows as (
    select r.start, r.state, r.tasks, r.durations, r.lateness
      from sked.finish_rollups r
     where r.grain = p_grain and r.start >= p_from and r.start < p_to
       and r.owner = coalesce(p_owner, '') and r.queue = coalesce(p_queue, '')
    union all
    select sked.finish_grain_start(p_grain, d.minute), d.state, d.tasks, d.durations,
           d.lateness
      from sked.finish_deltas d
     where d.minute >= p_from and d.minute < p_to
       and (p_owner is null or d.owner = p_owner) and (p_queue is null or d.queue = p_queue)
  ), stepped as (
    select p_from + p_step * floor(extract(epoch from r.start - p_from)
                                   / extract(epoch from p_step)) as step, r.*
      from rows r
  ), counts as (
    select s.step,
           sum(s.tasks) filter (where s.state = 'succeeded') as succeeded,
           sum(s.tasks) filter (where s.state = 'failed') as failed,
           sum(s.tasks) filter (where s.state = 'cancelled') as cancelled,
           sum(s.tasks) filter (where s.state = 'upstream_failed') as upstream_failed,
           sum(s.tasks) filter (where s.state = 'skipped') as skipped
      from stepped s group by s.step
  ), histograms as (
    -- Element-wise sums as one grouping over the histograms' non-zero elements (a set
    -- operation: an aggregate adding arrays row by row costs ten times as much, and most
    -- buckets of a minute are empty), kept sparse: bucket numbers and their counts.
    select e.step,
           array_agg(e.i order by e.i) filter (where e.d <> 0) as d_buckets,
           array_agg(e.d order by e.i) filter (where e.d <> 0) as d_counts,
           array_agg(e.i order by e.i) filter (where e.l <> 0) as l_buckets,
           array_agg(e.l order by e.i) filter (where e.l <> 0) as l_counts
      from (select s.step, u.i::integer as i, sum(u.d)::bigint as d, sum(u.l)::bigint as l
              from stepped s, unnest(s.durations, s.lateness) with ordinality u(d, l, i)
             where u.d <> 0 or u.l <> 0
             group by s.step, u.i) e
     group by e.step
  )
  select g.step, coalesce(c.succeeded, 0)::bigint, coalesce(c.failed, 0)::bigint,
         coalesce(c.cancelled, 0)::bigint, coalesce(c.upstream_failed, 0)::bigint,
         coalesce(c.skipped, 0)::bigint,
         q.d[1], q.d[2], q.d[3], q.l[1], q.l[2], q.l[3]
    from generate_series(p_from, p_to - p_step, p_step) g(step)
    left join counts c on c.step = g.step
    left join histograms h on h.step = g.step
    cross join lateral (
      select sked.histogram_quantiles(h.d_buckets, h.d_counts, '{0.5, 0.9, 0.99}') as d,
             sked.histogram_quantiles(h.l_buckets, h.l_counts, '{0.5, 0.9, 0.99}') as l) q
   order by g.step
$$;
-- The history of GET /api/v1/history: range p_range ('24h': 288 steps of 5 minutes, from
-- the 5-minute rows; '7d': 168 steps of an hour, from the hour rows) ending with the step that
-- p_now is in (steps start at whole multiples of their length since 2000-01-01 UTC), of owner
-- p_owner's tasks (null: every owner's) in queue p_queue (null: every queue). Returns no row
-- for another range.
create or replace function sked.finishes_history(p_owner text, p_queue text, p_range text,
                                                 p_now timestamptz default now())
returns table (start timestamptz, succeeded bigint, failed bigint, cancelled bigint,
               upstream_failed bigint, skipped bigint,
               duration_p50 double precision, duration_p90 double precision,
               duration_p99 double precision, lateness_p50 double precision,
               lateness_p90 double precision, lateness_p99 double precision)
language sql stable as $$
  select h.*
    from (select r.step, r.span, r.grain,
                 date_bin(r.step, p_now, timestamptz '2000-01-01 00:00:00+00') + r.step as upto
            from (values ('24h', interval '5 minutes', interval '24 hours', '5min'),
                         ('7d', interval '1 hour', interval '7 days', 'hour'))
                 r(range, step, span, grain)
           where r.range = p_range) w
   cross join lateral sked.finishes_history_steps(p_owner, p_queue, w.upto - w.span, w.upto,
                                                  w.step, w.grain) h
$$;

-- The queues with finishes since the hour p_from is in, of owner p_owner's tasks (null: every
-- owner's), by name: the choices of the history's queue filter (from the hour rows).
create or replace function sked.finishes_queues(p_owner text, p_from timestamptz)
returns setof text
language sql stable as $$
  select r.queue from sked.finish_rollups r
   where r.grain = 'hour' and r.start >= date_trunc('hour', p_from, 'UTC')
     and r.owner = coalesce(p_owner, '') and r.queue <> ''
  union
  select d.queue from sked.finish_deltas d
   where d.minute >= date_trunc('hour', p_from, 'UTC') and (p_owner is null or d.owner = p_owner)
  order by 1
$$;
