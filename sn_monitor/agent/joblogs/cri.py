"""The CRI container log format: ``<RFC 3339 time> <stream> <tag> <text>`` per line.

The kubelet's runtime (containerd, CRI-O) writes each line a container prints as
``2016-10-06T00:17:09.669794202Z stdout F text``; a line longer than the runtime's
buffer (16 KiB) is split into ``P`` (partial) lines ended by an ``F`` (full) one, per
stream. :class:`CriDecoder` joins them back, up to ``max_line_bytes`` (the rest is cut,
counted as ``too-long``), keeping the stream and the first part's time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sn_monitor.agent.joblogs.framing import text_of
from sn_monitor.agent.joblogs.lines import LineContext, LogLine, Stream
from sn_monitor.agent.joblogs.stats import SourceCounters


@dataclass(frozen=True, slots=True)
class CriLine:
    """One line of a CRI log: when, which stream, whether it ends a line, the bytes."""

    logged_at: float
    stream: Stream
    partial: bool
    content: bytes


def parse_cri_line(raw: bytes) -> CriLine | None:
    """One CRI log line (no newline) -> its parts; None when it is not in the format."""
    parts = raw.split(b" ", 3)
    if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
        return None
    tag = parts[2].split(b":", 1)[0]
    if tag not in (b"F", b"P"):
        return None
    try:
        logged_at = datetime.fromisoformat(parts[0].decode("ascii")).timestamp()
    except (UnicodeDecodeError, ValueError):
        return None
    return CriLine(logged_at, "stdout" if parts[1] == b"stdout" else "stderr", tag == b"P",
                   parts[3] if len(parts) == 4 else b"")


@dataclass(slots=True)
class _Pending:
    """A stream's partial line so far."""

    logged_at: float
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    cut: bool = False


class CriDecoder:
    """One CRI log file's lines to records, partial lines joined per stream (bounded)."""

    def __init__(self, context: LineContext, max_line_bytes: int,
                 counters: SourceCounters) -> None:
        self.context = context
        self._max = max_line_bytes
        self._counters = counters
        self._pending: dict[Stream, _Pending] = {}

    def decode(self, raw: bytes, cut: bool, read_at: float) -> LogLine | None:
        line = parse_cri_line(raw)
        if line is None:
            self._counters.dropped_lines_unparsed += 1
            return None
        pending = self._pending.get(line.stream)
        if pending is None:
            if not line.partial:
                return LogLine(self.context, text_of(line.content), read_at, line.logged_at,
                               line.stream, cut)
            pending = self._pending[line.stream] = _Pending(line.logged_at)
        self._add(pending, line.content, cut)
        if line.partial:
            return None
        del self._pending[line.stream]
        return LogLine(self.context, text_of(b"".join(pending.parts)), read_at,
                       pending.logged_at, line.stream, pending.cut)

    def _add(self, pending: _Pending, content: bytes, cut: bool) -> None:
        room = self._max - pending.size
        if len(content) > room:
            self._counters.dropped_bytes_too_long += len(content) - max(room, 0)
            content, cut = content[:max(room, 0)], True
        pending.parts.append(content)
        pending.size += len(content)
        pending.cut = pending.cut or cut
