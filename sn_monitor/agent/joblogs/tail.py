"""One open log file, read from an offset onwards: lines, a partial last line, truncation.

**Lines.** Bytes are cut at newlines; the last, unfinished line is held until its newline
comes. A line longer than ``max_line_bytes`` is handed on cut (``cut=True``, its first
``max_line_bytes``), the rest of it is skipped up to the next newline and counted as
``too-long``: memory per file is at most one line.

**Rate.** :meth:`FileTail.read` reads at most ``allowed`` bytes. When more are waiting,
the oldest are skipped unread (counted as ``rate``), then the partial line at the new
offset, up to its newline: what is read is the newest part of the file.

**Truncation.** A file smaller than the offset was truncated (``copytruncate``, or
``> file``): reading starts over at 0, counted, logged once per file (later ones at debug
level). A truncation followed by more writes than were read before it in one poll
interval cannot be told from growth: those bytes are read as if appended.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from sn_monitor.agent.joblogs.bounds import CHUNK_BYTES
from sn_monitor.agent.joblogs.framing import Decoder
from sn_monitor.agent.joblogs.lines import LogLine
from sn_monitor.agent.joblogs.stats import SourceCounters

log = logging.getLogger(__name__)

#: A file's identity across renames: (st_dev, st_ino).
Identity = tuple[int, int]


class FileTail:
    """File ``fd`` (``path`` when opened), followed from ``offset``; owns ``fd``."""

    def __init__(self, path: str, fd: int, offset: int, decoder: Decoder,
                 counters: SourceCounters, max_line_bytes: int) -> None:
        stat = os.fstat(fd)
        self.path = path
        self.identity: Identity = (stat.st_dev, stat.st_ino)
        self.offset = offset
        self.decoder = decoder
        self._fd = fd
        self._counters = counters
        self._max = max_line_bytes
        self._pending = b""
        #: Skipping bytes up to the next newline, and why (``rate``, ``too-long``).
        self._skipping: str | None = None
        self._truncation_logged = False
        self.size = stat.st_size

    def read(self, allowed: int, read_at: float, emit: Callable[[LogLine], None]) -> int:
        """Read up to ``allowed`` new bytes, handing each finished line to ``emit``.

        Returns the bytes read (what the rate buckets spend).
        """
        self.size = os.fstat(self._fd).st_size
        if self.size < self.offset:
            self._truncated()
        waiting = self.size - self.offset
        if waiting <= 0 or allowed <= 0:
            return 0
        if waiting > allowed:
            self._skip(waiting - allowed)
            waiting = allowed
        done = 0
        while done < waiting:
            data = os.pread(self._fd, min(CHUNK_BYTES, waiting - done), self.offset)
            if not data:
                break
            self.offset += len(data)
            done += len(data)
            self._feed(data, read_at, emit)
        self._counters.bytes += done
        return done

    @property
    def at_end(self) -> bool:
        """Whether every byte the file had at the last read has been read."""
        return self.offset >= self.size

    def close(self) -> None:
        """Close the file (the tail is not read again)."""
        os.close(self._fd)

    def _truncated(self) -> None:
        self._counters.truncations += 1
        level = logging.DEBUG if self._truncation_logged else logging.WARNING
        log.log(level, "log file %s was truncated (%d bytes, was read to %d): reading it "
                "from its start", self.path, self.size, self.offset)
        self._truncation_logged = True
        self.offset = 0
        self._pending = b""
        self._skipping = None

    def _skip(self, count: int) -> None:
        """Skip ``count`` bytes unread, and the partial line held (over the rate)."""
        self._counters.dropped_bytes_rate += count + len(self._pending)
        self.offset += count
        self._pending = b""
        at_line_start = os.pread(self._fd, 1, self.offset - 1) == b"\n"
        self._skipping = None if at_line_start else "rate"

    def _feed(self, data: bytes, read_at: float, emit: Callable[[LogLine], None]) -> None:
        if self._skipping is not None:
            data = self._skip_to_newline(data)
            if not data:
                return
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        decode = self.decoder.decode
        for raw in lines:
            cut = len(raw) > self._max
            if cut:
                self._counters.dropped_bytes_too_long += len(raw) - self._max
                raw = raw[:self._max]
            record = decode(raw, cut, read_at)
            if record is not None:
                emit(record)
        if len(self._pending) > self._max:
            record = decode(self._pending[:self._max], True, read_at)
            if record is not None:
                emit(record)
            self._counters.dropped_bytes_too_long += len(self._pending) - self._max
            self._pending = b""
            self._skipping = "too-long"

    def _skip_to_newline(self, data: bytes) -> bytes:
        """``data`` after the newline that ends the line being skipped (b"": none yet)."""
        end = data.find(b"\n")
        skipped = len(data) if end < 0 else end + 1
        if self._skipping == "rate":
            self._counters.dropped_bytes_rate += skipped
        else:
            self._counters.dropped_bytes_too_long += skipped
        if end < 0:
            return b""
        self._skipping = None
        return data[end + 1:]
