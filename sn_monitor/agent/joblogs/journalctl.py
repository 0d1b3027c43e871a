"""A systemd unit's journal, followed through a ``journalctl --follow`` subprocess.

``journalctl --follow --output=json --unit=U`` runs as an argument list (no shell) in a
session of its own, its output read without blocking on the reader thread's polls.
Each entry's ``__CURSOR`` is kept (and, with a ``cursor_file``, saved at most every
:data:`CURSOR_SAVE_SECONDS` and at close, written whole by rename): a journalctl that
exits is restarted after :data:`RESTART_SECONDS` with ``--after-cursor``, and so is the
agent after a restart, so nothing is read twice. Without a cursor the unit is read from
now (``--lines=0``), or from its start (``--lines=all``) with ``from_start``.

**Rate.** Unlike a file, a journal is not skipped when over the rate: the entries wait
in the journal (journalctl blocks on its full pipe), and are read later; the reader
falls behind instead of dropping. An output line longer than :data:`MAX_ENTRY_BYTES` is
skipped (counted ``unparsed``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from sn_monitor.agent.joblogs.bounds import CHUNK_BYTES, FollowLimits, TokenBucket
from sn_monitor.agent.joblogs.journal import journal_lines, parse_journal_entry
from sn_monitor.agent.joblogs.lines import LineContext, LogLine
from sn_monitor.agent.joblogs.stats import SourceCounters
from sn_monitor.clock import Clock

log = logging.getLogger(__name__)

#: Seconds before an exited journalctl is started again.
RESTART_SECONDS = 5.0
#: Seconds between two saves of a changed cursor.
CURSOR_SAVE_SECONDS = 5.0
#: The longest JSON line read (journald's own line limit is 48 KiB, escaped it grows).
MAX_ENTRY_BYTES = 256 << 10
#: Seconds journalctl is given to end after SIGTERM before it is killed.
STOP_GRACE_SECONDS = 1.0

#: Starts journalctl (``subprocess.Popen`` with these arguments, or a test's stand-in).
Launcher = Callable[[list[str]], "subprocess.Popen[bytes]"]


def launch(argv: list[str]) -> subprocess.Popen[bytes]:
    """Start ``argv`` with its output on a non-blocking pipe, in a session of its own."""
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    assert process.stdout is not None
    os.set_blocking(process.stdout.fileno(), False)
    return process


class JournalUnit:
    """Unit ``unit``'s journal through ``journalctl`` (a name on PATH or a path)."""

    def __init__(self, unit: str, context: LineContext, counters: SourceCounters,
                 limits: FollowLimits, clock: Clock, *, journalctl: str = "journalctl",
                 cursor_file: Path | None = None, start: Launcher = launch) -> None:
        self.unit = unit
        self._context = context
        self._counters = counters
        self._limits = limits
        self._clock = clock
        self._journalctl = journalctl
        self._cursor_file = cursor_file
        self._start = start
        self._bucket = TokenBucket(limits.bytes_per_second, limits.burst_bytes, clock)
        self._process: subprocess.Popen[bytes] | None = None
        self._restart_at = clock.monotonic()
        self._pending = b""
        self._skipping = False
        self.cursor = self._load_cursor()
        self._saved_cursor = self.cursor
        self._saved_at = clock.monotonic()

    @property
    def running(self) -> bool:
        """Whether a journalctl runs for the unit now (else one starts when due)."""
        return self._process is not None

    def argv(self) -> list[str]:
        """The arguments of journalctl: the unit as JSON, after the cursor if there is one."""
        where = ([f"--after-cursor={self.cursor}"] if self.cursor
                 else ["--lines=all" if self._limits.from_start else "--lines=0"])
        return [self._journalctl, "--follow", "--output=json", "--no-pager",
                f"--unit={self.unit}", *where]

    def poll(self, shared: TokenBucket, emit: Callable[[LogLine], None]) -> None:
        """Start journalctl when due, read what it wrote (as far as the rate allows)."""
        now = self._clock.monotonic()
        if self._process is None:
            if now < self._restart_at:
                return
            self._begin()
        allowed = min(self._bucket.available(), shared.available())
        if allowed > 0 and self._process is not None:
            done = self._read(self._process, allowed, emit)
            self._bucket.take(done)
            shared.take(done)
        if self.cursor != self._saved_cursor and now - self._saved_at >= CURSOR_SAVE_SECONDS:
            self._save_cursor(now)

    def close(self) -> None:
        """Stop journalctl and save the cursor."""
        if self._process is not None:
            self._end(self._process)
        self._save_cursor(self._clock.monotonic())

    def _begin(self) -> None:
        argv = self.argv()
        try:
            self._process = self._start(argv)
        except OSError as err:
            log.warning("cannot run %s: %s; trying again in %.0f s", argv[0], err,
                        RESTART_SECONDS)
            self._restart_at = self._clock.monotonic() + RESTART_SECONDS
            return
        self._pending, self._skipping = b"", False

    def _read(self, process: subprocess.Popen[bytes], allowed: int,
              emit: Callable[[LogLine], None]) -> int:
        """Read what journalctl wrote, up to ``allowed`` bytes; the bytes read."""
        assert process.stdout is not None
        done = 0
        while done < allowed:
            try:
                data = os.read(process.stdout.fileno(), min(CHUNK_BYTES, allowed - done))
            except BlockingIOError:
                break
            if not data:  # journalctl ended
                code = process.wait()
                log.warning("journalctl for %s exited (%s); starting it again in %.0f s",
                            self.unit, code, RESTART_SECONDS)
                self._end(process)
                break
            done += len(data)
            self._feed(data, emit)
        self._counters.bytes += done
        return done

    def _feed(self, data: bytes, emit: Callable[[LogLine], None]) -> None:
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        if self._skipping and lines:
            lines, self._skipping = lines[1:], False
        read_at = self._clock.time()
        for raw in lines:
            entry = parse_journal_entry(raw) if raw.strip() else None
            if entry is None:
                self._counters.dropped_lines_unparsed += int(bool(raw.strip()))
                continue
            self.cursor = entry.cursor or self.cursor
            records, cut_bytes = journal_lines(entry, self._context, read_at,
                                               self._limits.max_line_bytes)
            self._counters.dropped_bytes_too_long += cut_bytes
            for record in records:
                emit(record)
        if len(self._pending) > MAX_ENTRY_BYTES:
            self._counters.dropped_lines_unparsed += 1
            self._pending, self._skipping = b"", True

    def _end(self, process: subprocess.Popen[bytes]) -> None:
        """Stop ``process`` (SIGTERM, then SIGKILL after the grace) and reap it."""
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
        self._process = None
        self._restart_at = self._clock.monotonic() + RESTART_SECONDS

    def _load_cursor(self) -> str | None:
        if self._cursor_file is None:
            return None
        try:
            return self._cursor_file.read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as err:
            log.warning("cannot read journal cursor %s (%s): reading %s from now",
                        self._cursor_file, err, self.unit)
            return None

    def _save_cursor(self, now: float) -> None:
        if self._cursor_file is None or self.cursor is None or self.cursor == self._saved_cursor:
            return
        temporary = self._cursor_file.with_name(self._cursor_file.name + ".new")
        try:
            self._cursor_file.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(self.cursor + "\n", encoding="utf-8")
            os.replace(temporary, self._cursor_file)
        except OSError as err:
            log.warning("cannot save journal cursor %s: %s", self._cursor_file, err)
            with contextlib.suppress(OSError):
                temporary.unlink()
        self._saved_cursor, self._saved_at = self.cursor, now
