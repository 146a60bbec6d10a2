-- Task tokens (db/src/task_token.rs, docs/api.md "Spawning from a task"): a running attempt
-- shows the API a token to add work to its own workflow, the HMAC-SHA256 of its task and
-- attempt under this key. Workers mint them in memory from the key they load at start, so a
-- claim writes nothing for them; the server checks them with it. One key per database, made
-- here from random bytes (two gen_random_uuid() values: 244 random bits), readable by the
-- worker and server roles only (sql/roles.sql). Replacing it (an UPDATE by the administrator)
-- voids the tokens of running attempts; workers load the new one when they restart.
create table sked.task_token_key (
  one        boolean primary key default true,
  key        bytea not null default decode(
               replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'),
  created_at timestamptz not null default now(),
  constraint task_token_key_is_one_row check (one),
  constraint task_token_key_must_be_32_bytes check (length(key) = 32)
);

comment on table sked.task_token_key is
  'The key of task tokens (HMAC-SHA256 of a task id and attempt): one row, read by sked_worker and sked_server; see db/src/task_token.rs.';

insert into sked.task_token_key default values;
