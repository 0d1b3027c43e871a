"""The rule engine, lent to one caller at a time.

The engine is not thread-safe; ingest (the HTTP loop), the writer and the sweep (the
scheduler's thread) call it concurrently in the daemon. Each call is made under this
lock, held for the engine's calls only (never across the store or a file).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sn_monitor.rules.engine import Finding, RuleEngine


class EngineLock:
    """The rule engine and the lock its calls are made under (module docstring)."""

    def __init__(self, engine: RuleEngine) -> None:
        self._engine = engine
        self._lock = threading.Lock()

    @contextmanager
    def held(self) -> Iterator[RuleEngine]:
        """The engine, to call while the lock is held."""
        with self._lock:
            yield self._engine

    def firing(self) -> list[Finding]:
        """Every finding the engine holds as firing."""
        with self._lock:
            return self._engine.firing()
