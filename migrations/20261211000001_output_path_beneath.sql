-- An output_path names a file beneath the task's working directory: an absolute path or a `..`
-- component would make the worker (often root) upload any file it can read into
-- sked.artifacts, so the schema refuses them at submit, whatever the way in. The worker
-- still opens the path confined to the directory (rows written before this rule).
--
-- Rows written before this rule: an unfinished task or a schedule's template with such a path
-- would fail every later write of its row (a claim, a finish, a cancel) or firing on this
-- constraint, and with it the whole batch or firing, so the migration stops and names them
-- when there are any. Finished tasks are history: they are left as they are, and the
-- constraint is validated only when none of them breaks it (a retry of one is refused).

alter table sked.tasks
  add constraint tasks_output_path_must_be_relative_beneath_the_task_directory
    check (output_path !~ '^/|(^|/)\.\.(/|$)') not valid;

do $$
declare
  -- The rule, written once above, read back from the catalog.
  rule text := (select pg_get_expr(conbin, conrelid) from pg_constraint
                 where conname = 'tasks_output_path_must_be_relative_beneath_the_task_directory'
                   and conrelid = 'sked.tasks'::regclass);
  tasks text;
  schedules text;
  finished boolean;
begin
  execute format(
    'select string_agg(id::text, '', '') from (
       select id from sked.tasks
        where state in (''blocked'', ''waiting'', ''running'', ''retry'') and not %s
        order by id limit 20) t', rule) into tasks;
  -- The output_path of a task template, and of each task of a workflow template.
  execute format(
    'select string_agg(distinct quote_literal(name), '', '') from (
       select name, task ->> ''output_path'' as output_path
         from sked.schedules where jsonb_typeof(task) = ''object''
       union all
       select s.name, t ->> ''output_path''
         from sked.schedules s, jsonb_array_elements(s.workflow -> ''tasks'') t
        where jsonb_typeof(s.workflow -> ''tasks'') = ''array'' and jsonb_typeof(t) = ''object'') t
      where not %s', rule) into schedules;
  if tasks is not null or schedules is not null then
    raise exception 'output_path must be a relative path beneath the task''s directory (no leading /, no .. component), and rows written before this rule break it: unfinished tasks %, schedules %',
      coalesce(tasks, 'none'), coalesce(schedules, 'none')
      using hint = 'cancel those tasks or set their output_path to a relative path (or null), fix or delete those schedules, then migrate again';
  end if;
  execute format('select exists (select 1 from sked.tasks where not %s)', rule) into finished;
  if not finished then
    alter table sked.tasks
      validate constraint tasks_output_path_must_be_relative_beneath_the_task_directory;
  end if;
end
$$;
