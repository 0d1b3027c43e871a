"""What the log reading did, per source: lines and bytes read, and what was dropped, why.

The reader thread counts into :class:`SourceCounters`; any other thread reads a frozen
:class:`~sn_monitor.agent.snapshot.JobLogStats` through :meth:`JobLogCounters.snapshot`
(:mod:`sn_monitor.agent.joblog_series` formats it: ``sn_agent_log_lines_total{source}``,
``sn_agent_log_bytes_total{source}``, ``sn_agent_log_dropped_bytes_total{source,reason}``,
``sn_agent_log_dropped_lines_total{source,reason}``).

``bytes`` counts the bytes read (the work done); a dropped byte is one never handed on in
a line, read or not (a line's start skipped with the bytes before it, the end of a cut
line, is read, then dropped). Drop reasons:

* ``rate``: bytes skipped because the stream or the node was over its read rate (most
  are never read, so their lines are not counted);
* ``too-long``: the part of a line past ``max_line_bytes``;
* ``queue``: lines read, then pushed out of the full queue before the consumer took them;
* ``unparsed``: CRI or journald lines that are not in their format.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from sn_monitor.agent.snapshot import JobLogStats, SourceStats


@dataclass(slots=True)
class SourceCounters:
    """One source's running totals (written by the reader thread only)."""

    lines: int = 0
    bytes: int = 0
    dropped_bytes_rate: int = 0
    dropped_bytes_too_long: int = 0
    dropped_lines_queue: int = 0
    dropped_lines_unparsed: int = 0
    truncations: int = 0
    rotations: int = 0


@dataclass
class JobLogCounters:
    """The counters of every source by name, and the gauges the snapshot carries."""

    _sources: dict[str, SourceCounters] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    open_files: int = 0
    cpu_seconds: float = 0.0

    def of(self, source: str) -> SourceCounters:
        """The counters of ``source`` (made on first use)."""
        counters = self._sources.get(source)
        if counters is None:
            with self._lock:
                counters = self._sources.setdefault(source, SourceCounters())
        return counters

    def snapshot(self, queued_lines: int) -> JobLogStats:
        """A frozen copy, with ``queued_lines`` from the queue."""
        with self._lock:
            items = sorted(self._sources.items())
        return JobLogStats(
            sources=tuple(SourceStats(
                source=name, lines=c.lines, bytes=c.bytes,
                dropped_bytes_rate=c.dropped_bytes_rate,
                dropped_bytes_too_long=c.dropped_bytes_too_long,
                dropped_lines_queue=c.dropped_lines_queue,
                dropped_lines_unparsed=c.dropped_lines_unparsed,
                truncations=c.truncations, rotations=c.rotations) for name, c in items),
            open_files=self.open_files, queued_lines=queued_lines,
            cpu_seconds=self.cpu_seconds)
