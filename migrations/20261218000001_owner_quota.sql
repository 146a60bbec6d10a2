-- A quota per owner on the task rows created through the REST API, next to the limit per
-- request: one caller could otherwise fill the database with many requests, each within
-- --max-rows-per-request. It is a token bucket per owner, kept here so that it holds across
-- any number of `sked server` processes: it fills at --max-rows-per-owner-per-minute rows
-- per minute up to that many, and every request of a user token that creates task rows takes
-- them in its own transaction (sked.owner_quota_take, sql/quotas.sql), so a refused or
-- failed request takes nothing.
--
-- No role but the owner of the schema may read or write this table: the server reaches it
-- through sked.owner_quota_take only (sql/roles.sql).

create table sked.owner_quota (
  owner        text primary key,
  -- The rows the owner could create at refreshed_at; it fills from there.
  tokens       double precision not null,
  refreshed_at timestamptz not null,
  constraint owner_quota_tokens_must_not_be_negative check (tokens >= 0)
);

comment on table sked.owner_quota is
  'Per-owner token buckets of task rows created through the REST API (--max-rows-per-owner-per-minute). See docs/api.md.';
