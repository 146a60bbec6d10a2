"""Runs the operations of ``sked._ops`` on a connection: ``run`` on a ``psycopg.Connection``,
``arun`` on a ``psycopg.AsyncConnection``. They differ only in awaiting."""

from __future__ import annotations

from typing import Any, List, TypeVar

import psycopg
from psycopg import pq
from psycopg.rows import dict_row

from ._ops import Op, Query, RequireIdle, Row, Step, Wait
from .errors import AutocommitRequired, map_error

T = TypeVar("T")

_NOT_IDLE = (
    "awaiting needs a connection in autocommit mode and outside a transaction: the wait is "
    "registered, and its LISTEN takes effect, when the registering statement commits, and a "
    "waiter holds no transaction open while it waits. Open the connection with "
    "autocommit=True (or set conn.autocommit = True) and await outside conn.transaction(); "
    "a dedicated connection is best, since awaiting also consumes the connection's other "
    "notifications"
)


def _require_idle(autocommit: bool, status: pq.TransactionStatus) -> None:
    if not autocommit:
        raise AutocommitRequired(_NOT_IDLE + " (this connection is not in autocommit mode)")
    if status != pq.TransactionStatus.IDLE:
        raise AutocommitRequired(_NOT_IDLE + f" (this connection's transaction is {status.name})")


def _execute(conn: psycopg.Connection[Any], step: Step) -> Any:
    if isinstance(step, Query):
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(step.text, step.params)
            rows: List[Row] = cur.fetchall() if cur.description is not None else []
            return rows
    if isinstance(step, Wait):
        got = False
        # stop_after=1 ends the wait after the first batch of notifications; the whole
        # batch is consumed.
        for n in conn.notifies(timeout=step.seconds, stop_after=1):
            if n.channel == step.channel:
                got = True
        return got
    if isinstance(step, RequireIdle):
        _require_idle(conn.autocommit, conn.info.transaction_status)
        return None
    raise TypeError(f"unknown step {step!r}")


async def _aexecute(conn: psycopg.AsyncConnection[Any], step: Step) -> Any:
    if isinstance(step, Query):
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(step.text, step.params)
            rows: List[Row] = await cur.fetchall() if cur.description is not None else []
            return rows
    if isinstance(step, Wait):
        got = False
        async for n in conn.notifies(timeout=step.seconds, stop_after=1):
            if n.channel == step.channel:
                got = True
        return got
    if isinstance(step, RequireIdle):
        _require_idle(conn.autocommit, conn.info.transaction_status)
        return None
    raise TypeError(f"unknown step {step!r}")


def run(conn: psycopg.Connection[Any], op: Op[T]) -> T:
    """Run `op` on `conn`. A step's error (mapped to the client's) is raised inside the
    operation, so that it may clean up (an await UNLISTENs)."""
    try:
        step = next(op)
        while True:
            try:
                result = _execute(conn, step)
            except BaseException as exc:
                step = op.throw(map_error(exc))
            else:
                step = op.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value


async def arun(conn: psycopg.AsyncConnection[Any], op: Op[T]) -> T:
    """Run `op` on `conn` (see :func:`run`)."""
    try:
        step = next(op)
        while True:
            try:
                result = await _aexecute(conn, step)
            except BaseException as exc:
                step = op.throw(map_error(exc))
            else:
                step = op.send(result)
    except StopIteration as stop:
        value: T = stop.value
        return value
