"""The sync API against a real database and worker (DATABASE_URL)."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from conftest import ECHO_N1, EXIT_3, SECOND_TIME_LUCKY, unique
from psycopg import sql

import sked
from sked import TaskSpec, WorkflowTask

AWAIT = 30  # seconds: far more than any of these tasks takes
NEVER = "0 0 1 1 *"  # a cron that does not fire while the tests run
LATER = timedelta(hours=1)  # a delay no test waits for


def listening(conn: psycopg.Connection) -> list:
    return [r[0] for r in conn.execute("SELECT pg_listening_channels()").fetchall()]


# --- submitting ------------------------------------------------------------------------------


def test_submit_in_a_rolled_back_transaction_leaves_no_task(txconn, conn):
    submitted = sked.submit(txconn, ECHO_N1)
    assert sked.get_task(txconn, submitted.id) is not None  # visible inside the transaction
    txconn.rollback()
    assert sked.get_task(conn, submitted.id) is None


def test_a_delay_counts_from_the_commit(txconn, conn):
    """A 2 s delay asked for 1.5 s into a transaction is due 2 s after its COMMIT."""
    with txconn.transaction():
        time.sleep(1.5)
        submitted = sked.submit(txconn, ["true"], delay=timedelta(seconds=2), queue=unique("q"))
        time.sleep(0.2)
        before = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    after = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    task = sked.get_task(conn, submitted.id)
    assert task is not None and task.next_run_at is not None
    assert before + timedelta(seconds=2) <= task.next_run_at <= after + timedelta(seconds=2)


def test_submit_in_a_committed_transaction_runs(txconn, conn):
    with txconn.transaction():
        submitted = sked.submit(txconn, ECHO_N1, idempotency_key=unique("commit"))
        assert sked.get_task(conn, submitted.id) is None  # not committed yet
    task = sked.await_task(conn, submitted.id, timeout=AWAIT)
    assert task.state == "succeeded"
    assert task.output == {"n": 1}


def test_submit_many_in_one_statement(conn):
    submitted = sked.submit_many(
        conn,
        [
            TaskSpec(command=["sh", "-c", 'echo "{\\"i\\": 0}"']),
            {"command": ["sh", "-c", 'echo "{\\"i\\": 1}"'], "priority": 5},
            TaskSpec(kind="noop", fields={"preemptible": True}),
        ],
    )
    assert len(submitted) == 3 and len({s.id for s in submitted}) == 3
    assert all(s.created for s in submitted)
    tasks = [sked.await_task(conn, s.id, timeout=AWAIT) for s in submitted]
    assert [t.state for t in tasks] == ["succeeded"] * 3
    assert [t.output for t in tasks[:2]] == [{"i": 0}, {"i": 1}]
    assert tasks[1].priority == 5
    assert tasks[2].kind == "noop" and tasks[2].preemptible is True


def test_submit_many_is_all_or_nothing(conn):
    key = unique("all-or-nothing")
    with pytest.raises(sked.ValidationError) as raised:
        sked.submit_many(
            conn,
            [
                {"command": ECHO_N1, "idempotency_key": key},
                {"command": ["sh"], "queue": "bad queue"},
            ],
        )
    assert raised.value.constraint == "tasks_queue_name_must_be_1_to_64_word_characters"
    found = conn.execute("SELECT count(*) FROM sked.tasks WHERE idempotency_key = %s", (key,))
    assert found.fetchone() == (0,)


def test_submit_fields_and_intervals(conn):
    submitted = sked.submit(
        conn,
        ["true"],
        args=["a", "b"],
        env={"NAME": "world"},
        input={"x": [1, 2]},
        labels=[],
        delay=LATER,
        timeout=90.5,
        backoff_base="2 seconds",
        backoff_max=timedelta(minutes=5),
        max_attempts=4,
        output_path="out.json",
    )
    try:
        task = sked.get_task(conn, submitted.id)
        assert task is not None
        assert task.state == "waiting" and task.args == ["a", "b"]
        assert task.env == {"NAME": "world"} and task.input == {"x": [1, 2]}
        assert task.timeout == timedelta(seconds=90.5)
        assert task.backoff_base == timedelta(seconds=2)
        assert task.backoff_max == timedelta(minutes=5)
        assert task.max_attempts == 4 and task.output_path == "out.json"
        assert task.next_run_at is not None and task.created_at is not None
        assert task.next_run_at - task.created_at >= LATER - timedelta(seconds=1)
        assert task.attempts == []
    finally:
        assert sked.cancel(conn, submitted.id) == "cancelled"


# Idempotency keys (docs/sql.md): sked.tasks_submit answers a key with the task it names
# (`created` false) and refuses another definition (unique_violation,
# `tasks_idempotency_key_names_another_definition`).


def test_idempotent_submit_created_then_not_across_completion(conn):
    key = unique("idem")
    first = sked.submit(conn, ECHO_N1, idempotency_key=key)
    assert first.created is True
    again = sked.submit(conn, ECHO_N1, idempotency_key=key)
    assert again == sked.Submitted(id=first.id, created=False)
    assert sked.await_task(conn, first.id, timeout=AWAIT).state == "succeeded"
    after = sked.submit(conn, ECHO_N1, idempotency_key=key)
    assert after == sked.Submitted(id=first.id, created=False)
    (in_bulk,) = sked.submit_many(conn, [{"command": ECHO_N1, "idempotency_key": key}])
    assert in_bulk == sked.Submitted(id=first.id, created=False)
    # When it runs is not what it is: another delay is the same definition.
    later = sked.submit(conn, ECHO_N1, idempotency_key=key, delay=LATER)
    assert later == sked.Submitted(id=first.id, created=False)


def test_one_key_twice_in_a_batch_is_one_task(conn):
    key = unique("idem-batch")
    one, two = sked.submit_many(conn, [TaskSpec(command=ECHO_N1, idempotency_key=key)] * 2)
    assert (one.created, two.created) == (True, False)
    assert one.id == two.id
    assert sked.await_task(conn, one.id, timeout=AWAIT).state == "succeeded"


def test_idempotency_key_naming_another_definition_is_a_conflict(conn):
    key = unique("idem-conflict")
    first = sked.submit(conn, ECHO_N1, idempotency_key=key)
    assert first.created is True
    with pytest.raises(sked.ConflictError) as raised:
        sked.submit(conn, ["sh", "-c", "echo other"], idempotency_key=key)
    err = raised.value
    assert err.sqlstate == "23505"
    assert err.constraint == "tasks_idempotency_key_names_another_definition"
    assert err.name == err.constraint
    assert isinstance(err.__cause__, psycopg.errors.UniqueViolation)
    sked.await_task(conn, first.id, timeout=AWAIT)


# --- validation ------------------------------------------------------------------------------


def test_an_empty_command_is_a_validation_error_naming_the_rule(conn):
    with pytest.raises(sked.ValidationError) as raised:
        sked.submit(conn, [])
    err = raised.value
    assert err.sqlstate == "23514"
    assert err.constraint == "tasks_command_must_not_be_empty"
    assert err.condition == "check_violation"
    assert "command" in err.message


def test_a_broken_check_constraint_is_a_validation_error(conn):
    with pytest.raises(sked.ValidationError) as raised:
        sked.submit(conn, ECHO_N1, max_attempts=0)
    assert raised.value.sqlstate == "23514"
    assert raised.value.constraint == "tasks_max_attempts_must_be_at_least_1"


def test_a_priority_out_of_range_is_a_validation_error(conn):
    with pytest.raises(sked.ValidationError) as raised:
        sked.submit(conn, ECHO_N1, priority=2**31)
    assert raised.value.sqlstate == "22003"
    assert raised.value.name == "numeric_value_out_of_range"


def test_an_error_in_a_transaction_leaves_it_to_the_caller(txconn):
    with pytest.raises(sked.ValidationError):
        sked.submit(txconn, [])
    assert txconn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    txconn.rollback()


# --- awaiting --------------------------------------------------------------------------------


def test_await_success_returns_the_output_and_attempts(conn):
    submitted = sked.submit(conn, ECHO_N1)
    task = sked.await_task(conn, submitted.id, timeout=AWAIT)
    assert task.id == submitted.id
    assert task.state == "succeeded"
    assert task.output == {"n": 1}
    assert task.exit_code == 0
    assert [(a.attempt, a.outcome, a.exit_code) for a in task.attempts] == [(1, "succeeded", 0)]
    assert listening(conn) == []


def test_await_failure(conn):
    submitted = sked.submit(conn, EXIT_3, max_attempts=1)
    task = sked.await_task(conn, str(submitted.id), timeout=timedelta(seconds=AWAIT))
    assert task.state == "failed"
    assert task.exit_code == 3
    assert task.output is None
    assert [(a.attempt, a.outcome, a.exit_code) for a in task.attempts] == [(1, "failed", 3)]
    assert "failing" in (task.attempts[0].stderr_tail or "")


def test_await_a_task_cancelled_while_it_runs(conn):
    submitted = sked.submit(conn, ["sleep", "30"])
    deadline = time.monotonic() + AWAIT
    while (task := sked.get_task(conn, submitted.id)) and task.state != "running":
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.05)
    assert sked.cancel(conn, submitted.id) == "running"  # its worker stops it
    task = sked.await_task(conn, submitted.id, timeout=AWAIT)
    assert task.state == "cancelled"
    assert task.attempts[-1].outcome == "cancelled"


def test_await_a_task_cancelled_before_it_ran(conn):
    submitted = sked.submit(conn, ECHO_N1, delay=LATER)
    assert sked.cancel(conn, submitted.id) == "cancelled"
    task = sked.await_task(conn, submitted.id, timeout=0)
    assert task.state == "cancelled" and task.attempts == []
    assert sked.cancel(conn, submitted.id) == "cancelled"  # the final state it had


def test_await_timeout(conn):
    submitted = sked.submit(conn, ECHO_N1, delay=LATER)
    started = time.monotonic()
    with pytest.raises(sked.AwaitTimeout) as raised:
        sked.await_task(conn, submitted.id, timeout=0.3)
    assert 0.25 < time.monotonic() - started < 5
    assert raised.value.id == submitted.id and raised.value.state == "waiting"
    assert isinstance(raised.value, TimeoutError)
    assert listening(conn) == []  # UNLISTENed
    with pytest.raises(sked.AwaitTimeout):
        sked.await_task(conn, submitted.id, timeout=0)
    sked.cancel(conn, submitted.id)


def test_await_an_unknown_task_is_not_found(conn):
    with pytest.raises(sked.NotFoundError) as raised:
        sked.await_task(conn, uuid.uuid4(), timeout=1)
    assert raised.value.sqlstate == "P0002"
    assert raised.value.name == "no_data_found"
    assert listening(conn) == []


def test_await_needs_autocommit(txconn, conn):
    submitted = sked.submit(conn, ECHO_N1)
    with pytest.raises(sked.AutocommitRequired, match="autocommit"):
        sked.await_task(txconn, submitted.id, timeout=AWAIT)
    with conn.transaction():
        with pytest.raises(sked.AutocommitRequired, match="transaction"):
            sked.await_task(conn, submitted.id, timeout=AWAIT)
    assert sked.await_task(conn, submitted.id, timeout=AWAIT).state == "succeeded"


def test_await_after_retry_waits_for_the_new_run(conn):
    submitted = sked.submit(conn, SECOND_TIME_LUCKY, max_attempts=1)
    assert sked.await_task(conn, submitted.id, timeout=AWAIT).state == "failed"
    assert sked.retry(conn, submitted.id) == "waiting"
    task = sked.await_task(conn, submitted.id, timeout=AWAIT)
    assert task.state == "succeeded"
    assert task.output == {"attempt": 2}
    assert [(a.attempt, a.outcome) for a in task.attempts] == [(1, "failed"), (2, "succeeded")]
    assert sked.retry(conn, uuid.uuid4()) is None


# --- workflows -------------------------------------------------------------------------------


def test_await_a_workflow_that_succeeds(conn):
    workflow_id = sked.submit_workflow(
        conn,
        unique("wf-ok"),
        [
            WorkflowTask(name="a", command=ECHO_N1),
            # stdin: the parents' outputs, {"a": {"n": 1}}, which `cat` makes its own.
            WorkflowTask(name="b", command=["cat"], depends_on=["a"]),
            {"name": "c", "kind": "noop", "depends_on": ["a"], "trigger_rule": "one_failed"},
        ],
    )
    workflow = sked.await_workflow(conn, workflow_id, timeout=AWAIT)
    assert workflow.state == "succeeded"
    assert [(t.name, t.state) for t in workflow.tasks] == [
        ("a", "succeeded"),
        ("b", "succeeded"),
        ("c", "skipped"),
    ]
    a, b = workflow.task("a"), workflow.task("b")
    assert a is not None and b is not None
    assert b.output == {"a": {"n": 1}}
    assert {(e.task_id, e.depends_on) for e in workflow.edges} == {
        (b.id, a.id),
        (workflow.tasks[2].id, a.id),
    }
    assert a.attempts[0].outcome == "succeeded"
    assert listening(conn) == []


def test_await_a_workflow_that_fails_then_retry_it(conn):
    workflow_id = sked.submit_workflow(
        conn,
        unique("wf-fail"),
        [
            WorkflowTask(name="a", command=SECOND_TIME_LUCKY, max_attempts=1),
            WorkflowTask(name="b", command=ECHO_N1, depends_on=["a"]),
        ],
    )
    workflow = sked.await_workflow(conn, workflow_id, timeout=AWAIT)
    assert workflow.state == "failed"
    assert [(t.name, t.state) for t in workflow.tasks] == [
        ("a", "failed"),
        ("b", "upstream_failed"),
    ]
    assert sked.retry_workflow(conn, workflow_id) == 1
    workflow = sked.await_workflow(conn, workflow_id, timeout=AWAIT)
    assert workflow.state == "succeeded"
    assert [t.state for t in workflow.tasks] == ["succeeded", "succeeded"]


def test_cancel_a_workflow(conn):
    workflow_id = sked.submit_workflow(
        conn, unique("wf-cancel"), [WorkflowTask(name="later", command=ECHO_N1, delay=LATER)]
    )
    assert sked.cancel_workflow(conn, workflow_id) == "cancelled"
    workflow = sked.await_workflow(conn, workflow_id, timeout=0)
    assert workflow.state == "cancelled"
    assert workflow.tasks[0].state == "cancelled"
    assert sked.get_workflow(conn, uuid.uuid4()) is None
    assert sked.cancel_workflow(conn, uuid.uuid4()) is None


def test_a_broken_workflow_is_a_validation_error_naming_the_rule(conn):
    with pytest.raises(sked.ValidationError) as raised:
        sked.submit_workflow(
            conn,
            unique("wf-cycle"),
            [
                WorkflowTask(name="a", command=ECHO_N1, depends_on=["b"]),
                WorkflowTask(name="b", command=ECHO_N1, depends_on=["a"]),
            ],
        )
    assert raised.value.constraint == "workflows_tasks_must_not_form_a_cycle"


# --- reading ---------------------------------------------------------------------------------


def test_get_an_unknown_task_is_none(conn):
    assert sked.get_task(conn, uuid.uuid4()) is None
    assert sked.cancel(conn, uuid.uuid4()) is None


def test_logs_with_an_after_cursor(conn):
    submitted = sked.submit(
        conn, ["sh", "-c", "echo one; echo two >&2; sleep 0.4; echo three"], max_attempts=1
    )
    sked.await_task(conn, submitted.id, timeout=AWAIT)
    lines = sked.logs(conn, submitted.id)
    assert lines and all(line.task_id == submitted.id and line.attempt == 1 for line in lines)
    assert [line.id for line in lines] == sorted(line.id for line in lines)
    stdout = "".join(line.data for line in lines if line.stream == "stdout")
    stderr = "".join(line.data for line in lines if line.stream == "stderr")
    assert stdout == "one\nthree\n" and stderr == "two\n"
    assert sked.logs(conn, submitted.id, after=lines[-1].id) == []
    assert sked.logs(conn, submitted.id, after=lines[0].id) == lines[1:]
    assert sked.logs(conn, submitted.id, limit=1) == lines[:1]


def test_resubmit(conn):
    submitted = sked.submit(conn, ECHO_N1)
    sked.await_task(conn, submitted.id, timeout=AWAIT)
    again = sked.resubmit(conn, submitted.id)
    assert again is not None and again != submitted.id
    assert sked.await_task(conn, again, timeout=AWAIT).output == {"n": 1}


def test_as_a_submitter_role(conn):
    """A role of sked_submitter submits and awaits its own tasks and reads their attempts;
    it may not cancel (the API's)."""
    role = f"sked_client_test_{uuid.uuid4().hex[:16]}"
    conn.execute(sql.SQL("CREATE ROLE {} IN ROLE sked_submitter").format(sql.Identifier(role)))
    try:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        submitted = sked.submit(conn, ECHO_N1)
        task = sked.await_task(conn, submitted.id, timeout=AWAIT)
        assert (task.state, task.output, task.owner) == ("succeeded", {"n": 1}, role)
        assert task.attempts is not None and [a.outcome for a in task.attempts] == ["succeeded"]
        assert sked.get_task(conn, submitted.id, attempts=False).attempts is None
        assert [line.data for line in sked.logs(conn, submitted.id)] == ['{"n": 1}\n']
        with pytest.raises(sked.PermissionDeniedError):
            sked.cancel(conn, submitted.id)
    finally:
        conn.execute("RESET ROLE")
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# --- schedules -------------------------------------------------------------------------------


def test_a_schedule_created_listed_paused_run_and_deleted(conn):
    name = unique("schedule")
    schedule_id = sked.create_schedule(
        conn,
        name,
        NEVER,
        task=TaskSpec(kind="noop", timeout=timedelta(minutes=1)),
        time_zone="Europe/Berlin",
        jitter=0,
        misfire_grace=timedelta(minutes=2),
    )
    schedule = sked.get_schedule(conn, schedule_id)
    assert schedule is not None
    assert schedule.name == name and schedule.cron == NEVER and not schedule.paused
    assert schedule.time_zone == "Europe/Berlin"
    assert schedule.task == {"kind": "noop", "timeout": "60 seconds"}
    assert schedule.misfire_grace == timedelta(minutes=2)
    assert schedule.next_run_at is not None
    assert schedule_id in [s.id for s in sked.list_schedules(conn)]

    assert sked.pause_schedule(conn, schedule_id) is True
    paused = sked.get_schedule(conn, schedule_id)
    assert paused is not None and paused.paused
    assert sked.resume_schedule(conn, schedule_id) is True
    resumed = sked.get_schedule(conn, schedule_id)
    assert resumed is not None and not resumed.paused

    occurrence = sked.run_schedule_now(conn, schedule_id)
    assert occurrence is not None
    assert sked.await_task(conn, occurrence, timeout=AWAIT).state == "succeeded"
    runs = sked.schedule_runs(conn, schedule_id)
    assert [(r.outcome, r.task_id) for r in runs] == [("manual", occurrence)]

    with pytest.raises(sked.ConflictError) as raised:
        sked.create_schedule(conn, name, NEVER, task={"kind": "noop"})
    assert raised.value.constraint == "schedules_name_is_unique_per_owner"

    assert sked.delete_schedule(conn, schedule_id) is True
    assert sked.get_schedule(conn, schedule_id) is None
    assert sked.delete_schedule(conn, schedule_id) is False
    assert sked.pause_schedule(conn, schedule_id) is False
    assert sked.run_schedule_now(conn, schedule_id) is None


def test_a_paused_schedule_of_a_workflow(conn):
    schedule_id = sked.create_schedule(
        conn,
        unique("schedule-wf"),
        NEVER,
        workflow=sked.WorkflowSpec("nightly", [WorkflowTask(name="a", kind="noop")]),
        paused=True,
        overlap_policy="allow",
    )
    try:
        schedule = sked.get_schedule(conn, schedule_id)
        assert schedule is not None and schedule.paused and schedule.overlap_policy == "allow"
        assert schedule.workflow == {"name": "nightly", "tasks": [{"name": "a", "kind": "noop"}]}
    finally:
        sked.delete_schedule(conn, schedule_id)


def test_a_bad_cron_is_a_validation_error_naming_the_rule(conn):
    with pytest.raises(sked.ValidationError) as raised:
        sked.create_schedule(conn, unique("bad-cron"), "0 24 * * *", task={"kind": "noop"})
    assert raised.value.sqlstate == "23514"
    assert raised.value.constraint == "schedules_cron_must_be_valid"


# --- conversions -----------------------------------------------------------------------------


def test_specs_as_json():
    from sked.types import interval_text

    assert interval_text(timedelta(minutes=1, milliseconds=500)) == "60.500000 seconds"
    assert interval_text(-1.25) == "-1.250000 seconds"
    assert interval_text(3600) == "3600 seconds"
    assert interval_text("15 minutes") == "15 minutes"
    spec = WorkflowTask(name="b", command=("x",), depends_on=["a"], delay=2, fields={"shards": 3})
    assert spec.to_json() == {
        "command": ["x"],
        "delay": "2 seconds",
        "name": "b",
        "depends_on": ["a"],
        "shards": 3,
    }
    with pytest.raises(TypeError):
        TaskSpec(command="echo hello").to_json()  # type: ignore[arg-type]
