"""The controller's composition root: its parts wired, started, stopped, and the sweep.

One object the HTTP layer (api/) and the daemon (process/) call; each call is one part's
(:mod:`~sn_monitor.controller.service` lists them). Ingest is the hot path (thousands of
reports a second, on the event loop, :mod:`~.intake`): it never waits on the store, a
file or a lock held across I/O. What a report means for the store is queued for the one
writer (:mod:`sn_monitor.controller.storage.writer`), which the sweep's findings take
too. Everything slow or periodic (heartbeats, peer comparisons, retries, re-sending
firing alerts, node states) happens in :meth:`Controller.sweep`, on its own thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from sn_monitor.clock import Clock
from sn_monitor.controller.actions.policy import ClusterSummary, SafetyPolicy
from sn_monitor.controller.actions.routing import Drivers, NoDriver
from sn_monitor.controller.actions.runner import ActionRunner
from sn_monitor.controller.audit import ActionRecord, ActionRequest
from sn_monitor.controller.fabric.meter import FABRIC_METRICS
from sn_monitor.controller.fabric.view import FabricScope
from sn_monitor.controller.failslow.fabric_watch import FabricWatch
from sn_monitor.controller.failslow.finder import BottleneckFinder
from sn_monitor.controller.failslow.watch import FailSlowWatch
from sn_monitor.controller.incidents.blast_radius import BlastRadius
from sn_monitor.controller.incidents.breaker import BreakerKeeper
from sn_monitor.controller.incidents.engine_lock import EngineLock
from sn_monitor.controller.incidents.escalation import Escalation
from sn_monitor.controller.incidents.fleet_state import FleetState, heals_by_reading
from sn_monitor.controller.incidents.inherited import InheritedIncidents
from sn_monitor.controller.incidents.job_health import JobHealthWatch
from sn_monitor.controller.incidents.job_labels import JobLabels
from sn_monitor.controller.incidents.node_states import NodeStateRefresh
from sn_monitor.controller.incidents.pipeline import Breakage, IncidentPipeline
from sn_monitor.controller.incidents.steps import StepPlanner
from sn_monitor.controller.ingest.decode import NodeRegistry
from sn_monitor.controller.jobs.actions import RunnerJobActions
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.jobs.spec import JobControl, load_jobs
from sn_monitor.controller.jobs.triage import JobTriage
from sn_monitor.controller.remediation.ladder import RemediationLadder
from sn_monitor.controller.remediation.service_return import ServiceReturn
from sn_monitor.controller.security.auth import Identity
from sn_monitor.controller.service.audit_trail import AuditTrail
from sn_monitor.controller.service.commands import AuditedCommands
from sn_monitor.controller.service.intake import ReportIntake, count_stored_events
from sn_monitor.controller.service.job_desk import JobDesk
from sn_monitor.controller.service.queries import ControllerQueries
from sn_monitor.controller.service.snapshot import MetricsSnapshot
from sn_monitor.controller.service.topology_desk import Edition, TopologyDesk
from sn_monitor.controller.settings import ControllerSettings
from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Store
from sn_monitor.controller.storage.writer import PendingReply, StoreWriter
from sn_monitor.controller.supervision.stall import StallWatch
from sn_monitor.controller.telemetry.metrics import ControllerMetrics, ControllerState
from sn_monitor.controller.workloads.accounting import (
    WORKLOAD_METRICS,
    WorkloadAccounting,
    workload_document,
)
from sn_monitor.model import ReportReply
from sn_monitor.rules.engine import RuleEngine
from sn_monitor.rules.spec import CONFIG_SOURCE, Rule
from sn_monitor.rules.xid_catalog import load_catalog

log = logging.getLogger(__name__)


class Controller:
    """The parts wired, started and stopped, and the sweep (module docstring)."""

    #: Wired after the repair ladder, whose checks clear faults through it.
    pipeline: IncidentPipeline

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
        self.writer = StoreWriter(store, self.store_health,
                                  on_stored=partial(count_stored_events, self.telemetry))
        self.stalls = StallWatch(clock, float(settings.sweep_interval),
                                 on_stall=self._stalled,
                                 cpu_seconds=cpu_seconds) if watch_stalls else None
        #: Silence and holds are measured on the controller's own progress (stall.py):
        #: the registry's receive times and the rules' clock are this one's.
        self.progress: Clock = self.stalls if self.stalls is not None else clock
        #: NVIDIA's Xid catalogue: the XID rules' codes, the ladder's first rung.
        self.xids = load_catalog(Path(settings.xid_catalog) if settings.xid_catalog else None)
        self.engine = RuleEngine(rules, self.progress, catalog=self.xids, keep=(
            *(FABRIC_METRICS if settings.fail_slow.enabled else ()), *WORKLOAD_METRICS))
        #: Whose workloads hold the GPUs, and what each gets of them.
        self.workloads = WorkloadAccounting(self.progress, settings.workloads)
        self._rules = EngineLock(self.engine)
        self.registry = NodeRegistry(self.progress)
        self.fleet = FleetState(self.registry, partial(heals_by_reading, self.engine))
        self._wire_actions(settings, clock, store, drivers)
        self._wire_incidents(settings, clock, store, drivers)
        self._wire_api_parts()
        self._last_resend = clock.monotonic()
        #: Sweeps done since start (a metric: tests wait on it, not on the clock).
        self.sweeps = 0
        #: A worker of its own ticks the action runner (the daemon); the sweep does not.
        self.runs_actions_elsewhere = False
        #: The daemon's workers and whether each runs (``sn_controller_worker_up``).
        self.workers: Callable[[], Mapping[str, bool]] | None = None

    def _wire_actions(self, settings: ControllerSettings, clock: Clock, store: Store,
                      drivers: Drivers) -> None:
        """The safety policy, the action runner, the breaker, the jobs, the repair ladder."""
        self.policy = SafetyPolicy(settings.policy, clock)
        #: A controller-wide job control may run jobs this controller does not know:
        #: a node in none of its jobs is failed over there too (read before route_jobs).
        self._failover_elsewhere = not isinstance(drivers.by_action.get("failover"), NoDriver)
        drivers.route_jobs(self._job_control, clock)
        self.runner = ActionRunner(store, self.policy, drivers.by_action, clock,
                                   settings.runner)
        self.runner.on_succeeded = self._action_succeeded
        self.breaker = BreakerKeeper(self.policy, store, clock, self._submit_request)
        self.jobs = JobOrchestrator(
            store, clock, RunnerJobActions(self.runner, store, self.cluster,
                                           self.node_healthy),
            self._labels_of, settings.recovery)
        self.audit = AuditTrail(store, self.store_health, clock)
        #: GPU-level faults repaired rung by rung, each verified; back into service after.
        self.remediation = RemediationLadder(settings.remediation, clock, ServiceReturn(
            store=store, clock=clock, jobs=self.jobs, submit=self._submit_request,
            audit=self.audit.repair,
            clear_faults=lambda node, gpu, why: self.pipeline.clear_faults(node, gpu, why),
            labels_of=self._labels_of, forget_attempt=self.policy.did_nothing))

    def _wire_incidents(self, settings: ControllerSettings, clock: Clock, store: Store,
                        drivers: Drivers) -> None:
        """Findings to incidents and steps; what a restart inherits; the jobs' health."""
        self.job_labels = JobLabels(self.jobs, self.registry)
        self.triage = JobTriage(  # why a job died (its logs)
            self.jobs, clock, self.xids, settle=float(settings.recovery.failure_settle))
        #: Findings on many nodes at once that belong to their job or rack.
        self.blast = BlastRadius(self.engine.rule, self.job_labels.job_of, self._labels_of,
                                 self.progress)
        #: Repeat offenders climb one rung (read in the writer, from the store).
        self.escalation = Escalation(self.engine.rule, store)
        #: Node topologies, live link rates, and the bottleneck finder that reads them.
        self.fabric = FabricWatch(finder := BottleneckFinder(settings.fail_slow),
                                  FailSlowWatch(finder))
        self.finder = self.fabric.finder
        self.failslow = self.fabric.failslow
        planner = StepPlanner(
            engine=self.engine, xids=self.xids, jobs=self.jobs, fleet=self.fleet,
            registry=self.registry, remediation=self.remediation, runner=self.runner,
            store_health=self.store_health, clock=clock, cluster=self.cluster,
            failover_elsewhere=self._failover_elsewhere)
        self.pipeline = IncidentPipeline(
            blast=self.blast, escalation=self.escalation, planner=planner, fleet=self.fleet,
            rules=self._rules, writer=self.writer, store=store, store_health=self.store_health,
            breakage=Breakage(self.jobs, self.policy, self.breaker,
                              lambda: len(self.registry)),
            clock=clock, settle=settings.settle,
            detected=self.telemetry.detection_latency.observe)
        self.inherited = InheritedIncidents(
            engine=self.engine, rules=self._rules, fleet=self.fleet, registry=self.registry,
            pipeline=self.pipeline, planner=planner, jobs=self.jobs,
            remediation=self.remediation, store=store, clock=clock, settle=settings.settle,
            fail_slow_firing=self.fabric.firing)
        self.job_health = JobHealthWatch(
            jobs=self.jobs, pipeline=self.pipeline, fleet=self.fleet, fabric=self.fabric,
            engine=self.engine, registry=self.registry, writer=self.writer, store=store,
            store_health=self.store_health, clock=clock, triage=self.triage)
        self.node_states = NodeStateRefresh(
            fleet=self.fleet, registry=self.registry, store=store,
            store_health=self.store_health, clock=clock,
            store_back=self.pipeline.retry_unrecorded)
        self.intake = ReportIntake(
            registry=self.registry, rules=self._rules, pipeline=self.pipeline,
            fleet=self.fleet, fabric=self.fabric, jobs=self.jobs, commands=drivers.queue,
            writer=self.writer, store=store, store_health=self.store_health,
            telemetry=self.telemetry, clock=clock, job_labels=self.job_labels,
            labels_of=self._labels_of, triage=self.triage,
            repair_result=lambda node, result: self.store_health.attempt(
                self.remediation.on_result, node, result), workloads=self.workloads)
        drivers.queue.on_result = lambda node, result: self.writer.call(
            partial(self.intake.command_result, node, result))

    def _wire_api_parts(self) -> None:
        """What the API reads and changes besides reports (the read API, the changes)."""
        self.queries = ControllerQueries(
            registry=self.registry, fleet=self.fleet, store=self.store,
            store_health=self.store_health, jobs=self.jobs, remediation=self.remediation,
            breaker=self.breaker, policy=self.policy, progress=self.progress,
            peers=lambda: self.intake.peers, triage=self.triage)
        self.commands = AuditedCommands(
            runner=self.runner, breaker=self.breaker, audit=self.audit,
            registry=self.registry, jobs=self.jobs, remediation=self.remediation,
            store=self.store, store_health=self.store_health, clock=self.clock,
            cluster=self.cluster)
        self.job_desk = JobDesk(self.jobs, self.audit)
        fabric = self.job_health.fabric
        self.topology_desk = TopologyDesk(fabric, self.clock, health=partial(fabric, health=True),
                                          scoped=lambda scope: fabric(scope=scope))
        self.snapshot = MetricsSnapshot(
            fleet=self.fleet, registry=self.registry, store=self.store,
            store_health=self.store_health, runner=self.runner, policy=self.policy,
            writer=self.writer, pipeline=self.pipeline, stalls=self.stalls, jobs=self.jobs,
            fabric=self.fabric, workloads=self.workloads, clock=self.clock, triage=self.triage)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Load what the store remembers and resume actions a previous run left."""
        self.breaker.restore()
        self.store_health.attempt(self.remediation.load)
        self.inherited.take_nodes(RunnerJobActions(self.runner, self.store, self.cluster,
                                                   self.node_healthy).already_evicted)
        self.jobs.load_from_store()
        self._load_job_files()
        self.inherited.take_over()
        resumed = self.runner.resume(self.cluster())
        if resumed:
            log.info("resumed %d actions left in flight by the previous run", len(resumed))

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
        self.store_health.attempt(self.remediation.persist)
        idle = self.runner.close(timeout)
        self.drivers.close()
        return idle

    def reload_rules(self, rules: Sequence[Rule],
                     sources: Mapping[str, int] | None = None) -> None:
        """SIGHUP: new rules, firing state kept for unchanged ones."""
        with self._rules.held() as engine:
            findings = engine.reload(rules)
            self._rule_sources = _sources_of(rules, sources)
        self.pipeline.handle(findings)
        log.info("rules reloaded: %d rules", len(rules))

    # ------------------------------------------------------------------ reports

    def ingest(self, body: bytes, identity: Identity, peer: str | None = None
               ) -> ReportReply | PendingReply:
        """Take one report (:meth:`ReportIntake.ingest`)."""
        return self.intake.ingest(body, identity, peer)

    def ingest_alerts(self, body: bytes, who: str) -> dict[str, Any]:
        """Alertmanager's webhook (:meth:`ReportIntake.ingest_alerts`)."""
        return self.intake.ingest_alerts(body, who)

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
            with self._rules.held() as engine:
                findings = engine.sweep(self.registry.views())
            self.pipeline.handle(findings)
            self.pipeline.take(self.blast.sweep())
        self.inherited.close_cleared()
        self.pipeline.submit_settled()
        self.store_health.attempt(self.remediation.tick)
        self.jobs.observe_fleet(len(self.registry))
        self.job_health.tick()
        self.job_health.close_hangs()
        self.job_health.suspects_of_stalled_restores()
        self.job_health.watch_fail_slow()
        if not self.runs_actions_elsewhere:
            self.runner.tick()
        now = self.clock.monotonic()
        alertmanager = self.drivers.alertmanager
        if alertmanager is not None and (
                now - self._last_resend >= alertmanager.settings.resend_interval):
            self._last_resend = now
            alertmanager.resend_firing()
        self.store_health.attempt(self.breaker.sweep, self.node_healthy)
        self.job_labels.relabel()
        self.node_states.tick(now)

    def _stalled(self, where: str, seconds: float) -> None:
        """The controller stood still ``seconds`` (see stall.py); silent nodes get grace.

        Its agents' reports timed out meanwhile and they backed off, as after a restart.
        """
        self.telemetry.stalls.labels(where).observe(seconds)
        with self._rules.held() as engine:
            engine.forgive_silence()

    # ------------------------------------------------------------------ the parts' callbacks

    def _action_succeeded(self, record: ActionRecord) -> None:
        """Note an eviction (or its end); a recovery's step: take the next one now."""
        if record.node is not None and record.action in ("evict", "uncordon"):
            self.fleet.eviction(record.node, record.action == "evict")
        if record.owner is not None:
            self.job_health.tick()

    def _submit_request(self, request: ActionRequest) -> ActionRecord | None:
        """An action the ladder or the breaker asks for, through the runner (None: not recorded)."""
        return self.store_health.attempt(self.runner.submit, request, self.cluster(), False)

    def _job_control(self, job: str) -> JobControl | None:
        """The job's ``spec.control`` (None: it names none); KeyError: no such job."""
        spec = self.jobs.spec(job)
        if spec is None:
            raise KeyError(job)
        return spec.spec.control

    def _labels_of(self, node: str) -> dict[str, str] | None:
        view = self.registry.get(node)
        return dict(view.labels) if view is not None else None

    # ------------------------------------------------------------------ fleet, metrics

    def node_healthy(self, node: str, since: float | None = None) -> bool:
        """The node reports, and nothing that means it is broken fires on it (FleetState)."""
        return self.fleet.node_healthy(node, since)

    def cluster(self) -> ClusterSummary:
        """The numbers the safety policy needs."""
        # The runner records a cordon in the store the moment it is done; the sweep only
        # copies it into memory every NODE_REFRESH_SECONDS: read here (FleetState.summary).
        return self.fleet.summary(self.store_health.attempt(self.store.cordoned_by_us))

    def topology(self, job: str | None = None, scope: FabricScope | None = None) -> Edition:
        """``GET /api/v1/topology``: built once for every viewer (:class:`TopologyDesk`)."""
        return self.topology_desk.document(job, scope)

    def topology_overview(self, job: str | None, since: int | None) -> Edition:
        return self.topology_desk.overview(job, since)

    def state(self) -> ControllerState:
        """What the controller's own metrics show (:class:`MetricsSnapshot`)."""
        workers = self.workers() if self.workers is not None else {}
        return self.snapshot.take(workers=workers, sweeps=self.sweeps, rules=self._rule_sources)

    def metrics(self) -> bytes:
        """The controller's /metrics body."""
        return self.telemetry.render()


    # ------------------------------------------------------------------ the read API

    def list_nodes(self) -> list[dict[str, Any]]:
        return self.queries.list_nodes()

    def get_node(self, name: str) -> dict[str, Any] | None:
        return self.queries.get_node(name)

    def list_incidents(self, status: str | None, node: str | None,
                       limit: int) -> list[dict[str, Any]]:
        return self.queries.list_incidents(status, node, limit)

    def get_incident(self, incident_id: int) -> dict[str, Any] | None:
        return self.queries.get_incident(incident_id)

    def list_actions(self, node: str | None, state: str | None,
                     limit: int) -> list[dict[str, Any]]:
        return self.queries.list_actions(node, state, limit)

    def list_events(self, node: str | None, kind: str | None,
                    limit: int) -> list[dict[str, Any]]:
        return self.queries.list_events(node, kind, limit)

    def list_jobs(self) -> list[dict[str, Any]]:
        return self.queries.list_jobs()

    def get_job(self, name: str) -> dict[str, Any] | None:
        return self.queries.get_job(name)

    def restore_point(self, name: str) -> dict[str, Any] | None:
        return self.queries.restore_point(name)

    def list_recoveries(self, job: str | None, limit: int) -> list[dict[str, Any]]:
        return self.queries.list_recoveries(job, limit)

    def list_repairs(self, node: str | None, limit: int) -> list[dict[str, Any]]:
        return self.queries.list_repairs(node, limit)

    def service_discovery(self) -> list[dict[str, Any]]:
        return self.queries.service_discovery()

    def list_workloads(self) -> list[dict[str, Any]]:
        return [workload_document(usage) for usage in self.workloads.usage()]

    def breaker_state(self) -> dict[str, Any]:
        return self.queries.breaker_state()

    def health(self) -> tuple[bool, dict[str, Any]]:
        return self.queries.health()

    # ------------------------------------------------------------------ audited changes

    def manual_action(self, action: str, node: str, who: str, reason: str) -> dict[str, Any]:
        return self.commands.manual_action(action, node, who, reason)

    def approve(self, action_id: str, who: str) -> dict[str, Any]:
        return self.commands.approve(action_id, who)

    def set_breaker(self, open_it: bool, who: str, reason: str) -> dict[str, Any]:
        return self.commands.set_breaker(open_it, who, reason)

    def add_job(self, body: bytes, who: str, admin: bool = False) -> dict[str, Any]:
        return self.job_desk.add_job(body, who, admin)

    def delete_job(self, name: str, who: str) -> None:
        self.job_desk.delete_job(name, who)

    def approve_recovery(self, recovery_id: str, who: str) -> dict[str, Any]:
        return self.job_desk.approve_recovery(recovery_id, who)

    def return_to_pool(self, job: str, node: str, who: str) -> dict[str, Any]:
        return self.job_desk.return_to_pool(job, node, who)

    def job_progress(self, name: str, body: bytes) -> dict[str, Any]:
        return self.job_desk.job_progress(name, body)

    def job_checkpoint(self, name: str, body: bytes) -> dict[str, Any]:
        return self.job_desk.job_checkpoint(name, body)

def _sources_of(rules: Sequence[Rule], sources: Mapping[str, int] | None) -> dict[str, int]:
    return dict(sources) if sources is not None else {CONFIG_SOURCE: len(rules)}
