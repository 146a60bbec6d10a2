-- A task that waits to run (blocked, waiting or retry) must have an attempt left: the claim
-- charges one, and a row that could never be claimed once made every claim of its worker
-- fail on tasks_attempt_must_be_between_0_and_max_attempts, stopping all of its queues.
-- Requeueing a task by hand (`set state = 'waiting'` on a task that failed at its last
-- attempt) is now refused with this rule's name; sked.task_retry is the way to run it again.
--
-- Rows that break the rule already are repaired as sked.task_retry would: they get one more
-- attempt (max_attempts = attempt + 1), which is what the operator who requeued them asked
-- for. The constraint is added NOT VALID so that those rows can be repaired under it, and
-- validated after the repair, which proves that none is left. (The migration's transaction
-- holds the table's lock from its first statement to its last.)
--
-- PostgreSQL checks a row's constraints in the order of their names; this one's name sorts
-- after tasks_attempt_… and tasks_max_attempts_…, so a row whose attempt or max_attempts is
-- out of range is refused by the rule that names that field.

alter table sked.tasks
  add constraint tasks_waiting_task_must_have_an_attempt_left
    check (state not in ('blocked', 'waiting', 'retry') or attempt < max_attempts) not valid;

update sked.tasks
   set max_attempts = attempt + 1
 where state in ('blocked', 'waiting', 'retry') and attempt >= max_attempts;

alter table sked.tasks validate constraint tasks_waiting_task_must_have_an_attempt_left;
