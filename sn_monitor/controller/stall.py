"""The controller's own stalls, so that they are never taken for its nodes' silence.

A controller that was paused (SIGSTOP, a VM migration), starved of CPU, or stuck in a
long collection did not hear its nodes meanwhile; the nodes did not go quiet. Like
Kubernetes' node lifecycle controller and every serious failure detector, silence is
measured against the controller's own progress:

- :class:`StallWatch` is the clock the node registry and the rules measure intervals
  with: its monotonic time stands still while the controller stands still. The sweep
  thread tells it when each sweep starts and ends; a start later than the interval after
  the last end is a stall, and that much is left out of every interval from then on.
- The event loop, which reads the reports, ticks it every :data:`LOOP_TICK_SECONDS`. While
  it has not ticked for :data:`LOOP_LAG_SECONDS` the reports already waiting in the
  sockets have not been read yet: heartbeats are not judged until they are
  (:meth:`StallWatch.reports_behind`).

Every stall over :data:`STALL_SECONDS` is logged and observed in
``sn_controller_stall_seconds``. How late the loop's ticks run is its ingest lag: a report
that arrives while the loop is that far behind waits that long before it is read
(:meth:`StallWatch.ingest_lag`, ``sn_controller_ingest_lag_seconds``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Final

from sn_monitor.clock import Clock

log = logging.getLogger(__name__)

#: A sweep or loop tick this much later than due is a stall worth saying.
STALL_SECONDS: Final = 1.0
#: How often the event loop ticks the watch.
LOOP_TICK_SECONDS: Final = 0.25
#: The event loop is behind on the sockets when it has not ticked for this long.
LOOP_LAG_SECONDS: Final = 1.0


class StallWatch:
    """A clock whose monotonic time leaves out the controller's stalls (see the module)."""

    def __init__(self, clock: Clock, interval: float,
                 on_stall: Callable[[str, float], None] | None = None) -> None:
        self._clock = clock
        self._interval = interval
        self._on_stall = on_stall
        self._lock = threading.Lock()
        self._stalled = 0.0
        self._sweep_end: float | None = None
        self._loop_tick: float | None = None
        #: The latest tick's lateness, and the most since :meth:`ingest_lag` was read.
        self._lag = 0.0
        self._lag_peak = 0.0
        self.stalls_total = 0.0

    # -- the Clock protocol --------------------------------------------------------------

    def time(self) -> float:
        return self._clock.time()

    def monotonic(self) -> float:
        """The real monotonic time minus every stall seen so far."""
        with self._lock:
            return self._clock.monotonic() - self._stalled

    # -- what the controller tells it ---------------------------------------------------------

    def sweep_started(self) -> float:
        """A sweep starts; the stall since the last one ended (0.0: none)."""
        now = self._clock.monotonic()
        with self._lock:
            last, self._sweep_end = self._sweep_end, None
            if last is None:
                return 0.0
            stall = now - last - self._interval
            if stall <= 0.0:
                return 0.0
            self._stalled += stall
        self.stalls_total += stall
        if stall >= STALL_SECONDS:
            self._report("sweep", stall)
        return stall

    def sweep_finished(self) -> None:
        with self._lock:
            self._sweep_end = self._clock.monotonic()

    def loop_ticked(self) -> None:
        """The event loop ran (called every LOOP_TICK_SECONDS by the loop itself)."""
        now = self._clock.monotonic()
        with self._lock:
            last, self._loop_tick = self._loop_tick, now
            late = 0.0 if last is None else max(0.0, now - last - LOOP_TICK_SECONDS)
            self._lag = late
            self._lag_peak = max(self._lag_peak, late)
        if late >= STALL_SECONDS:
            self._report("event_loop", late)

    def ingest_lag(self) -> float:
        """The most the event loop ran late since the last call (then the latest).

        Read at each scrape, so a lag between two scrapes is seen even when the loop has
        caught up by the time it answers the scrape (it answers on that same loop).
        """
        with self._lock:
            peak, self._lag_peak = self._lag_peak, self._lag
        return peak

    def reports_behind(self) -> bool:
        """The event loop has not run lately: reports may be waiting, unread."""
        with self._lock:
            tick = self._loop_tick
        return tick is not None and self._clock.monotonic() - tick > LOOP_LAG_SECONDS

    def _report(self, where: str, seconds: float) -> None:
        log.warning("controller stalled for %.1fs (%s): not counted as node silence",
                    seconds, where)
        if self._on_stall is not None:
            self._on_stall(where, seconds)
