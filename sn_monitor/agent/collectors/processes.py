"""Processes from /proc: who uses a GPU (their container), and who is stuck in ``D``.

Two readers of ``<procfs>/<pid>/``, with pure parsers apart from the reading:

* :func:`parse_cgroup` takes ``/proc/<pid>/cgroup`` to the container and Kubernetes pod
  of a process (docker, containerd, CRI-O and podman paths, under the systemd and the
  cgroupfs drivers, cgroup v1 and v2). :func:`container_of` reads it for one pid: the
  nvml collector attributes each GPU's processes with it. NVML reports pids in the
  host's PID namespace, so an agent in a container needs the host's /proc (``hostPID``,
  or the host's /proc mounted and ``paths.procfs`` pointed at it).
* :class:`ProcessesCollector` scans every ``/proc/<pid>/stat`` for processes in
  uninterruptible sleep (``D``). A moment in D is normal (disk I/O); a process in D at
  every scan for ``stuck_after`` seconds without using any CPU time in between is
  stuck: a hung NFS or Lustre mount, a driver call that never returns, a dying disk.
  It cannot be killed, and if it is a training rank the job hangs. A process is known
  by (pid, start time), so a reused pid starts afresh.

A scan opens one file per process (~2,000 on a busy node), so it runs every
``interval`` seconds (default 10) and the cycles in between serve the last result.
Only the thread-group leader's state is read: a single stuck thread of a process whose
main thread is not in D is not seen (``/proc/<pid>/task/*`` would multiply the cost).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from sn_monitor.agent.collectors.base import SourceMissing
from sn_monitor.agent.snapshot import Collected, ProcessesSample, StuckProcess
from sn_monitor.clock import Clock

logger = logging.getLogger(__name__)

#: Seconds between two scans of /proc; the cycles in between serve the last result.
SCAN_INTERVAL_SECONDS = 10.0
#: A process in D this long (at every scan, using no CPU time) counts as stuck; the
#: kernel's own hung-task warning (``hung_task_timeout_secs``) waits 120 s too.
STUCK_AFTER_SECONDS = 120.0
#: Stuck processes listed in the snapshot (all are counted).
MAX_STUCK_LISTED = 32

_CONTAINER_ID = re.compile(
    r"(?:^|/)(?:(?:docker|cri-containerd|crio|libpod)-)?([0-9a-f]{64})(?:\.scope)?(?=/|$)"
)
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """The container and the Kubernetes pod a process runs in; None where none."""

    container_id: str | None = None
    pod_uid: str | None = None


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What the D-state scan needs from one ``/proc/<pid>/stat``."""

    pid: int
    name: str
    state: str
    cpu_ticks: int
    start_ticks: int


def parse_cgroup(text: str) -> CgroupIdentity:
    """``/proc/<pid>/cgroup`` -> the innermost container id and the pod UID, if any.

    Lines are ``hierarchy:controllers:path``; the cgroup v2 line (``0::``) is looked at
    first, then the others. A container id is a 64-hex path component, bare (cgroupfs
    driver: ``/docker/<id>``, ``/kubepods/burstable/pod<uid>/<id>``) or as a systemd scope
    (``docker-<id>.scope``, ``cri-containerd-<id>.scope``, ``crio-<id>.scope``,
    ``libpod-<id>.scope``); CRI-O's ``crio-conmon-<id>.scope`` is the monitor, not the
    container. The last one in a path wins (kind: a pod's container inside a docker
    node). A pod UID is ``pod<uid>`` with dashes, or with underscores under systemd
    (``kubepods-besteffort-pod<uid>.slice``); it is returned with dashes.
    """
    paths: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths.insert(0, parts[2])
        else:
            paths.append(parts[2])
    for path in paths:
        containers = _CONTAINER_ID.findall(path)
        pods = _POD_UID.findall(path)
        if containers or pods:
            return CgroupIdentity(
                container_id=containers[-1] if containers else None,
                pod_uid=pods[-1].replace("_", "-") if pods else None,
            )
    return CgroupIdentity()


def parse_proc_stat_line(text: str) -> ProcStat | None:
    """``/proc/<pid>/stat`` -> pid, name, state, CPU ticks (user + system), start time.

    The name (``comm``) is in parentheses and may itself hold spaces and parentheses,
    so the fields are taken after the *last* ``)``. None when malformed.
    """
    head, sep, tail = text.rpartition(")")
    pid_text, _, name = head.partition(" (")
    fields = tail.split()
    if not sep or len(fields) < 20:
        return None
    try:
        return ProcStat(
            pid=int(pid_text),
            name=name,
            state=fields[0],
            cpu_ticks=int(fields[11]) + int(fields[12]),
            start_ticks=int(fields[19]),
        )
    except ValueError:
        return None


def container_of(procfs: Path, pid: int) -> CgroupIdentity:
    """The container of process ``pid`` under ``procfs``; empty if gone or unreadable."""
    path = procfs / str(pid) / "cgroup"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:  # gone since NVML listed it, or not ours to read
        logger.debug("cannot read %s: %s", path, exc)
        return CgroupIdentity()
    return parse_cgroup(text)


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
