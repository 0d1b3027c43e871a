"""Blocks that span lines: a Python traceback and torchrun's "Root Cause" block.

Each reader takes the lines that follow its opening line (with the stream's line prefix
removed) one at a time and says when the block is complete, with the fields it read, or
that the text was not such a block after all. Every reader is bounded: a block longer
than :data:`MAX_BLOCK_LINES` lines is given up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final, Literal

#: The line that opens a traceback block and the one that opens a root-cause block.
TRACEBACK_MARK: Final = "Traceback (most recent call last):"
ROOT_CAUSE_MARK: Final = "Root Cause (first observed failure):"

#: The most lines one block may hold before it is given up (a runaway traceback).
MAX_BLOCK_LINES: Final = 400

_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+)(?:, in (?P<function>.+))?')
_EXCEPTION = re.compile(r"^(?P<qualified>(?:[A-Za-z_]\w*\.)*(?P<exception>[A-Z]\w*))"
                        r"(?::\s?(?P<message>.*))?$")
_FIELD = re.compile(r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?"
                    r"(?P<value>.*)$")
_RANK_VALUE = re.compile(r"^\s*(?P<rank>-?\d+)(?:\s*\(local_rank:\s*(?P<local_rank>\d+)\))?")
_EXIT_VALUE = re.compile(r"^\s*(?P<exitcode>-?\d+)(?:\s*\(pid:\s*(?P<pid>\d+)\))?")

Status = Literal["more", "done", "not-a-block"]

_TABLE_LINE = re.compile(r"^\s*(?:exitcode|traceback|error_file)\s*:")
_TABLE_ENTRY = re.compile(r"^\s*\[\d+\]:\s*$")
#: How far back from a field of torchrun's failure table its entry's rank may be.
_TABLE_ENTRY_LINES: Final = 6


def table_rank(text: str, start: int) -> int | None:
    """The rank of the torchrun failure-table entry whose field starts ``text`` at ``start``.

    torchrun's ``Failures:`` table lists each failed rank as an entry (``[0]:``, then
    ``time``, ``host``, ``rank : 2 (local_rank: 2)``, ``exitcode``, ...): the exitcode or
    traceback line that names the failure does not name the rank, the entry's rank line
    above it does. None when the line is no such field or no rank line is found in its
    entry (within the text given: a live stream's chunk may have cut it off).
    """
    end = text.find("\n", start)
    if _TABLE_LINE.match(text[start:end if end >= 0 else len(text)]) is None:
        return None
    stop = start
    for _ in range(_TABLE_ENTRY_LINES):
        if stop <= 0:
            return None
        begin = text.rfind("\n", 0, stop - 1) + 1
        line = text[begin:stop - 1]
        if _TABLE_ENTRY.match(line) or line.strip().startswith(("===", "---")):
            return None
        found = _FIELD.match(line)
        if found is not None and found["key"] == "rank":
            rank = _RANK_VALUE.match(found["value"])
            return int(rank["rank"]) if rank is not None else None
        stop = begin
    return None


@dataclass
class TracebackReader:
    """A Python traceback: frames, then the exception line that ends it."""

    lines: int = 0
    frame: str = ""
    function: str = ""
    fields: dict[str, str] = field(default_factory=dict)

    def take(self, body: str) -> Status:
        """One more line; ``done`` on the exception line (its fields in :attr:`fields`)."""
        self.lines += 1
        if self.lines > MAX_BLOCK_LINES:
            return "not-a-block"
        if body[:1] in (" ", "\t"):
            frame = _FRAME.match(body)
            if frame is not None:
                self.frame = body.strip()
                self.function = (frame["function"] or "").strip()
            return "more"
        found = _EXCEPTION.match(body.rstrip())
        if found is None:
            return "not-a-block"
        self.fields = {"exception": found["exception"], "qualified": found["qualified"],
                       "message": (found["message"] or "").strip(), "frame": self.frame,
                       "function": self.function}
        return "done"


@dataclass
class RootCauseReader:
    """torchrun's ``Root Cause (first observed failure):`` block, up to its ``====`` rule."""

    lines: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    #: The exitcode line's number within the block and its text: the finding's line.
    exit_line: int = 0
    exit_text: str = ""

    def take(self, body: str) -> Status:
        """One more line; ``done`` at the closing rule when an exit code was read."""
        self.lines += 1
        stripped = body.strip()
        if self.lines > 24 or stripped.startswith(("===", "---")) or (
                not stripped and self.fields):
            return "done" if "exitcode" in self.fields else "not-a-block"
        found = _FIELD.match(body)
        if found is None:
            return "more"
        key, value = found["key"], found["value"].strip()
        if key == "rank":
            self._read(_RANK_VALUE, value)
        elif key == "exitcode":
            self._read(_EXIT_VALUE, value)
            self.exit_line, self.exit_text = self.lines, body
        else:
            self.fields[key] = value
        return "more"

    def _read(self, pattern: re.Pattern[str], value: str) -> None:
        found = pattern.match(value)
        if found is not None:
            self.fields.update({k: v for k, v in found.groupdict().items() if v is not None})
