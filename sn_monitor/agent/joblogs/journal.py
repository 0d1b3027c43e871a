"""One entry of ``journalctl --output=json`` to line records. Pure.

journalctl writes one JSON object per entry and line. ``MESSAGE`` is a string, or an
array of byte values when it is not valid UTF-8 (or ``null`` when too large to show); a
field written more than once is an array of its values (the first is taken).
``__REALTIME_TIMESTAMP`` is microseconds since the epoch, as a string; ``__CURSOR`` is
where the entry is, which ``--after-cursor`` resumes after. A message of several lines
(a traceback logged at once) becomes one record per line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sn_monitor.agent.joblogs.lines import LineContext, LogLine


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """What a journal entry gives a log line: its cursor, time, message, unit and pid."""

    cursor: str | None
    logged_at: float | None
    message: str
    unit: str | None = None
    pid: int | None = None


def _first(value: Any) -> Any:
    """A field's value (the first, if it was written more than once)."""
    if isinstance(value, list) and value and not all(isinstance(v, int) for v in value):
        return value[0]
    return value


def _text(value: Any) -> str | None:
    value = _first(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, int) and 0 <= v < 256 for v in value):
        return bytes(value).decode("utf-8", "replace")
    return None


def parse_journal_entry(raw: bytes | str) -> JournalEntry | None:
    """One line of ``journalctl -o json`` -> its entry; None when it is not one."""
    try:
        fields = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(fields, dict):
        return None
    message = _text(fields.get("MESSAGE"))
    if message is None:
        return None
    micros, pid = _text(fields.get("__REALTIME_TIMESTAMP")), _text(fields.get("_PID"))
    return JournalEntry(
        cursor=_text(fields.get("__CURSOR")),
        logged_at=int(micros) / 1e6 if micros is not None and micros.isdigit() else None,
        message=message,
        unit=_text(fields.get("_SYSTEMD_UNIT")),
        pid=int(pid) if pid is not None and pid.isdigit() else None)


def journal_lines(entry: JournalEntry, context: LineContext, read_at: float,
                  max_line_bytes: int) -> tuple[list[LogLine], int]:
    """The entry's message as records, one per line, and the bytes cut off.

    Each line is cut at ``max_line_bytes``.
    """
    out, cut_bytes = [], 0
    for text in entry.message.splitlines() or [""]:
        data = text.encode("utf-8", "replace")
        cut = len(data) > max_line_bytes
        if cut:
            cut_bytes += len(data) - max_line_bytes
            text = data[:max_line_bytes].decode("utf-8", "ignore")
        out.append(LogLine(context, text, read_at, entry.logged_at, None, cut))
    return out, cut_bytes
