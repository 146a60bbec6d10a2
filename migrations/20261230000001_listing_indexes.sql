-- Task listings whose filters find their first page on an index (docs/api.md, "Listing
-- tasks"): a walk in id order for each queue and state, which also serves the states that
-- tasks_by_state leaves out (waiting and succeeded, walked once per queue). Running tasks
-- stay out: they are found on tasks_running, and a claim adds no entry. A task gets an
-- entry when it is submitted and one when it finishes; the cost on the hot path is measured
-- in bench/README.md (W1, W2) and the listings' times in W8.
--
-- The text filter's trigram index is not made here: it doubles the cost of an insert, so an
-- operator makes it when the search is worth that (`sked search-index enable`, docs/api.md);
-- what it indexes is defined here, so that every index made by that command is the same.

-- Tasks newest first per queue and state (running ones excepted), with what the
-- other filters test on the entries: a queue's listing merges one walk per state.
create index tasks_by_queue on sked.tasks (queue, state, id) include (owner, next_run_at)
  where state <> 'running';

-- What the text filter searches: the command line (the artifact URL or the command, then
-- the arguments, joined by spaces), and the name on a line of its own; the expression of
-- the trigram index tasks_text.
create function sked.task_search_text(artifact_url text, command text[], args text[], name text)
  returns text
  language sql immutable parallel safe
  return concat_ws(' ', artifact_url, array_to_string(command, ' '), array_to_string(args, ' '))
         || coalesce(E'\n' || name, '');

comment on function sked.task_search_text(text, text[], text[], text) is
  'What the task listing''s text filter (q) searches, case-insensitively: the command line, then the name on a line of its own.';
