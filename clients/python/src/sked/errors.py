"""The errors the client raises.

A database error that carries a SQLSTATE is raised as a :class:`DatabaseError` subclass chosen
by the SQLSTATE's class alone (never by its message), with the original psycopg error as
``__cause__``:

==========================  ===================================================
SQLSTATE                    raised as
==========================  ===================================================
``23505``, ``23P01``        :class:`ConflictError` (e.g. an idempotency key that
                            names another definition, a schedule name taken)
other ``23xxx``, ``22xxx``  :class:`ValidationError` (``check_violation``
                            ``23514`` names the broken rule as ``constraint``)
``P0002``, ``02xxx``        :class:`NotFoundError` (``no such task``)
``42501``, ``28xxx``        :class:`PermissionDeniedError`
anything else               :class:`DatabaseError`
==========================  ===================================================

Errors without a SQLSTATE (a lost connection, a closed connection) are psycopg's own and pass
through unchanged.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Optional, Type, Union
from uuid import UUID

import psycopg

__all__ = [
    "SkedError",
    "DatabaseError",
    "ValidationError",
    "ConflictError",
    "NotFoundError",
    "PermissionDeniedError",
    "AwaitTimeout",
    "AutocommitRequired",
]


class SkedError(Exception):
    """Base class of every error this client raises itself."""


class DatabaseError(SkedError):
    """An error the database raised, with its SQLSTATE and, for a broken rule, its name.

    ``constraint`` is the constraint (rule) the database named, e.g.
    ``tasks_command_must_not_be_empty``; ``condition`` is the SQLSTATE's condition name, e.g.
    ``check_violation``; ``name`` is the first of the two that is set.
    """

    def __init__(
        self,
        message: str,
        *,
        sqlstate: Optional[str] = None,
        constraint: Optional[str] = None,
        condition: Optional[str] = None,
        detail: Optional[str] = None,
        hint: Optional[str] = None,
        table: Optional[str] = None,
        schema: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.constraint = constraint
        self.condition = condition
        self.detail = detail
        self.hint = hint
        self.table = table
        self.schema = schema

    @property
    def name(self) -> Optional[str]:
        """The rule's name (``constraint``), or else the SQLSTATE's condition name."""
        return self.constraint or self.condition

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, sqlstate={self.sqlstate!r}, "
            f"constraint={self.constraint!r})"
        )


class ValidationError(DatabaseError):
    """A rejected value: SQLSTATE classes 22 (data exception) and 23 (integrity constraint
    violation) but for the conflicts. Nothing was inserted or changed."""


class ConflictError(DatabaseError):
    """A uniqueness conflict (``23505`` unique_violation, ``23P01`` exclusion_violation)."""


class NotFoundError(DatabaseError):
    """No such row: ``P0002`` (no_data_found, e.g. ``no such task``) and class ``02``.

    Also raised without a SQLSTATE when a task or workflow that was awaited is gone when it is
    read back."""


class PermissionDeniedError(DatabaseError):
    """``42501`` insufficient_privilege (and class ``28``, invalid authorization)."""


class AwaitTimeout(SkedError, TimeoutError):
    """The awaited task or workflow did not finish within the timeout.

    ``kind`` is ``"task"`` or ``"workflow"``, ``id`` its id, ``state`` the state it had when
    the wait gave up, ``timeout`` the timeout given."""

    def __init__(
        self, kind: str, id: UUID, state: Optional[str], timeout: Union[timedelta, float]
    ) -> None:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        super().__init__(
            f"{kind} {id} did not finish within {seconds:g} s (it is {state or 'unknown'})"
        )
        self.kind = kind
        self.id = id
        self.state = state
        self.timeout = timeout


class AutocommitRequired(SkedError):
    """Awaiting was asked of a connection that is not in autocommit mode or is inside a
    transaction. The wait is registered, and its LISTEN takes effect, when the registering
    statement commits, and a waiter must not hold a transaction open while it waits: await on
    a connection opened with ``autocommit=True`` and outside ``conn.transaction()``."""


def error_class(sqlstate: str) -> Type[DatabaseError]:
    """The error class of a SQLSTATE, by its class (its first two characters)."""
    if sqlstate in ("23505", "23P01"):
        return ConflictError
    klass = sqlstate[:2]
    if klass in ("22", "23"):
        return ValidationError
    if sqlstate == "P0002" or klass == "02":
        return NotFoundError
    if sqlstate == "42501" or klass == "28":
        return PermissionDeniedError
    return DatabaseError


_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def _condition_name(exc: psycopg.Error) -> Optional[str]:
    """The condition name of the SQLSTATE (``check_violation``), from psycopg's class for it."""
    cls = type(exc)
    if cls.__module__ == "psycopg.errors" and getattr(cls, "sqlstate", None) == exc.sqlstate:
        return _CAMEL.sub("_", cls.__name__).lower()
    return None


def map_error(exc: BaseException) -> BaseException:
    """The client's error for a psycopg error with a SQLSTATE; any other exception as it is."""
    if not isinstance(exc, psycopg.Error) or not exc.sqlstate:
        return exc
    diag = exc.diag
    mapped = error_class(exc.sqlstate)(
        diag.message_primary or str(exc),
        sqlstate=exc.sqlstate,
        constraint=diag.constraint_name,
        condition=_condition_name(exc),
        detail=diag.message_detail,
        hint=diag.message_hint,
        table=diag.table_name,
        schema=diag.schema_name,
    )
    mapped.__cause__ = exc
    return mapped.with_traceback(exc.__traceback__)
