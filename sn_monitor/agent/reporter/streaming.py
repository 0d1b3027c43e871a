"""Reports on a stream (:mod:`sn_monitor.agent.stream`) to a controller that has them.

One connection, one frame per report, and an answer only to a report that asks (or whose
answer carries commands or rules). Answers that came on their own are read before the
next report. A controller that answers the opening 404 (an earlier version), or whose TLS
the stream cannot set up, gets posted reports for :data:`STREAM_RETRY_SECONDS`; every
other outcome is a failure like a post's. Imports :mod:`.failover` and :mod:`.replies`.
"""

from __future__ import annotations

import logging
import math
import ssl
from collections.abc import Callable
from typing import Literal

from sn_monitor.agent.reporter.failover import Controllers
from sn_monitor.agent.reporter.replies import Failure, Reply, decode_reply
from sn_monitor.agent.stream import (
    ReportStream,
    StreamAnswer,
    StreamClosed,
    StreamRefused,
    tls_context,
)
from sn_monitor.clock import Clock
from sn_monitor.report_stream import NO_STREAM_STATUSES
from sn_monitor.transport import describe_failure, redact_url

log = logging.getLogger(__package__)  # the reporter's one logger (see .replies)

#: Seconds a controller without streams (or a stream that TLS could not set up) gets
#: posted reports before the agent tries a stream again.
STREAM_RETRY_SECONDS = 600.0

#: Takes a reply: (the reply, the command results it acknowledges, whether it answers
#: the report just sent).
TakeReply = Callable[[Reply, int, bool], None]


class StreamChannel:
    """The stream to the current controller of ``controllers``, opened when needed.

    ``enabled`` False: every report is posted. ``verify`` and ``cert`` set up its TLS.
    """

    def __init__(self, controllers: Controllers, token: str | None, timeout: float,
                 clock: Clock, node: str, *, enabled: bool, verify: bool | str,
                 cert: tuple[str, str] | None) -> None:
        self._controllers = controllers
        self._token = token
        self._timeout = timeout
        self._clock = clock
        self._node = node
        self.enabled = enabled
        self._verify = verify
        self._cert = cert
        self._stream: ReportStream | None = None
        #: Per controller URL: monotonic time before which its reports are posted.
        self._no_stream_until: dict[str, float] = {}
        #: Monotonic time of the last report that asked for an answer.
        self.asked_at = -math.inf

    @property
    def streaming(self) -> bool:
        """Whether reports go on a stream now."""
        return self._stream is not None

    def attempt(self, body: bytes, ask: bool, sequence: int, results_sent: int,
                take: TakeReply) -> Literal[True] | Failure | None:
        """Send the report on a stream: True when sent (and, if it asked, accepted).

        ``sequence`` is the report's; each reply is handed to ``take``. None: the current
        controller gets posted reports (no streams there, or not now).
        """
        opened = self._open(sequence, take)
        if opened is None or isinstance(opened, Failure):
            return opened
        fresh, stream = opened
        ask = ask or fresh
        try:
            stream.send(body, self._timeout, ask=ask)
            # An answer to a report that did not ask is read before the next report.
            answers = stream.wait(sequence, self._timeout) if ask else []
        except OSError as err:  # a timeout, the controller gone, an answer not one
            self.close()
            return Failure(f"{self._controllers.named()} unreachable: {describe_failure(err)} "
                           "(on the reports' stream)", fail_over=True)
        if ask:
            self.asked_at = self._clock.monotonic()
        return self._answered(answers, results_sent if ask else 0, sequence, take)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _open(self, sequence: int, take: TakeReply
              ) -> tuple[bool, ReportStream] | Failure | None:
        """The stream to the current controller, (opened just now, it); None: post."""
        url = self._controllers.url
        if not self.enabled or self._clock.monotonic() < self._no_stream_until.get(url, -1.0):
            self.close()
            return None
        stream = self._stream
        if stream is not None and stream.url == url:
            try:
                answers = stream.poll()  # answers that came on their own; is it still open?
            except OSError as err:
                level = logging.DEBUG if isinstance(err, StreamClosed) else logging.WARNING
                log.log(level, "stream to %s ended: %s; opening another", redact_url(url),
                        err, extra={"node": self._node})
                self.close()
            else:
                taken = self._answered(answers, 0, sequence, take)
                return (False, stream) if taken is True else taken
        self.close()
        try:
            tls = tls_context(self._verify, self._cert) if url.startswith("https://") else None
            stream = ReportStream.open(url, self._token, self._timeout, tls)
        except StreamRefused as err:
            if err.status not in NO_STREAM_STATUSES:
                return self._controllers.refused(err.status, err.text, err.retry_after,
                                                 standby=err.standby)
            self._post_for_now(url, f"it has no reports' stream ({err.status})")
            return None
        except ssl.SSLError as err:
            self._post_for_now(url, f"no TLS for a stream: {err}")
            return None
        except OSError as err:
            return Failure(f"{self._controllers.named()} unreachable: {describe_failure(err)}",
                           fail_over=True)
        log.debug("reports go on a stream to %s", redact_url(url), extra={"node": self._node})
        self._stream = stream
        return True, stream

    def _post_for_now(self, url: str, why: str) -> None:
        """Post the reports to ``url`` for STREAM_RETRY_SECONDS."""
        self._no_stream_until[url] = self._clock.monotonic() + STREAM_RETRY_SECONDS
        log.info("posting reports to %s: %s (a stream is tried again in %.0f s)",
                 redact_url(url), why, STREAM_RETRY_SECONDS, extra={"node": self._node})

    def _answered(self, answers: list[StreamAnswer], results_sent: int, sequence: int,
                  take: TakeReply) -> Literal[True] | Failure:
        """Take a stream's answers; the failure among them, if any (True: none)."""
        outcome: Literal[True] | Failure = True
        for answer in answers:
            ours = answer.sequence == sequence
            if answer.status != 200:
                outcome = self._controllers.refused(answer.status, answer.error,
                                                    answer.retry_after, standby=False)
                continue
            if not len(answer.reply):
                continue
            reply = decode_reply(answer.reply, self._controllers.named())
            if isinstance(reply, Failure):
                outcome = reply
                continue
            take(reply, results_sent if ours else 0, ours)
        return outcome
