-- A JSON number in sked is an IEEE 754 double (RFC 8259, section 6): what every client reads.
-- PostgreSQL's jsonb keeps any number (1e400), which no double holds and which a worker or the
-- server could then not read. Every JSON value a task or a schedule holds is held to it.
-- Existing rows are not checked (NOT VALID): a worker that cannot read a task's row fails
-- that task alone (see sked_db::worker::claim_within).

create function sked.json_numbers_fit_doubles(j jsonb) returns boolean
language sql immutable strict parallel safe as $$
  select not jsonb_path_exists(
    j, 'strict $.** ? (@.type() == "number" && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))')
$$;

comment on function sked.json_numbers_fit_doubles(jsonb) is
  'True when every number in the JSON value is within the range of an IEEE 754 double.';

alter table sked.tasks
  add constraint tasks_input_numbers_must_fit_a_double
    check (sked.json_numbers_fit_doubles(input)) not valid,
  add constraint tasks_output_numbers_must_fit_a_double
    check (sked.json_numbers_fit_doubles(output)) not valid,
  add constraint tasks_health_check_numbers_must_fit_a_double
    check (sked.json_numbers_fit_doubles(health_check)) not valid;

alter table sked.schedules
  add constraint schedules_task_numbers_must_fit_a_double
    check (sked.json_numbers_fit_doubles(task)) not valid,
  add constraint schedules_workflow_numbers_must_fit_a_double
    check (sked.json_numbers_fit_doubles(workflow)) not valid;
