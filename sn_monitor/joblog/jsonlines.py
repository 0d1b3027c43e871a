"""A file of JSON lines, rotated by size, written off the caller's thread.

:class:`RotatingFile` appends whole lines: one ``write()`` per line on a descriptor
opened with ``O_APPEND``, so a reader (Filebeat, Vector) never sees two documents
interleaved; past ``max_bytes`` the file is renamed ``<path>.1`` (``.1`` to ``.2``, ...,
the oldest beyond ``keep`` deleted) and a new one opened, which is how both shippers
expect a log to rotate (they follow the renamed file to its end by its inode).

:class:`LineQueue` puts a bounded queue in front of it: :meth:`LineQueue.offer` never
waits (a full queue drops the line and counts it), and one thread writes. Disk space is
bounded by ``max_bytes * (keep + 1)`` plus one line; memory by ``capacity`` lines.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

#: How long the writer thread waits for a line before looking at its stop flag again.
POLL_SECONDS: Final = 0.5


class RotatingFile:
    """Whole lines appended to ``path``; renamed aside past ``max_bytes``, ``keep`` kept."""

    def __init__(self, path: Path, *, max_bytes: int, keep: int) -> None:
        if max_bytes < 1 or keep < 0:
            raise ValueError(f"max_bytes must be >= 1 and keep >= 0, got {max_bytes}, {keep}")
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self._fd: int | None = None
        self._size = 0

    def append(self, line: bytes) -> None:
        """Write ``line`` (it ends with a newline) whole; OSError when the disk refuses."""
        fd = self._open()
        if self._size > 0 and self._size + len(line) > self.max_bytes:
            self._rotate()
            fd = self._open()
        written = os.write(fd, line)
        if written != len(line):
            # A short write on a full disk: end the torn line so the next one stands alone.
            os.write(fd, b"\n")
            raise OSError(f"{self.path}: wrote {written} of {len(line)} bytes")
        self._size += written

    def close(self) -> None:
        """Close the file (a later append opens it again)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            self._size = os.fstat(self._fd).st_size
        return self._fd

    def _rotate(self) -> None:
        self.close()
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
            return
        self._aside(self.keep).unlink(missing_ok=True)
        for number in range(self.keep - 1, 0, -1):
            if self._aside(number).exists():
                os.replace(self._aside(number), self._aside(number + 1))
        if self.path.exists():
            os.replace(self.path, self._aside(1))

    def _aside(self, number: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{number}")


@dataclass
class QueueCounts:
    """What became of the lines offered: written, dropped (queue full), failed (disk)."""

    written: int = 0
    dropped: int = 0
    failed: int = 0


class LineQueue:
    """A bounded queue of lines and the one thread that appends them to a file."""

    def __init__(self, file: RotatingFile, *, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.file = file
        self.counts = QueueCounts()
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=capacity)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: One writer at a time: the thread, or :meth:`drain` called beside it.
        self._writing = threading.Lock()
        self._failing = False

    def offer(self, line: bytes) -> bool:
        """Queue ``line`` without waiting; False (counted as dropped) when the queue is full."""
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self.counts.dropped += 1
            return False
        return True

    def drain(self) -> int:
        """Write the lines queued now (at most the queue's capacity); how many were taken."""
        taken = 0
        for _ in range(self._queue.maxsize):
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            taken += 1
            self._write(line)
        return taken

    def start(self) -> None:
        """Start the writer thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="joblog-ecs-writer",
                                            daemon=True)
            self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop the thread after the lines already queued; False if it outlived ``timeout``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
            self._thread = None
        self.drain()
        self.file.close()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                line = self._queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            self._write(line)
            self.drain()

    def _write(self, line: bytes) -> None:
        with self._writing:
            self._append(line)

    def _append(self, line: bytes) -> None:
        try:
            self.file.append(line)
        except OSError as err:
            self.counts.failed += 1
            if not self._failing:
                log.error("cannot write job-log documents to %s: %s (further failures "
                          "are counted, not logged)", self.file.path, err)
            self._failing = True
            self.file.close()
            return
        if self._failing:
            log.warning("writing job-log documents to %s again", self.file.path)
            self._failing = False
        self.counts.written += 1
