"""Offline analysis: saved logs (files and directories) -> findings, ranks, a root cause.

What ``sn-monitor logs analyze`` runs: every file named (a directory: every file under
it, in name order) is read in chunks of whole lines through one
:class:`~sn_monitor.joblog.recognition.Recognizer`, its rank and node taken from its path
(and from its lines), and the findings of all of them ordered by
:func:`~sn_monitor.joblog.rootcause.order`. Reading is bounded: at most
:data:`MAX_FILES` files, each read :data:`CHUNK_BYTES` at a time.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sn_monitor.errors import SnMonitorError
from sn_monitor.joblog.context import Origin, origin_of
from sn_monitor.joblog.errorfile import parse_error_file
from sn_monitor.joblog.model import Finding, Participant, RootCause
from sn_monitor.joblog.recognition import Recognizer
from sn_monitor.joblog.rootcause import order

#: The most files one analysis reads (a directory of a 10,000-rank job's logs).
MAX_FILES: Final = 20_000
#: How much of a file is read at once.
CHUNK_BYTES: Final = 1 << 20
#: The longest line kept whole; a longer one is read as several.
MAX_LINE_BYTES: Final = 16 * CHUNK_BYTES


class LogsError(SnMonitorError):
    """A path that cannot be analysed (missing, unreadable, too many files)."""


@dataclass(frozen=True)
class Analysis:
    """What the logs say: every finding, the ranks read, the root cause."""

    findings: tuple[Finding, ...]
    participants: tuple[Participant, ...]
    root_cause: RootCause | None
    files: int
    lines: int


def log_files(paths: Sequence[Path]) -> list[Path]:
    """The files named, directories walked (hidden entries skipped); LogsError if missing."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.is_file()
                                and not any(part.startswith(".")
                                            for part in p.relative_to(path).parts)))
        elif path.is_file():
            found.append(path)
        else:
            raise LogsError(f"{path}: no such file or directory")
        if len(found) > MAX_FILES:
            raise LogsError(f"more than {MAX_FILES} files under {path}: name fewer")
    return found


def analyze(paths: Sequence[Path], recognizer: Recognizer | None = None) -> Analysis:
    """Recognise every line of every file and order the findings into one root cause."""
    recognizer = recognizer or Recognizer()
    findings: list[Finding] = []
    participants: list[Participant] = []
    files = log_files(paths)
    lines = 0
    for path in files:
        file_findings, file_participants, read = _one_file(recognizer, path)
        findings.extend(file_findings)
        participants.extend(file_participants)
        lines += read
    return Analysis(findings=tuple(findings), participants=tuple(participants),
                    root_cause=order(findings, participants=participants),
                    files=len(files), lines=lines)


def _one_file(recognizer: Recognizer,
              path: Path) -> tuple[list[Finding], list[Participant], int]:
    origin = origin_of(str(path))
    if path.suffix == ".json":
        found = _error_file(recognizer, path, origin)
        if found is not None:
            return found, [], 1
    try:
        year = datetime.datetime.fromtimestamp(path.stat().st_mtime, tz=datetime.UTC).year
        stream = recognizer.stream(str(path), origin, year=year)
        found = [finding for chunk in _chunks(path) for finding in stream.feed(chunk)]
    except OSError as err:
        raise LogsError(f"{path}: cannot read: {err.strerror or err}") from None
    found.extend(stream.close())
    return found, _participants(origin, str(path), stream.prefixed_ranks, stream.lines), \
        stream.lines


def _error_file(recognizer: Recognizer, path: Path, origin: Origin) -> list[Finding] | None:
    """A torch elastic error file's findings, dated by the file; None if it is not one.

    Its traceback is read as the rank's log would be; every finding is on the file's one
    line, with the file's time where the line has none.
    """
    try:
        if path.stat().st_size > MAX_LINE_BYTES:
            return None
        error = parse_error_file(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as err:
        raise LogsError(f"{path}: cannot read: {err.strerror or err}") from None
    if error is None:
        return None
    year = datetime.datetime.fromtimestamp(error.timestamp or 0, tz=datetime.UTC).year
    found = recognizer.scan(str(path), error.py_callstack or error.message, origin, year=year)
    return [dataclasses.replace(f, line=1, timestamp=f.timestamp or error.timestamp)
            for f in found]


def _participants(origin: Origin, file: str, prefixed: set[int],
                  lines: int) -> list[Participant]:
    ranks = set(prefixed)
    if origin.rank is not None:
        ranks.add(origin.rank)
    return [Participant(rank=rank, file=file, node=origin.node, lines=lines,
                        shared=len(ranks) > 1) for rank in sorted(ranks)]


def _chunks(path: Path) -> Iterator[str]:
    """The file's text in chunks that end at a line break (the last may not)."""
    carry = ""
    with path.open(encoding="utf-8", errors="replace", newline="") as handle:
        while True:
            block = handle.read(CHUNK_BYTES)
            if not block:
                break
            text = carry + block
            cut = text.rfind("\n") + 1
            if cut == 0 and len(text) < MAX_LINE_BYTES:
                carry = text
                continue
            cut = cut or len(text)  # a line longer than MAX_LINE_BYTES is cut there
            carry = text[cut:]
            yield text[:cut]
    if carry:
        yield carry
