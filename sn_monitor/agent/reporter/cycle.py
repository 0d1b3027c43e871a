"""The reporter: one report per sample, its events spooled, its reply taken.

:class:`Reporter` builds each report (:func:`~sn_monitor.agent.report.build_report`) with
the spooled events that fit, hands it to the stream or the post, and takes the reply:
events acknowledged, command results dropped, topology and rules noted, commands handed
back. Between two samples, :meth:`Reporter.send_events` sends the spooled events at once
in an event-only report (:func:`~sn_monitor.agent.report.build_events_report`; the fast
path's). A controller that refuses one (an earlier version: 400 or 422 for the field it
does not know) keeps the events spooled for the next sampled report and gets no more
event-only reports; that is logged once. Imports every other module of the package.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import msgspec

from sn_monitor import __version__
from sn_monitor.agent.counter_memory import CounterMemory
from sn_monitor.agent.report import build_events_report, build_report
from sn_monitor.agent.reporter.edge_rules import EdgeRulesIntake
from sn_monitor.agent.reporter.failover import Controllers
from sn_monitor.agent.reporter.posting import ReportPoster
from sn_monitor.agent.reporter.replies import Failure, Reply, decode_commands
from sn_monitor.agent.reporter.streaming import StreamChannel
from sn_monitor.agent.reporter.topology import TopologyCarriage
from sn_monitor.agent.snapshot import NodeSnapshot
from sn_monitor.agent.spool import EventSpool
from sn_monitor.clock import Clock
from sn_monitor.model import (
    MAX_EVENTS,
    Command,
    CommandResult,
    Event,
    EventRecord,
    NodeTopology,
)
from sn_monitor.report_stream import ASK_EVERY_SECONDS
from sn_monitor.transport import redact_url

if TYPE_CHECKING:
    import requests

    from sn_monitor.agent.rules import NodeRules

log = logging.getLogger(__package__)  # the reporter's one logger (see .replies)

#: Low enough that after a controller restart every agent is back within the grace the
#: controller gives restored nodes (at least 60 s: ``restart_grace`` in
#: controller/incidents/inherited.py): a longer wait would make a healthy node look lost.
MAX_BACKOFF_SECONDS = 10.0
#: Events in one report take at most this many bytes: the controller refuses bodies over
#: 1 MiB (413), and a report refused for its size would be refused forever.
MAX_EVENT_BYTES_PER_REPORT = 512 * 1024


class Reporter:
    """One report per sample to the controller; see the package docstring."""

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
        self._controllers = Controllers(
            [urls] if isinstance(urls, str) else list(urls), node, clock,
            interval=interval, max_backoff=max_backoff, rng=rng or random.Random(),
        )
        self._poster = ReportPoster(self._controllers, token, timeout,
                                    verify=None if verify is True else verify, cert=cert,
                                    session=session)
        self._channel = StreamChannel(self._controllers, token, timeout, clock, node,
                                      enabled=streams, verify=verify, cert=cert)
        self._topology = TopologyCarriage()
        self._rules = EdgeRulesIntake(node, clock, counter_memory)
        self._node = node
        self._labels = dict(labels)
        self._clock = clock
        self._spool = spool
        #: Commands from the answers read since the last report returned them.
        self._commands_due: list[Command] = []
        if (verify is not True or cert is not None) and not self.url.startswith("https://"):
            log.warning("controller ca_file / cert_file are set but %s is not https://: "
                        "they are not used", redact_url(self.url))
        self._max_events = max_events_per_report
        self._interval = float(interval)
        self._agent_version = agent_version
        self._metrics_port = metrics_port
        self._encoder = msgspec.json.Encoder()
        self._results: list[CommandResult] = []
        self._highest_sent = -1
        #: The controllers that refused an event-only report: they get none again.
        self._no_events_only: set[str] = set()
        #: Random per process start: with ``sequence`` it tells a restart from a replay.
        self.instance = uuid.uuid4().hex
        #: The sequence number of the last report built (the first is 1).
        self.sequence = 0
        self.failures_total = 0
        self.reports_total = 0

    # ---------------------------------------------------------------- state, for reading

    @property
    def urls(self) -> tuple[str, ...]:
        """The controllers, in order (no trailing ``/``)."""
        return self._controllers.urls

    @property
    def url(self) -> str:
        """The controller the next report goes to."""
        return self._controllers.url

    @property
    def endpoint(self) -> str:
        return self._poster.endpoint

    @property
    def in_use(self) -> str | None:
        """The controller that accepted the latest accepted report (None: none yet)."""
        return self._controllers.in_use

    @property
    def switches_total(self) -> int:
        """Times a report was accepted by another controller than the one before."""
        return self._controllers.switches_total

    @property
    def last_success_wall(self) -> float | None:
        """Wall time of the last report the controller accepted."""
        return self._controllers.last_success_wall

    @property
    def backoff_until(self) -> float | None:
        """Monotonic time before which no report is attempted (None: not backing off)."""
        return self._controllers.backoff_until

    @property
    def streams(self) -> bool:
        """Whether reports go on a stream where the controller has them (False: posted)."""
        return self._channel.enabled

    @property
    def streaming(self) -> bool:
        """Whether reports go on a stream now."""
        return self._channel.streaming

    @property
    def spool(self) -> EventSpool:
        return self._spool

    @property
    def pending_results(self) -> int:
        return len(self._results)

    @property
    def labels(self) -> dict[str, str]:
        """The labels the next report carries."""
        return dict(self._labels)

    @property
    def topology_sent(self) -> str | None:
        """The digest of the topology a controller last accepted (None: none yet)."""
        return self._topology.sent

    @property
    def rules(self) -> NodeRules | None:
        """The node-local rules this agent evaluates (None: the controller evaluates all)."""
        return self._rules.current

    # ---------------------------------------------------------------- inputs

    def add_command_results(self, results: Sequence[CommandResult]) -> None:
        """Results to send with the next reports until the controller has them."""
        self._results.extend(results)

    def set_topology(self, topology: NodeTopology) -> None:
        """The node's topology now: its digest goes with every report from the next on."""
        self._topology.set(topology)

    def set_labels(self, labels: Mapping[str, str]) -> None:
        """The node's labels from the next report on (the Node's, read on another thread)."""
        labels = dict(labels)
        self._labels = labels  # one reference swap: the report thread reads it whole
        rules = self.rules
        if rules is not None:
            rules.set_labels(labels)

    def close(self) -> None:
        self._channel.close()
        self._poster.close()

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
        if self._controllers.backing_off():
            return []
        now = self._clock.monotonic()
        events = self._within_budget(self._spool.pending(self._max_events))
        results = self._results[:MAX_EVENTS]
        self.sequence += 1
        digest, carried = self._topology.for_report()
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
            takes_rules=self._rules.asking(),
            topology_digest=digest,
            topology=carried,
        )
        if events:
            self._highest_sent = max(self._highest_sent, events[-1].id)
        if self.rules is not None:
            report = self.rules.evaluate(report)
        ask = (bool(events or results) or carried is not None
               or now - self._channel.asked_at >= ASK_EVERY_SECONDS)
        self._deliver(self._encoder.encode(report), ask, len(results))
        commands, self._commands_due = self._commands_due, []
        return commands

    def send_events(self) -> list[Command]:
        """Send the spooled events now in an event-only report; return the reply's commands.

        Nothing is sent while backing off, with no event spooled, or to a controller that
        refused one: the events then go with the next sampled report. The report asks
        for an answer, which acknowledges its events. Never raises for a network or
        controller problem.
        """
        if self._controllers.backing_off() or self.url in self._no_events_only:
            return []
        events = self._within_budget(self._spool.pending(self._max_events))
        if not events:
            return []
        self.sequence += 1
        report = build_events_report(
            self._node,
            instance=self.instance,
            sequence=self.sequence,
            time_seconds=self._clock.time(),
            labels=self._labels,
            interval=self._interval,
            events=events,
            agent_version=self._agent_version,
            metrics_port=self._metrics_port,
        )
        self._highest_sent = max(self._highest_sent, events[-1].id)
        self._deliver(self._encoder.encode(report), True, 0, events_only=True)
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

    def _deliver(self, body: bytes, ask: bool, results_sent: int, *,
                 events_only: bool = False) -> None:
        """Send ``body`` to the current controller, then the next while they fail over.

        A round ends at a delivery, at a failure that is not the controller's absence,
        or when every controller was tried; without a delivery, it backs off, except
        after an event-only report refused for what it is (``events_only``): the next
        sampled report goes as usual.
        """
        controllers = self._controllers
        retry_after: float | None = None
        round_failures: list[str] = []
        for attempt in range(1, len(controllers.urls) + 1):
            self.reports_total += 1
            outcome = self._attempt(body, ask, results_sent)
            if outcome is True:
                return
            self.failures_total += 1
            if outcome.retry_after is not None:
                retry_after = max(retry_after or 0.0, outcome.retry_after)
            if outcome.fail_over and len(controllers.urls) > 1:
                round_failures.append(outcome.message)
                controllers.switch(outcome.message, last=attempt == len(controllers.urls))
                if attempt < len(controllers.urls):
                    continue
                controllers.failed(
                    f"no controller accepted the report ({'; '.join(round_failures)})",
                    retry_after=retry_after,
                )
            elif events_only and outcome.refused:
                self._refuse_events_only()
            else:
                controllers.failed(outcome.message, retry_after=retry_after,
                                   quiet=outcome.quiet)
            return
        raise AssertionError("unreachable: the last attempt returns")

    def _refuse_events_only(self) -> None:
        """The current controller refused an event-only report: send it none again."""
        url = self.url
        self._no_events_only.add(url)
        log.warning("controller %s does not take event-only reports (an earlier version?): "
                    "fault events go with the sampled reports to it", redact_url(url),
                    extra={"node": self._node})

    def _attempt(self, body: bytes, ask: bool, results_sent: int) -> Literal[True] | Failure:
        """One try at the current controller: on its stream, else posted."""
        outcome = self._channel.attempt(body, ask, self.sequence, results_sent, self._accepted)
        if outcome is not None:
            return outcome
        posted = self._poster.attempt(body)
        if isinstance(posted, Failure):
            return posted
        self._accepted(posted, results_sent, True)
        return True

    def _accepted(self, reply: Reply, results_sent: int, ours: bool) -> None:
        """Take a reply; ``ours``: it answers the report just sent (not an earlier one)."""
        self._controllers.reached()
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
        self._topology.answered(ours=ours, wanted=reply.topology_wanted)
        if len(reply.edge_rules):
            self._rules.take(reply.edge_rules, self._labels)
        commands, failed = decode_commands(reply.commands, self._clock)
        self._results += failed
        self._commands_due += commands
