"""The rule engine, lent to one caller at a time.

The engine is not thread-safe; ingest (the HTTP loop), the writer and the sweep (the
scheduler's thread) call it concurrently in the daemon. Each call is made under this
lock, held for the engine's calls only (never across the store or a file).
"""

from __future__ import annotations

import threading

from sn_monitor.rules.engine import Finding, RuleEngine


class EngineLock:
    """The rule engine and the lock its calls are made under (module docstring).

    ``with engine_lock.held() as engine:`` calls it under the lock. A plain context
    manager, not a ``@contextmanager`` generator: it is taken on every report, and a
    generator's frame costs a few microseconds there (``bench.ingest_bench``).
    """

    def __init__(self, engine: RuleEngine) -> None:
        self._engine = engine
        self._lock = threading.Lock()

    def held(self) -> EngineLock:
        """The engine, to call while the lock is held (``with ... as engine``)."""
        return self

    def __enter__(self) -> RuleEngine:
        self._lock.acquire()
        return self._engine

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def firing(self) -> list[Finding]:
        """Every finding the engine holds as firing."""
        with self._lock:
            return self._engine.firing()
