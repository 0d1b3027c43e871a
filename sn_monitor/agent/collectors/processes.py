"""Processes from /proc: who is stuck in ``D``.

:class:`ProcessesCollector` scans every ``/proc/<pid>/stat`` (parsed by
:func:`~sn_monitor.agent.workloads.procfs.parse_proc_stat_line`) for processes in
uninterruptible sleep (``D``). A moment in D is normal (disk I/O); a process in D at
every scan for ``stuck_after`` seconds without using any CPU time in between is stuck:
a hung NFS or Lustre mount, a driver call that never returns, a dying disk. It cannot be
killed, and if it is a training rank the job hangs. A process is known by (pid, start
time), so a reused pid starts afresh. (Who a GPU process is, its container and user:
:mod:`sn_monitor.agent.workloads.processes`.)

A scan opens one file per process (~2,000 on a busy node), so it runs every
``interval`` seconds (default 10) and the cycles in between serve the last result.
Only the thread-group leader's state is read: a single stuck thread of a process whose
main thread is not in D is not seen (``/proc/<pid>/task/*`` would multiply the cost).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from sn_monitor.agent.collectors.base import SourceMissing
from sn_monitor.agent.snapshot import Collected, ProcessesSample, StuckProcess
from sn_monitor.agent.workloads.procfs import ProcStat, parse_proc_stat_line
from sn_monitor.clock import Clock

logger = logging.getLogger(__name__)

#: Seconds between two scans of /proc; the cycles in between serve the last result.
SCAN_INTERVAL_SECONDS = 10.0
#: A process in D this long (at every scan, using no CPU time) counts as stuck; the
#: kernel's own hung-task warning (``hung_task_timeout_secs``) waits 120 s too.
STUCK_AFTER_SECONDS = 120.0
#: Stuck processes listed in the snapshot (all are counted).
MAX_STUCK_LISTED = 32


@dataclass(slots=True)
class _Watch:
    """A process seen in D: since when (monotonic), and its CPU ticks then."""

    since: float
    cpu_ticks: int


class StuckTracker:
    """Which processes have been in D, without CPU time, for ``stuck_after`` seconds.

    Fed one scan at a time (:meth:`update`); keeps only the processes in D at the last
    scan, so its memory is bounded by what the node has, not by time.
    """

    def __init__(self, stuck_after: float) -> None:
        if stuck_after <= 0:
            raise ValueError("stuck_after must be > 0")
        self._stuck_after = float(stuck_after)
        self._watched: dict[tuple[int, int], _Watch] = {}

    def update(self, now: float, stats: list[ProcStat]) -> tuple[int, tuple[StuckProcess, ...]]:
        """Take one scan's stats at monotonic ``now``: (processes in D, the stuck ones)."""
        watched: dict[tuple[int, int], _Watch] = {}
        stuck: list[StuckProcess] = []
        in_d = 0
        for stat in stats:
            if stat.state != "D":
                continue
            in_d += 1
            key = (stat.pid, stat.start_ticks)
            watch = self._watched.get(key)
            if watch is None or watch.cpu_ticks != stat.cpu_ticks:
                watch = _Watch(now, stat.cpu_ticks)  # new, or it ran since: not stuck
            watched[key] = watch
            if now - watch.since >= self._stuck_after:
                stuck.append(StuckProcess(stat.pid, stat.name, now - watch.since))
        self._watched = watched
        stuck.sort(key=lambda p: (-p.stuck_seconds, p.pid))
        return in_d, tuple(stuck)


class ProcessesCollector:
    """The ``processes`` collector: processes in D, and those stuck there.

    Scans ``<procfs>/<pid>/stat`` every ``interval`` seconds of ``clock``'s monotonic
    time; the cycles in between return the last scan's result. A /proc without any pid
    directory is :class:`SourceMissing`.
    """

    name = "processes"

    def __init__(
        self,
        procfs: Path,
        clock: Clock,
        *,
        interval: float = SCAN_INTERVAL_SECONDS,
        stuck_after: float = STUCK_AFTER_SECONDS,
    ) -> None:
        if interval < 0:
            raise ValueError("interval must be >= 0")
        self._procfs = Path(procfs)
        self._clock = clock
        self._interval = float(interval)
        self._tracker = StuckTracker(stuck_after)
        self._scanned_at: float | None = None
        self._last: ProcessesSample | None = None

    def collect(self) -> Collected:
        now = self._clock.monotonic()
        if (
            self._last is None
            or self._scanned_at is None
            or now - self._scanned_at >= self._interval
        ):
            self._last = self._scan(now)
            self._scanned_at = now
        return Collected(processes=self._last)

    def close(self) -> None:
        """Nothing is held between cycles."""

    def _scan(self, now: float) -> ProcessesSample:
        try:
            names = [e.name for e in os.scandir(self._procfs) if e.name.isdigit()]
        except OSError as exc:
            raise SourceMissing(f"cannot list {self._procfs}: {exc}") from exc
        if not names:
            raise SourceMissing(f"no processes under {self._procfs}")
        stats: list[ProcStat] = []
        for name in names:
            try:
                with open(os.path.join(self._procfs, name, "stat"), "rb") as f:
                    raw = f.read()
            except OSError:
                continue  # exited during the scan
            stat = parse_proc_stat_line(raw.decode("utf-8", errors="replace"))
            if stat is not None:
                stats.append(stat)
        in_d, stuck = self._tracker.update(now, stats)
        if stuck and (self._last is None or not self._last.stuck):
            logger.warning("%d process(es) stuck in D state, e.g. pid %d (%s) for %.0f s",
                           len(stuck), stuck[0].pid, stuck[0].name, stuck[0].stuck_seconds)
        return ProcessesSample(total=len(stats), uninterruptible=in_d, stuck_count=len(stuck),
                               stuck=stuck[:MAX_STUCK_LISTED])
