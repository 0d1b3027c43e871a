"""The files one source's globs match, each followed through rotation.

Every ``rescan`` seconds the globs are expanded again and each regular file is known by
its identity, ``(st_dev, st_ino)``, not its name:

* a file seen at the first scan is read from its end (``from_start``: its start); a
  file that appears later is new, read from its start;
* **rotation** (``train.log`` renamed, a new ``train.log`` made): the old file, still
  open, is read to its end, then closed once it has been at its end for ``rescan``
  seconds; the new one is read from its start. Files are read oldest first (the order
  they were opened; new files in one scan by modification time), so the old file's last
  lines come before the new one's first. A renamed file the glob still matches
  (``train.log*``) is the same file: it is not read twice;
* **rate**: each file reads at most its bucket's bytes and its share of the shared
  bucket (what is left of it divided among the files not yet read in this poll), so a
  noisy rank cannot take the reading of the quiet ones;
* **max open files** (shared by every file set): a new file past the bound closes the
  file here that has been at its end the longest (its offset is remembered, so it is
  resumed, not re-read, if it grows again); with none to close, the new file waits for
  a later scan (logged once).
"""

from __future__ import annotations

import glob
import logging
import os
import stat
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sn_monitor.agent.joblogs.bounds import FollowLimits, TokenBucket
from sn_monitor.agent.joblogs.framing import Decoder
from sn_monitor.agent.joblogs.lines import LogLine
from sn_monitor.agent.joblogs.stats import SourceCounters
from sn_monitor.agent.joblogs.tail import FileTail, Identity
from sn_monitor.clock import Clock

log = logging.getLogger(__name__)

#: How many closed files' offsets are remembered (to resume one that grows again), and how
#: many paths that are not the source's files.
REMEMBERED_OFFSETS = 4096

#: Makes the decoder of a file at a path (None: not a file of this source, e.g. a name
#: that is not a CRI log's).
DecoderFactory = Callable[[str], Decoder | None]


class OpenFiles:
    """The bound on files open at once, shared by every file set."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("at least one file must be allowed open")
        self.limit = limit
        self.count = 0

    def acquire(self) -> bool:
        """Take a slot; False when every slot is taken."""
        if self.count >= self.limit:
            return False
        self.count += 1
        return True

    def release(self) -> None:
        self.count -= 1


@dataclass(slots=True)
class _Followed:
    tail: FileTail
    bucket: TokenBucket
    #: When the file was last read from (monotonic): the longest-idle is closed first.
    active_at: float
    #: When the glob stopped matching it (monotonic), or None.
    detached_at: float | None = None


class FileSet:
    """One source's files: ``patterns`` (globs), lines made by ``decoder_for``."""

    def __init__(self, patterns: Sequence[str], decoder_for: DecoderFactory,
                 counters: SourceCounters, open_files: OpenFiles, limits: FollowLimits,
                 clock: Clock) -> None:
        self._patterns = tuple(patterns)
        self._decoder_for = decoder_for
        self._counters = counters
        self._open_files = open_files
        self._limits = limits
        self._clock = clock
        self._followed: dict[Identity, _Followed] = {}
        self._closed: OrderedDict[Identity, int] = OrderedDict()
        #: Paths that are not this source's files (no decoder): not opened again.
        self._ignored: set[str] = set()
        #: Paths that could not be opened (the warning is logged once for each).
        self._unopened: set[str] = set()
        self._scanned_at: float | None = None
        self._refusal_logged = False

    @property
    def open_count(self) -> int:
        """Files open now."""
        return len(self._followed)

    def poll(self, shared: TokenBucket, emit: Callable[[LogLine], None]) -> None:
        """Rescan when due, then read each file as far as its bucket and ``shared`` allow."""
        now = self._clock.monotonic()
        if self._scanned_at is None or now - self._scanned_at >= self._limits.rescan_seconds:
            self._scan(first=self._scanned_at is None, now=now)
            self._scanned_at = now
        read_at = self._clock.time()
        followed_now = list(self._followed.items())
        for index, (identity, followed) in enumerate(followed_now):
            share = shared.available() // (len(followed_now) - index)
            allowed = min(followed.bucket.available(), share)
            try:
                done = followed.tail.read(allowed, read_at, emit)
            except OSError as err:
                log.warning("cannot read log file %s: %s", followed.tail.path, err)
                self._close(identity, remember=False)
                continue
            followed.bucket.take(done)
            shared.take(done)
            if done:
                followed.active_at = now
            elif (followed.detached_at is not None and followed.tail.at_end
                  and now - followed.detached_at >= self._limits.rescan_seconds):
                self._close(identity, remember=False)

    def close(self) -> None:
        """Close every file."""
        for identity in list(self._followed):
            self._close(identity, remember=False)

    def _scan(self, first: bool, now: float) -> None:
        found = self._expand()
        for identity, followed in self._followed.items():
            seen = found.pop(identity, None)
            if seen is None:
                if followed.detached_at is None:
                    followed.detached_at = now
                    self._counters.rotations += 1
            else:
                followed.tail.path, followed.detached_at = seen[0][0], None
        for identity, (paths, _) in sorted(found.items(), key=lambda item: item[1][1]):
            self._open(identity, paths, first, now)

    def _expand(self) -> dict[Identity, tuple[list[str], float]]:
        """Every regular file the globs match: identity -> (its paths, modification time)."""
        found: dict[Identity, tuple[list[str], float]] = {}
        for pattern in self._patterns:
            for path in sorted(glob.glob(pattern)):
                if path in self._ignored:
                    continue
                try:
                    info = os.stat(path)
                except OSError:  # gone since the listing, or a dangling link
                    continue
                if stat.S_ISREG(info.st_mode):
                    paths, _ = found.setdefault((info.st_dev, info.st_ino), ([], info.st_mtime))
                    paths.append(path)
        return found

    def _decoder(self, paths: list[str]) -> tuple[str, Decoder] | None:
        """The first of ``paths`` that is a file of this source, and its decoder."""
        for path in paths:
            decoder = self._decoder_for(path)
            if decoder is not None:
                return path, decoder
            if len(self._ignored) >= REMEMBERED_OFFSETS:
                self._ignored.clear()
            self._ignored.add(path)
        return None

    def _open(self, identity: Identity, paths: list[str], first: bool, now: float) -> None:
        named = self._decoder(paths)
        if named is None:
            return
        path, decoder = named
        if not self._open_files.acquire() and not self._evict():
            level = logging.DEBUG if self._refusal_logged else logging.WARNING
            log.log(level, "not following log file %s: %d files open already (max_open_files)",
                    path, self._open_files.limit)
            self._refusal_logged = True
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as err:
            self._open_files.release()
            level = logging.DEBUG if path in self._unopened else logging.WARNING
            log.log(level, "cannot open log file %s: %s; trying again at each rescan", path, err)
            if len(self._unopened) >= REMEMBERED_OFFSETS:
                self._unopened.clear()
            self._unopened.add(path)
            return
        size = os.fstat(fd).st_size
        offset = self._closed.pop(identity, None)
        if offset is None or offset > size:
            offset = size if first and not self._limits.from_start else 0
        tail = FileTail(path, fd, offset, decoder, self._counters, self._limits.max_line_bytes)
        bucket = TokenBucket(self._limits.bytes_per_second, self._limits.burst_bytes, self._clock)
        self._followed[tail.identity] = _Followed(tail, bucket, now)

    def _evict(self) -> bool:
        """Close the file here that has been at its end the longest; False: none is."""
        idle = [(f.active_at, identity) for identity, f in self._followed.items()
                if f.tail.at_end]
        if not idle:
            return False
        self._close(min(idle)[1], remember=True)
        return self._open_files.acquire()

    def _close(self, identity: Identity, remember: bool) -> None:
        """Close a file; ``remember``: keep its offset, to resume it if opened again.

        Only for a file the globs still match: a file that left them may be deleted and
        its inode number reused by a new one.
        """
        followed = self._followed.pop(identity)
        followed.tail.close()
        self._open_files.release()
        if not remember:
            return
        self._closed[identity] = followed.tail.offset
        while len(self._closed) > REMEMBERED_OFFSETS:
            self._closed.popitem(last=False)
