"""The hot path: one agent's report in, its reply out; Alertmanager's alerts in.

On the event loop (thousands of reports a second): a report is decoded, judged and
answered, and nothing here waits on the store, a file or a lock held across I/O. What a
report means for the store (events, new nodes, incidents and the actions they start) is
queued for the one writer, and so are its events for the jobs' failure triage; a report
with events gets a :class:`~sn_monitor.controller.storage.writer.PendingReply` while the
writer has them queued, so that its answer acknowledges them. The results of the commands a report
carries back are recorded on their actions (by the writer), and the remediation ladder
reads them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import msgspec

from sn_monitor.clock import Clock
from sn_monitor.controller.actions.drivers.agent import AgentCommandQueue
from sn_monitor.controller.errors import Forbidden, Invalid, Malformed
from sn_monitor.controller.failslow.fabric_watch import FabricWatch
from sn_monitor.controller.incidents.engine_lock import EngineLock
from sn_monitor.controller.incidents.fleet_state import HEALED_BY_READING, FleetState
from sn_monitor.controller.incidents.job_labels import JobLabels
from sn_monitor.controller.incidents.pipeline import IncidentPipeline
from sn_monitor.controller.ingest.decode import NodeRegistry, controller_times, decode_report
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.jobs.triage import JobTriage
from sn_monitor.controller.remediation.ladder import describe_checks
from sn_monitor.controller.security.auth import Identity
from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Store, StoreError
from sn_monitor.controller.storage.writer import PendingReply, StoreWriter
from sn_monitor.controller.telemetry.metrics import ControllerMetrics
from sn_monitor.controller.workloads.accounting import WorkloadAccounting
from sn_monitor.model import CommandResult, EdgeRules, EventRecord, Report, ReportReply
from sn_monitor.rules.alerts import WebhookRejected, decode_webhook
from sn_monitor.rules.base import Now
from sn_monitor.rules.view import NodeView

log = logging.getLogger(__name__)


class ReportIntake:
    """Reports and alerts in, findings to the pipeline (module docstring)."""

    def __init__(self, *, registry: NodeRegistry, rules: EngineLock, pipeline: IncidentPipeline,
                 fleet: FleetState, fabric: FabricWatch, jobs: JobOrchestrator,
                 commands: AgentCommandQueue, writer: StoreWriter, store: Store,
                 store_health: StoreHealth, telemetry: ControllerMetrics, clock: Clock,
                 job_labels: JobLabels, labels_of: Callable[[str], dict[str, str] | None],
                 repair_result: Callable[[str, CommandResult], object],
                 workloads: WorkloadAccounting, triage: JobTriage) -> None:
        """The collaborators, passed in.

        ``repair_result``: the remediation ladder reads an agent's command result.
        """
        self._registry = registry
        self._rules = rules
        self._pipeline = pipeline
        self._fleet = fleet
        self._fabric = fabric
        self._jobs = jobs
        self._commands = commands
        self._writer = writer
        self._store = store
        self._store_health = store_health
        self._telemetry = telemetry
        self._clock = clock
        self._job_labels = job_labels
        self._labels_of = labels_of
        self._repair_result = repair_result
        self._workloads = workloads
        self._triage = triage
        #: Each agent's address and metrics port (Prometheus service discovery).
        self.peers: dict[str, tuple[str, int]] = {}

    def ingest(self, body: bytes, identity: Identity, peer: str | None = None
               ) -> ReportReply | PendingReply:
        """Take one report; the reply acknowledges its events and carries commands.

        On the event loop: nothing here waits on the store (see the module docstring). A
        report with events gets a :class:`PendingReply` while the writer has them queued:
        the API answers it once they are written, so that answer acknowledges them.
        """
        started = time.perf_counter()
        try:
            report = decode_report(body)
        except Invalid:
            self._telemetry.ingest.report("invalid")
            raise
        if not identity.may_report_for(report.node):
            self._telemetry.ingest.report("forbidden")
            raise Forbidden(f"{identity.name} may not report for node {report.node}")
        accepted = self._registry.accept(report)
        view = accepted.view
        # an events-only report is no sample: the view's receive time stays the sample's
        now = (view.received_wall if accepted.applied and not report.events_only
               else self._clock.time())
        if accepted.new_node or accepted.labels_changed:
            self._writer.call(partial(self._node_seen, report.node, dict(report.labels), now))
        written = None
        if report.events:
            # dated by the controller's clock, as the view the rules judge is
            events = controller_times(report, now).events
            written = self._writer.events(report.node, report.instance, events, now)
            # the triage reads the jobs (whose lock is held around store writes): later
            self._writer.call(partial(self._triage.take, report.node, report.instance,
                                      events))
        if peer is not None and report.metrics_port is not None:
            self.peers[report.node] = (peer, report.metrics_port)
        edge_rules = None
        topology_wanted = False
        if report.events_only:
            if accepted.applied:
                self._judge_events(view, now)
        elif accepted.applied:
            topology_wanted, edge_rules = self._judge_sample(report, view, now)
        elif report.takes_rules:
            with self._rules.held() as engine:
                edge_rules = engine.edge_rules(accepted.view, report.rules_version)
        if report.command_results:
            self._commands.complete(report.node, report.command_results)
        commands = self._commands.take(report.node)
        tally = self._telemetry.ingest
        tally.report("accepted" if accepted.applied else "stale")
        tally.observe(time.perf_counter() - started)
        reply = ReportReply(sequence=report.sequence, commands=commands,
                            edge_rules=edge_rules, node=report.node,
                            topology_wanted=topology_wanted)
        if written is None:
            return reply
        acknowledged = partial(self._acknowledging, reply, report)
        return acknowledged() if written.done() else PendingReply(written, acknowledged)

    def _judge_sample(self, report: Report, view: NodeView, now: float
                      ) -> tuple[bool, EdgeRules | None]:
        """A sample applied: every rule judges it; (topology wanted, edge rules to send)."""
        topology_wanted = self._fabric.take_report(report)
        if report.gpus:  # a trimmed report without them leaves the last ones standing
            self._workloads.take(report.node, report.gpus)
        self._job_labels.label(view)
        edge_rules = None
        with self._rules.held() as engine:
            findings = engine.observe(view, Now(view.received_monotonic, now))
            if report.takes_rules:
                edge_rules = engine.edge_rules(view, report.rules_version)
        if findings:
            self._pipeline.handle(findings)
        gone = self._fleet.gpus_gone(report.node) if report.gpus else None
        if gone:
            self._gpus_back(view.report or report, gone)
        self._fleet.reporting(report.node)
        return topology_wanted, edge_rules

    def _judge_events(self, view: NodeView, now: float) -> None:
        """An events-only report applied: its events go through the event rules at once.

        Nothing else moves: no sample came (the heartbeat, the workloads, the fabric and
        the node-local rules wait for the next one), and what the event rules find is
        handled now, not at the next sweep.
        """
        with self._rules.held() as engine:
            findings = engine.observe_events(view, Now(self._clock.monotonic(), now))
        if findings:
            self._pipeline.handle(findings)

    def _acknowledging(self, reply: ReportReply, report: Report) -> ReportReply:
        """``reply`` acknowledging the report's events stored (after the writer had them)."""
        stored = self._writer.stored_through(report.node, report.instance)
        return msgspec.structs.replace(
            reply, events_stored_through=min(stored, max(e.id for e in report.events)))

    def _gpus_back(self, report: Report, gone: Mapping[int, float]) -> None:
        """A GPU that was lost (or fell off the bus) reads healthy again: those close.

        ``gone``: the node's lost GPUs, each with when its loss was seen.
        """
        sampled = report.sample_time_seconds
        back = [g.index for g in report.gpus
                if g.index in gone and not g.lost and sampled > gone[g.index]]
        for gpu in back:
            with self._rules.held() as engine:
                findings = engine.cancel(
                    report.node, gpu, f"GPU {gpu} answers NVML again (a healthy reading)",
                    HEALED_BY_READING)
            self._pipeline.handle(findings)

    def _node_seen(self, node: str, labels: dict[str, str], now: float) -> None:
        """A new node, or new labels (the writer): stored, and label selectors may pick it."""
        self._store_health.attempt(self._store.upsert_node, node, labels, now)
        self._jobs.note_node(node, labels)

    def ingest_alerts(self, body: bytes, who: str) -> dict[str, Any]:
        """Alertmanager's webhook: alerts that alert rules match become findings.

        They are handled like a report's (incidents, actions through the policy); the
        actions' audit records name ``who`` (the token's name) as their source.
        """
        try:
            payload = decode_webhook(body)
        except WebhookRejected as err:
            raise Malformed(err.message) from None
        with self._rules.held() as engine:
            intake = engine.receive_alerts(payload.alerts, self._labels_of,
                                           f"alertmanager:{who}")
        self._pipeline.handle(intake.findings)
        for outcome, count in (("accepted", intake.accepted), ("unmatched", intake.unmatched),
                               ("skipped", intake.skipped)):
            self._telemetry.webhook_alerts.labels(outcome).inc(count)
        log.info("alertmanager (%s, %s): %d alerts, %d accepted, %d skipped, %d unmatched, "
                 "%d findings", who, payload.receiver or "no receiver", len(payload.alerts),
                 intake.accepted, intake.skipped, intake.unmatched, len(intake.findings))
        for why in intake.why:
            log.warning("alertmanager alert skipped: %s", why)
        return {"accepted": intake.accepted, "skipped": intake.skipped,
                "unmatched": intake.unmatched, "findings": len(intake.findings), "by": who}

    def command_result(self, node: str, result: CommandResult) -> None:
        """An agent ran a command (the writer): its record says so, the ladder reads it."""
        what = "done" if result.ok else "failed"
        message = f"agent {what}: {result.message}" + (" (dry run)" if result.dry_run else "")
        if result.checks:
            message += f" [{describe_checks(result) if not result.ok else 'checks passed'}]"
        try:
            self._store.update_action(result.id, at=self._clock.time(), outcome_message=message)
        except StoreError as err:
            log.warning("agent result for unknown action %s: %s", result.id, err,
                        extra={"node": node})
        self._repair_result(node, result)


def count_stored_events(telemetry: ControllerMetrics, events: list[EventRecord]) -> None:
    """The writer stored these events: counted by kind."""
    for event in events:
        telemetry.events.labels(event.kind).inc()
