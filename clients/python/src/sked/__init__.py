"""sked: a typed client of sked's SQL contract (docs/sql.md) on psycopg 3.

The functions here take a ``psycopg.Connection``; ``sked.aio`` has the same functions as
coroutines on a ``psycopg.AsyncConnection``. Each is one documented SQL function call or query
on a documented table or view; the client maps types and errors only::

    import psycopg, sked

    with psycopg.connect(url, autocommit=True) as conn:
        submitted = sked.submit(conn, ["sh", "-c", "echo 42"])
        task = sked.await_task(conn, submitted.id, timeout=60)
        assert (task.state, task.output) == ("succeeded", 42)
"""

from . import aio
from ._sync import (
    await_task,
    await_workflow,
    cancel,
    cancel_workflow,
    create_schedule,
    delete_schedule,
    get_schedule,
    get_task,
    get_workflow,
    list_schedules,
    logs,
    pause_schedule,
    resubmit,
    resume_schedule,
    retry,
    retry_workflow,
    run_schedule_now,
    schedule_runs,
    submit,
    submit_many,
    submit_workflow,
)
from .errors import (
    AutocommitRequired,
    AwaitTimeout,
    ConflictError,
    DatabaseError,
    NotFoundError,
    PermissionDeniedError,
    SkedError,
    ValidationError,
)
from .types import (
    Attempt,
    Edge,
    Interval,
    LogLine,
    Schedule,
    ScheduleRun,
    Submitted,
    Task,
    TaskSpec,
    Workflow,
    WorkflowSpec,
    WorkflowTask,
)

__version__ = "0.1.0"

__all__ = [
    "aio",
    # operations
    "submit",
    "submit_many",
    "submit_workflow",
    "get_task",
    "get_workflow",
    "logs",
    "cancel",
    "retry",
    "resubmit",
    "cancel_workflow",
    "retry_workflow",
    "await_task",
    "await_workflow",
    "create_schedule",
    "get_schedule",
    "list_schedules",
    "schedule_runs",
    "pause_schedule",
    "resume_schedule",
    "run_schedule_now",
    "delete_schedule",
    # types
    "Interval",
    "TaskSpec",
    "WorkflowTask",
    "WorkflowSpec",
    "Submitted",
    "Task",
    "Attempt",
    "Workflow",
    "Edge",
    "LogLine",
    "Schedule",
    "ScheduleRun",
    # errors
    "SkedError",
    "DatabaseError",
    "ValidationError",
    "ConflictError",
    "NotFoundError",
    "PermissionDeniedError",
    "AwaitTimeout",
    "AutocommitRequired",
]
