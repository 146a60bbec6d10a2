-- Task listings whose every filter finds its first page on an index (docs/api.md, "Listing
-- tasks"): a walk in id order for each state (waiting and succeeded included) and for each
-- queue, and a trigram index for the text search. Running tasks stay out of the new
-- indexes: they are found on tasks_running, and a claim adds no entry to them. The cost on
-- the hot path is measured in bench/README.md (W1, W2) and the listings' times in W8.

-- Tasks newest first per state, every state but running: replaces tasks_by_state, which left
-- out waiting and succeeded tasks (the most numerous, found by walking the primary key).
create index tasks_by_state_all on sked.tasks (state, id) include (queue, owner, next_run_at)
  where state <> 'running';
drop index sked.tasks_by_state;
alter index sked.tasks_by_state_all rename to tasks_by_state;

-- Tasks newest first per queue and state (running ones excepted, as above), with what the
-- other filters test on the entries: a queue's listing merges one walk per state.
create index tasks_by_queue on sked.tasks (queue, state, id) include (owner, next_run_at)
  where state <> 'running';

-- What the text filter searches: the command line (the artifact URL or the command, then
-- the arguments, joined by spaces), and the name on a line of its own.
create function sked.task_search_text(artifact_url text, command text[], args text[], name text)
  returns text
  language sql immutable parallel safe
  return concat_ws(' ', artifact_url, array_to_string(command, ' '), array_to_string(args, ' '))
         || coalesce(E'\n' || name, '');

comment on function sked.task_search_text(text, text[], text[], text) is
  'What the task listing''s text filter (q) searches, case-insensitively: the command line, then the name on a line of its own.';

-- The trigram index of that text, when the pg_trgm extension can be had (it ships with
-- PostgreSQL; creating it needs the CREATE privilege on the database, which trusted
-- extensions ask of whoever runs the migrations). Without it the text filter still works,
-- on at most the scan limit's rows per request.
do $$
declare
  trgm_schema name;
begin
  begin
    create extension if not exists pg_trgm;
  exception when insufficient_privilege or undefined_file or feature_not_supported then
    raise notice 'pg_trgm is not available (%): the task listing''s text filter has no index', sqlerrm;
  end;
  select n.nspname into trgm_schema
    from pg_extension e join pg_namespace n on n.oid = e.extnamespace
   where e.extname = 'pg_trgm';
  if trgm_schema is not null then
    execute format(
      'create index tasks_text on sked.tasks using gin '
      '(sked.task_search_text(artifact_url, command, args, name) %I.gin_trgm_ops)',
      trgm_schema);
  end if;
end
$$;
