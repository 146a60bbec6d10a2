"""What the client takes (task and workflow specifications) and returns (rows as dataclasses).

Results map the columns of the documented tables and views by name; columns this version does
not know land in ``extra``, so a newer schema never breaks reading.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union
from uuid import UUID

__all__ = [
    "Interval",
    "Submitted",
    "Attempt",
    "Task",
    "Edge",
    "Workflow",
    "LogLine",
    "Schedule",
    "ScheduleRun",
    "TaskSpec",
    "WorkflowTask",
    "WorkflowSpec",
    "interval_text",
    "to_timedelta",
]

#: A duration: a :class:`~datetime.timedelta`, a number of seconds, or PostgreSQL interval
#: text such as ``"15 minutes"`` (passed as it is).
Interval = Union[timedelta, int, float, str]


def to_timedelta(value: Union[timedelta, int, float]) -> timedelta:
    """A duration given as a timedelta or a number of seconds, as a timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a duration is a timedelta or a number of seconds, not {value!r}")
    return timedelta(seconds=value)


def interval_text(value: Interval) -> str:
    """The PostgreSQL interval text of a duration, as the JSON of a task carries it.

    A timedelta or a number of seconds becomes exact seconds (``"90.5 seconds"``, to the
    microsecond, the precision of both); text is passed as it is (``"15 minutes"``).
    """
    if isinstance(value, str):
        return value
    micros = to_timedelta(value) // timedelta(microseconds=1)
    sign = "-" if micros < 0 else ""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    if fraction:
        return f"{sign}{seconds}.{fraction:06d} seconds"
    return f"{sign}{seconds} seconds"


def json_default(value: Any) -> Any:
    """JSON for the Python values a task's JSON may hold besides JSON's own."""
    if isinstance(value, timedelta):
        return interval_text(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, (TaskSpec, WorkflowSpec)):
        return value.to_json()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def json_dumps(value: Any) -> str:
    return json.dumps(value, default=json_default)


# ---------------------------------------------------------------------------------------------
# What the client takes
# ---------------------------------------------------------------------------------------------

_INTERVAL_FIELDS = frozenset({"delay", "timeout", "backoff_base", "backoff_max"})
_LIST_FIELDS = frozenset({"command", "args", "labels", "depends_on"})


@dataclass
class TaskSpec:
    """A task to submit: the fields of ``sked.task_fields()``.

    A field left ``None`` takes the table's default. ``run_at`` and ``delay`` add up (the task
    is due at ``coalesce(run_at, now()) + delay``). Durations (``delay``, ``timeout``,
    ``backoff_base``, ``backoff_max``) are timedeltas, numbers of seconds or interval text.
    Any other field (``artifact_url``, ``output_path``, ``shards``, ``cpu_millis``,
    ``preemptible``, …) goes in ``fields``, by its name, as JSON.
    """

    command: Optional[Sequence[str]] = None
    args: Optional[Sequence[str]] = None
    queue: Optional[str] = None
    priority: Optional[int] = None
    input: Any = None
    env: Optional[Mapping[str, str]] = None
    run_at: Optional[datetime] = None
    delay: Optional[Interval] = None
    max_attempts: Optional[int] = None
    timeout: Optional[Interval] = None
    idempotency_key: Optional[str] = None
    labels: Optional[Sequence[str]] = None
    owner: Optional[str] = None
    kind: Optional[str] = None
    backoff_base: Optional[Interval] = None
    backoff_max: Optional[Interval] = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        """The task as a JSON object of ``sked.tasks_submit`` (fields left None omitted)."""
        out: Dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "fields":
                continue
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name in _INTERVAL_FIELDS:
                value = interval_text(value)
            elif isinstance(value, str) and f.name in _LIST_FIELDS:
                raise TypeError(f"{f.name} is a sequence of strings, not the string {value!r}")
            elif isinstance(value, (list, tuple)):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        for name, value in self.fields.items():
            if value is not None:
                out[name] = interval_text(value) if name in _INTERVAL_FIELDS else value
        return out


@dataclass
class WorkflowTask(TaskSpec):
    """A task of a workflow: a :class:`TaskSpec` with its ``name`` (unique in the workflow),
    the names it ``depends_on`` and its ``trigger_rule`` (``all_success`` by default,
    ``all_done``, ``one_failed`` alias ``on_failure``). Give them by keyword."""

    name: Optional[str] = None
    depends_on: Sequence[str] = ()
    trigger_rule: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        out = super().to_json()
        if self.depends_on:
            out["depends_on"] = list(self.depends_on)
        elif "depends_on" in out:
            del out["depends_on"]
        return out


TaskLike = Union[TaskSpec, Mapping[str, Any]]


@dataclass
class WorkflowSpec:
    """A workflow to submit (or a schedule's workflow template): its name and its tasks."""

    name: str
    tasks: Sequence[Union[WorkflowTask, Mapping[str, Any]]]

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "tasks": [task_json(t) for t in self.tasks]}


def task_json(task: TaskLike) -> Dict[str, Any]:
    """A task given as a spec or as a mapping of fields, as a JSON object."""
    if isinstance(task, TaskSpec):
        return task.to_json()
    return {
        k: (interval_text(v) if k in _INTERVAL_FIELDS and v is not None else v)
        for k, v in task.items()
    }


def workflow_json(workflow: Union[WorkflowSpec, Mapping[str, Any]]) -> Dict[str, Any]:
    if isinstance(workflow, WorkflowSpec):
        return workflow.to_json()
    out = dict(workflow)
    if isinstance(out.get("tasks"), (list, tuple)):
        out["tasks"] = [task_json(t) for t in out["tasks"]]
    return out


# ---------------------------------------------------------------------------------------------
# What the client returns
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    """A submitted task: its id, and whether this submission created it (false when its
    idempotency key named a task that already exists with the same definition, whose id it
    is)."""

    id: UUID
    created: bool


@dataclass(frozen=True)
class Attempt:
    """An attempt of a task (a row of ``sked.task_attempt_history``)."""

    task_id: UUID
    attempt: int
    outcome: str
    worker_id: Optional[UUID] = None
    started_at: Optional[datetime] = None
    finished_at: Optional[datetime] = None
    exit_code: Optional[int] = None
    error: Optional[str] = None
    stdout_tail: Optional[str] = None
    stderr_tail: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """A row of ``sked.tasks`` with its attempts (``sked.task_attempt_history``, oldest
    first), or None for ``attempts`` when they were not read (``attempts=False``).

    ``output`` is the JSON output of its last successful attempt; ``state`` one of
    ``blocked``, ``waiting``, ``running``, ``retry``, ``succeeded``, ``failed``,
    ``cancelled``, ``upstream_failed``, ``skipped``."""

    id: UUID
    state: str
    owner: Optional[str] = None
    queue: Optional[str] = None
    priority: Optional[int] = None
    kind: Optional[str] = None
    command: Optional[List[str]] = None
    args: Optional[List[str]] = None
    artifact_url: Optional[str] = None
    artifact_sha256: Optional[str] = None
    input: Any = None
    env: Optional[Dict[str, str]] = None
    labels: Optional[List[str]] = None
    output_path: Optional[str] = None
    timeout: Optional[timedelta] = None
    max_attempts: Optional[int] = None
    backoff_base: Optional[timedelta] = None
    backoff_max: Optional[timedelta] = None
    idempotency_key: Optional[str] = None
    attempt: Optional[int] = None
    next_run_at: Optional[datetime] = None
    worker_id: Optional[UUID] = None
    cancel_requested_at: Optional[datetime] = None
    created_at: Optional[datetime] = None
    started_at: Optional[datetime] = None
    finished_at: Optional[datetime] = None
    exit_code: Optional[int] = None
    error: Optional[str] = None
    stdout_tail: Optional[str] = None
    stderr_tail: Optional[str] = None
    output: Any = None
    output_sha256: Optional[str] = None
    workflow_id: Optional[UUID] = None
    name: Optional[str] = None
    trigger_rule: Optional[str] = None
    parents: Optional[int] = None
    children: Optional[int] = None
    parents_pending: Optional[int] = None
    shard_total: Optional[int] = None
    shard_index: Optional[int] = None
    shard_of: Optional[UUID] = None
    broadcast: Optional[bool] = None
    pinned_worker: Optional[UUID] = None
    cpu_millis: Optional[int] = None
    memory_mb: Optional[int] = None
    max_output_bytes: Optional[int] = None
    run_as: Optional[str] = None
    replicas: Optional[int] = None
    restart_policy: Optional[str] = None
    health_check: Any = None
    preemptible: Optional[bool] = None
    attempts: Optional[List[Attempt]] = None
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Edge:
    """A dependency (a row of ``sked.task_edges``): ``task_id`` runs after ``depends_on``."""

    task_id: UUID
    depends_on: UUID


@dataclass(frozen=True)
class Workflow:
    """A row of ``sked.workflows`` (``state``: ``running``, ``succeeded``, ``failed``,
    ``cancelled``) with its tasks in submission order and their edges."""

    id: UUID
    state: str
    name: Optional[str] = None
    owner: Optional[str] = None
    created_at: Optional[datetime] = None
    finished_at: Optional[datetime] = None
    tasks: List[Task] = field(default_factory=list)
    edges: List[Edge] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)

    def task(self, name: str) -> Optional[Task]:
        """The task of this name, or None."""
        return next((t for t in self.tasks if t.name == name and t.shard_of is None), None)


@dataclass(frozen=True)
class LogLine:
    """A chunk of a task's stdout or stderr (a row of ``sked.task_logs``); ``id`` increases."""

    id: int
    task_id: UUID
    attempt: int
    stream: str
    at: datetime
    data: str
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Schedule:
    """A row of ``sked.schedules``: a cron schedule of a task or workflow template."""

    id: UUID
    name: str
    cron: str
    owner: Optional[str] = None
    time_zone: Optional[str] = None
    task: Optional[Dict[str, Any]] = None
    workflow: Optional[Dict[str, Any]] = None
    misfire_policy: Optional[str] = None
    misfire_grace: Optional[timedelta] = None
    catch_up_limit: Optional[int] = None
    overlap_policy: Optional[str] = None
    jitter: Optional[timedelta] = None
    history_limit: Optional[int] = None
    paused_at: Optional[datetime] = None
    next_run_at: Optional[datetime] = None
    last_fire_at: Optional[datetime] = None
    last_task_id: Optional[UUID] = None
    last_workflow_id: Optional[UUID] = None
    queued_fire_at: Optional[datetime] = None
    created_at: Optional[datetime] = None
    updated_at: Optional[datetime] = None
    last_tick_at: Optional[datetime] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


@dataclass(frozen=True)
class ScheduleRun:
    """A row of ``sked.schedule_runs``: one tick (``fired``, ``queued``, ``skipped``,
    ``missed``) or a manual run (``manual``)."""

    id: int
    schedule_id: UUID
    fire_at: datetime
    outcome: str
    task_id: Optional[UUID] = None
    workflow_id: Optional[UUID] = None
    missed_ticks: Optional[int] = None
    detail: Optional[str] = None
    recorded_at: Optional[datetime] = None
    extra: Dict[str, Any] = field(default_factory=dict)
