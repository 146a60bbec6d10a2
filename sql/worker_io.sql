-- The worker's reads and writes outside the task state machine: marking itself stopping,
-- appending log chunks, fetching and storing artifacts, and reading how a copy of a service
-- is supervised. A worker calls these functions instead of reading or writing tables, so
-- that the sked_worker role (sql/roles.sql) needs no privilege on any table.

-- Marks worker `p_id` as stopping: it claims nothing more.
create or replace function sked.worker_stopping(p_id uuid, p_now timestamptz default now())
returns void
language sql as $$
  update sked.workers set stopping_at = p_now where id = p_id
$$;

-- Appends log chunks: the i-th chunk is `p_data[i]` of stream `p_streams[i]` (stdout or
-- stderr) of attempt `p_attempts[i]` of task `p_task_ids[i]`.
create or replace function sked.task_logs_append(
  p_task_ids uuid[], p_attempts integer[], p_streams text[], p_data text[])
returns void
language sql as $$
  insert into sked.task_logs (task_id, attempt, stream, data)
  select * from unnest(p_task_ids, p_attempts, p_streams, p_data)
$$;

-- The content of the artifact stored in Postgres under `p_sha256`; null when there is none.
create or replace function sked.artifact_get(p_sha256 text) returns bytea
language sql stable as $$
  select a.content from sked.artifacts a where a.sha256 = p_sha256
$$;

-- Stores `p_content` as the artifact `p_sha256` (the table's constraint checks that this is
-- its SHA-256); storing it again keeps the content and renews its `created_at`, so that the
-- artifacts' collection (sked.artifacts_prune) gives it its whole grace period again.
create or replace function sked.artifact_put(p_sha256 text, p_content bytea) returns void
language sql as $$
  insert into sked.artifacts as a (sha256, content) values (p_sha256, p_content)
  on conflict (sha256) do update set created_at = greatest(a.created_at, excluded.created_at)
$$;

-- How the copy of a service `p_id` is supervised: its restart policy and health check.
-- No row when there is no such task.
create or replace function sked.service_copy_spec(p_id uuid)
returns table (restart_policy text, health_check jsonb)
language sql stable as $$
  select t.restart_policy, t.health_check from sked.tasks t where t.id = p_id
$$;
