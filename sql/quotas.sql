-- The quota per owner on task rows created through the REST API (docs/api.md, "Tokens and
-- quotas"). Each owner has a token bucket, its row of sked.owner_quota
-- (migrations/20261218000001_owner_quota.sql): it holds up to `per_minute` rows and fills at
-- `per_minute` rows per minute. The server takes a request's rows in the transaction that
-- inserts them, before it inserts them, so that a refused request and one that fails after
-- (a rule of the schema, a lost connection) take nothing: the rollback gives them back. The
-- row stays locked until that transaction ends, so the requests of one owner take turns
-- while they insert; other owners never wait.

-- The rows a bucket holds at p_now: what it held at refreshed_at, plus p_per_minute for
-- every minute since, up to p_per_minute. A clock behind refreshed_at adds nothing.
create or replace function sked.owner_quota_tokens(
  tokens double precision, refreshed_at timestamptz, p_per_minute bigint, p_now timestamptz)
returns double precision
language sql immutable parallel safe as $$
  select least(p_per_minute::double precision,
               tokens + p_per_minute::double precision
                        * greatest(0, extract(epoch from p_now - refreshed_at))::double precision
                        / 60)
$$;

-- Takes p_rows task rows from the bucket of p_owner, which fills at p_per_minute rows per
-- minute up to p_per_minute, at p_now. Returns 0 when they were taken, else the seconds
-- until the bucket will hold them (nothing is taken); 'Infinity' when p_rows is more than
-- the bucket can ever hold. One statement takes them or not: concurrent callers for one
-- owner take turns on its row. A bucket a caller never used starts full.
create or replace function sked.owner_quota_take(
  p_owner text, p_rows bigint, p_per_minute bigint, p_now timestamptz default now())
returns double precision
language plpgsql as $$
declare
  held double precision;
begin
  if p_owner is null or p_rows is null or p_rows < 0 or p_per_minute is null or p_per_minute < 1 then
    raise exception 'sked.owner_quota_take: an owner, rows >= 0 and per_minute >= 1 are required (got %, %, %)',
      p_owner, p_rows, p_per_minute
      using errcode = 'invalid_parameter_value';
  end if;
  if p_rows > p_per_minute then
    return 'Infinity'::double precision;
  end if;
  -- 1e-9: a bucket refilled to exactly what is asked may hold a hair less in floating point.
  insert into sked.owner_quota as q (owner, tokens, refreshed_at)
  values (p_owner, p_per_minute - p_rows, p_now)
  on conflict (owner) do update
     set tokens = greatest(0, sked.owner_quota_tokens(q.tokens, q.refreshed_at, p_per_minute, p_now) - p_rows),
         refreshed_at = greatest(q.refreshed_at, p_now)
   where sked.owner_quota_tokens(q.tokens, q.refreshed_at, p_per_minute, p_now) + 1e-9 >= p_rows;
  if found then
    return 0;
  end if;
  -- Refused. ON CONFLICT locked the row all the same, so it holds what it held.
  select sked.owner_quota_tokens(q.tokens, q.refreshed_at, p_per_minute, p_now) into held
    from sked.owner_quota q where q.owner = p_owner;
  return (p_rows - coalesce(held, 0)) * 60 / p_per_minute;
end
$$;
