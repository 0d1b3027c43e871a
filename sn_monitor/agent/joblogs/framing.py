"""Raw lines to records: the :class:`Decoder` a file's lines go through, and plain text's.

A file's tail cuts its bytes into lines (at most ``max_line_bytes`` each, ``cut`` when
longer); a decoder turns each into a :class:`~.lines.LogLine`, or into nothing yet (a
CRI partial line waits for its end) or nothing at all (a line not in its format, which
the decoder counts as ``unparsed``). Bytes that are not UTF-8 are replaced (U+FFFD), never
an error.
"""

from __future__ import annotations

from typing import Protocol

from sn_monitor.agent.joblogs.lines import LineContext, LogLine


class Decoder(Protocol):
    """Turns one file's raw lines into records, in the order they were read."""

    def decode(self, raw: bytes, cut: bool, read_at: float) -> LogLine | None:
        """The record of ``raw`` (no newline); None when it yields none (yet)."""
        ...


def text_of(raw: bytes) -> str:
    """``raw`` as text: UTF-8 with bad bytes replaced, a trailing carriage return dropped."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    return raw.decode("utf-8", "replace")


class PlainDecoder:
    """A plain text file: every line is a record, with no timestamp of its own."""

    def __init__(self, context: LineContext) -> None:
        self.context = context

    def decode(self, raw: bytes, cut: bool, read_at: float) -> LogLine:
        return LogLine(self.context, text_of(raw), read_at, None, self.context.stream, cut)
