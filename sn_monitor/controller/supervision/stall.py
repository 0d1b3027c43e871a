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

- A controller saturated by its own ingest (its process has used
  :data:`SATURATED_SHARE` of a core or more over the last
  :data:`SATURATION_WINDOW_SECONDS`: CPython's one core is the limit) reads its reports
  late and its nodes' agents, waiting for their replies, send less: their silence is its
  backlog. While it is saturated its monotonic time stands still, as in a stall, and
  heartbeats are not judged (:meth:`StallWatch.reports_behind`): under overload the first
  work shed is judging silence, never reading reports, rules on them or actions. A node
  that dies meanwhile is found lost once the controller catches up; the ingest lag and
  its alert say that it is behind.

Every stall over :data:`STALL_SECONDS` is logged and observed in
``sn_controller_stall_seconds``. How late the loop's ticks run is its ingest lag: a report
that arrives while the loop is that far behind waits that long before it is read
(:meth:`StallWatch.ingest_lag`, ``sn_controller_ingest_lag_seconds``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
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
#: The share of one core over :data:`SATURATION_WINDOW_SECONDS` from which the controller
#: counts as saturated by its own work.
SATURATED_SHARE: Final = 0.9
SATURATION_WINDOW_SECONDS: Final = 3.0


class StallWatch:
    """A clock whose monotonic time leaves out the controller's stalls (see the module)."""

    def __init__(self, clock: Clock, interval: float,
                 on_stall: Callable[[str, float], None] | None = None,
                 cpu_seconds: Callable[[], float] = time.process_time) -> None:
        self._clock = clock
        self._interval = interval
        self._on_stall = on_stall
        #: The process's CPU time (all threads): how busy the controller itself is.
        self._cpu_seconds = cpu_seconds
        self._cpu_samples: deque[tuple[float, float]] = deque()
        #: When the current saturation began (None: not saturated).
        self._saturated_since: float | None = None
        self._lock = threading.Lock()
        self._stalled = 0.0
        self._last_read = float("-inf")
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
        """The real monotonic time minus every stall seen so far, never going back.

        A stall is left out when the sweep after it sees it; a time read meanwhile (a
        report received while the controller was saturated) is not taken back: the
        clock stands still until the real time has caught up with it.
        """
        with self._lock:
            now = max(self._last_read, self._clock.monotonic() - self._stalled)
            self._last_read = now
            return now

    # -- what the controller tells it ---------------------------------------------------------

    def sweep_started(self) -> float:
        """A sweep starts; the stall since the last one ended (0.0: none).

        While the controller is saturated, all of that time is a stall.
        """
        now = self._clock.monotonic()
        saturated = self._note_cpu(now)
        with self._lock:
            last, self._sweep_end = self._sweep_end, None
            if last is None:
                return 0.0
            stall = now - last if saturated else now - last - self._interval
            if stall <= 0.0:
                return 0.0
            self._stalled += stall
        if saturated:
            return stall  # said once, when the saturation ends
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
        """Reports may be waiting, unread: the loop has not run lately, or it is saturated."""
        with self._lock:
            tick, saturated = self._loop_tick, self._saturated_since is not None
        return saturated or (tick is not None
                             and self._clock.monotonic() - tick > LOOP_LAG_SECONDS)

    def _note_cpu(self, now: float) -> bool:
        """Sample the process's CPU time; whether the controller is saturated now."""
        cpu = self._cpu_seconds()
        samples = self._cpu_samples
        samples.append((now, cpu))
        while len(samples) > 2 and now - samples[1][0] >= SATURATION_WINDOW_SECONDS:
            samples.popleft()
        first_at, first_cpu = samples[0]
        span = now - first_at
        busy = span >= SATURATION_WINDOW_SECONDS / 2 and \
            (cpu - first_cpu) / span >= SATURATED_SHARE
        with self._lock:
            since = self._saturated_since
            if busy and since is None:
                self._saturated_since = now
            elif not busy and since is not None:
                self._saturated_since = None
        if busy and since is None:
            log.warning("controller saturated (%.0f %% of a core over %.1f s): its nodes' "
                        "silence is not judged until it catches up",
                        100 * (cpu - first_cpu) / span, span)
        elif not busy and since is not None:
            self.stalls_total += now - since
            self._report("saturated", now - since)
        return busy

    def _report(self, where: str, seconds: float) -> None:
        log.warning("controller stalled for %.1fs (%s): not counted as node silence",
                    seconds, where)
        if self._on_stall is not None:
            self._on_stall(where, seconds)
