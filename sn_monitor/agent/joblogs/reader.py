"""The ``agent-joblogs`` thread: polls every source every ``poll_interval`` seconds.

Every read of a job's log happens here, never on the sampling thread. One poll reads, per
source and stream, at most what the rate buckets hold (a burst of one second at most),
so a poll is bounded in bytes and so in time; the thread waits between polls on an event
that :meth:`JobLogReader.stop` sets, so it stops within a poll and the journalctl
processes' grace. Sources are polled in a rotating order so that the shared rate is not
always spent by the first. Polling (``stat`` and ``pread``), not inotify: Python has no
inotify in its standard library, inotify does not see writes to files on NFS or Lustre
(where a job's logs often are), and polling 256 idle files every 250 ms (globbed every
second) costs about 1 % of a core.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from sn_monitor.agent.joblogs.bounds import LineQueue, TokenBucket
from sn_monitor.agent.joblogs.fileset import OpenFiles
from sn_monitor.agent.joblogs.lines import LogLine
from sn_monitor.agent.joblogs.stats import JobLogCounters
from sn_monitor.agent.snapshot import JobLogStats

log = logging.getLogger(__name__)

THREAD_NAME = "agent-joblogs"
#: Lines handed to the consumer at once (a chunk it can search in one go).
HAND_ON_LINES = 4096
#: What takes the lines after each poll, on the reader's thread (recognition).
Consumer = Callable[[list[LogLine]], None]


class LogSource(Protocol):
    """A configured source: a file set (globs, containers) or a journald unit."""

    def poll(self, shared: TokenBucket, emit: Callable[[LogLine], None]) -> None:
        """Read what is new, as far as the rate allows, handing each line to ``emit``."""
        ...

    def close(self) -> None:
        """Release the files or processes held."""
        ...


class JobLogReader:
    """Polls ``sources`` on its thread, lines into ``queue``, counts into ``counters``.

    With a ``consumer``, every poll ends by handing it the queued lines, on this thread;
    without one, another thread takes them (:meth:`take`).
    """

    def __init__(self, sources: Sequence[LogSource], queue_lines: int, shared: TokenBucket,
                 open_files: OpenFiles, counters: JobLogCounters,
                 poll_interval: float, consumer: Consumer | None = None) -> None:
        if poll_interval <= 0:
            raise ValueError("the poll interval must be positive")
        self._sources = tuple(sources)
        self._shared = shared
        self._open_files = open_files
        self._counters = counters
        self._queue = LineQueue(queue_lines, self._dropped)
        self._interval = poll_interval
        self._consumer = consumer
        self._polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._closed = False
        self._failing = False

    def start(self) -> None:
        """Start polling on the ``agent-joblogs`` thread."""
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop the thread (it closes the sources); False if it did not end in ``timeout``."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
            return not self._thread.is_alive()
        self.close()
        return True

    @property
    def native_thread_id(self) -> int | None:
        """The thread's id in the kernel (``/proc/self/task/<id>``), once started."""
        return self._thread.native_id

    def take(self, limit: int) -> list[LogLine]:
        """Up to ``limit`` queued lines, oldest first, without waiting (any thread)."""
        return self._queue.take(limit)

    def stats(self) -> JobLogStats:
        """Every source's counters now (any thread)."""
        return self._counters.snapshot(len(self._queue))

    def poll_once(self) -> None:
        """Poll every source once, from the next in the rotating order."""
        count = len(self._sources)
        first = self._polls % count if count else 0
        self._polls += 1
        for source in self._sources[first:] + self._sources[:first]:
            source.poll(self._shared, self._emit)
        self._counters.open_files = self._open_files.count
        if self._consumer is not None:
            while lines := self._queue.take(HAND_ON_LINES):
                self._consumer(lines)

    def close(self) -> None:
        """Close every source (once)."""
        if self._closed:
            return
        self._closed = True
        for source in self._sources:
            source.close()
        self._counters.open_files = self._open_files.count

    def _emit(self, line: LogLine) -> None:
        self._counters.of(line.context.source).lines += 1
        self._queue.put(line)

    def _dropped(self, line: LogLine) -> None:
        self._counters.of(line.context.source).dropped_lines_queue += 1

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self.poll_once()
                    self._failing = False
                except Exception:  # the thread must outlive a bug in one poll; logged
                    log.log(logging.DEBUG if self._failing else logging.ERROR,
                            "reading the job logs failed; polling again", exc_info=True)
                    self._failing = True
                self._counters.cpu_seconds = time.thread_time()
                self._stop.wait(self._interval)
        finally:
            self.close()
