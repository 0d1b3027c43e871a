"""A store whose disk is full: a SQLite connection that fails every write with the error
a full disk gives, for the tests of the writer and of the store's and election's fault
handling."""

from __future__ import annotations

import sqlite3
import threading
from types import TracebackType
from typing import Any

from sn_monitor.controller.storage.store import Store


class _FullConnection:
    """A sqlite3 connection whose write transactions fail like a full disk's."""

    def __init__(self, real: sqlite3.Connection, full: threading.Event) -> None:
        self._real = real
        self._full = full

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if self._full.is_set() and sql.lstrip().upper().startswith("BEGIN"):
            raise sqlite3.OperationalError("database or disk is full")
        return self._real.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class FullDisk:
    """``with FullDisk(store):`` every write to ``store`` fails; reads still work."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.full = threading.Event()

    def __enter__(self) -> FullDisk:
        with self.store.db._lock:  # type: ignore[attr-defined]
            self.store.db._conn = _FullConnection(self.store.db._conn, self.full)  # type: ignore[attr-defined]
        self.full.set()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.full.clear()
        with self.store.db._lock:  # type: ignore[attr-defined]
            conn = self.store.db._conn  # type: ignore[attr-defined]
            if isinstance(conn, _FullConnection):
                self.store.db._conn = conn._real  # type: ignore[attr-defined]
