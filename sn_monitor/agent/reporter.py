"""Sends a report to the controller after each sample and hands back its commands.

``POST {url}/api/v1/reports`` with a JSON :class:`Report`, ``Authorization: Bearer``, over
one keep-alive :class:`requests.Session` (over HTTPS: ``verify`` is the CA bundle the
controller's certificate must chain to, ``cert`` the agent's client certificate and key).
Events ride along from the :class:`EventSpool` and leave it only when a reply says the
controller stored them (``events_stored_through``), so an outage or a restart loses
none; metrics are never resent, the controller sees fresh samples when it is back.

When the controller is unreachable (connection refused, timeout, 5xx, 429) the reporter
backs off: exponentially from one interval up to :data:`MAX_BACKOFF_SECONDS`, with
jitter so a supernode's agents do not return in lockstep. While backing off
:meth:`Reporter.report` makes no network call and returns no commands; sampling, the
guard and /metrics go on. Any other 4xx (a report the controller refuses, a bad token)
is also a failure; its message is logged once per distinct message, because the same
report will be refused again every second.

Several controllers (a high-availability pair on bare metal, where no Service picks the
active one) are tried in order, sticky: reports go to the controller that last accepted
one. When it cannot be reached (connection refused, timeout, TLS) or answers as a
standby (503 with ``X-SN-Controller-Role: standby``), the same report goes to the next
controller at once, without backing off and whatever the standby's ``Retry-After``; only
when every controller failed in one such round does the backoff above apply, and the
next round starts from the same controller again. Any other failure (a 5xx or 429 from
the active controller, a refusal, a redirect) backs off on that controller as with one.

The reply is decoded leniently: a command this agent does not understand (a newer
controller) is answered with a failed result instead of making the whole reply, and
with it the event acknowledgement, undecodable.

**The reports' stream** (:mod:`sn_monitor.report_stream`, :mod:`sn_monitor.agent.stream`).
Reports go on a stream to the controller when it has them: one connection, one frame per
report, and an answer only to a report that asks (one carrying events or command
results, the first on a new stream, and one every
:data:`~sn_monitor.report_stream.ASK_EVERY_SECONDS`, which tells a controller that has
stopped answering) or whose answer carries commands or rules. Answers that came on their
own (commands) are read before the next report, without waiting. A controller that
answers the opening 404
(an earlier version), or whose TLS the stream cannot set up, gets posted reports, and
the stream is tried again after :data:`STREAM_RETRY_SECONDS`; every other outcome (no
connection, a timeout, a standby, a refusal) is the same failure as a post's, with the
same fail-over and backoff. A stream the controller closed is opened again before the
next report.

**Topology.** Every report carries the digest of the node's latest topology
(:meth:`Reporter.set_topology`, from the topology loop about once a minute); the whole
topology rides along on the first report that has one, when its digest changed since the
last one a controller accepted, and after a reply said ``topology_wanted`` (a controller
that has none for that digest: after its own restart, say). A report carrying it asks for
an answer on a stream, so that the reporter knows it arrived; one that fails is followed
by another carrying it.

A reply may carry the node-local rules the controller wants this node to evaluate
(:mod:`sn_monitor.rules.edge`): from the next report on, the agent runs them on each
sample (:class:`~sn_monitor.agent.rules.NodeRules`) and sends their findings with only
the values the controller's own rules read. Their rate and increase rules begin from the
counters kept by the agent's last run (``counter_memory``,
:mod:`sn_monitor.agent.counter_memory`), so a counter that rose during a restart fires.
Rules this agent cannot take (a newer controller's) are logged once and the reports stay
full: the controller then evaluates them itself, as it does for an agent of an earlier
version.
"""

from __future__ import annotations

import logging
import math
import random
import ssl
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import msgspec

from sn_monitor import __version__
from sn_monitor.agent.counter_memory import CounterMemory
from sn_monitor.agent.report import build_report
from sn_monitor.agent.snapshot import NodeSnapshot
from sn_monitor.agent.spool import EventSpool
from sn_monitor.agent.stream import (
    ReportStream,
    StreamAnswer,
    StreamClosed,
    StreamRefused,
    tls_context,
)
from sn_monitor.clock import Clock
from sn_monitor.config import ConfigError
from sn_monitor.model import (
    MAX_EVENTS,
    Command,
    CommandResult,
    EdgeRules,
    Event,
    EventRecord,
    NodeTopology,
    topology_digest,
)
from sn_monitor.report_stream import ASK_EVERY_SECONDS, NO_STREAM_STATUSES
from sn_monitor.transport import (
    describe_failure,
    error_text,
    is_standby,
    parse_retry_after,
    redact_url,
)

if TYPE_CHECKING:
    import requests

    from sn_monitor.agent.rules import NodeRules

log = logging.getLogger(__name__)

REPORTS_PATH = "/api/v1/reports"
#: Low enough that after a controller restart every agent is back within the grace the
#: controller gives restored nodes (``RESTART_REPORT_GRACE`` in controller/service.py):
#: a longer wait would make a healthy node look lost.
MAX_BACKOFF_SECONDS = 10.0
#: Events in one report take at most this many bytes: the controller refuses bodies over
#: 1 MiB (413), and a report refused for its size would be refused forever.
MAX_EVENT_BYTES_PER_REPORT = 512 * 1024
#: Seconds an agent that could not take the controller's node-local rules sends full
#: reports before it asks for them again (a report that asks is not judged on them).
RULES_RETRY_SECONDS = 600.0
#: Seconds a controller without streams (or a stream that TLS could not set up) gets
#: posted reports before the agent tries a stream again.
STREAM_RETRY_SECONDS = 600.0
_JITTER = 0.2
_MAX_LOGGED_MESSAGES = 64
_MAX_ERROR_TEXT = 500


class _Reply(msgspec.Struct, frozen=True):
    """:class:`ReportReply` with the commands and rules left raw, to decode one by one."""

    sequence: int
    events_stored_through: int = -1
    commands: list[msgspec.Raw] = []
    edge_rules: msgspec.Raw = msgspec.Raw(b"")  # absent: empty
    topology_wanted: bool = False


class _CommandId(msgspec.Struct):
    id: str = ""


@dataclass(frozen=True)
class _Failure:
    """One report attempt that failed."""

    message: str
    retry_after: float | None = None
    #: Already logged (a refusal, once per distinct message).
    quiet: bool = False
    #: The controller is unreachable or a standby: the next one gets the report at once.
    fail_over: bool = False


class Reporter:
    """One report per sample to the controller; see the module docstring."""

    def __init__(
        self,
        urls: str | Sequence[str],
        token: str | None,
        node: str,
        labels: Mapping[str, str],
        clock: Clock,
        spool: EventSpool,
        session: requests.Session | None = None,
        timeout: float = 2.0,
        max_events_per_report: int = 500,
        *,
        interval: float = 1.0,
        max_backoff: float = MAX_BACKOFF_SECONDS,
        rng: random.Random | None = None,
        agent_version: str = __version__,
        metrics_port: int | None = None,
        verify: bool | str = True,
        cert: tuple[str, str] | None = None,
        streams: bool = True,
        counter_memory: CounterMemory | None = None,
    ) -> None:
        if not 0 < max_events_per_report <= MAX_EVENTS:
            raise ValueError(f"max_events_per_report must be in 1..{MAX_EVENTS}")
        listed = [urls] if isinstance(urls, str) else list(urls)
        if not listed:
            raise ValueError("no controller URL")
        if len({url.partition("://")[0] for url in listed}) > 1:
            raise ValueError("every controller URL must use one scheme")
        #: The controllers, in order (no trailing ``/``).
        self.urls: tuple[str, ...] = tuple(url.rstrip("/") for url in listed)
        self._current = 0
        self._token = token
        self._node = node
        self._labels = dict(labels)
        self._clock = clock
        self._spool = spool
        self._owns_session = session is None
        #: Made for the first posted report: an agent whose reports go on a stream never
        #: imports requests (~16 MB of its RSS).
        self._session = session
        # Per request, not on the session: requests lets REQUESTS_CA_BUNDLE override a
        # session's ``verify`` (None: the session's and the environment's default).
        self._verify: bool | str | None = None if verify is True else verify
        self._cert = cert
        #: Reports go on a stream where the controller has them (False: always posted).
        self.streams = streams
        self._stream: ReportStream | None = None
        #: Per controller URL: monotonic time before which its reports are posted.
        self._no_stream_until: dict[str, float] = {}
        self._asked_at = -math.inf
        #: Commands from the answers read since the last report returned them.
        self._commands_due: list[Command] = []
        if (verify is not True or cert is not None) and not self.url.startswith("https://"):
            log.warning("controller ca_file / cert_file are set but %s is not https://: "
                        "they are not used", redact_url(self.url))
        self._timeout = timeout
        self._max_events = max_events_per_report
        self._interval = float(interval)
        self._max_backoff = max(max_backoff, interval)
        self._rng = rng or random.Random()
        self._agent_version = agent_version
        self._metrics_port = metrics_port
        self._encoder = msgspec.json.Encoder()
        self._results: list[CommandResult] = []
        self._streak = 0
        self._logged: set[str] = set()
        self._highest_sent = -1
        #: The node's latest topology and its digest (None: none collected yet); set by
        #: the topology loop's thread, read by the report thread (one reference swap).
        self._topology: tuple[NodeTopology, str] | None = None
        #: The digest of the topology a controller last accepted a report with.
        self._topology_sent: str | None = None
        #: A reply asked for the topology: the next report carries it.
        self._topology_wanted = False
        #: The digest of the topology the report in flight carries (None: it carries none).
        self._topology_carried: str | None = None
        #: The node-local rules this agent evaluates (None: the controller evaluates all).
        self.rules: NodeRules | None = None  # imported with the first rules (2.5 MB)
        #: Where those rules keep their counters across restarts (None: they do not).
        self._counter_memory = counter_memory
        self._refused_rules: str | None = None
        #: After rules it could not take, the agent sends full reports for the controller
        #: to evaluate until this monotonic time, then asks again.
        self._full_until = -math.inf
        #: Random per process start: with ``sequence`` it tells a restart from a replay.
        self.instance = uuid.uuid4().hex
        #: The sequence number of the last report built (the first is 1).
        self.sequence = 0
        self.failures_total = 0
        self.reports_total = 0
        #: Times a report was accepted by another controller than the one before.
        self.switches_total = 0
        #: The controller that accepted the latest accepted report (None: none yet).
        self.in_use: str | None = None
        #: Wall time of the last report the controller accepted.
        self.last_success_wall: float | None = None
        #: Monotonic time before which no report is attempted (None: not backing off).
        self.backoff_until: float | None = None

    @property
    def url(self) -> str:
        """The controller the next report goes to."""
        return self.urls[self._current]

    @property
    def endpoint(self) -> str:
        return self.url + REPORTS_PATH

    @property
    def spool(self) -> EventSpool:
        return self._spool

    @property
    def pending_results(self) -> int:
        return len(self._results)

    def add_command_results(self, results: Sequence[CommandResult]) -> None:
        """Results to send with the next reports until the controller has them."""
        self._results.extend(results)

    def set_topology(self, topology: NodeTopology) -> None:
        """The node's topology now: its digest goes with every report from the next on."""
        self._topology = (topology, topology_digest(topology))

    def set_labels(self, labels: Mapping[str, str]) -> None:
        """The node's labels from the next report on (the Node's, read on another thread)."""
        labels = dict(labels)
        self._labels = labels  # one reference swap: the report thread reads it whole
        rules = self.rules
        if rules is not None:
            rules.set_labels(labels)

    @property
    def labels(self) -> dict[str, str]:
        """The labels the next report carries."""
        return dict(self._labels)

    @property
    def topology_sent(self) -> str | None:
        """The digest of the topology a controller last accepted (None: none yet)."""
        return self._topology_sent

    @property
    def streaming(self) -> bool:
        """Whether reports go on a stream now."""
        return self._stream is not None

    def close(self) -> None:
        self._close_stream()
        if self._owns_session and self._session is not None:
            self._session.close()

    # ---------------------------------------------------------------- the cycle

    def report(
        self,
        snapshot: NodeSnapshot,
        guard_throttled: set[int] | frozenset[int] = frozenset(),
        extra_events: Sequence[Event] = (),
    ) -> list[Command]:
        """Spool this cycle's events, send a report unless backing off, return commands.

        ``extra_events`` are events from outside the sampler (the guard's). Never raises
        for a network or controller problem: those are counted and logged.
        """
        self.spool_events([*snapshot.events, *extra_events])
        return self.send(snapshot, guard_throttled)

    def spool_events(self, events: Sequence[Event]) -> None:
        """Keep events on disk until the controller has stored them (never dropped here)."""
        if events:
            try:
                self._spool.extend(events)
            except OSError as err:
                log.error("cannot spool %d events: %s", len(events), err)

    def send(
        self,
        snapshot: NodeSnapshot,
        guard_throttled: set[int] | frozenset[int] = frozenset(),
    ) -> list[Command]:
        """Report ``snapshot`` with the spooled events, unless backing off; return commands.

        The snapshot's own events are not spooled here: :meth:`spool_events` does that on
        the sampling thread, so a report skipped while the controller is slow loses none.
        """
        now = self._clock.monotonic()
        if self.backoff_until is not None and now < self.backoff_until:
            return []
        events = self._within_budget(self._spool.pending(self._max_events))
        results = self._results[:MAX_EVENTS]
        self.sequence += 1
        current = self._topology
        digest = current[1] if current is not None else ""
        carried = (current[0] if current is not None
                   and (self._topology_wanted or digest != self._topology_sent) else None)
        self._topology_carried = digest if carried is not None else None
        report = build_report(
            snapshot,
            instance=self.instance,
            sequence=self.sequence,
            labels=self._labels,
            interval=self._interval,
            events=events,
            command_results=results,
            guard_throttled=guard_throttled,
            agent_version=self._agent_version,
            metrics_port=self._metrics_port,
            takes_rules=self._takes_rules(),
            topology_digest=digest,
            topology=carried,
        )
        if events:
            self._highest_sent = max(self._highest_sent, events[-1].id)
        if self.rules is not None:
            report = self.rules.evaluate(report)
        ask = (bool(events or results) or carried is not None
               or now - self._asked_at >= ASK_EVERY_SECONDS)
        self._deliver(self._encoder.encode(report), ask, len(results))
        commands, self._commands_due = self._commands_due, []
        return commands

    def _within_budget(self, events: list[EventRecord]) -> list[EventRecord]:
        """The oldest events that fit :data:`MAX_EVENT_BYTES_PER_REPORT` (at least one)."""
        used = 0
        for count, record in enumerate(events):
            used += len(self._encoder.encode(record))
            if used > MAX_EVENT_BYTES_PER_REPORT and count > 0:
                return events[:count]
        return events

    def _deliver(self, body: bytes, ask: bool, results_sent: int) -> None:
        """Send ``body`` to the current controller, then the next while they fail over.

        A round ends at a delivery, at a failure that is not the controller's absence,
        or when every controller was tried; without a delivery, it backs off.
        """
        retry_after: float | None = None
        round_failures: list[str] = []
        for attempt in range(1, len(self.urls) + 1):
            self.reports_total += 1
            outcome = self._attempt_stream(body, ask, results_sent)
            if outcome is None:
                outcome = self._attempt(body, results_sent)
            if outcome is True:
                return
            self.failures_total += 1
            if outcome.retry_after is not None:
                retry_after = max(retry_after or 0.0, outcome.retry_after)
            if outcome.fail_over and len(self.urls) > 1:
                round_failures.append(outcome.message)
                self._switch(outcome.message, last=attempt == len(self.urls))
                if attempt < len(self.urls):
                    continue
                self._failed(f"no controller accepted the report ({'; '.join(round_failures)})",
                             retry_after=retry_after)
            else:
                self._failed(outcome.message, retry_after=retry_after, quiet=outcome.quiet)
            return
        raise AssertionError("unreachable: the last attempt returns")

    def _attempt(self, body: bytes, results_sent: int) -> Literal[True] | _Failure:
        """POST the report: True when accepted (its reply taken), else the failure."""
        import requests  # only once a controller without streams is met

        if self._session is None:
            self._session = requests.Session()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            response = self._session.post(
                self.endpoint, data=body, headers=headers, timeout=self._timeout,
                verify=self._verify, cert=self._cert, allow_redirects=False,
            )
        except requests.RequestException as err:
            return _Failure(f"{self._named()} unreachable: {describe_failure(err)}",
                            fail_over=True)
        status = response.status_code
        if not 200 <= status < 300:
            return self._refused(status,
                                 error_text(response.content, _MAX_ERROR_TEXT)
                                 or response.reason or "",
                                 parse_retry_after(response.headers.get("Retry-After")),
                                 standby=is_standby(status, response.headers))
        try:
            reply = msgspec.json.decode(response.content, type=_Reply)
        except msgspec.DecodeError as err:
            return _Failure(f"{self._named()}: its reply is not a report reply: {err}")
        self._accepted(reply, results_sent)
        return True

    def _refused(self, status: int, text: str, retry_after: float | None, *,
                 standby: bool) -> _Failure:
        """The failure an answer other than 2xx is (a refusal is logged once)."""
        if standby:
            return _Failure(f"{self._named()} is a standby", retry_after=retry_after,
                            fail_over=True)
        if status == 429 or status >= 500:
            return _Failure(f"{self._named()} answered {status}: {text}",
                            retry_after=retry_after)
        message = f"{self._named()} refused the report ({status}): {text}"
        if message not in self._logged:
            if len(self._logged) >= _MAX_LOGGED_MESSAGES:
                self._logged.clear()
            self._logged.add(message)
            log.error("%s", message, extra={"node": self._node})
        return _Failure(message, quiet=True)

    # ---------------------------------------------------------------- the stream

    def _attempt_stream(self, body: bytes, ask: bool, results_sent: int
                        ) -> Literal[True] | _Failure | None:
        """Send the report on a stream: True when sent (and, if it asked, accepted).

        None: the current controller gets posted reports (no streams there, or not now).
        """
        opened = self._open_stream()
        if opened is None or isinstance(opened, _Failure):
            return opened
        fresh, stream = opened
        ask = ask or fresh
        try:
            stream.send(body, self._timeout, ask=ask)
            # An answer to a report that did not ask is read before the next report.
            answers = stream.wait(self.sequence, self._timeout) if ask else []
        except OSError as err:  # a timeout, the controller gone, an answer not one
            self._close_stream()
            return _Failure(f"{self._named()} unreachable: {describe_failure(err)} "
                            "(on the reports' stream)", fail_over=True)
        if ask:
            self._asked_at = self._clock.monotonic()
        return self._answered(answers, results_sent if ask else 0)

    def _open_stream(self) -> tuple[bool, ReportStream] | _Failure | None:
        """The stream to the current controller, (opened just now, it); None: post."""
        url = self.url
        if not self.streams or self._clock.monotonic() < self._no_stream_until.get(url, -1.0):
            self._close_stream()
            return None
        stream = self._stream
        if stream is not None and stream.url == url:
            try:
                answers = stream.poll()  # answers that came on their own; is it still open?
            except OSError as err:
                level = logging.DEBUG if isinstance(err, StreamClosed) else logging.WARNING
                log.log(level, "stream to %s ended: %s; opening another", redact_url(url),
                        err, extra={"node": self._node})
                self._close_stream()
            else:
                taken = self._answered(answers, 0)
                return (False, stream) if taken is True else taken
        self._close_stream()
        try:
            verify = True if self._verify is None else self._verify
            tls = tls_context(verify, self._cert) if url.startswith("https://") else None
            stream = ReportStream.open(url, self._token, self._timeout, tls)
        except StreamRefused as err:
            if err.status not in NO_STREAM_STATUSES:
                return self._refused(err.status, err.text, err.retry_after,
                                     standby=err.standby)
            self._post_for_now(url, f"it has no reports' stream ({err.status})")
            return None
        except ssl.SSLError as err:
            self._post_for_now(url, f"no TLS for a stream: {err}")
            return None
        except OSError as err:
            return _Failure(f"{self._named()} unreachable: {describe_failure(err)}",
                            fail_over=True)
        log.debug("reports go on a stream to %s", redact_url(url), extra={"node": self._node})
        self._stream = stream
        return True, stream

    def _post_for_now(self, url: str, why: str) -> None:
        """Post the reports to ``url`` for STREAM_RETRY_SECONDS."""
        self._no_stream_until[url] = self._clock.monotonic() + STREAM_RETRY_SECONDS
        log.info("posting reports to %s: %s (a stream is tried again in %.0f s)",
                 redact_url(url), why, STREAM_RETRY_SECONDS, extra={"node": self._node})

    def _answered(self, answers: list[StreamAnswer], results_sent: int) -> Literal[True] | _Failure:
        """Take a stream's answers; the failure among them, if any (True: none)."""
        outcome: Literal[True] | _Failure = True
        for answer in answers:
            ours = answer.sequence == self.sequence
            if answer.status != 200:
                outcome = self._refused(answer.status, answer.error, answer.retry_after,
                                        standby=False)
                continue
            if not len(answer.reply):
                continue
            try:
                reply = msgspec.json.decode(answer.reply, type=_Reply)
            except msgspec.DecodeError as err:
                outcome = _Failure(f"{self._named()}: its reply is not a report reply: {err}")
                continue
            self._accepted(reply, results_sent if ours else 0, ours=ours)
        return outcome

    def _named(self) -> str:
        """``controller http://ctl:9848``: the one this attempt went to, for a message."""
        return f"controller {redact_url(self.url)}"

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _switch(self, why: str, *, last: bool) -> None:
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

    def _accepted(self, reply: _Reply, results_sent: int, *, ours: bool = True) -> None:
        """Take a reply; ``ours``: it answers the report just sent (not an earlier one)."""
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
        del self._results[:results_sent]
        if reply.sequence != self.sequence:
            log.debug("reply is for sequence %d, sent %d", reply.sequence, self.sequence)
        through = min(reply.events_stored_through, self._highest_sent)
        if through >= 0:
            try:
                self._spool.acknowledge(through)
            except OSError as err:
                log.error("cannot record event acknowledgement: %s (events will be resent)",
                          err)
        if ours and self._topology_carried is not None:
            self._topology_sent = self._topology_carried
            self._topology_wanted = False
        if reply.topology_wanted:
            self._topology_wanted = True
        if len(reply.edge_rules):
            self._take_rules(reply.edge_rules)
        self._commands_due += self._commands(reply.commands)

    def _takes_rules(self) -> bool:
        """Whether to ask for node-local rules (and leave them to this agent) now."""
        return self.rules is not None or self._clock.monotonic() >= self._full_until

    def _take_rules(self, raw: msgspec.Raw) -> None:
        """Evaluate the node-local rules of ``raw`` from the next sample on, if this can."""
        from sn_monitor.agent.rules import NodeRules  # the rule engine: only once needed

        try:
            edge = msgspec.json.decode(raw, type=EdgeRules)
        except msgspec.DecodeError as err:
            self._refuse_rules(None, str(err))
            return
        if edge.version == self._refused_rules:
            self._full_until = self._clock.monotonic() + RULES_RETRY_SECONDS
            return
        try:
            self.rules = NodeRules(edge, self._node, self._labels, self._clock,
                                   self._counter_memory)
        except ConfigError as err:
            self._refuse_rules(edge.version, str(err))
            return
        log.info("evaluating %d node-local rules of the controller (version %s)",
                 len(edge.rules), edge.version, extra={"node": self._node})

    def _refuse_rules(self, version: str | None, why: str) -> None:
        """Leave every rule to the controller (full reports) for a while; log it once."""
        self._refused_rules = version
        self.rules = None
        self._full_until = self._clock.monotonic() + RULES_RETRY_SECONDS
        log.error("cannot evaluate the controller's node-local rules (%s); sending full "
                  "reports for the controller to evaluate, asking again in %.0f s", why,
                  RULES_RETRY_SECONDS, extra={"node": self._node})

    def _commands(self, raw: Sequence[msgspec.Raw]) -> list[Command]:
        commands: list[Command] = []
        for item in raw:
            try:
                commands.append(msgspec.json.decode(item, type=Command))
            except msgspec.DecodeError as err:
                command_id = _command_id(item)
                log.error("cannot carry out command %r: %s", command_id or "?", err)
                if command_id:
                    self._results.append(CommandResult(
                        id=command_id[:128], ok=False, time_seconds=self._clock.time(),
                        message=f"agent cannot decode the command: {err}"[:4096],
                    ))
        return commands

    def _failed(self, message: str, *, retry_after: float | None = None,
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


def _command_id(raw: msgspec.Raw) -> str | None:
    try:
        value = msgspec.json.decode(raw, type=_CommandId).id
    except msgspec.DecodeError:
        return None
    return value or None
