"""The API on a ``psycopg.Connection`` (re-exported by ``sked``; ``sked.aio`` is the same on a
``psycopg.AsyncConnection``).

Every function takes the connection to use and runs on it as it is: inside the caller's
transaction when one is open (a submission then commits or rolls back with it), in autocommit
otherwise. Awaiting is the exception: it needs a connection in autocommit mode, outside a
transaction (see :func:`await_task`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Union
from uuid import UUID

import psycopg

from . import _ops
from ._driver import run
from ._ops import Id
from .types import (
    Interval,
    LogLine,
    Schedule,
    ScheduleRun,
    Submitted,
    Task,
    TaskLike,
    TaskSpec,
    Workflow,
    WorkflowSpec,
    WorkflowTask,
)

Connection = psycopg.Connection[Any]


def submit(
    conn: Connection,
    command: Optional[Sequence[str]] = None,
    *,
    args: Optional[Sequence[str]] = None,
    queue: Optional[str] = None,
    priority: Optional[int] = None,
    input: Any = None,
    env: Optional[Mapping[str, str]] = None,
    run_at: Optional[datetime] = None,
    delay: Optional[Interval] = None,
    max_attempts: Optional[int] = None,
    timeout: Optional[Interval] = None,
    idempotency_key: Optional[str] = None,
    labels: Optional[Sequence[str]] = None,
    owner: Optional[str] = None,
    kind: Optional[str] = None,
    backoff_base: Optional[Interval] = None,
    backoff_max: Optional[Interval] = None,
    **fields: Any,
) -> Submitted:
    """Submit one task (``sked.tasks_submit``); returns its id and whether it was created.

    Arguments left None take the table's defaults; ``fields`` passes any other field of
    ``sked.task_fields()`` by name (``output_path=…``, ``shards=…``, ``cpu_millis=…``).
    An ``idempotency_key`` names the first task of the owner submitted with it, in every
    state, for as long as it is kept: submitting the key again with the same definition (the
    fields but ``owner``, the key, ``run_at`` and ``delay``) inserts nothing and answers with
    that task's id and ``created`` false; with another definition it raises
    :class:`~sked.errors.ConflictError` (``tasks_idempotency_key_names_another_definition``).
    """
    spec = TaskSpec(
        command=command, args=args, queue=queue, priority=priority, input=input, env=env,
        run_at=run_at, delay=delay, max_attempts=max_attempts, timeout=timeout,
        idempotency_key=idempotency_key, labels=labels, owner=owner, kind=kind,
        backoff_base=backoff_base, backoff_max=backoff_max, fields=fields,
    )  # fmt: skip
    return run(conn, _ops.submit_one(spec, None))


def submit_many(
    conn: Connection, tasks: Iterable[TaskLike], *, owner: Optional[str] = None
) -> List[Submitted]:
    """Submit many tasks in one statement, all or nothing (``sked.tasks_submit``).

    Each task is a :class:`~sked.TaskSpec` or a mapping of fields; ``owner`` is the owner of
    those that name none (default: the current user). Results are in input order; objects
    with one idempotency key are one task (see :func:`submit`)."""
    return run(conn, _ops.submit_many(tasks, owner))


def submit_workflow(
    conn: Connection,
    name: str,
    tasks: Iterable[Union[WorkflowTask, Mapping[str, Any]]],
    *,
    owner: Optional[str] = None,
) -> UUID:
    """Submit a workflow (``sked.workflow_submit``): tasks with ``name``, ``depends_on`` and
    ``trigger_rule``, all or nothing. Returns the workflow's id."""
    return run(conn, _ops.submit_workflow(WorkflowSpec(name, list(tasks)), owner))


def get_task(conn: Connection, id: Id, *, attempts: bool = True) -> Optional[Task]:
    """The task (a row of ``sked.tasks``) with its attempts, or None when there is none.

    ``attempts=False`` leaves ``attempts`` unread (None), one query fewer. (On PostgreSQL
    before 15 the role ``sked_submitter`` may not read the view ``sked.task_attempt_history``.)
    """
    return run(conn, _ops.get_task(id, attempts))


def get_workflow(conn: Connection, id: Id, *, attempts: bool = True) -> Optional[Workflow]:
    """The workflow with its tasks (in submission order, with their attempts) and edges, or
    None when there is none.

    ``attempts=False`` leaves ``attempts`` unread (None), one query fewer. (On PostgreSQL
    before 15 the role ``sked_submitter`` may not read the view ``sked.task_attempt_history``.)
    """
    return run(conn, _ops.get_workflow(id, attempts))


def logs(conn: Connection, task_id: Id, *, after: int = 0, limit: int = 1000) -> List[LogLine]:
    """The task's stdout and stderr chunks (``sked.task_logs``) whose id is after ``after``,
    oldest first, at most ``limit``: pass the last id seen to read on."""
    return run(conn, _ops.logs(task_id, after, limit))


def cancel(conn: Connection, id: Id) -> Optional[str]:
    """Cancel a task (``sked.task_cancel``): the state after the call (``cancelled``;
    ``running`` while its worker stops it; or the final state it had), None when absent."""
    return run(conn, _ops.cancel(id))


def retry(conn: Connection, id: Id) -> Optional[str]:
    """Run a finished task again (``sked.task_retry``): ``waiting`` (``blocked`` in a DAG
    whose parents are unfinished), the unchanged state of an unfinished task, None when
    absent."""
    return run(conn, _ops.retry(id))


def resubmit(conn: Connection, id: Id, *, owner: Optional[str] = None) -> Optional[UUID]:
    """Submit a new task with the definition of task ``id`` (``sked.task_resubmit``); its id,
    or None when there is no such task."""
    return run(conn, _ops.resubmit(id, owner))


def cancel_workflow(conn: Connection, id: Id) -> Optional[str]:
    """Cancel a workflow (``sked.workflow_cancel``): its state after the call, None when
    absent."""
    return run(conn, _ops.cancel_workflow(id))


def retry_workflow(conn: Connection, id: Id) -> Optional[int]:
    """Re-run a workflow's failed and cancelled tasks (``sked.workflow_retry``): how many run
    again (0: nothing to re-run), None when absent."""
    return run(conn, _ops.retry_workflow(id))


def await_task(
    conn: Connection,
    id: Id,
    *,
    timeout: Optional[Union[timedelta, float]] = None,
    attempts: bool = True,
) -> Task:
    """Wait until the task is finished and return it, with its output and attempts.

    ``sked.task_await`` registers the wait and LISTENs, then the wait is for the notification
    on the task's channel; nothing is held open meanwhile. The connection must be in
    autocommit mode and outside a transaction
    (:class:`~sked.errors.AutocommitRequired` otherwise); use one without notification
    handlers, and know that awaiting consumes its other pending notifications.

    ``timeout`` (a timedelta or seconds; None: no limit) raises
    :class:`~sked.errors.AwaitTimeout`; 0 checks once. A task that does not exist (or that
    the caller may not read) raises :class:`~sked.errors.NotFoundError`. ``attempts`` as for
    :func:`get_task`.
    """
    return run(conn, _ops.await_task(id, timeout, attempts))


def await_workflow(
    conn: Connection,
    id: Id,
    *,
    timeout: Optional[Union[timedelta, float]] = None,
    attempts: bool = True,
) -> Workflow:
    """Wait until the workflow is finished and return it with its tasks (see
    :func:`await_task`)."""
    return run(conn, _ops.await_workflow(id, timeout, attempts))


def create_schedule(
    conn: Connection,
    name: str,
    cron: str,
    *,
    task: Optional[TaskLike] = None,
    workflow: Optional[Union[WorkflowSpec, Mapping[str, Any]]] = None,
    time_zone: Optional[str] = None,
    misfire_policy: Optional[str] = None,
    misfire_grace: Optional[Interval] = None,
    catch_up_limit: Optional[int] = None,
    overlap_policy: Optional[str] = None,
    jitter: Optional[Interval] = None,
    history_limit: Optional[int] = None,
    paused: Optional[bool] = None,
    owner: Optional[str] = None,
) -> UUID:
    """Create a cron schedule of a task or a workflow template (``sked.schedule_create``);
    returns its id. Arguments left None keep the function's defaults."""
    return run(
        conn,
        _ops.create_schedule(
            dict(
                name=name,
                cron=cron,
                task=task,
                workflow=workflow,
                time_zone=time_zone,
                misfire_policy=misfire_policy,
                misfire_grace=misfire_grace,
                catch_up_limit=catch_up_limit,
                overlap_policy=overlap_policy,
                jitter=jitter,
                history_limit=history_limit,
                paused=paused,
                owner=owner,
            )
        ),
    )


def get_schedule(conn: Connection, id: Id) -> Optional[Schedule]:
    """The schedule (a row of ``sked.schedules``), or None."""
    return run(conn, _ops.get_schedule(id))


def list_schedules(conn: Connection) -> List[Schedule]:
    """Every schedule the connection's role may read, by name."""
    return run(conn, _ops.list_schedules())


def schedule_runs(conn: Connection, id: Id, *, limit: int = 50) -> List[ScheduleRun]:
    """The schedule's latest runs (``sked.schedule_runs``), newest first."""
    return run(conn, _ops.schedule_runs(id, limit))


def pause_schedule(conn: Connection, id: Id) -> bool:
    """Pause a schedule (``sked.schedule_pause``); False when there is no such schedule."""
    return run(conn, _ops.pause_schedule(id))


def resume_schedule(conn: Connection, id: Id) -> bool:
    """Resume a schedule at its next future tick (``sked.schedule_resume``); False when there
    is no such schedule."""
    return run(conn, _ops.resume_schedule(id))


def run_schedule_now(conn: Connection, id: Id) -> Optional[UUID]:
    """An occurrence now, recorded as a manual run (``sked.schedule_run_now``): the id of the
    task or workflow it submitted, None when there is no such schedule."""
    return run(conn, _ops.run_schedule_now(id))


def delete_schedule(conn: Connection, id: Id) -> bool:
    """Delete a schedule and its runs (its occurrences stay); False when there was none."""
    return run(conn, _ops.delete_schedule(id))
