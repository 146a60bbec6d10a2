-- The schedule functions of the SQL contract: cron parsing and next fire times, schedule
-- validation, and firing. See docs/schedules.md.
--
-- Cron is evaluated here, in the database, so that a schedule inserted by plain SQL is checked
-- and armed at once, any process that can run `select sked.schedules_fire()` fires ticks, and
-- the next fire times shown by the API are the ones that will fire.

-- ---------------------------------------------------------------------------------------------
-- Parsing
-- ---------------------------------------------------------------------------------------------

-- The value of one field item: a number or a name (JAN…DEC, SUN…SAT).
create or replace function sked.cron_value(expr text, field text, item text, lo integer, hi integer)
returns integer
language plpgsql immutable as $$
declare
  v integer;
  names text[];
begin
  if item ~ '^[0-9]{1,4}$' then
    v := item::integer;
  else
    names := case field
      when 'month' then array['JAN','FEB','MAR','APR','MAY','JUN','JUL','AUG','SEP','OCT','NOV','DEC']
      when 'day of week' then array['SUN','MON','TUE','WED','THU','FRI','SAT']
    end;
    v := array_position(names, upper(item));
    if v is null then
      raise exception 'cron expression %: % field: % is not a number%', quote_literal(expr), field,
        quote_literal(item),
        case field when 'month' then ' or a month name (JAN-DEC)'
                   when 'day of week' then ' or a day name (SUN-SAT)' else '' end
        using errcode = '22023';
    end if;
    v := v + lo - 1;
  end if;
  if v < lo or v > hi then
    raise exception 'cron expression %: % field: % is out of range %-%', quote_literal(expr),
      field, v, lo, hi
      using errcode = '22023';
  end if;
  return v;
end
$$;

-- One field as a bit mask (bit v set when value v matches). `item`s are separated by commas;
-- each is `*`, `?` (day fields), `N`, `N-M`, with an optional `/STEP`. Day-of-week 7 is Sunday.
create or replace function sked.cron_field(expr text, field text, spec text, lo integer, hi integer)
returns bigint
language plpgsql immutable as $$
declare
  item text;
  m text[];
  a integer;
  b integer;
  step integer;
  mask bigint := 0;
  top integer := case field when 'day of week' then 7 else hi end;
begin
  foreach item in array string_to_array(spec, ',') loop
    m := regexp_match(item, '^(\*|\?|[0-9A-Za-z]+)(?:-([0-9A-Za-z]+))?(?:/([0-9]+))?$');
    if m is null or item = '' then
      raise exception 'cron expression %: % field: cannot read %', quote_literal(expr), field,
        quote_literal(coalesce(nullif(item, ''), spec))
        using errcode = '22023';
    end if;
    if m[1] = '?' and field not in ('day of month', 'day of week') then
      raise exception 'cron expression %: ? is only allowed in the day-of-month and day-of-week fields',
        quote_literal(expr)
        using errcode = '22023';
    end if;
    if m[1] in ('*', '?') then
      if m[2] is not null then
        raise exception 'cron expression %: % field: % cannot start a range', quote_literal(expr),
          field, m[1]
          using errcode = '22023';
      end if;
      a := lo;
      b := top;
    else
      a := sked.cron_value(expr, field, m[1], lo, top);
      b := case when m[2] is not null then sked.cron_value(expr, field, m[2], lo, top)
                when m[3] is not null then top
                else a end;
      if b < a then
        raise exception 'cron expression %: % field: range %-% runs backwards', quote_literal(expr),
          field, m[1], m[2]
          using errcode = '22023';
      end if;
    end if;
    step := coalesce(m[3]::integer, 1);
    if step < 1 or step > top then
      raise exception 'cron expression %: % field: step % must be between 1 and %',
        quote_literal(expr), field, step, top
        using errcode = '22023';
    end if;
    for v in a..b by step loop
      mask := mask | (1::bigint << (case when field = 'day of week' and v = 7 then 0 else v end));
    end loop;
  end loop;
  return mask;
end
$$;

-- Parse a cron expression:
--   [SECOND] MINUTE HOUR DAY-OF-MONTH MONTH DAY-OF-WEEK        (5 fields, or 6 with seconds)
--   @yearly @annually @monthly @weekly @daily @midnight @hourly
-- Fields take `*`, numbers, names (JAN-DEC, SUN-SAT), ranges `a-b`, lists `a,b`, steps `*/n`,
-- `a/n`, `a-b/n`; day-of-week 0 and 7 are Sunday. Day of month also takes `L` (last day),
-- `LW` (last weekday), `nW` (weekday nearest to day n, within the month); day of week takes
-- `nL` (last weekday n of the month) and `n#k` (k-th weekday n). As in Vixie cron, when both
-- day fields are restricted (neither starts with `*` or `?`) a day matching either fires.
-- A schedule whose minute or hour field starts with `*` follows real time across daylight
-- saving changes; any other is a fixed-time schedule (see sked.cron_next).
create or replace function sked.cron_parse(expr text) returns sked.cron_spec
language plpgsql immutable as $$
declare
  e text := lower(btrim(expr));
  f text[];
  r sked.cron_spec;
  item text;
  m text[];
  dom_plain text[] := '{}';
  dow_plain text[] := '{}';
begin
  if expr is null then
    raise exception 'cron expression must not be null' using errcode = '22023';
  end if;
  e := case e
    when '@yearly' then '0 0 1 1 *' when '@annually' then '0 0 1 1 *'
    when '@monthly' then '0 0 1 * *' when '@weekly' then '0 0 * * 0'
    when '@daily' then '0 0 * * *' when '@midnight' then '0 0 * * *'
    when '@hourly' then '0 * * * *'
    else btrim(expr) end;
  if e like '@%' then
    raise exception 'cron expression %: unknown macro (known: @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly)',
      quote_literal(expr)
      using errcode = '22023';
  end if;
  f := regexp_split_to_array(e, '\s+');
  if e = '' or cardinality(f) not in (5, 6) then
    raise exception 'cron expression %: expected 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds first, found %',
      quote_literal(expr), case when e = '' then 0 else cardinality(f) end
      using errcode = '22023';
  end if;
  if cardinality(f) = 5 then
    f := array['0'] || f;
  end if;

  r.seconds := sked.cron_field(expr, 'second', f[1], 0, 59);
  r.minutes := sked.cron_field(expr, 'minute', f[2], 0, 59);
  r.hours := sked.cron_field(expr, 'hour', f[3], 0, 23);
  r.months := sked.cron_field(expr, 'month', f[5], 1, 12);

  -- Day of month: L, LW and nW items are kept apart from the plain ones.
  r.day_last := false;
  r.day_last_weekday := false;
  r.day_nearest_weekday := '{}';
  foreach item in array string_to_array(f[4], ',') loop
    if upper(item) = 'L' then
      r.day_last := true;
    elsif upper(item) = 'LW' then
      r.day_last_weekday := true;
    elsif upper(item) ~ '^[0-9]+W$' then
      r.day_nearest_weekday := r.day_nearest_weekday
        || sked.cron_value(expr, 'day of month', rtrim(upper(item), 'W'), 1, 31);
    else
      dom_plain := dom_plain || item;
    end if;
  end loop;
  r.days := case when cardinality(dom_plain) = 0 then 0
                 else sked.cron_field(expr, 'day of month', array_to_string(dom_plain, ','), 1, 31) end;

  -- Day of week: nL and n#k items likewise.
  r.weekday_last := '{}';
  r.weekday_nth := '{}';
  foreach item in array string_to_array(f[6], ',') loop
    if upper(item) ~ '^[0-9A-Z]+L$' and upper(item) <> 'L' then
      r.weekday_last := r.weekday_last
        || (sked.cron_value(expr, 'day of week', left(item, -1), 0, 7) % 7);
    elsif item ~ '^[0-9A-Za-z]+#[0-9]+$' then
      m := regexp_match(item, '^([0-9A-Za-z]+)#([0-9]+)$');
      if m[2]::integer not between 1 and 5 then
        raise exception 'cron expression %: day of week field: in %, the week must be 1 to 5',
          quote_literal(expr), quote_literal(item)
          using errcode = '22023';
      end if;
      r.weekday_nth := r.weekday_nth
        || ((sked.cron_value(expr, 'day of week', m[1], 0, 7) % 7) * 10 + m[2]::integer);
    elsif upper(item) = 'L' then
      raise exception 'cron expression %: day of week field: L needs a day, e.g. 5L for the last Friday of the month',
        quote_literal(expr)
        using errcode = '22023';
    else
      dow_plain := dow_plain || item;
    end if;
  end loop;
  r.weekdays := case when cardinality(dow_plain) = 0 then 0
                     else sked.cron_field(expr, 'day of week', array_to_string(dow_plain, ','), 0, 7) end;

  r.dom_star := left(f[4], 1) in ('*', '?');
  r.dow_star := left(f[6], 1) in ('*', '?');
  r.real_time := left(f[2], 1) = '*' or left(f[3], 1) = '*';
  return r;
end
$$;

-- ---------------------------------------------------------------------------------------------
-- Next fire time
-- ---------------------------------------------------------------------------------------------

-- The smallest value >= v whose bit is set in mask, or null.
create or replace function sked.cron_bit_next(mask bigint, v integer) returns integer
language sql immutable strict parallel safe as $$
  select case when mask >> v = 0 then null
              else v + bit_count((((mask >> v) & -(mask >> v)) - 1)::bit(64))::integer end
$$;

-- Whether a day matches the day-of-month and day-of-week fields.
create or replace function sked.cron_day_matches(s sked.cron_spec, y integer, mo integer, d integer, dim integer)
returns boolean
language plpgsql immutable strict as $$
declare
  dow integer := extract(dow from make_date(y, mo, d))::integer;
  dom_ok boolean := (s.days >> d) & 1 = 1;
  dow_ok boolean := (s.weekdays >> dow) & 1 = 1;
  n integer;
  w integer;
  wd integer;
begin
  if not dom_ok and s.day_last then
    dom_ok := d = dim;
  end if;
  if not dom_ok and s.day_last_weekday then
    -- The last day of the month, or the Friday before it when it falls on a weekend.
    wd := extract(dow from make_date(y, mo, dim))::integer;
    dom_ok := d = dim - case wd when 6 then 1 when 0 then 2 else 0 end;
  end if;
  if not dom_ok and cardinality(s.day_nearest_weekday) > 0 then
    foreach n in array s.day_nearest_weekday loop
      continue when n > dim;
      wd := extract(dow from make_date(y, mo, n))::integer;
      w := case
             when wd = 6 and n = 1 then 3       -- Saturday the 1st: Monday the 3rd
             when wd = 6 then n - 1             -- Saturday: the Friday before
             when wd = 0 and n = dim then n - 2 -- Sunday the last day: the Friday before
             when wd = 0 then n + 1             -- Sunday: the Monday after
             else n end;
      if w = d then
        dom_ok := true;
        exit;
      end if;
    end loop;
  end if;
  if not dow_ok and cardinality(s.weekday_last) > 0 then
    dow_ok := dow = any(s.weekday_last) and d + 7 > dim;
  end if;
  if not dow_ok and cardinality(s.weekday_nth) > 0 then
    dow_ok := dow * 10 + (d - 1) / 7 + 1 = any(s.weekday_nth);
  end if;
  if s.dom_star or s.dow_star then
    return dom_ok and dow_ok;
  end if;
  return dom_ok or dow_ok;
end
$$;

-- The first wall-clock time strictly after `after` (to the second) that the spec matches, or
-- null when there is none within eight years (an expression such as `0 0 30 2 *`).
create or replace function sked.cron_next_local(s sked.cron_spec, after timestamp)
returns timestamp
language plpgsql immutable strict as $$
declare
  t timestamp := date_trunc('second', after) + interval '1 second';
  y integer := extract(year from t)::integer;
  mo integer := extract(month from t)::integer;
  d integer := extract(day from t)::integer;
  h integer := extract(hour from t)::integer;
  mi integer := extract(minute from t)::integer;
  sec integer := floor(extract(second from t))::integer;
  last_year integer := y + 8;
  dim integer;
  v integer;
begin
  loop
    if mo > 12 then
      mo := 1;
      y := y + 1;
    end if;
    if y > last_year then
      return null;
    end if;
    v := sked.cron_bit_next(s.months, mo);
    if v is null then
      mo := 13;
      d := 1; h := 0; mi := 0; sec := 0;
      continue;
    elsif v <> mo then
      mo := v;
      d := 1; h := 0; mi := 0; sec := 0;
    end if;
    dim := extract(day from make_date(y, mo, 1) + interval '1 month' - interval '1 day')::integer;
    while d <= dim and not sked.cron_day_matches(s, y, mo, d, dim) loop
      d := d + 1;
      h := 0; mi := 0; sec := 0;
    end loop;
    if d > dim then
      mo := mo + 1;
      d := 1; h := 0; mi := 0; sec := 0;
      continue;
    end if;
    v := sked.cron_bit_next(s.hours, h);
    if v is null then
      d := d + 1;
      h := 0; mi := 0; sec := 0;
      if d > dim then
        mo := mo + 1;
        d := 1;
      end if;
      continue;
    elsif v <> h then
      h := v;
      mi := 0; sec := 0;
    end if;
    v := sked.cron_bit_next(s.minutes, mi);
    if v is null then
      h := h + 1;
      mi := 0; sec := 0;
      if h > 23 then
        h := 0;
        d := d + 1;
        if d > dim then
          mo := mo + 1;
          d := 1;
        end if;
      end if;
      continue;
    elsif v <> mi then
      mi := v;
      sec := 0;
    end if;
    v := sked.cron_bit_next(s.seconds, sec);
    if v is null then
      mi := mi + 1;
      sec := 0;
      if mi > 59 then
        mi := 0;
        h := h + 1;
        if h > 23 then
          h := 0;
          d := d + 1;
          if d > dim then
            mo := mo + 1;
            d := 1;
          end if;
        end if;
      end if;
      continue;
    end if;
    return make_timestamp(y, mo, d, h, mi, v);
  end loop;
end
$$;

-- The UTC offset of a time zone at an instant.
create or replace function sked.tz_offset(i timestamptz, tz text) returns interval
language sql stable strict parallel safe as $$
  select (i at time zone tz) - (i at time zone 'UTC')
$$;

-- The next fire time strictly after `after` of a parsed cron spec in a time zone, or null when
-- the spec matches nothing within eight years. Daylight saving time (as Vixie cron):
--   * A fixed-time schedule (neither minute nor hour field starts with `*`) fires once per
--     matching wall-clock time. A time that does not exist that day (the clocks spring forward
--     over it) fires at the first instant after the gap; a time that occurs twice (the clocks
--     fall back) fires at its first occurrence only.
--   * A real-time schedule (minute or hour field starts with `*`) follows real time: matches
--     inside a gap do not exist, and in a repeated hour it fires on both passes.
create or replace function sked.cron_next(s sked.cron_spec, tz text, after timestamptz)
returns timestamptz
language plpgsql stable strict as $$
declare
  l timestamp := after at time zone tz;
  i0 timestamptz;
  c1 timestamptz;
  c2 timestamptz;
  ok1 boolean;
  ok2 boolean;
  lo timestamptz;
  hi timestamptz;
  mid timestamptz;
  best timestamptz;
  o_now interval;
  t timestamptz;
  l2 timestamp;
  i2 timestamptz;
begin
  loop
    l := sked.cron_next_local(s, l);
    if l is null then
      return null;
    end if;
    -- The instants at which the wall clock reads l: one, none (a gap) or two (a repeat). The
    -- offsets a day either side are those before and after any transition near l.
    i0 := l at time zone tz;
    c1 := (l - sked.tz_offset(i0 - interval '1 day', tz)) at time zone 'UTC';
    c2 := (l - sked.tz_offset(i0 + interval '1 day', tz)) at time zone 'UTC';
    if c2 < c1 then
      lo := c1; c1 := c2; c2 := lo;
    end if;
    ok1 := (c1 at time zone tz) = l;
    ok2 := (c2 at time zone tz) = l;
    if s.real_time then
      if ok1 and c1 > after then
        best := c1;
        exit;
      elsif ok2 and c2 > after then
        best := c2;
        exit;
      end if;
    elsif ok1 or ok2 then
      -- Fixed time: the first occurrence, or nothing when it has passed.
      lo := case when ok1 then c1 else c2 end;
      if lo > after then
        return lo;
      end if;
    else
      -- Fixed time in a gap: the first instant after it (the transition), found to the second.
      lo := c1;
      hi := c2;
      while hi - lo > interval '1 second' loop
        mid := lo + (hi - lo) / 2;
        mid := date_trunc('second', mid);
        if (mid at time zone tz) > l then
          hi := mid;
        else
          lo := mid;
        end if;
      end loop;
      if hi > after then
        return hi;
      end if;
    end if;
  end loop;

  -- Real time: if `after` lies in the first pass of a repeated hour, the second pass repeats
  -- wall-clock times up to and including `after`'s, and one of them may come before `best`.
  o_now := sked.tz_offset(after, tz);
  if sked.tz_offset(after + interval '3 hours', tz) < o_now then
    lo := after;
    hi := after + interval '3 hours';
    while hi - lo > interval '1 second' loop
      mid := date_trunc('second', lo + (hi - lo) / 2);
      if sked.tz_offset(mid, tz) = o_now then
        lo := mid;
      else
        hi := mid;
      end if;
    end loop;
    t := hi; -- the first instant of the second pass
    l2 := sked.cron_next_local(s, (t at time zone tz) - interval '1 second');
    if l2 is not null then
      i2 := (l2 - sked.tz_offset(t, tz)) at time zone 'UTC';
      if i2 > after and i2 < best and (i2 at time zone tz) = l2 then
        best := i2;
      end if;
    end if;
  end if;
  return best;
end
$$;

-- The next `n` fire times of an expression after `after` (for previews and tests).
create or replace function sked.cron_next_times(expr text, tz text default 'UTC',
                                                after timestamptz default now(), n integer default 5)
returns setof timestamptz
language plpgsql stable as $$
declare
  s sked.cron_spec := sked.cron_parse(expr);
  t timestamptz := after;
begin
  perform sked.tz_check(tz);
  for k in 1..n loop
    t := sked.cron_next(s, tz, t);
    exit when t is null;
    return next t;
  end loop;
end
$$;

-- Raises a readable error when tz is not a time zone name PostgreSQL knows. (Looking it up in
-- pg_timezone_names reads the whole time zone database: tens of milliseconds per call.) POSIX
-- offset strings such as '+03' or 'UTC+3', whose signs read backwards, are refused.
create or replace function sked.tz_check(tz text) returns void
language plpgsql stable as $$
declare
  ok boolean := tz ~ '^[A-Za-z][A-Za-z0-9_/+-]*$' and tz !~ '^(UTC|GMT)[+-]';
begin
  if ok then
    begin
      perform now() at time zone tz;
    exception when invalid_parameter_value then
      ok := false;
    end;
  end if;
  if not ok or tz is null then
    raise exception 'time zone % is not known (use an IANA name such as UTC, Europe/Berlin, America/New_York)',
      coalesce(quote_literal(tz), 'null')
      using errcode = '22023';
  end if;
end
$$;

-- ---------------------------------------------------------------------------------------------
-- Schedules: validation
-- ---------------------------------------------------------------------------------------------

-- A tick as its occurrence sees it (docs/schedules.md, "The tick"): `tick` in the schedule's
-- time zone with its offset (2026-03-29T02:30:00+02:00), `tick_utc` (2026-03-29T00:30:00Z)
-- and `tick_date`, the tick's date in the zone (2026-03-29).
create or replace function sked.schedule_tick_params(tick timestamptz, tz text) returns jsonb
language sql stable as $$
  select jsonb_build_object(
    'tick', to_char(tick at time zone tz, 'YYYY-MM-DD"T"HH24:MI:SS')
            || case when (tick at time zone tz) - (tick at time zone 'UTC') = interval '0'
                    then 'Z'
                    else case when (tick at time zone tz) < (tick at time zone 'UTC') then '-' else '+' end
                         || to_char(abs(extract(epoch from (tick at time zone tz) - (tick at time zone 'UTC')))
                                    * interval '1 second', 'HH24:MI') end,
    'tick_utc', to_char(tick at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
    'tick_date', to_char(tick at time zone tz, 'YYYY-MM-DD'))
$$;

-- The workflow a schedule submits for `tick`: its template, with the tick's parameters
-- (sked.schedule_tick_params) over the template's own `params`.
create or replace function sked.schedule_workflow_at(workflow jsonb, tick timestamptz, tz text)
returns jsonb
language sql stable as $$
  select workflow || jsonb_build_object('params',
    case when jsonb_typeof(workflow -> 'params') = 'object' then workflow -> 'params' else '{}' end
    || sked.schedule_tick_params(tick, tz))
$$;

-- The task a schedule submits for `tick`: its template, with SKED_TICK, SKED_TICK_UTC and
-- SKED_TICK_DATE in its environment (the tick's parameters, as for a workflow).
create or replace function sked.schedule_task_at(task jsonb, tick timestamptz, tz text)
returns jsonb
language sql stable as $$
  select task || jsonb_build_object('env',
    case when jsonb_typeof(task -> 'env') = 'object' then task -> 'env' else '{}' end
    || (select jsonb_object_agg('SKED_' || upper(k), v)
          from jsonb_each(sked.schedule_tick_params(tick, tz)) as p(k, v)))
$$;

-- Checks a task template by submitting it in a subtransaction that is always rolled back, so
-- that a template is held to exactly the rules of a submitted task. Its keys are the fields
-- of a task (sked.task_fields()) but the schedule's own (run_at, delay, owner), an
-- idempotency key (which names one task, and a schedule makes many) and those of a service.
create or replace function sked.schedule_check_template(s sked.schedules) returns void
language plpgsql as $$
declare
  bad text;
  rule text;
begin
  if s.task is not null then
    select string_agg(k, ', ' order by k) into bad
      from jsonb_object_keys(s.task) k
     where k <> all (sked.task_fields())
        or k in ('run_at', 'delay', 'owner', 'idempotency_key', 'replicas', 'restart_policy',
                 'health_check');
    if bad is not null then
      raise exception 'schedule %: the task template has unknown or unsettable keys: % (the schedule sets run_at, delay and owner; an idempotency key would name its first task only)',
        quote_literal(s.name), bad
        using errcode = 'check_violation', constraint = 'schedules_task_template_must_be_valid';
    end if;
  end if;
  begin
    if s.task is not null then
      perform sked.tasks_submit(jsonb_build_array(sked.schedule_task_at(s.task, now(), s.time_zone)),
                                s.owner);
    else
      perform sked.workflow_submit(sked.schedule_workflow_at(s.workflow, now(), s.time_zone),
                                   s.owner);
    end if;
    raise exception using errcode = 'SKD00';
  exception
    when sqlstate 'SKD00' then
      null; -- the template is valid; its trial occurrence is rolled back
    when others then
      -- A broadcast that no live worker could take now keeps its rule's name: the workers
      -- alive now refuse it, not a rule of the template (the REST API answers 409).
      get stacked diagnostics rule = constraint_name;
      raise exception 'schedule %: the % template is not valid: %', quote_literal(s.name),
        case when s.task is not null then 'task' else 'workflow' end, sqlerrm
        using errcode = 'check_violation',
              constraint = case when rule = 'tasks_broadcast_needs_a_live_worker' then rule
                                when s.task is not null then 'schedules_task_template_must_be_valid'
                                else 'schedules_workflow_template_must_be_valid' end;
  end;
end
$$;

-- A schedule's parsed expression, after checking it and its time zone; a bad expression
-- raises check_violation (schedules_cron_must_be_valid), a time zone PostgreSQL does not know
-- check_violation (schedules_time_zone_must_be_known), naming the schedule.
create or replace function sked.schedule_spec(name text, cron text, tz text)
returns sked.cron_spec
language plpgsql stable as $$
declare
  s sked.cron_spec;
begin
  begin
    s := sked.cron_parse(cron);
  exception when sqlstate '22023' then
    raise exception 'schedule %: %', quote_literal(name), sqlerrm
      using errcode = 'check_violation', constraint = 'schedules_cron_must_be_valid';
  end;
  begin
    perform sked.tz_check(tz);
  exception when sqlstate '22023' then
    raise exception 'schedule %: %', quote_literal(name), sqlerrm
      using errcode = 'check_violation', constraint = 'schedules_time_zone_must_be_known';
  end;
  return s;
end
$$;

-- The tick a schedule is armed with when re-armed at `now` (a change of expression or time
-- zone, a resume): the first tick after both `now` and the latest tick it has handled
-- (`last_tick_at`), so that no tick fires twice, even one fired a moment ahead of its time
-- or one that an equivalent time zone or a new expression names again. Null when the
-- expression has no such tick within eight years.
create or replace function sked.schedule_rearm(
  spec sked.cron_spec, tz text, last_tick_at timestamptz, now_ timestamptz)
returns timestamptz
language sql stable as $$
  select sked.cron_next(spec, tz, greatest(now_, last_tick_at))
$$;

-- Parses the expression, checks the time zone and the template, and arms next_run_at: on
-- insert (unless given), when the expression or time zone changes, and on resume (see
-- sked.schedule_rearm).
create or replace function sked.schedules_before_write() returns trigger
language plpgsql as $$
declare
  -- The clock, not the transaction's start: a tick that passed while a long transaction
  -- inserted the schedule is not due.
  now_ timestamptz := clock_timestamp();
begin
  if tg_op = 'INSERT' or new.cron is distinct from old.cron
     or new.time_zone is distinct from old.time_zone then
    new.spec := sked.schedule_spec(new.name, new.cron, new.time_zone);
    if tg_op = 'UPDATE' or new.next_run_at is null then
      new.next_run_at := sked.schedule_rearm(new.spec, new.time_zone, new.last_tick_at, now_);
    end if;
  elsif old.paused_at is not null and new.paused_at is null
        and new.next_run_at is not distinct from old.next_run_at then
    -- Resumed: ticks that passed while paused were paused on purpose, not missed.
    new.next_run_at := sked.schedule_rearm(new.spec, new.time_zone, new.last_tick_at, now_);
  end if;
  if new.next_run_at is null then
    raise exception 'schedule %: cron expression % never fires (no tick within eight years)',
      quote_literal(new.name), quote_literal(new.cron)
      using errcode = 'check_violation', constraint = 'schedules_cron_must_be_valid';
  end if;
  if tg_op = 'INSERT' or new.task is distinct from old.task
     or new.workflow is distinct from old.workflow or new.owner is distinct from old.owner then
    perform sked.schedule_check_template(new);
  end if;
  if tg_op = 'UPDATE' then
    new.updated_at := now_;
  end if;
  return new;
end
$$;

create or replace trigger schedules_before_write
  before insert or update on sked.schedules
  for each row execute function sked.schedules_before_write();

-- Firing loops sleep until the next tick; a changed schedule wakes them to look again.
create or replace function sked.schedules_after_write_notify() returns trigger
language plpgsql as $$
begin
  perform pg_notify('sked_schedules', '');
  return null;
end
$$;

create or replace trigger schedules_after_write_notify
  after insert or update of cron, time_zone, next_run_at, paused_at on sked.schedules
  for each statement execute function sked.schedules_after_write_notify();

-- ---------------------------------------------------------------------------------------------
-- Schedules: the SQL interface
-- ---------------------------------------------------------------------------------------------

-- Create a schedule with named arguments; returns its id. Exactly one of task and workflow.
drop function if exists sked.schedule_create(text, text, jsonb, jsonb, text, text, interval,
                                             integer, text, interval, integer, boolean, text,
                                             timestamptz);
create or replace function sked.schedule_create(
  name            text,
  cron            text,
  task            jsonb       default null,
  workflow        jsonb       default null,
  time_zone       text        default 'UTC',
  misfire_policy  text        default 'run_once',
  misfire_grace   interval    default '1 minute',
  catch_up_limit  integer     default 100,
  overlap_policy  text        default 'skip',
  jitter          interval    default '0',
  history_limit   integer     default 1000,
  paused          boolean     default false,
  owner           text        default current_user,
  notify          jsonb       default null,
  p_now           timestamptz default now()
) returns uuid
language plpgsql as $$
#variable_conflict use_variable
declare
  s sked.cron_spec := sked.schedule_spec(name, cron, time_zone);
  new_id uuid;
begin
  insert into sked.schedules (name, cron, task, workflow, time_zone, misfire_policy,
                              misfire_grace, catch_up_limit, overlap_policy, jitter,
                              history_limit, paused_at, owner, next_run_at, created_at,
                              updated_at, notify)
  values (name, cron, task, workflow, time_zone, misfire_policy, misfire_grace,
          catch_up_limit, overlap_policy, jitter, history_limit,
          case when paused then p_now end, owner,
          sked.cron_next(s, time_zone, p_now), p_now, p_now, notify)
  returning id into new_id;
  return new_id;
end
$$;

-- Pause a schedule (no tick fires while paused). Returns false when there is no such schedule.
create or replace function sked.schedule_pause(p_id uuid, p_now timestamptz default now())
returns boolean
language plpgsql as $$
begin
  update sked.schedules set paused_at = coalesce(paused_at, p_now) where id = p_id;
  return found;
end
$$;

-- Resume a paused schedule at its next future tick: ticks that passed while it was paused are
-- not missed ticks and do not fire, and no tick it has handled fires again (see
-- sked.schedule_rearm). Returns false when there is no such schedule.
create or replace function sked.schedule_resume(p_id uuid, p_now timestamptz default now())
returns boolean
language plpgsql as $$
begin
  update sked.schedules
     set next_run_at = case when paused_at is null then next_run_at
                            else sked.schedule_rearm(spec, time_zone, last_tick_at, p_now) end,
         paused_at = null
   where id = p_id;
  return found;
end
$$;

-- Seconds until the next tick of an active schedule is due (zero or negative when one is
-- due, null when there is none); one second while an occurrence is queued behind a running one
-- or a backfill runs.
create or replace function sked.schedules_next_due(p_now timestamptz default now())
returns double precision
language sql stable as $$
  select least(
    (select extract(epoch from min(next_run_at) - p_now)::double precision
       from sked.schedules where paused_at is null),
    (select 1.0::double precision from sked.schedules
      where queued_fire_at is not null and paused_at is null limit 1),
    (select 1.0::double precision from sked.schedule_backfills where state = 'running' limit 1))
$$;

-- ---------------------------------------------------------------------------------------------
-- Firing
-- ---------------------------------------------------------------------------------------------

-- Whether a schedule's latest occurrence is unfinished (for the overlap policy).
create or replace function sked.schedule_occurrence_unfinished(p_task uuid, p_workflow uuid)
returns boolean
language plpgsql stable as $$
declare
  st text;
begin
  if p_task is not null then
    select t.state into st from sked.tasks t where t.id = p_task;
    return sked.state_is_unfinished(st);
  elsif p_workflow is not null then
    execute 'select w.state from sked.workflows w where w.id = $1' into st using p_workflow;
    return st = 'running';
  end if;
  return false;
end
$$;

-- Fire every tick due by p_now + p_horizon, at most p_limit schedules per call (call again
-- while it returns p_limit). Safe to run from any number of processes at once: due schedules
-- are locked with SKIP LOCKED, and a tick's occurrence, its sked.schedule_runs row (keyed by
-- schedule and fire time) and the schedule's new next_run_at commit together.
--
-- A tick fires at most once, ever. Its sked.schedule_runs row is the claim: the runs are
-- inserted first, and only a tick whose row this call inserted (or moved on from `queued`)
-- gets its occurrence, cancels a replaced one, or submits a workflow. A tick recorded
-- already (a schedule whose next_run_at was set back by hand) does nothing, and the
-- schedule moves on past it. The schedule keeps the latest tick it handled in last_tick_at,
-- from which re-arming starts (sked.schedule_rearm).
--
-- The firing duty of the background upkeep (db/src/upkeep.rs) passes a small horizon so that occurrences are queued a moment ahead with
-- next_run_at = the tick, and workers start them on time. A tick older than misfire_grace
-- when it is seen was missed, and the misfire policy decides:
--   skip      nothing runs; one `missed` row counts the missed ticks; resume at the next tick
--   run_once  one occurrence now, for the first missed tick (the rest are counted in its row)
--   catch_up  an occurrence per missed tick, up to catch_up_limit; the rest counted as missed
-- Every occurrence (on time or catching up) is subject to the overlap policy when the
-- previous occurrence is unfinished (blocked, waiting, running or retrying):
--   allow     run anyway
--   skip      a `skipped` row, no occurrence
--   queue_one a `queued` row; it fires when the previous occurrence finishes (one at most;
--             further ticks are skipped meanwhile)
--   replace   cancel the previous occurrence, then run
-- Running backfills go a step first (sked.schedule_backfills_step).
-- Returns the number of schedules handled and backfills stepped.
drop function if exists sked.schedules_fire(timestamptz, interval, integer);
create or replace function sked.schedules_fire(
  p_horizon interval default '0', p_limit integer default 1000, p_now timestamptz default now())
returns integer
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  r record;
  handled integer := 0;
  until_ timestamptz := p_now + p_horizon;
  -- What the loop decides, applied after it: the runs first (one insert, the claim of their
  -- ticks), then for the claimed ones the cancels, the task occurrences (one insert) and the
  -- workflows, then the schedules (one update). Per run i: run_occ[i] indexes occ for a task
  -- occurrence, run_wf[i] is a workflow to submit with its owner run_wf_owner[i], and
  -- run_cancel_task[i] / run_cancel_wf[i] the occurrence it replaces. Read by subscript only.
  occ jsonb[] := '{}';
  n_occ integer := 0;
  runs sked.schedule_runs[] := '{}';
  run_occ integer[] := '{}';
  run_wf jsonb[] := '{}';
  run_wf_owner text[] := '{}';
  run_cancel_task uuid[] := '{}';
  run_cancel_wf uuid[] := '{}';
  n_run integer := 0;
  upd_id uuid[] := '{}';
  upd_next timestamptz[] := '{}';
  upd_last_fire timestamptz[] := '{}';
  upd_last_tick timestamptz[] := '{}';
  upd_last_occ integer[] := '{}';
  upd_last_wf_run integer[] := '{}';
  upd_queued timestamptz[] := '{}';
  upd_paused timestamptz[] := '{}';
  ticks timestamptz[];
  tick timestamptz;
  nxt timestamptz;
  missed integer;
  missed_from timestamptz;
  t timestamptz;
  busy boolean;
  queued timestamptz;
  last_occ integer;
  last_wf_run integer;
  last_fire timestamptz;
  last_tick timestamptz;
  prev_task uuid;
  detail text;
  late_detail text;
  late_missed integer;
  -- After the claim: the claimed runs (indexes into runs) and their row ids, the tasks
  -- inserted (by occ index) and the workflows submitted (by run index).
  claimed integer[];
  claimed_row bigint[];
  i integer;
  sub jsonb[] := '{}';
  sub_occ integer[] := '{}';
  sub_ids uuid[];
  task_ids uuid[] := '{}';
  wf_ids uuid[] := '{}';
  -- The notifications of missed ticks.
  m_owners text[];
  m_rules jsonb[];
  m_events jsonb[];
  -- The running backfills go a step first (sked.schedule_backfills_step).
  stepped integer := sked.schedule_backfills_step(p_limit, p_now);
begin
  for r in
    select s.*, coalesce(sked.state_is_unfinished(pt.state), false) as task_busy
      from sked.schedules s
      left join sked.tasks pt on pt.id = s.last_task_id
     where s.paused_at is null
       and (s.next_run_at <= until_
            or (s.queued_fire_at is not null
                and not sked.schedule_occurrence_unfinished(s.last_task_id, s.last_workflow_id)))
     order by s.next_run_at
     limit p_limit
     for update of s skip locked
  loop
    handled := handled + 1;
    busy := r.task_busy
            or (r.last_workflow_id is not null
                and sked.schedule_occurrence_unfinished(null, r.last_workflow_id));
    queued := r.queued_fire_at;
    last_occ := null;
    last_wf_run := null;
    last_fire := r.last_fire_at;
    last_tick := r.last_tick_at;
    prev_task := r.last_task_id;
    nxt := r.next_run_at;
    late_detail := null;
    late_missed := null;

    -- A tick queued behind an occurrence that has finished runs now.
    if queued is not null and not busy then
      ticks := array[queued];
      queued := null;
    else
      ticks := '{}';
    end if;

    if r.next_run_at <= until_ then
      if r.next_run_at >= p_now - r.misfire_grace then
        ticks := ticks || r.next_run_at;
        last_tick := greatest(last_tick, r.next_run_at);
        nxt := sked.cron_next(r.spec, r.time_zone, r.next_run_at);
      else
        -- Missed ticks: from next_run_at up to now (counted up to 10,000).
        missed := 0;
        missed_from := null;
        t := r.next_run_at;
        while t is not null and t <= p_now and missed < 10000 loop
          if (r.misfire_policy = 'catch_up' and cardinality(ticks) < r.catch_up_limit)
             or (r.misfire_policy = 'run_once' and cardinality(ticks) = 0) then
            ticks := ticks || t;
          else
            missed := missed + 1;
            missed_from := coalesce(missed_from, t);
          end if;
          last_tick := greatest(last_tick, t);
          t := sked.cron_next(r.spec, r.time_zone, t);
        end loop;
        nxt := sked.cron_next(r.spec, r.time_zone, p_now);
        if missed > 0 and r.misfire_policy = 'run_once' then
          -- The one late occurrence stands for the others.
          late_missed := missed;
          late_detail := format('late: one run for %s%s missed ticks (misfire policy run_once)',
                                case when missed >= 10000 then 'at least ' else '' end, missed + 1);
        elsif missed > 0 then
          n_run := n_run + 1;
          runs[n_run] := row(null, r.id, missed_from, 'missed', null, null, missed,
                             format('%s%s ticks missed from %s (misfire policy %s)',
                                    case when missed >= 10000 then 'at least ' else '' end,
                                    missed, missed_from, r.misfire_policy),
                             p_now, null)::sked.schedule_runs;
        else
          late_detail := format('late (misfire policy %s)', r.misfire_policy);
        end if;
      end if;
    end if;

    foreach tick in array ticks loop
      detail := case when tick < p_now - r.misfire_grace then late_detail end;
      n_run := n_run + 1;
      if busy and r.overlap_policy = 'skip' then
        runs[n_run] := row(null, r.id, tick, 'skipped', null, null, coalesce(late_missed, 0),
                           concat_ws('; ', detail,
                                     'the previous occurrence was unfinished (overlap policy skip)'),
                           p_now, null)::sked.schedule_runs;
      elsif busy and r.overlap_policy = 'queue_one' and queued is null then
        queued := tick;
        runs[n_run] := row(null, r.id, tick, 'queued', null, null, coalesce(late_missed, 0),
                           concat_ws('; ', detail,
                                     'waiting for the previous occurrence to finish (overlap policy queue_one)'),
                           p_now, null)::sked.schedule_runs;
      elsif busy and r.overlap_policy = 'queue_one' then
        runs[n_run] := row(null, r.id, tick, 'skipped', null, null, coalesce(late_missed, 0),
                           concat_ws('; ', detail,
                                     'an occurrence was already queued (overlap policy queue_one)'),
                           p_now, null)::sked.schedule_runs;
      else
        if busy and r.overlap_policy = 'replace' then
          if prev_task is not null then
            run_cancel_task[n_run] := prev_task;
          elsif last_wf_run is null and r.last_workflow_id is not null then
            run_cancel_wf[n_run] := r.last_workflow_id;
          end if;
          detail := concat_ws('; ', detail,
                              'replaced the unfinished previous occurrence (overlap policy replace)');
        end if;
        -- Fire: a task occurrence joins the insert below; a workflow is submitted after the
        -- claim.
        if r.task is not null then
          n_occ := n_occ + 1;
          occ[n_occ] := sked.schedule_task_at(r.task, tick, r.time_zone)
                        || jsonb_build_object('owner', r.owner,
                                              'run_at', tick + r.jitter * random());
          last_occ := n_occ;
          run_occ[n_run] := n_occ;
          prev_task := null; -- the previous occurrence is now one of this call's
        else
          run_wf[n_run] := sked.schedule_workflow_at(r.workflow, tick, r.time_zone);
          run_wf_owner[n_run] := r.owner;
          last_wf_run := n_run;
        end if;
        runs[n_run] := row(null, r.id, tick, 'fired', null, null, coalesce(late_missed, 0), detail,
                           p_now, null)::sked.schedule_runs;
        last_fire := tick;
        busy := true;
      end if;
      late_missed := null;
      late_detail := null;
    end loop;

    if nxt is null then
      -- No tick within eight years: the schedule has run out; it is paused where it ended.
      n_run := n_run + 1;
      runs[n_run] := row(null, r.id, coalesce(last_fire, r.next_run_at) + interval '1 microsecond',
                         'missed', null, null, 0,
                         'the expression has no tick within eight years: the schedule was paused',
                         p_now, null)::sked.schedule_runs;
    end if;
    upd_id[handled] := r.id;
    upd_next[handled] := coalesce(nxt, r.next_run_at);
    upd_paused[handled] := case when nxt is null then p_now end;
    upd_last_fire[handled] := last_fire;
    upd_last_tick[handled] := last_tick;
    upd_last_occ[handled] := last_occ;
    upd_last_wf_run[handled] := last_wf_run;
    upd_queued[handled] := queued;
  end loop;

  if handled = 0 then
    return stepped;
  end if;

  -- The claim: every run in one statement. A tick recorded already is not claimed again,
  -- except a queued one, which fires now.
  with inserted as (
    insert into sked.schedule_runs as sr (schedule_id, fire_at, outcome, task_id, workflow_id,
                                          missed_ticks, detail, recorded_at)
    select u.schedule_id, u.fire_at, u.outcome, null, null, u.missed_ticks, u.detail,
           u.recorded_at
      from unnest(runs) as u
    on conflict (schedule_id, fire_at) where outcome <> 'manual' do update
       set outcome = excluded.outcome, task_id = null, workflow_id = null,
           detail = excluded.detail, recorded_at = excluded.recorded_at
     where sr.outcome = 'queued'
    returning sr.id, sr.schedule_id, sr.fire_at
  )
  select coalesce(array_agg(u.i order by u.i), '{}'), coalesce(array_agg(n.id order by u.i), '{}')
    into claimed, claimed_row
    from unnest(runs) with ordinality
         as u(id, schedule_id, fire_at, outcome, task_id, workflow_id, missed_ticks, detail,
              recorded_at, backfill_id, i)
    join inserted n on n.schedule_id = u.schedule_id and n.fire_at = u.fire_at;

  -- The claimed ticks count in sked.schedule_ticks (/metrics): a fired or skipped run is one
  -- tick, and a run also stands for the missed ticks it counts. A queued run counts when it
  -- fires or is skipped.
  update sked.schedule_ticks st
     set ticks = st.ticks + c.n
    from (select x.outcome, sum(x.n) as n
            from unnest(runs) with ordinality
                 as u(id, schedule_id, fire_at, outcome, task_id, workflow_id, missed_ticks,
                      detail, recorded_at, backfill_id, i)
            join unnest(claimed) as k(i) on k.i = u.i
            cross join lateral (values
                   (u.outcome, case when u.outcome = 'missed' then 0 else 1 end),
                   ('missed', u.missed_ticks)) as x(outcome, n)
           group by x.outcome) c
   where st.outcome = c.outcome and c.n > 0;

  -- Missed ticks are told to their schedule's on_missed (sql/alerts.sql).
  select array_agg(sc.owner), array_agg(sc.notify -> 'on_missed'),
         array_agg(jsonb_build_object('event', 'schedule.missed', 'at', p_now,
                                      'schedule', sked.alert_schedule(sc),
                                      'missed_ticks', u.missed_ticks,
                                      'first_missed_at', u.fire_at))
    into m_owners, m_rules, m_events
    from unnest(runs) with ordinality
         as u(id, schedule_id, fire_at, outcome, task_id, workflow_id, missed_ticks, detail,
              recorded_at, backfill_id, i)
    join unnest(claimed) as k(i) on k.i = u.i
    join sked.schedules sc on sc.id = u.schedule_id
   where u.missed_ticks > 0 and jsonb_typeof(sc.notify -> 'on_missed') = 'array';
  if m_owners is not null then
    perform sked.alerts_deliver(m_owners, m_rules, m_events,
                                array_fill(null::uuid, array[cardinality(m_owners)]),
                                array_fill(null::integer, array[cardinality(m_owners)]));
  end if;

  -- Replaced occurrences are cancelled before their successors are inserted.
  foreach i in array claimed loop
    if run_cancel_task[i] is not null then
      perform sked.task_cancel(run_cancel_task[i], p_now);
    elsif run_cancel_wf[i] is not null then
      perform sked.workflow_cancel(run_cancel_wf[i], p_now);
    end if;
    if run_occ[i] is not null then
      sub := sub || occ[run_occ[i]];
      sub_occ := sub_occ || run_occ[i];
    end if;
  end loop;

  -- All claimed task occurrences in one statement (one insert notification).
  if cardinality(sub) > 0 then
    select array_agg(x.id) into sub_ids from sked.tasks_submit(to_jsonb(sub)) x;
    for i in 1 .. cardinality(sub_occ) loop
      task_ids[sub_occ[i]] := sub_ids[i];
    end loop;
  end if;
  foreach i in array claimed loop
    if run_wf[i] is not null then
      wf_ids[i] := sked.workflow_submit(run_wf[i], run_wf_owner[i], p_now);
    end if;
  end loop;

  -- The claimed runs name their occurrences.
  update sked.schedule_runs sr
     set task_id = task_ids[run_occ[c.i]], workflow_id = wf_ids[c.i]
    from unnest(claimed, claimed_row) as c(i, id)
   where sr.id = c.id and (run_occ[c.i] is not null or run_wf[c.i] is not null);

  update sked.schedules s
     set next_run_at = u.nxt,
         last_fire_at = u.last_fire,
         last_tick_at = u.last_tick,
         -- The latest occurrence this call inserted, if it claimed one.
         last_task_id = case when task_ids[u.occ] is null and wf_ids[u.wf_run] is null
                             then s.last_task_id else task_ids[u.occ] end,
         last_workflow_id = case when task_ids[u.occ] is null and wf_ids[u.wf_run] is null
                                 then s.last_workflow_id else wf_ids[u.wf_run] end,
         queued_fire_at = u.queued,
         paused_at = coalesce(u.paused, s.paused_at)
    from unnest(upd_id, upd_next, upd_last_fire, upd_last_tick, upd_last_occ, upd_last_wf_run,
                upd_queued, upd_paused)
         as u(id, nxt, last_fire, last_tick, occ, wf_run, queued, paused)
   where s.id = u.id;
  return handled + stepped;
end
$$;

-- "Run now": an occurrence outside the schedule, whatever the overlap policy; recorded as a
-- `manual` run. Returns the task's (or workflow's) id, or null when there is no such schedule.
create or replace function sked.schedule_run_now(p_id uuid, p_now timestamptz default now())
returns uuid
language plpgsql as $$
declare
  s sked.schedules;
  occ uuid;
  at_ timestamptz := p_now;
begin
  select * into s from sked.schedules where id = p_id for update;
  if not found then
    return null;
  end if;
  if s.task is not null then
    select x.id into occ
      from sked.tasks_submit(jsonb_build_array(sked.schedule_task_at(s.task, p_now, s.time_zone)
                                               || jsonb_build_object('owner', s.owner, 'run_at', p_now))) x;
    update sked.schedules set last_task_id = occ, last_workflow_id = null, last_fire_at = at_
     where id = p_id;
  else
    occ := sked.workflow_submit(sked.schedule_workflow_at(s.workflow, p_now, s.time_zone),
                                s.owner, p_now);
    update sked.schedules set last_workflow_id = occ, last_task_id = null, last_fire_at = at_
     where id = p_id;
  end if;
  insert into sked.schedule_runs (schedule_id, fire_at, outcome, task_id, workflow_id, detail, recorded_at)
  values (p_id, at_, 'manual',
          case when s.task is not null then occ end,
          case when s.workflow is not null then occ end,
          'run now', p_now);
  return occ;
end
$$;

-- ---------------------------------------------------------------------------------------------
-- Backfills (docs/schedules.md, "Backfill")
-- ---------------------------------------------------------------------------------------------

-- Raises check_violation for a broken backfill rule, naming it as the constraint.
create or replace function sked.backfill_rule_raise(rule text, says text) returns void
language plpgsql as $$
begin
  raise exception 'sked.schedule_backfills: %', says
    using errcode = 'check_violation', constraint = rule, table = 'schedule_backfills',
          schema = 'sked';
end
$$;

-- The ticks of schedule `s` from p_from to p_to, both included, in order; at most p_max + 1
-- of them (one more than the caller takes tells it there are more).
create or replace function sked.schedule_ticks_between(
  s sked.schedules, p_from timestamptz, p_to timestamptz, p_max integer)
returns timestamptz[]
language plpgsql stable as $$
declare
  ticks timestamptz[] := '{}';
  t timestamptz := sked.cron_next(s.spec, s.time_zone, p_from - interval '1 microsecond');
begin
  while t is not null and t <= p_to and cardinality(ticks) <= p_max loop
    ticks := ticks || t;
    t := sked.cron_next(s.spec, s.time_zone, t);
  end loop;
  return ticks;
end
$$;

-- Starts a backfill of schedule p_schedule: an occurrence for every tick from p_from to p_to
-- (both included; p_to not after p_now), at most p_max_active running at once, the oldest
-- tick first or, with p_newest_first, the newest. The firing duty starts them
-- (sked.schedule_backfills_step). A tick that has a run already (fired or queued by the
-- schedule, or by another backfill) is not fired again; one the schedule missed or skipped
-- is. Returns the backfill's id; null when there is no such schedule.
create or replace function sked.schedule_backfill(
  p_schedule uuid, p_from timestamptz, p_to timestamptz, p_max_active integer default 1,
  p_newest_first boolean default false, p_now timestamptz default now())
returns uuid
language plpgsql as $$
declare
  s sked.schedules;
  ticks timestamptz[];
  id_ uuid;
begin
  select * into s from sked.schedules where id = p_schedule;
  if not found then
    return null;
  end if;
  if p_from is null or p_to is null then
    perform sked.backfill_rule_raise('schedule_backfills_range_must_be_given',
      format('backfill of schedule %L: give the first and the last moment of the range (from, to)',
             s.name));
  elsif p_from > p_to then
    perform sked.backfill_rule_raise('schedule_backfills_from_must_not_be_after_to',
      format('backfill of schedule %L: from (%s) is after to (%s)', s.name, p_from, p_to));
  elsif p_to > p_now then
    perform sked.backfill_rule_raise('schedule_backfills_must_end_in_the_past',
      format('backfill of schedule %L: to (%s) is in the future; the schedule fires its ticks from now on itself',
             s.name, p_to));
  elsif p_max_active is null or p_max_active not between 1 and 1000 then
    perform sked.backfill_rule_raise('schedule_backfills_max_active_must_be_1_to_1000',
      format('backfill of schedule %L: max_active must be 1 to 1000, not %s', s.name,
             coalesce(p_max_active::text, 'null')));
  end if;
  ticks := sked.schedule_ticks_between(s, p_from, p_to, 10000);
  if cardinality(ticks) = 0 then
    perform sked.backfill_rule_raise('schedule_backfills_must_cover_a_tick',
      format('backfill of schedule %L: %L in %s has no tick from %s to %s', s.name, s.cron,
             s.time_zone, p_from, p_to));
  elsif cardinality(ticks) > 10000 then
    perform sked.backfill_rule_raise('schedule_backfills_ticks_must_be_1_to_10000',
      format('backfill of schedule %L: the range from %s to %s holds more than 10000 ticks; backfill it in parts',
             s.name, p_from, p_to));
  end if;
  if coalesce(p_newest_first, false) then
    ticks := array(select t from unnest(ticks) t order by t desc);
  end if;
  insert into sked.schedule_backfills (schedule_id, from_at, to_at, newest_first, max_active,
                                       ticks, created_at)
  values (p_schedule, p_from, p_to, coalesce(p_newest_first, false), p_max_active, ticks, p_now)
  returning id into id_;
  -- The firing duty starts the first ticks at once.
  perform pg_notify('sked_schedules', '');
  return id_;
end
$$;

-- Stops a running backfill: it starts no more ticks (the occurrences it started run on).
-- False when there is no such backfill or it is not running.
create or replace function sked.schedule_backfill_cancel(p_id uuid, p_now timestamptz default now())
returns boolean
language plpgsql as $$
begin
  update sked.schedule_backfills
     set state = 'cancelled', finished_at = p_now
   where id = p_id and state = 'running';
  return found;
end
$$;

-- Steps the running backfills, at most p_limit of them, each in a subtransaction of its own:
-- it counts the occurrences it started that have ended since, then claims its next ticks
-- while fewer than max_active occurrences run, and submits an occurrence for each tick it
-- claimed, as the schedule's own firing does (its template now, the tick's parameters,
-- run at p_now; the overlap and misfire policies and the jitter are the schedule's, not a
-- backfill's). A tick's claim is its run: inserted with the backfill's id, or a `missed` or
-- `skipped` run of the tick turned `fired`; a tick with any other run is counted `already`.
-- A backfill whose occurrence cannot be submitted fails with the reason, and the others go
-- on. Called by sked.schedules_fire. Returns the backfills that claimed a tick or ended.
create or replace function sked.schedule_backfills_step(
  p_limit integer default 100, p_now timestamptz default now())
returns integer
language plpgsql
set enable_seqscan = off -- see the planner note at the top of sql/workers.sql
set jit = off
as $$
declare
  b record;
  stepped integer := 0;
  still uuid[];
  ended_ok integer;
  ended_bad integer;
  free integer;
  pos integer;
  take timestamptz[];
  claimed timestamptz[];
  n_already integer;
  occ uuid[];
  t timestamptz;
  done_ boolean;
begin
  for b in
    select f.id, f.schedule_id, f.ticks, f.next_tick, f.active, f.max_active, f.failed,
           s.owner, s.task, s.workflow, s.time_zone, s.name
      from sked.schedule_backfills f
      join sked.schedules s on s.id = f.schedule_id
     where f.state = 'running'
     order by f.created_at
     limit p_limit
     for update of f skip locked
  loop
    t := null;
    claimed := '{}';
    begin
      -- The occurrences that ended since the last step (one deleted meanwhile counts as
      -- neither).
      select coalesce(array_agg(a.id) filter (where sked.state_is_unfinished(x.st)), '{}'),
             count(*) filter (where x.st = 'succeeded'),
             count(*) filter (where x.st is not null and not sked.state_is_unfinished(x.st)
                                and x.st <> 'succeeded')
        into still, ended_ok, ended_bad
        from unnest(b.active) as a(id)
        cross join lateral (
          select coalesce((select t.state from sked.tasks t where t.id = a.id),
                          (select w.state from sked.workflows w where w.id = a.id)) as st) x;

      -- Claim ticks for the free slots; a tick recorded already takes none.
      free := b.max_active - cardinality(still);
      pos := b.next_tick;
      claimed := '{}';
      n_already := 0;
      while cardinality(claimed) < free and pos <= cardinality(b.ticks) loop
        take := b.ticks[pos : pos + (free - cardinality(claimed)) - 1];
        pos := pos + cardinality(take);
        with claim as (
          insert into sked.schedule_runs as sr (schedule_id, fire_at, outcome, missed_ticks,
                                                detail, recorded_at, backfill_id)
          select b.schedule_id, k.t, 'fired', 0, 'backfill', p_now, b.id
            from unnest(take) as k(t)
          on conflict (schedule_id, fire_at) where outcome <> 'manual' do update
             set outcome = 'fired', task_id = null, workflow_id = null, missed_ticks = 0,
                 detail = 'backfill; before: ' || sr.outcome
                          || coalesce(' (' || sr.detail || ')', ''),
                 recorded_at = excluded.recorded_at, backfill_id = excluded.backfill_id
           where sr.outcome in ('missed', 'skipped')
          returning sr.fire_at
        )
        select claimed || coalesce(array_agg(k.t order by k.i) filter (where c.fire_at is not null), '{}'),
               n_already + cardinality(take) - count(c.fire_at)::integer
          into claimed, n_already
          from unnest(take) with ordinality as k(t, i)
          left join claim c on c.fire_at = k.t;
      end loop;

      -- An occurrence per claimed tick, in the order of the ticks.
      occ := '{}';
      if cardinality(claimed) > 0 then
        if b.task is not null then
          select coalesce(array_agg(x.id), '{}') into occ
            from sked.tasks_submit(
                   (select jsonb_agg(sked.schedule_task_at(b.task, c.t, b.time_zone)
                                     || jsonb_build_object('owner', b.owner, 'run_at', p_now)
                                     order by c.i)
                      from unnest(claimed) with ordinality as c(t, i))) x;
        else
          foreach t in array claimed loop
            occ := occ || sked.workflow_submit(sked.schedule_workflow_at(b.workflow, t, b.time_zone),
                                               b.owner, p_now);
          end loop;
        end if;
        update sked.schedule_runs sr
           set task_id = case when b.task is not null then c.id end,
               workflow_id = case when b.task is null then c.id end
          from unnest(claimed, occ) as c(t, id)
         where sr.schedule_id = b.schedule_id and sr.fire_at = c.t and sr.outcome <> 'manual';
      end if;

      done_ := pos > cardinality(b.ticks) and cardinality(still) + cardinality(occ) = 0;
      update sked.schedule_backfills f
         set next_tick = pos,
             active = still || occ,
             fired = f.fired + cardinality(claimed),
             already = f.already + n_already,
             succeeded = f.succeeded + ended_ok,
             failed = f.failed + ended_bad,
             state = case when not done_ then 'running'
                          when f.failed + ended_bad > 0 then 'failed'
                          else 'succeeded' end,
             finished_at = case when done_ then p_now end
       where f.id = b.id and f.state = 'running';
      if done_ or cardinality(claimed) > 0 or n_already > 0 or ended_ok + ended_bad > 0 then
        stepped := stepped + 1;
      end if;
    exception when others then
      -- This backfill's step is undone; it fails with the reason and the others go on.
      update sked.schedule_backfills f
         set state = 'failed', finished_at = p_now,
             error = format('the occurrence of the tick at %s could not be submitted: %s',
                            coalesce(t, claimed[1]), sqlerrm)
       where f.id = b.id and f.state = 'running';
      stepped := stepped + 1;
    end;
  end loop;
  return stepped;
end
$$;

-- Keep at most history_limit runs per schedule (the newest). The runs of a backfill are kept
-- as long as the backfill, and do not count. Returns the rows deleted.
create or replace function sked.schedule_runs_prune(p_limit integer default 10000)
returns integer
language plpgsql as $$
declare
  deleted integer;
begin
  with ranked as (
    select r.id,
           row_number() over (partition by r.schedule_id order by r.fire_at desc, r.id desc) as n,
           s.history_limit
      from sked.schedule_runs r join sked.schedules s on s.id = r.schedule_id
     where r.backfill_id is null
  ), doomed as (
    select id from ranked where n > history_limit limit p_limit
  )
  delete from sked.schedule_runs r using doomed d where r.id = d.id;
  get diagnostics deleted = row_count;
  return deleted;
end
$$;
