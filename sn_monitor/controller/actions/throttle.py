"""The failure throttle: a (node, action) pair that failed too often is held a while.

When a (node, action) pair has ended ``failed`` ``limit`` times within ``window``
seconds, new actions for that pair are refused and its pending retries are held until
fewer than that many failures are left in the window: a flapping XID cannot start an
eviction or reboot storm (kopf's throttlers, simplified). Alerts are not throttled (a
lost "resolved" alert is worse than a retried one) and neither are actions without a
node. Times are monotonic; at start-up they are seeded from the audit trail
(:meth:`FailureThrottle.seed`).

Imports the clock and the audit records only.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from sn_monitor.clock import Clock
from sn_monitor.controller.audit import ActionRecord


class FailureThrottle:
    """Recent failures per (node, action), and until when each pair is held."""

    def __init__(self, clock: Clock, limit: int, window: float) -> None:
        self.clock = clock
        self.limit = limit
        self.window = window
        self._lock = threading.Lock()
        self._failures: dict[tuple[str, str], deque[float]] = {}  # (node, action) -> mono

    def note_failure(self, node: str | None, action: str) -> None:
        """``action`` on ``node`` ended ``failed`` now."""
        if node is None or action == "alert":
            return
        with self._lock:
            times = self._failures.setdefault((node, action), deque())
            times.append(self.clock.monotonic())

    def held_until(self, node: str | None, action: str) -> float | None:
        """Monotonic time until which (node, action) is held, or None."""
        if node is None or action == "alert":
            return None
        window, limit = self.window, self.limit
        now = self.clock.monotonic()
        with self._lock:
            times = self._failures.get((node, action))
            if not times:
                return None
            while times and now - times[0] >= window:
                times.popleft()
            if len(times) < limit:
                return None
            return times[-limit] + window

    def seed(self, recent: Iterable[ActionRecord], now: float) -> None:
        """The failures of the ``recent`` actions that are still in the window (wall ``now``)."""
        mono = self.clock.monotonic()
        with self._lock:
            for record in recent:
                if record.state == "failed" and record.node is not None \
                        and record.action != "alert" \
                        and now - record.updated_at < self.window:
                    times = self._failures.setdefault((record.node, record.action), deque())
                    times.append(mono - (now - record.updated_at))
            for times in self._failures.values():
                ordered = sorted(times)
                times.clear()
                times.extend(ordered)
