-- What a task asks of the machine that runs it, and what a worker offers.
--
-- A task may request CPU (millicores: 1000 is one core) and memory (MB); a worker claims it
-- only when its free capacity covers the request (sked.tasks_claim), and runs it with those
-- requests as its limits where it enforces limits (docs/runtime.md). It may also cap the
-- bytes its stdout and stderr may write, and name the user it runs as. Null means "no
-- request": such a task fits any worker, and runs under the worker's defaults.
--
-- A worker advertises its capacity next to its slots (`concurrency`): CPU millicores and
-- memory MB, detected from the machine unless configured. Null: a worker of an older
-- version, which claims by slots and labels only.

alter table sked.tasks
  add column cpu_millis       integer,
  add column memory_mb        integer,
  add column max_output_bytes bigint,
  add column run_as           text;

alter table sked.tasks
  add constraint tasks_cpu_millis_must_be_1_to_1000000
    check (cpu_millis between 1 and 1000000),
  add constraint tasks_memory_mb_must_be_1_to_16777216
    check (memory_mb between 1 and 16777216),
  add constraint tasks_max_output_bytes_must_be_positive
    check (max_output_bytes > 0),
  -- A user name as useradd accepts it, or a numeric uid.
  add constraint tasks_run_as_must_be_a_user_name_or_uid
    check (run_as ~ '^([A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10})$');

alter table sked.workers
  add column cpu_millis integer,
  add column memory_mb  integer;

alter table sked.workers
  add constraint workers_cpu_millis_must_be_positive check (cpu_millis > 0),
  add constraint workers_memory_mb_must_be_positive check (memory_mb > 0);
