"""The interface between the store and a database engine, and the store's errors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from sn_monitor.errors import SnMonitorError

#: One result row, by column name (``sqlite3.Row`` and psycopg's ``dict_row`` both are).
Row = Mapping[str, Any]


class StoreError(SnMonitorError):
    """The store cannot do what was asked (a bug, a conflict, a file from the future)."""


class StoreUnavailable(StoreError):
    """The database cannot be written or opened.

    Disk full, read-only, missing, an I/O error, or (PostgreSQL) the server cannot be
    reached.

    Callers that are about to act on an outside system must refuse to act: an action
    that cannot be recorded first is not taken.
    """


class Fenced(StoreUnavailable):
    """Another controller holds the lease now: this one's writes are refused.

    A controller that lost its lease without noticing (a long pause, a partition from
    the lease but not from the database) must not record, and so must not take, any
    action after its successor took over: every write transaction checks the epoch.
    """


class Transaction(Protocol):
    """One open transaction; SQL uses ``?`` placeholders whatever the engine."""

    def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run one statement; how many rows it changed."""
        ...

    def one(self, sql: str, args: Sequence[Any] = ()) -> Row | None:
        """The first row of a query, or None."""
        ...

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """Every row of a query."""
        ...


class Database(Protocol):
    """A connection to one database, shared by the controller's threads.

    ``insertion_order`` names a column that orders the ``actions`` table's rows as they
    were inserted (SQLite's ``rowid``; a generated ``seq`` in PostgreSQL);
    ``lock_rows`` is appended to a SELECT to lock what it reads until the transaction
    ends (empty in SQLite, whose write transactions lock the whole file).
    """

    name: str
    insertion_order: str
    lock_rows: str
    shared_lock_rows: str

    def transaction(self, *, durable: bool = False) -> AbstractContextManager[Transaction]:
        """A write transaction; ``durable`` commits only once it is on stable storage."""
        ...

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """Rows of one read-only query."""
        ...

    def schema_version(self) -> int:
        """The schema version the database is at (0 when empty)."""
        ...

    def migrate(self, steps: Sequence[str], to_version: int) -> None:
        """Bring the schema from its version to ``to_version`` with ``steps[version:]``.

        ``steps[i]`` is DDL (``;``-separated, in SQLite's spelling) taking version i to
        i + 1. A database newer than ``to_version`` raises StoreError.
        """
        ...

    def close(self) -> None:
        """Close the connection."""
        ...
