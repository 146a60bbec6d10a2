"""Fixtures: connections to the database named by DATABASE_URL, which must be migrated and
served by a sked worker on queue `default`."""

from __future__ import annotations

import os
import uuid
from typing import AsyncIterator, Iterator

import psycopg
import pytest


def database_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        pytest.fail(
            "DATABASE_URL is not set: these tests need a migrated sked database served by a "
            "worker on queue 'default'",
            pytrace=False,
        )
    return url


def unique(prefix: str) -> str:
    """A name no other test (or run) uses."""
    return f"{prefix}-{uuid.uuid4()}"


# sh -c scripts. The task's output is the JSON of the last line on stdout.
ECHO_N1 = ["sh", "-c", 'echo "{\\"n\\": 1}"']
EXIT_3 = ["sh", "-c", "echo failing >&2; exit 3"]
# Fails at its first attempt, succeeds at the next one (after a retry).
SECOND_TIME_LUCKY = [
    "sh",
    "-c",
    'if [ "$SKED_ATTEMPT" -ge 2 ]; then echo "{\\"attempt\\": $SKED_ATTEMPT}"; else exit 3; fi',
]


@pytest.fixture
def conn() -> Iterator[psycopg.Connection]:
    """A connection in autocommit mode (awaiting needs one)."""
    with psycopg.connect(database_url(), autocommit=True) as c:
        yield c


@pytest.fixture
def txconn() -> Iterator[psycopg.Connection]:
    """A connection in psycopg's default mode: statements run in a transaction."""
    with psycopg.connect(database_url()) as c:
        yield c


@pytest.fixture
async def aconn() -> AsyncIterator[psycopg.AsyncConnection]:
    c = await psycopg.AsyncConnection.connect(database_url(), autocommit=True)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def atxconn() -> AsyncIterator[psycopg.AsyncConnection]:
    c = await psycopg.AsyncConnection.connect(database_url())
    try:
        yield c
    finally:
        await c.close()
