"""A line of a job's log as the agent read it, and where it came from.

A :class:`LineContext` is shared by every line of one file (or journald unit): the job
named in the config, the rank and node the path gives, the pod and container a CRI name
gives. A :class:`LogLine` adds the text, when it was read (the reader's clock) and when it
was logged, where the format says (CRI and journald carry a timestamp; plain files do not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: The kind of source a line came from.
SourceKind = Literal["file", "container", "journald"]
#: The stream a line was written to, where known (CRI lines, torchrun's stdout.log/stderr.log).
Stream = Literal["stdout", "stderr"]


@dataclass(frozen=True, slots=True)
class LineContext:
    """Where the lines of one file or unit come from.

    ``source``: the configured source's name, the ``source`` label of its counters
    (``file:<job>``, ``containers``, ``journald:<unit>``); ``origin``: the file's path or
    the unit. ``rank`` and ``local_rank``: the global and node-local rank when the path
    names them (torchrun's ``--log-dir`` names only the local rank); ``node`` when the
    path names it (else the line was read on this agent's node).
    """

    kind: SourceKind
    source: str
    origin: str
    job: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    node: str | None = None
    stream: Stream | None = None
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line: its text (no newline), when it was read and, if the format says, logged.

    ``read_at`` and ``logged_at`` are seconds since the epoch; ``cut``: the line was
    longer than ``max_line_bytes`` and only its start is kept.
    """

    context: LineContext
    text: str
    read_at: float
    logged_at: float | None = None
    stream: Stream | None = None
    cut: bool = False
