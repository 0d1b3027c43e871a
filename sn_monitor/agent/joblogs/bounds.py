"""The bounds on reading: a token bucket of bytes per second, and a bounded line queue.

**Rate.** Each stream (a file, a unit) has a :class:`TokenBucket` and all of them share
one more; a stream may read ``min(its tokens, the shared tokens)`` bytes per poll. A file
with more unread bytes than that skips the oldest (seeks past them, unread) and reads
the newest: a job that prints 50 MB/s costs the agent its rate, not 50 MB/s, and what is
read is the end of the log, where a failure is.

**Queue.** :class:`LineQueue` holds at most ``capacity`` lines for the consumer; when it
is full, the *oldest* line is dropped (counted): the newest lines are the ones that say
why a job stopped, and the consumer, once it catches up, reads the present.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sn_monitor.agent.joblogs.lines import LogLine
from sn_monitor.clock import Clock

#: The most one read call asks for: bounds the bytes held at once per file or unit.
CHUNK_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class FollowLimits:
    """How each stream is read: its rate, the longest line, rescans, where to start.

    ``bytes_per_second`` and ``burst_bytes`` make the stream's bucket; ``rescan_seconds``:
    how often a glob is expanded again; ``from_start``: a file or unit already there is
    read from its start (else from its end).
    """

    bytes_per_second: float
    burst_bytes: float
    max_line_bytes: int
    rescan_seconds: float
    from_start: bool = False


class TokenBucket:
    """``rate`` bytes per second, at most ``capacity`` saved up, on ``clock``'s monotonic time.

    Starts full. :meth:`available` refills by the time passed; :meth:`take` spends.
    """

    def __init__(self, rate: float, capacity: float, clock: Clock) -> None:
        if rate <= 0 or capacity <= 0:
            raise ValueError("a token bucket needs a positive rate and capacity")
        self._rate = float(rate)
        self._capacity = float(capacity)
        self._clock = clock
        self._tokens = float(capacity)
        self._at = clock.monotonic()

    def available(self) -> int:
        """Whole bytes that may be read now."""
        now = self._clock.monotonic()
        self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate)
        self._at = now
        return int(self._tokens)

    def take(self, count: int) -> None:
        """Spend ``count`` bytes (never below zero)."""
        self._tokens = max(0.0, self._tokens - count)


class LineQueue:
    """At most ``capacity`` lines, oldest first; full, a new line pushes out the oldest.

    ``dropped(line)`` is called for each line pushed out (on the putting thread). Safe
    for one producer and any consumers.
    """

    def __init__(self, capacity: int, dropped: Callable[[LogLine], None]) -> None:
        if capacity < 1:
            raise ValueError("the queue must hold at least one line")
        self._lines: deque[LogLine] = deque()
        self._capacity = capacity
        self._dropped = dropped
        self._lock = threading.Lock()

    def put(self, line: LogLine) -> None:
        """Queue ``line``; when full, drop the oldest first."""
        with self._lock:
            pushed_out = self._lines.popleft() if len(self._lines) >= self._capacity else None
            self._lines.append(line)
        if pushed_out is not None:
            self._dropped(pushed_out)

    def take(self, limit: int) -> list[LogLine]:
        """Up to ``limit`` lines, oldest first (none: an empty list, without waiting)."""
        with self._lock:
            count = min(limit, len(self._lines))
            return [self._lines.popleft() for _ in range(count)]

    def __len__(self) -> int:
        return len(self._lines)
