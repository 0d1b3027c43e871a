"""The controller: reports in, rule findings, incidents, actions through the safety policy.

One object owns the decisions; the HTTP layer (app.py) and the daemon only call it.
Ingest is the hot path (thousands of reports a second, on the event loop): it decodes,
judges and answers, and never waits on the store, a file or a lock held across I/O. What
a report means for the store (events, new nodes, incidents and the actions they start) is
queued for the one writer (:mod:`sn_monitor.controller.storage.writer`), which the sweep's
findings take too; a report with events is answered once the writer has stored them (a
:class:`~sn_monitor.controller.storage.writer.PendingReply` the HTTP layer waits for without
holding the event loop), so that its answer acknowledges them. Everything slow or
periodic (heartbeats, peer comparisons, retries, re-sending firing alerts, node states)
happens in :meth:`sweep`, on its own thread.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import msgspec

from sn_monitor.clock import Clock
from sn_monitor.config import ConfigError
from sn_monitor.controller.actions.policy import ClusterSummary, SafetyPolicy
from sn_monitor.controller.actions.routing import Drivers, NoDriver
from sn_monitor.controller.actions.runner import ActionRunner, ActionStateError
from sn_monitor.controller.audit import ActionRecord, ActionRequest
from sn_monitor.controller.errors import (
    Conflict,
    Forbidden,
    Invalid,
    Malformed,
    NotFound,
    Unavailable,
)
from sn_monitor.controller.fabric.meter import FABRIC_METRICS
from sn_monitor.controller.fabric.view import JobOnFabric, fleet_topology
from sn_monitor.controller.failslow.finder import BottleneckFinder
from sn_monitor.controller.failslow.watch import FailSlowWatch, JobPace
from sn_monitor.controller.incidents.blast_radius import BlastRadius
from sn_monitor.controller.incidents.breaker import BreakerKeeper, breaker_doc
from sn_monitor.controller.incidents.escalation import Escalation
from sn_monitor.controller.ingest.decode import NodeRegistry, controller_times, decode_report
from sn_monitor.controller.jobs.actions import RunnerJobActions
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.jobs.settings import JobError, UnknownJob, UnknownRecovery
from sn_monitor.controller.jobs.spec import JobControl, job_from_json, load_jobs
from sn_monitor.controller.jobs.views import HangFinding
from sn_monitor.controller.remediation.ladder import (
    RemediationLadder,
    Rung,
    describe_checks,
    first_rung,
)
from sn_monitor.controller.remediation.service_return import ServiceReturn
from sn_monitor.controller.security.auth import Identity
from sn_monitor.controller.settings import ControllerSettings
from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Incident, Store, StoreError, StoreUnavailable
from sn_monitor.controller.storage.writer import PendingReply, StoreWriter
from sn_monitor.controller.supervision.stall import StallWatch
from sn_monitor.controller.telemetry.metrics import ControllerMetrics, ControllerState
from sn_monitor.model import (
    ActionName,
    CheckpointBody,
    CommandResult,
    EventRecord,
    ProgressBody,
    Report,
    ReportReply,
)
from sn_monitor.rules.alerts import WebhookRejected, decode_webhook
from sn_monitor.rules.base import Now
from sn_monitor.rules.engine import Finding, RuleEngine
from sn_monitor.rules.spec import CONFIG_SOURCE, AlertRule, EventRule, Rule
from sn_monitor.rules.view import NodeState, NodeView
from sn_monitor.rules.xid_catalog import load_catalog

log = logging.getLogger(__name__)

#: Actions whose firing means the node itself is broken: they count for the breaker.
NODE_FATAL_ACTIONS = frozenset({"failover", "evict", "cordon"})
#: For a node of a DistributedJob, ``failover`` and ``evict`` are a job recovery (the
#: recovery evicts the node, once, takes a spare and restores from the latest complete
#: checkpoint; every fault of the job's nodes joins the one recovery) and ``checkpoint``
#: asks the job for a pre-emptive checkpoint.
RECOVER = "recover"
#: The actions a rule takes on a job's node that the job's recovery takes over.
RECOVERED_ACTIONS = frozenset({"failover", "evict"})
CHECKPOINT_JOBS = "checkpoint-jobs"
#: Events after which the ranks on that GPU are dead: no checkpoint first.
RANK_KILLING_EVENTS = frozenset({"xid", "gpu_lost", "gpu_fallen_off_bus"})
#: Events a later healthy reading cancels: a GPU that was lost answers NVML again.
HEALED_BY_READING = frozenset({"gpu_lost", "gpu_fallen_off_bus"})
#: Steps that wait ``settle`` seconds before they run.
SETTLED_ACTIONS = frozenset({"cordon", "evict", "failover", "reset_gpu", "reboot", RECOVER})
#: Actions that are rungs of the remediation ladder: the ladder runs them, and verifies.
LADDER_RUNGS = frozenset({"reset_gpu", "reboot"})
NODE_REFRESH_SECONDS = 5.0
#: The newest actions of one incident its page shows (a flapping fault's alerts are many).
INCIDENT_ACTIONS_SHOWN = 1000
#: Job controls that make the controller run a program or call a URL: from job files
#: (configuration) or an admin token only, never from an operate token.
ADMIN_ONLY_CONTROL = frozenset({"webhook", "command"})
#: What a client is told to wait before asking again while the store takes no writes.
STORE_RETRY_AFTER_SECONDS = 5.0


class Controller:
    """The controller's decisions; see the module docstring."""

    def __init__(
        self,
        settings: ControllerSettings,
        rules: Sequence[Rule],
        clock: Clock,
        store: Store,
        drivers: Drivers,
        *,
        watch_stalls: bool = False,
        rule_sources: Mapping[str, int] | None = None,
        cpu_seconds: Callable[[], float] = time.process_time,
    ) -> None:
        """The controller's parts, wired; nothing is read from the store yet (:meth:`start`).

        ``watch_stalls``: leave the controller's own stalls out of node silence (the
        daemon; tests that move a manual clock by hand mean every second they move it).
        ``rule_sources``: how many of ``rules`` each source gave (``sn_controller_rules``);
        default: all of them from ``config``. ``cpu_seconds``: the process's CPU time, by
        which the stall watch tells a controller saturated by its own work (injected where
        the clock is manual: real CPU time against a hand-moved clock is no measure).
        """
        self.settings = settings
        self._rule_sources = _sources_of(rules, rule_sources)
        self.clock = clock
        self.store = store
        self.drivers = drivers
        self.telemetry = ControllerMetrics(self.state)
        #: Every call that needs the store goes through it (refused: skipped, remembered).
        self.store_health = StoreHealth()
        #: The one writer of what reports and findings mean for the store.
        self.writer = StoreWriter(store, self.store_health, on_stored=self._events_stored)
        self.stalls = StallWatch(clock, float(settings.sweep_interval),
                                 on_stall=self._stalled,
                                 cpu_seconds=cpu_seconds) if watch_stalls else None
        #: Silence and holds are measured on the controller's own progress (stall.py):
        #: the registry's receive times and the rules' clock are this one's.
        self.progress: Clock = self.stalls if self.stalls is not None else clock
        #: NVIDIA's Xid catalogue: the XID rules' codes, the ladder's first rung.
        self.xids = load_catalog(Path(settings.xid_catalog) if settings.xid_catalog else None)
        self.engine = RuleEngine(rules, self.progress, catalog=self.xids,
                                 keep=FABRIC_METRICS if settings.fail_slow.enabled else ())
        self.registry = NodeRegistry(self.progress)
        self.policy = SafetyPolicy(settings.policy, clock)
        #: A controller-wide job control may run jobs this controller does not know:
        #: a node in none of its jobs is failed over there too (read before route_jobs).
        self._failover_elsewhere = not isinstance(drivers.by_action.get("failover"), NoDriver)
        drivers.route_jobs(self._job_control, clock)
        self.runner = ActionRunner(store, self.policy, drivers.by_action, clock,
                                   settings.runner)
        self.runner.on_succeeded = self._action_succeeded
        self.breaker = BreakerKeeper(
            self.policy, store, clock,
            lambda request: self.store_health.attempt(self.runner.submit, request, self.cluster(),
                                                False))
        self.jobs = JobOrchestrator(
            store, clock, RunnerJobActions(self.runner, store, self.cluster,
                                           self.node_healthy),
            self._labels_of, settings.recovery)
        drivers.queue.on_result = lambda node, result: self.writer.call(
            partial(self._command_result, node, result))
        #: Findings on many nodes at once that belong to their job or rack.
        self.blast = BlastRadius(self.engine.rule, self._job_of, self._labels_of,
                                 self.progress)
        #: Repeat offenders climb one rung (read in the writer, from the store).
        self.escalation = Escalation(self.engine.rule, store)
        #: GPU-level faults repaired rung by rung, each verified; back into service after.
        self.remediation = RemediationLadder(settings.remediation, clock, ServiceReturn(
            store=store, clock=clock, jobs=self.jobs, submit=self._submit_request,
            audit=self._audit_repair, clear_faults=self._clear_faults,
            labels_of=self._labels_of, forget_attempt=self.policy.did_nothing))
        #: Node topologies, live link rates, and the bottleneck finder that reads them.
        self.finder = BottleneckFinder(settings.fail_slow)
        self.failslow = FailSlowWatch(self.finder)
        #: Held around the finder, its meter and its book (ingest, sweep and the API).
        self._fabric_lock = threading.Lock()
        self._lock = threading.RLock()
        # The engine is not thread-safe; ingest (the HTTP loop) and the sweep (the
        # scheduler's thread) call it concurrently in the daemon. Held for engine calls only.
        self._engine_lock = threading.Lock()
        self._firing: dict[str, set[tuple[str, str]]] = {}
        #: The findings firing on each node that mean the node itself is broken, with
        #: when each was detected (wall).
        self._fatal: dict[str, dict[tuple[str, str], float]] = {}
        self._lost: set[str] = set()
        #: GPUs with a lost / fallen-off-bus incident open, by node: a healthy reading
        #: of one closes them (checked on the reports of these nodes only).
        self._gone_gpus: dict[str, set[int]] = {}
        #: Nodes an eviction ran on, until they are uncordoned.
        self._evicted: set[str] = set()
        self._membership_seen = -1
        self._cordoned: set[str] = set()
        self._peers: dict[str, tuple[str, int]] = {}
        self._states: dict[str, NodeState] = {}
        #: The nodes whose recorded state is not healthy.
        self._unhealthy: set[str] = set()
        self._last_refresh = -1e18
        self._last_resend = clock.monotonic()
        self._deferred: list[tuple[float, str, Finding, int]] = []
        #: Sweeps done since start (a metric: tests wait on it, not on the clock).
        self.sweeps = 0
        #: Findings whose incident the store could not record: acted on when it can.
        self._unrecorded: dict[tuple[str, str, str], Finding] = {}
        self._inherited: dict[tuple[str, str, str], tuple[Incident, float]] = {}
        self._hangs: dict[str, Finding] = {}
        #: (job, node, restored nodes) that joined a stalled restore's recovery.
        self._joined: set[tuple[str, str, tuple[str, ...]]] = set()
        #: A worker of its own ticks the action runner (the daemon); the sweep does not.
        self.runs_actions_elsewhere = False
        #: The daemon's workers and whether each runs (``sn_controller_worker_up``).
        self.workers: Callable[[], Mapping[str, bool]] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Load what the store remembers and resume actions a previous run left."""
        self.breaker.restore()
        self.store_health.attempt(self.remediation.load)
        evictions = RunnerJobActions(self.runner, self.store, self.cluster, self.node_healthy)
        for record in self.store.list_nodes():
            state: NodeState = record.state if record.state in (
                "healthy", "degraded", "lost", "cordoned", "evicted") else "healthy"  # type: ignore[assignment]
            self.registry.restore(record.name, record.labels, state)
            self._set_state(record.name, state)
            if record.cordoned_by_us:
                self._cordoned.add(record.name)
                if evictions.already_evicted(record.name):
                    self._evicted.add(record.name)
        self.jobs.load_from_store()
        self._load_job_files()
        rules = {rule.name: rule for rule in self.engine.rules}
        grace = restart_grace(self.engine.rules)
        now_mono, now_wall = self.clock.monotonic(), self.clock.time()
        for incident in self.store.list_incidents(status="open", limit=100_000):
            self._firing.setdefault(incident.node, set()).add((incident.rule, incident.subject))
            rule = rules.get(incident.rule)
            if rule is not None and (rule.kind == "heartbeat"
                                     or NODE_FATAL_ACTIONS & set(rule.actions)):
                self._fatal.setdefault(incident.node, {})[
                    (incident.rule, incident.subject)] = incident.detected_at
            self._settle_again(incident, rule)
            if isinstance(rule, AlertRule) and self.engine.restore(
                    _firing_finding(incident, rule)):
                continue  # Alertmanager, not a report, says when it resolves
            wait = grace
            if isinstance(rule, EventRule):
                wait = max(0.0, incident.detected_at + rule.clear_after - now_wall)
            elif rule is None:
                wait = 0.0
            self._inherited[(incident.rule, incident.node, incident.subject)] = (
                incident, now_mono + wait)
        resumed = self.runner.resume(self.cluster())
        if resumed:
            log.info("resumed %d actions left in flight by the previous run", len(resumed))

    def _close_inherited(self) -> None:
        """Close incidents from before a restart whose fault is gone.

        The engine starts with no memory of what fired, so an incident whose fault cleared
        while the controller was down would stay open forever. Each inherited incident
        gets a grace period (long enough for every node to report and every ``for`` timer
        to run again; for event rules, the rest of ``clear_after``); if its rule has not
        fired again by then, it is resolved like any other.
        """
        if not self._inherited:
            return
        now = self.clock.monotonic()
        with self._engine_lock:
            firing = {(f.rule, f.node, f.subject) for f in self.engine.firing()}
        with self._fabric_lock:
            firing |= self.failslow.firing()
        rules = {rule.name: rule for rule in self.engine.rules}
        for key, (incident, deadline) in list(self._inherited.items()):
            if key in firing:
                del self._inherited[key]
                continue
            if now < deadline:
                continue
            del self._inherited[key]
            rule = rules.get(incident.rule)
            self._handle([Finding(
                rule=incident.rule, kind=rule.kind if rule else "gone", node=incident.node,
                subject=incident.subject, gpu=incident.gpu, status="resolved",
                severity=incident.severity, actions=tuple(rule.actions) if rule else (),
                dry_run=rule.dry_run if rule else False, value=incident.value,
                message=f"{incident.message} (cleared while the controller was down, or "
                        "its rule was removed)",
                observed_wall=incident.observed_at, detected_wall=self.clock.time())])

    def _settle_again(self, incident: Incident, rule: Rule | None) -> None:
        """Defer again the settled actions of ``incident`` that were never recorded.

        A controller that stopped within an incident's settle time had those actions
        only in memory, and the rule does not fire again for a fault it already reported
        (an XID is acknowledged once): without this they would never run.
        """
        if rule is None:
            return
        if self.jobs.owns_incident(incident.id):
            return  # a job recovery acted on it: it is the recovery's, never planned again
        steps = [step for step in self._plan(incident.node, rule.actions)
                 if step in SETTLED_ACTIONS]
        # A job recovery is keyed by its incident inside the orchestrator: asking again
        # for one it already handled does nothing, so it is always settled again.
        missing = [step for step in steps if step == RECOVER or not self._decided(incident, step)]
        if not missing:
            return
        finding = _firing_finding(incident, rule)
        due = self.clock.monotonic() + self.settings.settle
        log.info("incident %d: %s not yet decided before the restart; settling again",
                 incident.id, ", ".join(missing),
                 extra={"node": incident.node, "rule": incident.rule})
        with self._lock:
            self._deferred.extend((due, step, finding, incident.id) for step in missing)

    def _decided(self, incident: Incident, step: str) -> bool:
        """Whether ``step`` of ``incident`` was acted on before the restart.

        A ladder rung is the ladder's (a repair keeps the incidents it took in; its
        actions are keyed by the repair); any other action is keyed by the incident.
        """
        if step in LADDER_RUNGS:
            return self.remediation.decided(incident.id)
        return self.store.get_action_by_key(f"incident:{incident.id}:{step}") is not None

    def _load_job_files(self) -> None:
        if self.settings.jobs is None:
            return
        for name, job in load_jobs(Path(self.settings.jobs)).items():
            self.jobs.add_job(job, f"{self.settings.jobs}/{name}")
            log.info("job %s loaded from %s", name, self.settings.jobs)

    def close(self, timeout: float | None = None) -> bool:
        """Stop acting; the jobs' progress counters (ETTR) are written first.

        Waits up to ``timeout`` for the actions under way; False if some still ran then
        (their records say so, and the next start resumes them).
        """
        self.store_health.attempt(self.jobs.save_all)
        idle = self.runner.close(timeout)
        self.drivers.close()
        return idle

    # ------------------------------------------------------------------ ingest

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
            self.telemetry.ingest.report("invalid")
            raise
        if not identity.may_report_for(report.node):
            self.telemetry.ingest.report("forbidden")
            raise Forbidden(f"{identity.name} may not report for node {report.node}")
        accepted = self.registry.accept(report)
        view = accepted.view
        now = view.received_wall if accepted.applied else self.clock.time()
        if accepted.new_node or accepted.labels_changed:
            self.writer.call(partial(self._node_seen, report.node, dict(report.labels), now))
        written = None
        if report.events:
            # dated by the controller's clock, as the view the rules judge is
            events = controller_times(report, now).events
            written = self.writer.events(report.node, report.instance, events, now)
        if peer is not None and report.metrics_port is not None:
            self._peers[report.node] = (peer, report.metrics_port)
        edge_rules = None
        topology_wanted = False
        if accepted.applied:
            with self._fabric_lock:  # rates over the agent's own sampling intervals
                topology_wanted = self.finder.book.take(report)
                self.finder.meter.observe(report, report.sample_time_seconds)
            self._label_with_job(accepted.view)
            with self._engine_lock:
                findings = self.engine.observe(view, Now(view.received_monotonic, now))
                if report.takes_rules:
                    edge_rules = self.engine.edge_rules(accepted.view, report.rules_version)
            if findings:
                self._handle(findings)
            if report.node in self._gone_gpus and report.gpus:
                self._gpus_back(report)
            if report.node in self._lost:
                self._lost.discard(report.node)
        elif report.takes_rules:
            with self._engine_lock:
                edge_rules = self.engine.edge_rules(accepted.view, report.rules_version)
        if report.command_results:
            self.drivers.queue.complete(report.node, report.command_results)
        commands = self.drivers.queue.take(report.node)
        tally = self.telemetry.ingest
        tally.report("accepted" if accepted.applied else "stale")
        tally.observe(time.perf_counter() - started)
        reply = ReportReply(sequence=report.sequence, commands=commands,
                            edge_rules=edge_rules, node=report.node,
                            topology_wanted=topology_wanted)
        if written is None:
            return reply
        acknowledged = partial(self._acknowledging, reply, report)
        return acknowledged() if written.done() else PendingReply(written, acknowledged)

    def _acknowledging(self, reply: ReportReply, report: Report) -> ReportReply:
        """``reply`` acknowledging the report's events stored (after the writer had them)."""
        stored = self.writer.stored_through(report.node, report.instance)
        return msgspec.structs.replace(
            reply, events_stored_through=min(stored, max(e.id for e in report.events)))

    def _gpus_back(self, report: Report) -> None:
        """A GPU that was lost (or fell off the bus) reads healthy again: those close."""
        gone = self._gone_gpus.get(report.node, set())
        back = [g.index for g in report.gpus if g.index in gone and not g.lost]
        for gpu in back:
            with self._engine_lock:
                findings = self.engine.cancel(
                    report.node, gpu, f"GPU {gpu} answers NVML again (a healthy reading)",
                    HEALED_BY_READING)
            self._handle(findings)

    def _node_seen(self, node: str, labels: dict[str, str], now: float) -> None:
        """A new node, or new labels (the writer): stored, and label selectors may pick it."""
        self.store_health.attempt(self.store.upsert_node, node, labels, now)
        self.jobs.note_node(node, labels)

    def _events_stored(self, events: list[EventRecord]) -> None:
        for event in events:
            self.telemetry.events.labels(event.kind).inc()

    def ingest_alerts(self, body: bytes, who: str) -> dict[str, Any]:
        """Alertmanager's webhook: alerts that alert rules match become findings.

        They are handled like a report's (incidents, actions through the policy); the
        actions' audit records name ``who`` (the token's name) as their source.
        """
        try:
            payload = decode_webhook(body)
        except WebhookRejected as err:
            raise Malformed(err.message) from None
        with self._engine_lock:
            intake = self.engine.receive_alerts(payload.alerts, self._labels_of,
                                                f"alertmanager:{who}")
        self._handle(intake.findings)
        for outcome, count in (("accepted", intake.accepted), ("unmatched", intake.unmatched),
                               ("skipped", intake.skipped)):
            self.telemetry.webhook_alerts.labels(outcome).inc(count)
        log.info("alertmanager (%s, %s): %d alerts, %d accepted, %d skipped, %d unmatched, "
                 "%d findings", who, payload.receiver or "no receiver", len(payload.alerts),
                 intake.accepted, intake.skipped, intake.unmatched, len(intake.findings))
        for why in intake.why:
            log.warning("alertmanager alert skipped: %s", why)
        return {"accepted": intake.accepted, "skipped": intake.skipped,
                "unmatched": intake.unmatched, "findings": len(intake.findings), "by": who}

    # ------------------------------------------------------------------ findings

    def _handle(self, findings: Sequence[Finding]) -> None:
        """Findings: noted in memory now, recorded and acted on by the writer, in order.

        The blast radius sees them first: a fault on many nodes of one job (or rack) at
        once becomes one incident of the job (or rack).
        """
        self._take(self.blast.screen(findings))

    def _take(self, findings: Sequence[Finding]) -> None:
        """Findings past the blast radius: noted now, recorded and acted on by the writer."""
        for finding in findings:
            if finding.status == "firing":
                self._note_fired(finding)
                self.writer.call(partial(self._record_fired, finding))
            else:
                self._note_resolved(finding)
                self.writer.call(partial(self._record_resolved, finding))

    def _note_fired(self, f: Finding) -> None:
        with self._lock:
            self._firing.setdefault(f.node, set()).add((f.rule, f.subject))
            if f.gpu is not None and self._heals_by_reading(f.rule):
                self._gone_gpus.setdefault(f.node, set()).add(f.gpu)
            if _means_broken(f):
                self._fatal.setdefault(f.node, {})[(f.rule, f.subject)] = f.detected_wall
            if f.kind == "heartbeat":
                self._lost.add(f.node)
        self.telemetry.detection_latency.observe(max(0.0, f.detected_wall - f.observed_wall))
        log.warning("%s: %s", f.rule, f.message,
                    extra={"node": f.node, "rule": f.rule, "gpu": f.gpu})

    def _record_fired(self, f: Finding) -> int | None:
        """Record the incident and start its actions (the writer); its id (None: not).

        A repeat offender's incident takes its rule's next rung (escalation) first.
        """
        escalated = self.store_health.attempt(self.escalation.escalate, f)
        if escalated is not None and escalated is not f:
            f = escalated
            if _means_broken(f):
                with self._lock:
                    self._fatal.setdefault(f.node, {})[(f.rule, f.subject)] = f.detected_wall
        incident_id = self.store_health.attempt(
            self.store.open_incident, f.rule, f.node, f.subject, severity=f.severity,
            message=f.message, observed_at=f.observed_wall, detected_at=f.detected_wall,
            gpu=f.gpu, value=f.value,
        )
        if incident_id is None:
            log.error("not acting on %s: the incident could not be recorded", f.rule,
                      extra={"node": f.node, "rule": f.rule})
            with self._lock:
                self._unrecorded[(f.node, f.rule, f.subject)] = f
            return None
        if _means_broken(f):
            self.jobs.note_fleet_fault()
            opened = self.policy.note_fault(f.node, max(1, len(self.registry)))
            if opened is not None:
                self.store_health.attempt(self.breaker.opened, opened)
        due = self.clock.monotonic() + self.settings.settle
        for step in self._plan(f.node, f.actions):
            if step in SETTLED_ACTIONS and self.settings.settle > 0:
                with self._lock:
                    self._deferred.append((due, step, f, incident_id))
            else:
                self._run_step(step, f, incident_id)
        return int(incident_id)

    def _plan(self, node: str, actions: Sequence[str]) -> list[str]:
        """The steps a firing rule's actions mean for this node.

        On a job's node (or one its active recovery is evicting, or one of its spares)
        ``failover`` and ``evict`` are the recovery's (RECOVER: a spare leaves the pool).
        Elsewhere ``failover`` is an eviction, and a ``failover`` to the controller-wide
        job control when one is configured (it may run jobs the controller does not know).
        A node already evicted is not evicted again.
        """
        in_job = bool(self.jobs.jobs_of_node(node))
        recovering = (in_job or self.jobs.recovering(node)
                      or "spare" in self.jobs.roles_of(node).values())
        with self._lock:
            evicted = node in self._evicted
        steps: list[str] = []
        for action in actions:
            if recovering and action in RECOVERED_ACTIONS:
                if RECOVER not in steps:
                    steps.append(RECOVER)
            elif in_job and action == "checkpoint":
                steps.append(CHECKPOINT_JOBS)
            elif action in RECOVERED_ACTIONS and evicted:
                continue  # already out of service: nothing more to take
            elif action == "failover":
                steps.extend(("evict", "failover") if self._failover_elsewhere else ("evict",))
            else:
                steps.append(action)
        return list(dict.fromkeys(steps))

    def _run_step(self, step: str, f: Finding, incident_id: int) -> None:
        if step in LADDER_RUNGS:
            self.store_health.attempt(
                self.remediation.start, f.node, f.gpu, self._first_rung(step, f), rule=f.rule,
                reason=f.message, incident_id=incident_id)
        elif step == RECOVER:
            self.store_health.attempt(self.jobs.on_node_fault, f.node,
                                "lost" if f.kind == "heartbeat" else "fatal", incident_id,
                                self._ranks_alive(f), f.observed_wall)
        elif step == CHECKPOINT_JOBS:
            self.store_health.attempt(self.jobs.on_node_degrading, f.node, f.rule, incident_id)
        else:
            self._submit(cast(ActionName, step), f, incident_id, "firing")

    def _first_rung(self, step: str, f: Finding) -> Rung:
        """The rung a rule asks for, or higher where NVIDIA's catalogue says the XID needs it."""
        rule = self.engine.rule(f.rule)
        entry = None
        if isinstance(rule, EventRule) and rule.event == "xid" and f.value is not None:
            entry = self.xids.get(int(f.value))
        return first_rung(cast(Rung, step), entry.resolution if entry is not None else None)

    def _ranks_alive(self, f: Finding) -> bool:
        """Whether the job's ranks on ``f``'s node may still run (and so checkpoint).

        Not on a lost node, nor after an XID or a lost GPU: the catalogue's action for
        those kills the application on that GPU (and a synchronous job with it).
        """
        if f.kind == "heartbeat":
            return False
        rule = next((r for r in self.engine.rules if r.name == f.rule), None)
        return not (isinstance(rule, EventRule) and rule.event in RANK_KILLING_EVENTS)

    def _submit_settled(self) -> None:
        """Submit node-taking actions whose settle time has passed, if still wanted."""
        now = self.clock.monotonic()
        with self._lock:
            ready = [d for d in self._deferred if d[0] <= now]
        for _, action, f, incident_id in ready:
            with self._lock:
                still = (f.rule, f.subject) in self._firing.get(f.node, set())
            if not still:
                log.info("not running %s: %s cleared within the settle time", action, f.rule,
                         extra={"node": f.node, "rule": f.rule})
                continue
            self.writer.call(partial(self._run_step, action, f, incident_id))
        # Left in the list until handed to the writer: an action is always counted as
        # settling or queued (sn_controller_actions_settling, the store queue).
        handed = {id(d) for d in ready}
        with self._lock:
            self._deferred = [d for d in self._deferred if id(d) not in handed]

    def _action_succeeded(self, record: ActionRecord) -> None:
        """Note an eviction (or its end); a recovery's step: take the next one now."""
        if record.node is not None and record.action in ("evict", "uncordon"):
            with self._lock:
                if record.action == "evict":
                    self._evicted.add(record.node)
                else:
                    self._evicted.discard(record.node)
        if record.owner is not None:
            for hang in self.store_health.attempt(self.jobs.tick) or ():
                self._job_hung(hang)

    def _job_hung(self, hang: HangFinding) -> None:
        """A job stopped making progress: a hang incident naming who stopped first.

        Noted now, recorded (and the job told) by the writer, after what is queued.

        When its ranks cannot tell (every one stopped together, as a collective that waits
        on one broken link does), the job's nodes with a critical incident open are the
        suspects: restarting in place on a node whose InfiniBand port is down only hangs
        again.
        """
        if not hang.nodes:
            suspects = self._critical_members(hang.job)
            if suspects:
                hang = replace(hang, nodes=suspects, message=(
                    f"{hang.message}; {', '.join(suspects)} with a critical incident open"))
        node = hang.nodes[0] if hang.nodes else f"job:{hang.job}"
        who = (f"ranks {', '.join(map(str, hang.ranks))} on {', '.join(hang.nodes)} "
               "stopped first" if hang.nodes else "every rank stopped together")
        finding = Finding(
            rule="job-hang", kind="hang", node=node, subject=f"job:{hang.job}", gpu=None,
            status="firing", severity="critical", actions=("alert",), dry_run=False,
            value=hang.stalled_seconds,
            message=(f"job {hang.job} hung at step {hang.step}: {who}, "
                     f"{hang.stalled_seconds:.0f} s without progress"),
            observed_wall=hang.stopped_at, detected_wall=self.clock.time())
        self._note_fired(finding)
        self.writer.call(partial(self._record_hang, finding, hang))

    def _record_hang(self, finding: Finding, hang: HangFinding) -> None:
        """The hang's incident, then the job's recovery; only then may it close.

        :meth:`_close_hangs` closes a hang whose job runs: before its recovery starts the
        job still says ``running``, so the hang is kept apart until it has.
        """
        self.store_health.attempt(self.jobs.on_hang, hang, self._record_fired(finding))
        with self._lock:
            self._hangs[hang.job] = finding

    def _watch_fail_slow(self) -> None:
        """Every few seconds: the jobs' paces to the finder, its bottlenecks as incidents."""
        now = self.clock.time()
        if not self.failslow.due(now):
            return
        paces = [JobPace(j.name, j.nodes, j.generation, j.state == "running",
                         j.recent_step_seconds or j.median_step_seconds)
                 for j in self.jobs.jobs()]
        # the meter's readings lock first: waiting for it (a topology being read) while
        # holding the fabric lock would hold every report
        with self.finder.meter.reading(), self._fabric_lock:
            findings = self.failslow.tick(paces, now)
        self._take(findings)

    def topology(self, job: str | None = None) -> dict[str, Any]:
        """``GET /api/v1/topology``: the fleet graph, rates and bottlenecks (fabric.view).

        Under the fabric lock, which every report takes, only copies are made (the jobs
        are read before it, their lock may wait on a store); the rates are worked in
        under the meter's readings lock, which no report takes; the document (a second
        or more at thousands of nodes) is built with no lock held. Otherwise the event
        loop would wait on the fabric lock, every report behind it.
        """
        now = self.clock.time()
        incidents = [{"id": i.id, "node": i.node, "rule": i.rule, "severity": i.severity,
                      "gpu": i.gpu, "message": i.message}
                     for i in self.store_health.attempt(
                         self.store.list_incidents, status="open", limit=1000) or ()]
        views = self.registry.views()
        states = {name: self._state_of(name) for name in views}
        jobs: list[JobOnFabric] = []
        statuses = [(j, self.jobs.ranks_by_node(j.name)) for j in self.jobs.jobs()]
        with self._fabric_lock:
            for j, ranks in statuses:
                trend = self.finder.trend(j.name)
                slow = self.finder.slowdown(j.name, now)
                jobs.append(JobOnFabric(
                    name=j.name, state=j.state, nodes=j.nodes, ranks=ranks,
                    step_time_seconds=j.recent_step_seconds or j.median_step_seconds,
                    baseline_step_time_seconds=trend.baseline() if trend else None,
                    slowdown_ratio=slow.ratio if slow else 0.0 if trend else None))
            fail_slow = [{"job": b.job, "node": b.node, "link": b.link, "kind": b.kind,
                          "rail": b.rail, "gpu": b.gpu, "since": b.since,
                          "detected": b.detected, "slowdown_ratio": round(b.slowdown_ratio, 4),
                          "message": b.message} for b in self.failslow.standing.values()]
            wirings = self.finder.book.wirings()
        meter = self.finder.meter
        readings = {name: values for name in views if (values := meter.values(name)) is not None}
        return fleet_topology(now=now, views=views, states=states, incidents=incidents,
                              wirings=wirings, readings=readings, jobs=jobs,
                              fail_slow=fail_slow, job=job)

    def _critical_members(self, job: str, nodes: Sequence[str] | None = None
                          ) -> tuple[str, ...]:
        """The job's nodes (or ``nodes``) on which a critical rule is firing."""
        if nodes is None:
            status = self.jobs.job(job)
            if status is None:
                return ()
            nodes = status.nodes
        critical = {r.name for r in self.engine.rules if r.severity == "critical"}
        with self._lock:
            return tuple(sorted(n for n in nodes
                                if any(rule in critical for rule, _ in self._firing.get(n, ()))))

    def _suspects_of_stalled_restores(self) -> None:
        """A restore that does not progress, onto a node with a critical incident.

        That node joins the recovery (it is evicted, a spare takes its place), once.
        """
        for job, nodes in self.store_health.attempt(self.jobs.stalled_restores) or ():
            for node in self._critical_members(job, nodes):
                key = (job, node, tuple(nodes))
                if key in self._joined:
                    continue
                self._joined.add(key)
                log.warning("job %s: the restore makes no progress and %s has a critical "
                            "incident open: it joins the recovery", job, node,
                            extra={"node": node})
                self.writer.call(partial(self.store_health.attempt, self.jobs.on_node_fault, node,
                                         "hang", None, True, None, job))

    def _close_hangs(self) -> None:
        """A hang incident clears once its job runs again (recovered, or unstuck)."""
        with self._lock:
            hung = dict(self._hangs)
        for job, finding in hung.items():
            status = self.jobs.job(job)
            if status is not None and status.state not in ("running",):
                continue
            with self._lock:
                self._hangs.pop(job, None)
            self._handle([replace(finding, status="resolved", detected_wall=self.clock.time())])

    def _heals_by_reading(self, rule_name: str) -> bool:
        rule = self.engine.rule(rule_name)
        return isinstance(rule, EventRule) and rule.event in HEALED_BY_READING

    def _note_resolved(self, f: Finding) -> None:
        with self._lock:
            if f.gpu is not None and self._heals_by_reading(f.rule):
                gone = self._gone_gpus.get(f.node)
                if gone is not None:
                    gone.discard(f.gpu)
                    if not gone:
                        del self._gone_gpus[f.node]
            self._firing.get(f.node, set()).discard((f.rule, f.subject))
            self._fatal.get(f.node, {}).pop((f.rule, f.subject), None)
            self._unrecorded.pop((f.node, f.rule, f.subject), None)
            if f.kind == "heartbeat":
                self._lost.discard(f.node)
        log.info("%s resolved: %s", f.rule, f.message,
                 extra={"node": f.node, "rule": f.rule, "gpu": f.gpu})

    def _record_resolved(self, f: Finding) -> None:
        """Close the incident (the writer); alert that it resolved, release a throttle."""
        incident_id = self.store_health.attempt(self.store.close_incident, f.rule, f.node,
                                          f.subject, f.detected_wall)
        if incident_id is None:
            return
        if "alert" in f.actions:
            self._submit("alert", f, incident_id, "resolved")
        if "throttle" in f.actions:
            self._submit("release", f, incident_id, "resolved")

    def _submit(self, action: ActionName, f: Finding, incident_id: int, status: str) -> None:
        suffix = ":resolved" if status == "resolved" and action == "alert" else ""
        request = ActionRequest(
            id=uuid.uuid4().hex, key=f"incident:{incident_id}:{action}{suffix}",
            action=action, node=f.node, reason=f.message, rule=f.rule,
            incident_id=incident_id, gpu=f.gpu, severity=f.severity,
            labels=self._finding_labels(f),
            params={"status": status, "subject": f.subject, "value": f.value,
                    "observed_at": f.observed_wall, "detected_at": f.detected_wall},
            requested_by=f"rule:{f.rule}" + (f" via {f.source}" if f.source else ""),
            created_seconds=self.clock.time(),
        )
        self.store_health.attempt(self.runner.submit, request, self.cluster(), f.dry_run)

    def _command_result(self, node: str, result: CommandResult) -> None:
        what = "done" if result.ok else "failed"
        message = f"agent {what}: {result.message}" + (" (dry run)" if result.dry_run else "")
        if result.checks:
            message += f" [{describe_checks(result) if not result.ok else 'checks passed'}]"
        try:
            self.store.update_action(result.id, at=self.clock.time(), outcome_message=message)
        except StoreError as err:
            log.warning("agent result for unknown action %s: %s", result.id, err,
                        extra={"node": node})
        self.store_health.attempt(self.remediation.on_result, node, result)

    def _submit_request(self, request: ActionRequest) -> ActionRecord | None:
        """An action the remediation ladder asks for, through the runner (None: not recorded)."""
        return self.store_health.attempt(self.runner.submit, request, self.cluster(), False)

    def _audit_repair(self, what: str, who: str, reason: str, node: str,
                      params: dict[str, Any]) -> None:
        self.store_health.attempt(self._audit, what, who, reason, node=node, params=params)

    def _clear_faults(self, node: str, gpu: int | None, why: str) -> None:
        """A repair passed its check: the event incidents it cleared close."""
        with self._engine_lock:
            findings = self.engine.cancel(node, gpu, why)
        self._take(findings)

    # ------------------------------------------------------------------ sweep

    def sweep(self) -> None:
        """Heartbeats, peers, retries, alert re-sends, node states: every sweep interval."""
        stalls = self.stalls
        if stalls is not None:
            stalls.sweep_started()
        try:
            self._sweep()
        finally:
            self.sweeps += 1
            if stalls is not None:
                stalls.sweep_finished()

    def _sweep(self) -> None:
        if self.stalls is not None and self.stalls.reports_behind():
            # The event loop has not read the sockets lately: the reports waiting there
            # are not silence. The rules' sweep waits until they are in.
            log.info("event loop behind: heartbeats not judged this sweep")
        else:
            with self._engine_lock:
                findings = self.engine.sweep(self.registry.views())
            self._handle(findings)
            self._take(self.blast.sweep())
        self._close_inherited()
        self._submit_settled()
        self.store_health.attempt(self.remediation.tick)
        self.jobs.observe_fleet(len(self.registry))
        for hang in self.store_health.attempt(self.jobs.tick) or ():
            self._job_hung(hang)
        self._close_hangs()
        self._suspects_of_stalled_restores()
        self._watch_fail_slow()
        if not self.runs_actions_elsewhere:
            self.runner.tick()
        now = self.clock.monotonic()
        alertmanager = self.drivers.alertmanager
        if alertmanager is not None and (
                now - self._last_resend >= alertmanager.settings.resend_interval):
            self._last_resend = now
            alertmanager.resend_firing()
        self.store_health.attempt(self.breaker.sweep, self.node_healthy)
        if self.jobs.membership_version != self._membership_seen:
            self._relabel_jobs()
        if now - self._last_refresh >= NODE_REFRESH_SECONDS:
            self._last_refresh = now
            self._refresh_nodes()

    def _refresh_nodes(self) -> None:
        cordoned = self.store_health.attempt(self.store.cordoned_by_us)
        if cordoned is None:
            return
        if not self.store_health.ok and self._store_takes_writes():
            log.warning("store writable again: acting resumes")
            self.store_health.recovered()
            self._retry_unrecorded()
        with self._lock:
            self._cordoned = cordoned
            # Only these can be anything but healthy, or have just become healthy: the
            # rest of a fleet of thousands is healthy and stays so (not walked each time).
            suspects = (self._lost | self._evicted | cordoned
                        | {n for n, pairs in self._firing.items() if pairs})
        suspects |= self._unhealthy
        views = self.registry.views()
        suspects |= views.keys() - self._states.keys()
        changed: list[tuple[str, NodeState, str]] = []
        for name in suspects:
            view = views.get(name)
            if view is None:
                continue
            state = self._state_of(name)
            if self._states.get(name) != state:
                reason = ", ".join(sorted(r for r, _ in self._firing.get(name, ()))) or "clear"
                changed.append((name, state, reason))
            view.state = state
        if changed:  # one transaction: a fleet's first sweep changes thousands
            self.store_health.attempt(self.store.set_node_states, changed, self.clock.time())
            for name, state, _ in changed:
                self._set_state(name, state)

    def _set_state(self, node: str, state: NodeState) -> None:
        """The state recorded for ``node``; the unhealthy ones are kept apart (refresh)."""
        self._states[node] = state
        if state == "healthy":
            self._unhealthy.discard(node)
        else:
            self._unhealthy.add(node)

    def _store_takes_writes(self) -> bool:
        """A probe while the store refuses writes: whether it takes one again."""
        try:
            self.store.set_meta("alive", str(self.clock.time()))
        except StoreError as err:
            self.store_health.error = str(err)
            return False
        return True

    def _retry_unrecorded(self) -> None:
        """Act on the faults seen while the store took no writes, if they still hold.

        The rules hold them as firing (an event is not seen twice), so without this a
        fault that came while the disk was full would never be acted on.
        """
        with self._lock:
            kept, self._unrecorded = self._unrecorded, {}
        if not kept:
            return
        with self._engine_lock:
            firing = {(f.node, f.rule, f.subject) for f in self.engine.firing()}
        now = self.clock.time()
        for key, f in kept.items():
            if key in firing:
                log.warning("%s: acting now that the store takes writes", f.rule,
                            extra={"node": f.node, "rule": f.rule, "gpu": f.gpu})
                self._handle([replace(f, detected_wall=now)])

    def _stalled(self, where: str, seconds: float) -> None:
        """The controller stood still ``seconds`` (see stall.py); silent nodes get grace.

        Its agents' reports timed out meanwhile and they backed off, as after a restart.
        """
        self.telemetry.stalls.labels(where).observe(seconds)
        with self._engine_lock:
            self.engine.forgive_silence()

    def node_healthy(self, node: str, since: float | None = None) -> bool:
        """The node reports, and nothing that means it is broken is firing on it.

        With ``since`` (wall time), faults detected before it do not count: the breaker
        asks whether a node is back from what it counted the node for, and a node that
        was broken before the burst (and stays so) is back from the burst.
        """
        with self._lock:
            fatal = self._fatal.get(node, {})
            return node not in self._lost and self.registry.get(node) is not None and \
                not [at for at in fatal.values() if since is None or at >= since]

    def _state_of(self, node: str) -> NodeState:
        with self._lock:
            if node in self._lost:
                return "lost"
            if node in self._evicted and node in self._cordoned:
                return "evicted"
            if node in self._cordoned:
                return "cordoned"
            if self._firing.get(node):
                return "degraded"
        return "healthy"

    def _label_with_job(self, view: NodeView) -> None:
        """Give a node of a DistributedJob the ``job`` label, for rules that group by it.

        A ``job`` label the agent sends itself wins; the one the controller adds follows
        the job's membership (an evicted node loses it: :meth:`_relabel_jobs`).
        """
        if view.report is not None and "job" in view.report.labels:
            return
        jobs = self.jobs.jobs_of_node(view.name)
        wanted = jobs[0] if jobs else None
        if view.labels.get("job") != wanted:
            labels = {k: v for k, v in view.labels.items() if k != "job"}
            view.labels = labels if wanted is None else {**labels, "job": wanted}

    def _relabel_jobs(self) -> None:
        """A job's members changed: every node's ``job`` label follows, at once."""
        self._membership_seen = self.jobs.membership_version
        for view in self.registry.views().values():
            self._label_with_job(view)

    def _job_control(self, job: str) -> JobControl | None:
        """The job's ``spec.control`` (None: it names none); KeyError: no such job."""
        spec = self.jobs.spec(job)
        if spec is None:
            raise KeyError(job)
        return spec.spec.control

    def _labels_of(self, node: str) -> dict[str, str] | None:
        view = self.registry.get(node)
        return dict(view.labels) if view is not None else None

    def _job_of(self, node: str) -> tuple[str, int] | None:
        """``node``'s job and its size: a job the controller runs, else its job label."""
        jobs = self.jobs.jobs_of_node(node)
        if jobs:
            status = self.jobs.job(jobs[0])
            return jobs[0], len(status.nodes) if status is not None else 0
        view = self.registry.get(node)
        label = view.labels.get("job") if view is not None else None
        if label is None:
            return None
        size = sum(1 for v in self.registry.views().values() if v.labels.get("job") == label)
        return label, size

    def _finding_labels(self, f: Finding) -> dict[str, str]:
        """An action's labels: its node's, or for a job's incident the job's (its owner)."""
        if f.node.startswith("job:"):
            job = f.node[len("job:"):]
            spec = self.jobs.spec(job)
            return {**(spec.metadata.labels if spec is not None else {}), "job": job}
        view = self.registry.get(f.node)
        return dict(view.labels) if view else {}

    def cluster(self) -> ClusterSummary:
        """The numbers the safety policy needs."""
        # The runner records a cordon in the store the moment it is done; the sweep only
        # copies it into memory every NODE_REFRESH_SECONDS. Read it here, or a second
        # cordon within those seconds would not see the first one (max_unavailable).
        # One small query and set arithmetic: this runs before every action, and a
        # per-node walk of 8,192 nodes here was most of the controller's CPU in a burst.
        cordoned = self.store_health.attempt(self.store.cordoned_by_us)
        known = self.registry.names()
        with self._lock:
            if cordoned is not None:
                self._cordoned = cordoned
            out = frozenset((self._lost | self._cordoned) & known)
        return ClusterSummary(total_nodes=max(1, len(known)), unavailable=out)

    def reload_rules(self, rules: Sequence[Rule],
                     sources: Mapping[str, int] | None = None) -> None:
        """SIGHUP: new rules, firing state kept for unchanged ones."""
        with self._engine_lock:
            findings = self.engine.reload(rules)
            self._rule_sources = _sources_of(rules, sources)
        self._handle(findings)
        log.info("rules reloaded: %d rules", len(rules))

    # ------------------------------------------------------------------ API

    def list_nodes(self) -> list[dict[str, Any]]:
        return [self._node_doc(view) for _, view in sorted(self.registry.views().items())]

    def get_node(self, name: str) -> dict[str, Any] | None:
        view = self.registry.get(name)
        if view is None:
            return None
        doc = self._node_doc(view)
        doc["incidents"] = [_incident_doc(i) for i in self.store.list_incidents(
            status="open", node=name, limit=100)]
        return doc

    def _node_doc(self, view: NodeView) -> dict[str, Any]:
        report = view.report
        temps = [g.temperature_celsius for g in report.gpus
                 if g.temperature_celsius is not None] if report else []
        with self._lock:
            firing = sorted({rule for rule, _ in self._firing.get(view.name, ())})
        age = self.progress.monotonic() - view.received_monotonic
        return {
            "name": view.name,
            "labels": dict(view.labels),
            "state": self._state_of(view.name),
            "last_report_age_seconds": round(age, 3) if report else None,
            "gpus": len(report.gpus) if report else 0,
            "gpus_lost": sum(1 for g in report.gpus if g.lost) if report else 0,
            "hottest_gpu_celsius": max(temps) if temps else None,
            "firing": firing,
            "cordoned_by_us": view.name in self._cordoned,
            "jobs": self.jobs.roles_of(view.name),
        }

    def manual_action(self, action: str, node: str, who: str, reason: str) -> dict[str, Any]:
        if action not in ("cordon", "uncordon"):
            raise Invalid(f"cannot {action} by hand")
        view = self.registry.get(node)
        request = ActionRequest(
            id=uuid.uuid4().hex, key=f"manual:{uuid.uuid4().hex}", action=cast(ActionName, action),
            node=node, reason=f"{reason} (by {who})", requested_by=who,
            labels=dict(view.labels) if view else {}, params={"status": "manual"},
            created_seconds=self.clock.time(),
        )
        record = self.store_health.attempt(self.runner.submit, request, self.cluster(), False)
        if record is None:
            raise self._unavailable()
        if action == "uncordon" and self.jobs.excluding(node):
            # a person says it is repaired: a job takes it back as a spare after its check
            self.store_health.attempt(self.remediation.check, node, f"uncordoned by {who}")
        return _action_doc(record)

    def _unavailable(self) -> Unavailable:
        return Unavailable(f"store unavailable, refusing to act: {self.store_health.error}",
                           STORE_RETRY_AFTER_SECONDS)

    def list_incidents(self, status: str | None, node: str | None,
                       limit: int) -> list[dict[str, Any]]:
        return [_incident_doc(i) for i in self.store.list_incidents(
            status=status, node=node, limit=limit)]  # type: ignore[arg-type]

    def get_incident(self, incident_id: int) -> dict[str, Any] | None:
        incident = self.store.get_incident(incident_id)
        if incident is None:
            return None
        doc = _incident_doc(incident)
        doc["actions"] = [_action_doc(a) for a in self.store.list_actions(
            incident_id=incident_id, limit=INCIDENT_ACTIONS_SHOWN)]
        return doc

    def list_actions(self, node: str | None, state: str | None,
                     limit: int) -> list[dict[str, Any]]:
        return [_action_doc(a) for a in self.store.list_actions(
            node=node, state=state, limit=limit)]

    # ------------------------------------------------------------------ jobs API

    def add_job(self, body: bytes, who: str, admin: bool = False) -> dict[str, Any]:
        """A DistributedJob from the API; only ``admin`` may name a program or a URL."""
        try:
            job = job_from_json(body)
        except ConfigError as err:
            raise Invalid(str(err)) from None
        control = job.spec.control
        if control is not None and control.kind in ADMIN_ONLY_CONTROL and not admin:
            # A program to run or a URL to call (with a secret file to read) is a choice
            # for whoever configures the controller, not for an operate token.
            raise Forbidden(f"spec.control.{control.kind}: only an admin token may post "
                           "a job that names a program or a URL for the controller to call; "
                           "put the job in the controller's --jobs directory, or use "
                           "kubernetes or slurm control")
        # The spec stays out of the audit record: its control may carry a secret.
        with self._audited("add-job", who, f"job {job.name} added", params={"job": job.name}):
            status = self.jobs.add_job(job, f"api:{who}")
        log.info("job %s added by %s", job.name, who)
        return status.to_dict()

    def list_jobs(self) -> list[dict[str, Any]]:
        return [status.to_dict() for status in self.jobs.jobs()]

    def get_job(self, name: str) -> dict[str, Any] | None:
        status = self.jobs.job(name)
        if status is None:
            return None
        doc = status.to_dict()
        doc["recoveries"] = [r.to_dict() for r in self.jobs.recoveries(name, limit=20)]
        return doc

    def delete_job(self, name: str, who: str) -> None:
        if self.jobs.job(name) is None:
            raise NotFound(f"no job {name!r}")
        with self._audited("delete-job", who, f"job {name} removed",
                           params={"job": name}) as audit:
            if not self.jobs.remove_job(name):  # removed by someone else in between
                self._audit_refused(audit, "no such job")
                raise NotFound(f"no job {name!r}")
        log.info("job %s removed by %s", name, who)

    def job_progress(self, name: str, body: bytes) -> dict[str, Any]:
        progress = _decode(_progress_decoder, body)
        try:
            reply = self.jobs.progress(
                name, progress.rank, progress.node, progress.world_size,
                [(u.step, u.time) for u in progress.updates], progress.step_time_seconds)
        except UnknownJob:
            raise NotFound(f"no job {name!r}") from None
        except ValueError as err:
            raise Invalid(str(err)) from None
        return reply.to_dict()

    def job_checkpoint(self, name: str, body: bytes) -> dict[str, Any]:
        saved = _decode(_checkpoint_decoder, body)
        try:
            checkpoint = self.jobs.checkpoint_saved(name, saved.rank, saved.node, saved.step,
                                                    saved.path, saved.save_seconds)
        except UnknownJob:
            raise NotFound(f"no job {name!r}") from None
        except (ValueError, OSError) as err:
            raise Invalid(str(err)) from None
        return {"step": checkpoint.step, "path": str(checkpoint.path),
                "complete": checkpoint.complete, "reason": checkpoint.reason}

    def restore_point(self, name: str) -> dict[str, Any] | None:
        try:
            point = self.jobs.restore_point(name)
        except UnknownJob:
            raise NotFound(f"no job {name!r}") from None
        return None if point is None else point.to_dict()

    def list_recoveries(self, job: str | None, limit: int) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.jobs.recoveries(job, limit=limit)]

    def list_repairs(self, node: str | None, limit: int) -> list[dict[str, Any]]:
        """The remediation ladders in progress and the latest ended, newest first."""
        return self.remediation.repairs(node)[:limit]

    def approve_recovery(self, recovery_id: str, who: str) -> dict[str, Any]:
        with self._audited("approve-recovery", who, f"recovery {recovery_id} approved",
                           params={"recovery": recovery_id},
                           unknown=("no such recovery", f"no recovery {recovery_id!r}")):
            return self.jobs.approve_recovery(recovery_id, who).to_dict()

    def return_to_pool(self, job: str, node: str, who: str) -> dict[str, Any]:
        with self._audited("return-to-pool", who, f"{node} back in the spare pool of {job}",
                           node=node, params={"job": job},
                           unknown=("no such job", f"no job {job!r}")):
            status = self.jobs.return_to_pool(job, node)
        log.info("node %s returned to the spare pool of %s by %s", node, job, who)
        return status.to_dict()

    def _audit(self, what: str, who: str, reason: str, *, node: str | None = None,
               params: dict[str, Any] | None = None) -> ActionRecord:
        """The audit record of an API call that changes jobs (not an action for a driver).

        Written before the change, in a final state, so that the runner never picks it
        up; :meth:`_audit_refused` corrects it when the change is then refused. A store
        that takes no writes refuses the call (503), as for any action.
        """
        now = self.clock.time()
        request = ActionRequest(
            id=uuid.uuid4().hex, key=f"api:{uuid.uuid4().hex}", action=cast(ActionName, what),
            node=node, reason=f"{reason} (by {who})", requested_by=who,
            params={**(params or {}), "status": "api"}, created_seconds=now,
        )
        recorded = self.store_health.attempt(self.store.record_action, request, "succeeded",
                                             f"API call by {who}", at=now)
        if recorded is None:
            raise self._unavailable()
        return recorded[0]

    @contextmanager
    def _audited(self, what: str, who: str, reason: str, *, node: str | None = None,
                 params: dict[str, Any] | None = None,
                 unknown: tuple[str, str] | None = None) -> Iterator[ActionRecord]:
        """The audit record (:meth:`_audit`) around a job change; a refusal corrects it.

        The refusal becomes the API's answer: an unknown job or recovery 404 when
        ``unknown`` = (what the record says, the API's message) is given, any other
        :class:`JobError` 409, a store that takes no writes 503.
        """
        record = self._audit(what, who, reason, node=node, params=params)
        try:
            yield record
        except JobError as err:
            if unknown is not None and isinstance(err, UnknownJob | UnknownRecovery):
                self._audit_refused(record, unknown[0])
                raise NotFound(unknown[1]) from None
            self._audit_refused(record, str(err))
            raise Conflict(str(err)) from None
        except StoreUnavailable as err:
            self._audit_refused(record, str(err))
            raise Unavailable(f"store unavailable: {err}",
                              STORE_RETRY_AFTER_SECONDS) from None

    def _audit_refused(self, record: ActionRecord, why: str) -> None:
        try:
            self.store.update_action(record.id, at=self.clock.time(), state="refused",
                                     outcome_message=why)
        except StoreError as err:
            log.error("audit record %s not corrected (%s): %s", record.id, why, err)

    def list_events(self, node: str | None, kind: str | None,
                    limit: int) -> list[dict[str, Any]]:
        return self.store.list_events(node=node, kind=kind, limit=limit)

    def approve(self, action_id: str, who: str) -> dict[str, Any]:
        if self.store.get_action(action_id) is None:
            raise NotFound(f"no action {action_id!r}")
        # The approval is recorded on the action itself ("approved by <who>; ...").
        try:
            return _action_doc(self.runner.approve(action_id, who, self.cluster()))
        except ActionStateError as err:
            raise Conflict(str(err)) from None
        except StoreUnavailable as err:
            raise Unavailable(f"store unavailable, refusing to act: {err}",
                              STORE_RETRY_AFTER_SECONDS) from None
        except StoreError as err:  # approved or cancelled by someone else meanwhile
            raise Conflict(str(err)) from None

    def service_discovery(self) -> list[dict[str, Any]]:
        """Prometheus HTTP SD: one target group per agent, labelled for dashboards."""
        groups = []
        for name, view in sorted(self.registry.views().items()):
            address = self._peers.get(name)
            if address is None:
                continue
            host, port = address
            target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            labels = {"node": name}
            for key in ("supernode", "rack", "job"):
                if key in view.labels:
                    labels[key] = view.labels[key]
            groups.append({"targets": [target], "labels": labels})
        return groups

    def breaker_state(self) -> dict[str, Any]:
        return breaker_doc(self.breaker.state())

    def set_breaker(self, open_it: bool, who: str, reason: str) -> dict[str, Any]:
        """A person closes the breaker (evictions go on) or opens it (they freeze); audited."""
        what = "open-breaker" if open_it else "close-breaker"
        with self._audited(what, who, f"circuit breaker {'opened' if open_it else 'closed'}: "
                                      f"{reason}", params={"reason": reason}):
            state = (self.breaker.open_by_hand(who, reason) if open_it
                     else self.breaker.close_by_hand(who, reason))
        log.warning("circuit breaker %s by %s: %s", "opened" if open_it else "closed", who,
                    reason)
        return breaker_doc(state)

    def health(self) -> tuple[bool, dict[str, Any]]:
        breaker = self.policy.breaker_state()
        body = {
            "status": "ok" if self.store_health.ok else "refusing to act",
            "nodes": len(self.registry),
            "breaker": {"open": breaker.open, "reason": breaker.reason},
            "store": self.store_health.error or "ok",
        }
        return self.store_health.ok, body

    def state(self) -> ControllerState:
        with self._lock:
            firing = tuple((rule, node) for node, pairs in self._firing.items()
                           for rule, _ in pairs)
        count = self.store_health.attempt(self.store.open_incident_count)
        return ControllerState(
            node_states={n: self._state_of(n) for n in self.registry.views()},
            firing=firing,
            open_incidents=count,
            action_outcomes=self.runner.outcomes(),
            breaker_open=self.policy.breaker_state().open,
            store_up=self.store_health.ok,
            workers=dict(self.workers()) if self.workers is not None else {},
            store_queue=self.writer.depth,
            settling=len(self._deferred),
            sweeps=self.sweeps,
            ingest_lag=self.stalls.ingest_lag() if self.stalls is not None else None,
            jobs=self.jobs.metrics(),
            rules=self._rule_sources,
            **self._paces(),
        )

    def _paces(self) -> dict[str, Any]:
        """The finder's view of the jobs, for the metrics."""
        now = self.clock.time()
        with self._fabric_lock:
            paces: dict[str, tuple[float | None, float | None, float]] = {}
            for job in self.finder.jobs():
                trend = self.finder.trend(job)
                slow = self.finder.slowdown(job, now)
                if trend is not None:
                    paces[job] = (trend.latest(), trend.baseline(), slow.ratio if slow else 0.0)
            named = tuple((b.job, b.node, b.link, b.kind)
                          for b in self.failslow.standing.values())
        return {"job_paces": paces, "fail_slow": named}

    def metrics(self) -> bytes:
        """The controller's /metrics body."""
        return self.telemetry.render()


_progress_decoder = msgspec.json.Decoder(ProgressBody)
_checkpoint_decoder = msgspec.json.Decoder(CheckpointBody)

_T = TypeVar("_T")


def _decode(decoder: msgspec.json.Decoder[_T], body: bytes) -> _T:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as err:
        raise Invalid(f"invalid body: {err}") from None
    except msgspec.DecodeError as err:
        raise Malformed(f"malformed JSON: {err}") from None


def _means_broken(f: Finding) -> bool:
    """Whether ``f`` says its node itself is broken (it counts for the breaker)."""
    return f.kind == "heartbeat" or bool(NODE_FATAL_ACTIONS & set(f.actions))


def _sources_of(rules: Sequence[Rule], sources: Mapping[str, int] | None) -> dict[str, int]:
    return dict(sources) if sources is not None else {CONFIG_SOURCE: len(rules)}


def restart_grace(rules: Sequence[Rule]) -> float:
    """How long an incident from before a restart waits for its rule to fire again."""
    longest = max((float(getattr(rule, "hold", 0) or 0) for rule in rules), default=0.0)
    heartbeat = max((float(getattr(rule, "heartbeat_timeout", 0) or 0) for rule in rules),
                    default=0.0)
    return max(60.0, 2 * longest + 30.0, 3 * heartbeat)


def _firing_finding(incident: Incident, rule: Rule) -> Finding:
    """The firing finding an open incident stands for (after a restart)."""
    return Finding(
        rule=incident.rule, kind=rule.kind, node=incident.node, subject=incident.subject,
        gpu=incident.gpu, status="firing", severity=incident.severity,
        actions=tuple(rule.actions), dry_run=rule.dry_run, value=incident.value,
        message=incident.message, observed_wall=incident.observed_at,
        detected_wall=incident.detected_at)


def _incident_doc(incident: Incident) -> dict[str, Any]:
    return {
        "id": incident.id, "rule": incident.rule, "node": incident.node,
        "subject": incident.subject, "gpu": incident.gpu, "severity": incident.severity,
        "status": incident.status, "message": incident.message,
        "observed_at": incident.observed_at, "detected_at": incident.detected_at,
        "detection_latency_seconds": round(incident.detected_at - incident.observed_at, 3),
        "closed_at": incident.closed_at, "value": incident.value,
    }


def _action_doc(record: ActionRecord) -> dict[str, Any]:
    return {
        "id": record.id, "key": record.key, "action": record.action, "node": record.node,
        "gpu": record.gpu, "rule": record.rule, "incident_id": record.incident_id,
        "severity": record.severity, "reason": record.reason, "state": record.state,
        "verdict": record.verdict_reason, "requested_by": record.requested_by,
        "attempts": record.attempts, "created_at": record.created_at,
        "updated_at": record.updated_at, "outcome": record.outcome_message,
        "params": dict(record.params),
    }
