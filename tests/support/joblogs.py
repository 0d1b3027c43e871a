"""What the job-log source tests share: a file set over tmp_path with a manual clock."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sn_monitor.agent.joblogs.bounds import FollowLimits, TokenBucket
from sn_monitor.agent.joblogs.fileset import DecoderFactory, FileSet, OpenFiles
from sn_monitor.agent.joblogs.framing import PlainDecoder
from sn_monitor.agent.joblogs.lines import LineContext, LogLine
from sn_monitor.agent.joblogs.paths import path_context
from sn_monitor.agent.joblogs.stats import SourceCounters
from sn_monitor.clock import ManualClock

T = TypeVar("T")

#: A rate no test reaches: reading is bounded by what was written.
UNBOUNDED = 1 << 30


def limits(*, rate: float = UNBOUNDED, max_line: int = 4096, from_start: bool = False,
           rescan: float = 1.0) -> FollowLimits:
    return FollowLimits(bytes_per_second=rate, burst_bytes=rate, max_line_bytes=max_line,
                        rescan_seconds=rescan, from_start=from_start)


def plain(source: str = "file:job") -> DecoderFactory:
    base = LineContext(kind="file", source=source, origin="", job="job")
    return lambda path: PlainDecoder(path_context(base, path, None))


class Files:
    """A file set, its counters, a manual clock, and the lines it has read so far."""

    def __init__(self, patterns: list[str], *, decoder_for: DecoderFactory | None = None,
                 open_files: int = 64, shared_rate: float = UNBOUNDED,
                 counters: SourceCounters | None = None,
                 follow: FollowLimits | None = None) -> None:
        self.clock = ManualClock()
        self.counters = counters or SourceCounters()
        self.open_files = OpenFiles(open_files)
        self.shared = TokenBucket(shared_rate, shared_rate, self.clock)
        self.set = FileSet(patterns, decoder_for or plain(), self.counters, self.open_files,
                           follow or limits(), self.clock)
        self.lines: list[LogLine] = []

    def poll(self) -> list[str]:
        """Poll once; the texts of the lines read by this poll."""
        before = len(self.lines)
        self.set.poll(self.shared, self.lines.append)
        return [line.text for line in self.lines[before:]]

    def later(self, seconds: float = 1.0) -> list[str]:
        """Move the clock on by ``seconds``, then poll."""
        self.clock.advance(seconds)
        return self.poll()


def append(path: Path, data: bytes | str) -> None:
    """Append ``data`` to ``path`` (made if missing)."""
    with path.open("ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def truncate(path: Path, size: int = 0) -> None:
    """Cut ``path`` to ``size`` bytes, in place (its inode kept)."""
    os.truncate(path, size)


def wait_for(probe: Callable[[], T], what: str, timeout: float = 20.0) -> T:
    """``probe()`` until it is truthy, at most ``timeout`` seconds (a wait for a state,
    never a sleep then an assertion); the last answer in the failure."""
    deadline = time.monotonic() + timeout
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; last: {last!r}")
        time.sleep(0.01)


#: A stand-in for journalctl: writes its arguments to $FAKE_JOURNALCTL_ARGV, prints
#: $FAKE_JOURNALCTL_OUTPUT, then waits (with $FAKE_JOURNALCTL_STAY) or exits.
FAKE_JOURNALCTL = """#!/bin/sh
printf '%s\\n' "$*" >> "$FAKE_JOURNALCTL_ARGV"
cat "$FAKE_JOURNALCTL_OUTPUT"
if [ -n "$FAKE_JOURNALCTL_STAY" ]; then exec sleep 60; fi
"""


def fake_journalctl(bin_dir: Path) -> Path:
    """Write the stand-in as ``bin_dir/journalctl``; its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "journalctl"
    script.write_text(FAKE_JOURNALCTL, encoding="utf-8")
    script.chmod(0o755)
    return script
