"""The SQLite backend: one file in the state directory, for a single controller.

One file (stdlib :mod:`sqlite3`, WAL mode) so that an operator can open it with the
``sqlite3`` shell, and so that a restarted controller knows what it was doing.

Durability. The connection runs ``synchronous=NORMAL``: in WAL mode a committed
transaction survives a crash of the *process* (SIGKILL, OOM kill) because it is already
in the WAL file in the OS page cache; only an OS crash or power loss can lose the last
few commits. That is right for node and incident rows, which the next reports rebuild.
A durable transaction (every action write) commits with ``synchronous=FULL`` (the WAL
is fsynced at that commit): it survives a power cut, at the price of one fsync.

Concurrency. All threads share one connection, guarded by one lock. SQLite serialises
writers anyway; one connection keeps the WAL reader/writer dance out of our code.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from sn_monitor.controller.storage.database.base import Row, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

# Primary result codes that mean "the store cannot take writes (or be read) right now".
_UNAVAILABLE_CODES: Final = frozenset(
    {sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN,
     sqlite3.SQLITE_IOERR, sqlite3.SQLITE_PERM, sqlite3.SQLITE_NOTADB}
)


def _unavailable(err: sqlite3.Error) -> bool:
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None and (code & 0xFF) in _UNAVAILABLE_CODES:
        return True
    text = str(err).lower()
    return any(s in text for s in ("database or disk is full", "readonly database",
                                   "unable to open", "disk i/o error"))


class _SQLiteTransaction:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        return int(self._conn.execute(sql, tuple(args)).rowcount)

    def one(self, sql: str, args: Sequence[Any] = ()) -> Row | None:
        row: Row | None = self._conn.execute(sql, tuple(args)).fetchone()
        return row

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        return list(self._conn.execute(sql, tuple(args)).fetchall())


class SQLiteDatabase:
    """A SQLite file. ``path`` is a file path or a ``file:`` URI (``file:/x.db?mode=ro``).

    ``max_bytes`` caps the file's size: past it writes raise StoreUnavailable, as on a
    full disk, so that an audit trail cannot fill the controller's state volume.
    """

    insertion_order = "rowid"
    lock_rows = ""
    shared_lock_rows = ""

    def __init__(self, path: Path | str, *, max_bytes: int | None = None) -> None:
        self.name = self.path = str(path)
        self._lock = threading.RLock()
        uri = self.path.startswith("file:")
        try:
            if not uri:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, uri=uri, isolation_level=None,
                                         check_same_thread=False, timeout=10.0)
        except (OSError, sqlite3.Error) as err:
            raise StoreUnavailable(f"cannot open the store at {self.path}: {err}") from err
        self._conn.row_factory = sqlite3.Row
        try:
            with self._guard():
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                self._conn.execute("PRAGMA synchronous=NORMAL")
                self._conn.execute("PRAGMA foreign_keys=ON")
                if max_bytes is not None:
                    page = self._conn.execute("PRAGMA page_size").fetchone()[0]
                    self._conn.execute(f"PRAGMA max_page_count={max(1, max_bytes // page)}")
        except BaseException:
            self._conn.close()
            raise
        self.journal_mode: str = str(mode).lower()
        if self.journal_mode != "wal" and "mode=ro" not in self.path:
            # e.g. a network file system without shared memory: still correct, slower
            log.warning("store %s: WAL mode not available, running in %s mode",
                        self.path, self.journal_mode)

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn "cannot write" errors into StoreUnavailable; leave bugs as they are."""
        try:
            yield
        except sqlite3.DatabaseError as err:  # OperationalError is one of these
            if _unavailable(err):
                raise StoreUnavailable(f"store {self.path}: {err}") from err
            raise

    @contextmanager
    def transaction(self, *, durable: bool = False) -> Iterator[_SQLiteTransaction]:
        """One write transaction under the lock; ``durable`` fsyncs the WAL at commit."""
        with self._lock, self._guard():
            if durable:
                self._conn.execute("PRAGMA synchronous=FULL")
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield _SQLiteTransaction(self._conn)
                except BaseException:
                    # SQLite may have rolled back already (SQLITE_FULL does); a second
                    # ROLLBACK would hide the real error behind "no transaction is active".
                    if self._conn.in_transaction:
                        self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            finally:
                if durable:
                    self._conn.execute("PRAGMA synchronous=NORMAL")

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        with self._lock, self._guard():
            return list(self._conn.execute(sql, tuple(args)).fetchall())

    def schema_version(self) -> int:
        return int(self.query("PRAGMA user_version")[0]["user_version"])

    def migrate(self, steps: Sequence[str], to_version: int) -> None:
        version = self.schema_version()
        if version > to_version:
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this sn-monitor "
                f"understands ({to_version}); upgrade sn-monitor or use another state dir")
        if version == to_version:
            return
        with self.transaction() as tx:
            for step in range(version, to_version):
                for statement in steps[step].split(";"):
                    if statement.strip():
                        tx.execute(statement)
            # PRAGMA takes no parameters; the value is our own integer constant.
            tx.execute(f"PRAGMA user_version={int(to_version)}")

    def close(self) -> None:
        """Close the connection (a WAL checkpoint happens on the last close)."""
        with self._lock:
            self._conn.close()
