"""The controllers a report may go to, which one gets it, and the backoff after a failed round.

Tried in order, sticky: reports go to the controller that last accepted one. A controller
that cannot be reached or answers as a standby passes the report to the next at once; a
round in which every controller failed, or any other failure, backs off exponentially
from one interval up to the maximum, with jitter. A refusal is logged once per distinct
message. Imports :mod:`.replies`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

from sn_monitor.agent.reporter.replies import Failure
from sn_monitor.clock import Clock
from sn_monitor.transport import redact_url

log = logging.getLogger(__package__)  # the reporter's one logger (see .replies)

_JITTER = 0.2
#: The statuses of a report refused for what it says (malformed, invalid).
_REFUSED_FOR_CONTENT = frozenset({400, 422})
_MAX_LOGGED_MESSAGES = 64


class Controllers:
    """The controllers (``urls``, in order), the current one and the backoff.

    ``interval`` is the first backoff (seconds), ``max_backoff`` the longest (at least
    ``interval``), ``rng`` draws the jitter; ``node`` goes into each log line's context.
    """

    def __init__(self, urls: Sequence[str], node: str, clock: Clock, *, interval: float,
                 max_backoff: float, rng: random.Random) -> None:
        if not urls:
            raise ValueError("no controller URL")
        if len({url.partition("://")[0] for url in urls}) > 1:
            raise ValueError("every controller URL must use one scheme")
        #: The controllers, in order (no trailing ``/``).
        self.urls: tuple[str, ...] = tuple(url.rstrip("/") for url in urls)
        self._current = 0
        self._node = node
        self._clock = clock
        self._interval = float(interval)
        self._max_backoff = max(max_backoff, interval)
        self._rng = rng
        #: Failed rounds in a row.
        self._streak = 0
        self._logged: set[str] = set()
        #: Times a report was accepted by another controller than the one before.
        self.switches_total = 0
        #: The controller that accepted the latest accepted report (None: none yet).
        self.in_use: str | None = None
        #: Wall time of the last report the controller accepted.
        self.last_success_wall: float | None = None
        #: Monotonic time before which no report is attempted (None: not backing off).
        self.backoff_until: float | None = None

    def backing_off(self) -> bool:
        """Whether a failed round's backoff still holds every report back."""
        return self.backoff_until is not None and self._clock.monotonic() < self.backoff_until

    @property
    def url(self) -> str:
        """The controller the next report goes to."""
        return self.urls[self._current]

    def named(self) -> str:
        """``controller http://ctl:9848``: the one this attempt went to, for a message."""
        return f"controller {redact_url(self.url)}"

    def refused(self, status: int, text: str, retry_after: float | None, *,
                standby: bool) -> Failure:
        """The failure an answer other than 2xx is (a refusal is logged once)."""
        if standby:
            return Failure(f"{self.named()} is a standby", retry_after=retry_after,
                           fail_over=True)
        if status == 429 or status >= 500:
            return Failure(f"{self.named()} answered {status}: {text}",
                           retry_after=retry_after)
        message = f"{self.named()} refused the report ({status}): {text}"
        if message not in self._logged:
            if len(self._logged) >= _MAX_LOGGED_MESSAGES:
                self._logged.clear()
            self._logged.add(message)
            log.error("%s", message, extra={"node": self._node})
        return Failure(message, quiet=True, refused=status in _REFUSED_FOR_CONTENT)

    def switch(self, why: str, *, last: bool) -> None:
        """Move to the next controller; ``last``: back to where this round began.

        ``why`` names the controller it failed on (as every failure's message does).
        """
        self._current = (self._current + 1) % len(self.urls)
        if last:
            return  # the round failed: the backoff's warning says so
        # Once per outage at INFO (the first round); while every controller stays
        # unreachable, each round would say the same again.
        level = logging.INFO if self._streak == 0 else logging.DEBUG
        log.log(level, "%s; switching to %s", why, redact_url(self.url),
                extra={"node": self._node})

    def reached(self) -> None:
        """The current controller accepted a report: the outage, if any, is over."""
        if self.in_use is not None and self.url != self.in_use:
            self.switches_total += 1
        if self._streak:
            moved = "" if self.url == self.in_use else f", at {redact_url(self.url)}"
            if moved and self.in_use is not None:
                moved += f" (was {redact_url(self.in_use)})"
            log.info("controller reachable again after %d failed reports%s", self._streak,
                     moved, extra={"node": self._node})
        self.in_use = self.url
        self._streak = 0
        self._logged.clear()
        self.backoff_until = None
        self.last_success_wall = self._clock.time()

    def failed(self, message: str, *, retry_after: float | None = None,
               quiet: bool = False) -> None:
        """A round of attempts failed: back off before the next."""
        self._streak += 1
        delay = min(self._max_backoff, self._interval * 2.0 ** (self._streak - 1))
        delay = min(self._max_backoff, delay * self._rng.uniform(1.0 - _JITTER, 1.0 + _JITTER))
        if retry_after is not None:
            delay = max(delay, min(self._max_backoff, retry_after))
        self.backoff_until = self._clock.monotonic() + delay
        if quiet:
            return
        if self._streak == 1:
            log.warning("%s; retrying in %.1f s (events stay spooled)", message, delay,
                        extra={"node": self._node})
        else:
            log.debug("%s (%d in a row); retrying in %.1f s", message, self._streak, delay,
                      extra={"node": self._node})
