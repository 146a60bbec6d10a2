"""The async API (sked.aio) against a real database and worker (DATABASE_URL)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from conftest import ECHO_N1, EXIT_3, SECOND_TIME_LUCKY, database_url, unique

import sked
from sked import TaskSpec, WorkflowTask, aio

AWAIT = 30
NEVER = "0 0 1 1 *"
LATER = timedelta(hours=1)


async def listening(aconn: psycopg.AsyncConnection) -> list:
    cur = await aconn.execute("SELECT pg_listening_channels()")
    return [r[0] for r in await cur.fetchall()]


async def test_submit_in_a_rolled_back_transaction_leaves_no_task(atxconn, aconn):
    submitted = await aio.submit(atxconn, ECHO_N1)
    assert await aio.get_task(atxconn, submitted.id) is not None
    await atxconn.rollback()
    assert await aio.get_task(aconn, submitted.id) is None


async def test_submit_in_a_committed_transaction_runs(atxconn, aconn):
    async with atxconn.transaction():
        submitted = await aio.submit(atxconn, ECHO_N1)
        assert await aio.get_task(aconn, submitted.id) is None
    task = await aio.await_task(aconn, submitted.id, timeout=AWAIT)
    assert (task.state, task.output) == ("succeeded", {"n": 1})


async def test_submit_many(aconn):
    submitted = await aio.submit_many(
        aconn, [TaskSpec(command=ECHO_N1), {"kind": "noop"}], owner="postgres"
    )
    assert len(submitted) == 2 and all(s.created for s in submitted)
    tasks = [await aio.await_task(aconn, s.id, timeout=AWAIT) for s in submitted]
    assert [t.state for t in tasks] == ["succeeded", "succeeded"]
    assert tasks[0].output == {"n": 1}


# Idempotency keys (docs/sql.md): sked.tasks_submit answers a key with the task it names
# (`created` false) and refuses another definition (unique_violation,
# `tasks_idempotency_key_names_another_definition`).


async def test_idempotent_submit_created_then_not_across_completion(aconn):
    key = unique("aidem")
    first = await aio.submit(aconn, ECHO_N1, idempotency_key=key)
    assert first.created is True
    assert await aio.submit(aconn, ECHO_N1, idempotency_key=key) == sked.Submitted(first.id, False)
    await aio.await_task(aconn, first.id, timeout=AWAIT)
    assert await aio.submit(aconn, ECHO_N1, idempotency_key=key) == sked.Submitted(first.id, False)
    with pytest.raises(sked.ConflictError) as raised:
        await aio.submit(aconn, EXIT_3, idempotency_key=key)
    assert raised.value.sqlstate == "23505"
    assert raised.value.constraint == "tasks_idempotency_key_names_another_definition"


async def test_validation_error_names_the_rule(aconn):
    with pytest.raises(sked.ValidationError) as raised:
        await aio.submit(aconn, [])
    assert raised.value.sqlstate == "23514"
    assert raised.value.constraint == "tasks_command_must_not_be_empty"


async def test_await_success_and_failure_at_once(aconn):
    other = await psycopg.AsyncConnection.connect(database_url(), autocommit=True)
    try:
        ok = await aio.submit(aconn, ECHO_N1)
        bad = await aio.submit(aconn, EXIT_3, max_attempts=1)
        done, failed = await asyncio.gather(
            aio.await_task(aconn, ok.id, timeout=AWAIT),
            aio.await_task(other, bad.id, timeout=AWAIT),
        )
    finally:
        await other.close()
    assert (done.state, done.output, done.exit_code) == ("succeeded", {"n": 1}, 0)
    assert [(a.attempt, a.outcome) for a in done.attempts] == [(1, "succeeded")]
    assert (failed.state, failed.exit_code) == ("failed", 3)
    assert [(a.outcome, a.exit_code) for a in failed.attempts] == [("failed", 3)]
    assert await listening(aconn) == []


async def test_await_a_cancelled_task(aconn):
    submitted = await aio.submit(aconn, ["sleep", "30"])
    waiter = asyncio.ensure_future(aio.await_task(aconn, submitted.id, timeout=AWAIT))
    canceller = await psycopg.AsyncConnection.connect(database_url(), autocommit=True)
    try:
        deadline = time.monotonic() + AWAIT
        while (task := await aio.get_task(canceller, submitted.id)) and task.state != "running":
            assert time.monotonic() < deadline, "the task never started"
            await asyncio.sleep(0.05)
        assert await aio.cancel(canceller, submitted.id) == "running"
    finally:
        await canceller.close()
    task = await waiter
    assert task.state == "cancelled"
    assert task.attempts[-1].outcome == "cancelled"


async def test_await_timeout(aconn):
    submitted = await aio.submit(aconn, ECHO_N1, delay=LATER)
    with pytest.raises(sked.AwaitTimeout) as raised:
        await aio.await_task(aconn, submitted.id, timeout=timedelta(milliseconds=300))
    assert raised.value.state == "waiting"
    assert await listening(aconn) == []
    assert await aio.cancel(aconn, submitted.id) == "cancelled"


async def test_await_cancelled_by_the_caller_unlistens(aconn):
    submitted = await aio.submit(aconn, ECHO_N1, delay=LATER)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(aio.await_task(aconn, submitted.id), timeout=0.3)
    assert await listening(aconn) == []
    await aio.cancel(aconn, submitted.id)


async def test_await_needs_autocommit(atxconn):
    with pytest.raises(sked.AutocommitRequired):
        await aio.await_task(atxconn, uuid.uuid4(), timeout=1)


async def test_await_an_unknown_task_is_not_found(aconn):
    with pytest.raises(sked.NotFoundError) as raised:
        await aio.await_workflow(aconn, uuid.uuid4(), timeout=1)
    assert raised.value.sqlstate == "P0002"


async def test_retry_and_logs(aconn):
    submitted = await aio.submit(aconn, SECOND_TIME_LUCKY, max_attempts=1)
    assert (await aio.await_task(aconn, submitted.id, timeout=AWAIT)).state == "failed"
    assert await aio.retry(aconn, submitted.id) == "waiting"
    task = await aio.await_task(aconn, submitted.id, timeout=AWAIT)
    assert (task.state, task.output) == ("succeeded", {"attempt": 2})
    assert [a.outcome for a in task.attempts] == ["failed", "succeeded"]
    lines = await aio.logs(aconn, submitted.id)
    assert [(line.attempt, line.stream, line.data) for line in lines] == [
        (2, "stdout", '{"attempt": 2}\n')
    ]
    assert await aio.logs(aconn, submitted.id, after=lines[-1].id) == []


async def test_workflows(aconn):
    ok = await aio.submit_workflow(
        aconn,
        unique("awf-ok"),
        [
            WorkflowTask(name="a", command=ECHO_N1),
            WorkflowTask(name="b", command=["cat"], depends_on=["a"]),
        ],
    )
    failing = await aio.submit_workflow(
        aconn,
        unique("awf-fail"),
        [
            WorkflowTask(name="a", command=EXIT_3, max_attempts=1),
            WorkflowTask(name="b", command=ECHO_N1, depends_on=["a"]),
        ],
    )
    workflow = await aio.await_workflow(aconn, ok, timeout=AWAIT)
    assert workflow.state == "succeeded"
    b = workflow.task("b")
    assert b is not None and b.output == {"a": {"n": 1}}
    workflow = await aio.await_workflow(aconn, failing, timeout=AWAIT)
    assert workflow.state == "failed"
    assert [t.state for t in workflow.tasks] == ["failed", "upstream_failed"]
    fetched = await aio.get_workflow(aconn, failing)
    assert fetched is not None and fetched.state == "failed" and len(fetched.edges) == 1


async def test_schedules(aconn):
    name = unique("aschedule")
    schedule_id = await aio.create_schedule(aconn, name, NEVER, task={"kind": "noop"})
    assert schedule_id in [s.id for s in await aio.list_schedules(aconn)]
    assert await aio.pause_schedule(aconn, schedule_id) is True
    schedule = await aio.get_schedule(aconn, schedule_id)
    assert schedule is not None and schedule.paused and schedule.name == name
    assert await aio.delete_schedule(aconn, schedule_id) is True
    assert await aio.get_schedule(aconn, schedule_id) is None
