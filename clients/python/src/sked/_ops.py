"""Every operation of the client, written once for the sync and the async API.

An operation is a generator that yields steps — a statement to run (:class:`Query`), a wait
for a notification (:class:`Wait`), a check that the connection may await
(:class:`RequireIdle`) — and receives each step's result; its return value is the
operation's result. ``sked._sync`` runs operations on a ``psycopg.Connection``, ``sked.aio``
on a ``psycopg.AsyncConnection``: the two differ only in awaiting. Each SQL statement of the
client is written once, below.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import (
    Any,
    Dict,
    FrozenSet,
    Generator,
    Iterable,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Sequence,
    Type,
    TypeVar,
    Union,
    cast,
)
from uuid import UUID

from psycopg import sql
from psycopg.types.json import Jsonb

from .errors import AwaitTimeout, NotFoundError
from .types import (
    Attempt,
    Edge,
    Interval,
    LogLine,
    Schedule,
    ScheduleRun,
    Submitted,
    Task,
    TaskLike,
    Workflow,
    WorkflowSpec,
    json_dumps,
    task_json,
    to_timedelta,
    workflow_json,
)

T = TypeVar("T")
Row = Dict[str, Any]
QueryText = Union[str, bytes, sql.SQL, sql.Composed]
Id = Union[UUID, str]


class Query(NamedTuple):
    """Run a statement; the result is its rows as dicts (none for a statement without)."""

    text: QueryText
    params: Optional[Union[Sequence[Any], Mapping[str, Any]]] = None


class Wait(NamedTuple):
    """Wait up to ``seconds`` for notifications; the result is whether one came on
    ``channel``."""

    channel: str
    seconds: float


class RequireIdle(NamedTuple):
    """Raise :class:`~sked.errors.AutocommitRequired` unless the connection is in autocommit
    mode and outside a transaction."""


Step = Union[Query, Wait, RequireIdle]
Op = Generator[Step, Any, T]

# ---------------------------------------------------------------------------------------------
# The statements
# ---------------------------------------------------------------------------------------------

SUBMIT = "SELECT id, created FROM sked.tasks_submit(%s, coalesce(%s::text, current_user))"
WORKFLOW_SUBMIT = "SELECT sked.workflow_submit(%s, coalesce(%s::text, current_user)) AS id"

TASK = "SELECT * FROM sked.tasks WHERE id = %s"
ATTEMPTS = (
    "SELECT * FROM sked.task_attempt_history WHERE task_id = ANY(%s) ORDER BY task_id, attempt"
)
WORKFLOW = "SELECT * FROM sked.workflows WHERE id = %s"
WORKFLOW_TASKS = "SELECT * FROM sked.tasks WHERE workflow_id = %s ORDER BY id"
EDGES = (
    "SELECT task_id, depends_on FROM sked.task_edges WHERE task_id = ANY(%s)"
    " ORDER BY task_id, depends_on"
)
LOGS = "SELECT * FROM sked.task_logs WHERE task_id = %s AND id > %s ORDER BY id LIMIT %s"

TASK_CANCEL = "SELECT sked.task_cancel(%s) AS state"
TASK_RETRY = "SELECT sked.task_retry(%s) AS state"
TASK_RESUBMIT = "SELECT sked.task_resubmit(%s, coalesce(%s::text, current_user)) AS id"
WORKFLOW_CANCEL = "SELECT sked.workflow_cancel(%s) AS state"
WORKFLOW_RETRY = "SELECT sked.workflow_retry(%s) AS tasks"

TASK_AWAIT = (
    "SELECT a.state, a.finished, sked.task_channel(%(id)s) AS channel"
    " FROM sked.task_await(%(id)s, true, %(for)s) a"
)
WORKFLOW_AWAIT = (
    "SELECT a.state, a.finished, sked.workflow_channel(%(id)s) AS channel"
    " FROM sked.workflow_await(%(id)s, true, %(for)s) a"
)
UNLISTEN = "UNLISTEN {}"

SCHEDULE_COLUMNS = (
    "id, owner, name, cron, time_zone, task, workflow, misfire_policy, misfire_grace,"
    " catch_up_limit, overlap_policy, jitter, history_limit, paused_at, next_run_at,"
    " last_fire_at, last_task_id, last_workflow_id, queued_fire_at, created_at, updated_at,"
    " last_tick_at"
)
SCHEDULE = "SELECT " + SCHEDULE_COLUMNS + " FROM sked.schedules WHERE id = %s"
SCHEDULES = "SELECT " + SCHEDULE_COLUMNS + " FROM sked.schedules ORDER BY name, id"
SCHEDULE_RUNS = (
    "SELECT * FROM sked.schedule_runs WHERE schedule_id = %s"
    " ORDER BY fire_at DESC, id DESC LIMIT %s"
)
SCHEDULE_CREATE = "SELECT sked.schedule_create({}) AS id"
SCHEDULE_PAUSE = "SELECT sked.schedule_pause(%s) AS found"
SCHEDULE_RESUME = "SELECT sked.schedule_resume(%s) AS found"
SCHEDULE_RUN_NOW = "SELECT sked.schedule_run_now(%s) AS id"
SCHEDULE_DELETE = "DELETE FROM sked.schedules WHERE id = %s RETURNING id"

#: The arguments of sked.schedule_create and their types, in its order (p_now is left to the
#: database). Only the arguments given are named in the call: the others keep their defaults.
SCHEDULE_CREATE_ARGS = (
    ("name", "text"),
    ("cron", "text"),
    ("task", "jsonb"),
    ("workflow", "jsonb"),
    ("time_zone", "text"),
    ("misfire_policy", "text"),
    ("misfire_grace", "interval"),
    ("catch_up_limit", "integer"),
    ("overlap_policy", "text"),
    ("jitter", "interval"),
    ("history_limit", "integer"),
    ("paused", "boolean"),
    ("owner", "text"),
)

#: How long one wait lasts before the await is registered again (sked.task_await's `for`
#: must be renewed before it passes), and the registration's margin beyond it.
AWAIT_PERIOD = 300.0
AWAIT_MARGIN = 10.0

# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------


def uuid(value: Id) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


def jsonb(value: Any) -> Jsonb:
    return Jsonb(value, dumps=json_dumps)


def interval_param(value: Interval) -> Union[timedelta, str]:
    """A duration as a statement's parameter: a timedelta (psycopg sends an interval), or
    interval text as it is."""
    return value if isinstance(value, str) else to_timedelta(value)


def seconds(value: Union[timedelta, int, float]) -> float:
    return to_timedelta(value).total_seconds()


_FIELDS: Dict[type, FrozenSet[str]] = {}


def build(cls: Type[T], row: Mapping[str, Any], **given: Any) -> T:
    """An instance of the dataclass `cls` from a row: the columns it knows by name, the
    others in `extra`."""
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = frozenset(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    known = {k: v for k, v in row.items() if k in names and k != "extra"}
    extra = {k: v for k, v in row.items() if k not in names or k == "extra"}
    known.update(given)
    return cast(T, cast(Any, cls)(**known, extra=extra))


def one(rows: List[Row]) -> Optional[Row]:
    return rows[0] if rows else None


def value(rows: List[Row], column: str) -> Any:
    return rows[0][column] if rows else None


# ---------------------------------------------------------------------------------------------
# Submitting
# ---------------------------------------------------------------------------------------------


def submit_many(tasks: Iterable[TaskLike], owner: Optional[str]) -> Op[List[Submitted]]:
    payload = [task_json(t) for t in tasks]
    rows = yield Query(SUBMIT, (jsonb(payload), owner))
    return [Submitted(id=r["id"], created=r["created"]) for r in rows]


def submit_one(task: TaskLike, owner: Optional[str]) -> Op[Submitted]:
    (submitted,) = yield from submit_many([task], owner)
    return submitted


def submit_workflow(
    workflow: Union[WorkflowSpec, Mapping[str, Any]], owner: Optional[str]
) -> Op[UUID]:
    rows = yield Query(WORKFLOW_SUBMIT, (jsonb(workflow_json(workflow)), owner))
    result: UUID = rows[0]["id"]
    return result


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


def _attempts_by_task(rows: List[Row]) -> Dict[UUID, List[Attempt]]:
    out: Dict[UUID, List[Attempt]] = {}
    for r in rows:
        out.setdefault(r["task_id"], []).append(build(Attempt, r))
    return out


def get_task(id: Id, attempts: bool) -> Op[Optional[Task]]:
    task_id = uuid(id)
    row = one((yield Query(TASK, (task_id,))))
    if row is None:
        return None
    if not attempts:
        return build(Task, row)
    by_task = _attempts_by_task((yield Query(ATTEMPTS, ([task_id],))))
    return build(Task, row, attempts=by_task.get(task_id, []))


def get_workflow(id: Id, attempts: bool) -> Op[Optional[Workflow]]:
    workflow_id = uuid(id)
    row = one((yield Query(WORKFLOW, (workflow_id,))))
    if row is None:
        return None
    task_rows = yield Query(WORKFLOW_TASKS, (workflow_id,))
    ids = [r["id"] for r in task_rows]
    by_task = _attempts_by_task((yield Query(ATTEMPTS, (ids,)))) if ids and attempts else {}
    edge_rows = (yield Query(EDGES, (ids,))) if ids else []
    tasks = [
        build(Task, r, attempts=by_task.get(r["id"], [])) if attempts else build(Task, r)
        for r in task_rows
    ]
    edges = [Edge(task_id=e["task_id"], depends_on=e["depends_on"]) for e in edge_rows]
    return build(Workflow, row, tasks=tasks, edges=edges)


def logs(task_id: Id, after: int, limit: int) -> Op[List[LogLine]]:
    rows = yield Query(LOGS, (uuid(task_id), after, limit))
    return [build(LogLine, r) for r in rows]


# ---------------------------------------------------------------------------------------------
# Acting
# ---------------------------------------------------------------------------------------------


def call_value(text: QueryText, params: Sequence[Any], column: str) -> Op[Any]:
    rows = yield Query(text, params)
    return value(rows, column)


def cancel(id: Id) -> Op[Optional[str]]:
    return call_value(TASK_CANCEL, (uuid(id),), "state")


def retry(id: Id) -> Op[Optional[str]]:
    return call_value(TASK_RETRY, (uuid(id),), "state")


def resubmit(id: Id, owner: Optional[str]) -> Op[Optional[UUID]]:
    return call_value(TASK_RESUBMIT, (uuid(id), owner), "id")


def cancel_workflow(id: Id) -> Op[Optional[str]]:
    return call_value(WORKFLOW_CANCEL, (uuid(id),), "state")


def retry_workflow(id: Id) -> Op[Optional[int]]:
    return call_value(WORKFLOW_RETRY, (uuid(id),), "tasks")


# ---------------------------------------------------------------------------------------------
# Awaiting
# ---------------------------------------------------------------------------------------------


def _wait_until_finished(
    kind: str, text: QueryText, id: UUID, timeout: Optional[Union[timedelta, float]]
) -> Op[None]:
    """docs/sql.md, "Awaiting a result": register the wait and LISTEN (sked.*_await, in
    autocommit), wait for the notification on the channel, register again before the
    registration's `for` passes, and UNLISTEN at the end, however it ends."""
    yield RequireIdle()
    deadline = None if timeout is None else time.monotonic() + seconds(timeout)
    channel: Optional[str] = None
    try:
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            span = AWAIT_PERIOD if remaining is None else min(AWAIT_PERIOD, max(remaining, 0.0))
            rows = yield Query(text, {"id": id, "for": timedelta(seconds=span + AWAIT_MARGIN)})
            if rows[0]["finished"]:
                break
            channel = rows[0]["channel"]
            if remaining is not None and remaining <= 0:
                assert timeout is not None
                raise AwaitTimeout(kind, id, rows[0]["state"], timeout)
            # Until the span ends or a notification on the channel comes; then the state is
            # read again (a notification left from an earlier wait on this connection must
            # not end this one).
            until = time.monotonic() + span
            while (left := until - time.monotonic()) > 0:
                if (yield Wait(channel, left)):
                    break
    except GeneratorExit:
        raise
    except BaseException:
        if channel is not None:
            try:
                yield Query(sql.SQL(UNLISTEN).format(sql.Identifier(channel)))
            except Exception:
                pass  # the error being raised says more
        raise
    if channel is not None:
        yield Query(sql.SQL(UNLISTEN).format(sql.Identifier(channel)))


def await_task(id: Id, timeout: Optional[Union[timedelta, float]], attempts: bool) -> Op[Task]:
    task_id = uuid(id)
    yield from _wait_until_finished("task", TASK_AWAIT, task_id, timeout)
    task = yield from get_task(task_id, attempts)
    if task is None:
        raise NotFoundError(f"no such task: {task_id}")
    return task


def await_workflow(
    id: Id, timeout: Optional[Union[timedelta, float]], attempts: bool
) -> Op[Workflow]:
    workflow_id = uuid(id)
    yield from _wait_until_finished("workflow", WORKFLOW_AWAIT, workflow_id, timeout)
    workflow = yield from get_workflow(workflow_id, attempts)
    if workflow is None:
        raise NotFoundError(f"no such workflow: {workflow_id}")
    return workflow


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------


def create_schedule(arguments: Mapping[str, Any]) -> Op[UUID]:
    """sked.schedule_create with the arguments given (not None), by name."""
    names: List[sql.Composable] = []
    params: List[Any] = []
    for name, type_ in SCHEDULE_CREATE_ARGS:
        given = arguments.get(name)
        if given is None:
            continue
        if name == "task":
            given = jsonb(task_json(given))
        elif name == "workflow":
            given = jsonb(workflow_json(given))
        elif type_ == "interval":
            given = interval_param(given)
        names.append(
            sql.SQL("{} => {}::{}").format(sql.Identifier(name), sql.Placeholder(), sql.SQL(type_))
        )
        params.append(given)
    text = sql.SQL(SCHEDULE_CREATE).format(sql.SQL(", ").join(names))
    rows = yield Query(text, params)
    result: UUID = rows[0]["id"]
    return result


def get_schedule(id: Id) -> Op[Optional[Schedule]]:
    row = one((yield Query(SCHEDULE, (uuid(id),))))
    return None if row is None else build(Schedule, row)


def list_schedules() -> Op[List[Schedule]]:
    rows = yield Query(SCHEDULES)
    return [build(Schedule, r) for r in rows]


def schedule_runs(id: Id, limit: int) -> Op[List[ScheduleRun]]:
    rows = yield Query(SCHEDULE_RUNS, (uuid(id), limit))
    return [build(ScheduleRun, r) for r in rows]


def pause_schedule(id: Id) -> Op[bool]:
    rows = yield Query(SCHEDULE_PAUSE, (uuid(id),))
    return bool(value(rows, "found"))


def resume_schedule(id: Id) -> Op[bool]:
    rows = yield Query(SCHEDULE_RESUME, (uuid(id),))
    return bool(value(rows, "found"))


def run_schedule_now(id: Id) -> Op[Optional[UUID]]:
    return call_value(SCHEDULE_RUN_NOW, (uuid(id),), "id")


def delete_schedule(id: Id) -> Op[bool]:
    rows = yield Query(SCHEDULE_DELETE, (uuid(id),))
    return bool(rows)
