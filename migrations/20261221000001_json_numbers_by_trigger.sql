-- The rule that a task's JSON numbers fit a double moves from CHECK constraints, which every
-- update of a row evaluates (each claim, heartbeat and finish walked the task's input), to
-- the rule triggers of sql/tasks.sql (sked.task_rule_broken): once per inserting statement,
-- and per row when an update writes `input`, `output` or `health_check`. The rules keep their
-- names.

alter table sked.tasks
  drop constraint tasks_input_numbers_must_fit_a_double,
  drop constraint tasks_output_numbers_must_fit_a_double,
  drop constraint tasks_health_check_numbers_must_fit_a_double;
