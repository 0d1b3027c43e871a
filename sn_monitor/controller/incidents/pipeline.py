"""Findings become incidents and steps: noted in memory now, recorded by the writer.

A finding past the blast radius is noted at once in the fleet state (what fires on its
node), then handed to the one writer, in order: a firing one opens its incident (a
repeat offender's takes its rule's next rung first), counts for the breaker when it
means its node is broken, and starts its steps (:mod:`~.steps`); the node-taking ones
wait ``settle`` seconds and run only if the rule still fires then. A resolved one
closes its incident, alerts that it resolved and releases a throttle.

A finding whose incident the store could not record is kept, and acted on when the
store takes writes again if its rule still fires (:meth:`IncidentPipeline.retry_unrecorded`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

from sn_monitor.clock import Clock
from sn_monitor.controller.actions.policy import SafetyPolicy
from sn_monitor.controller.incidents.blast_radius import BlastRadius
from sn_monitor.controller.incidents.breaker import BreakerKeeper
from sn_monitor.controller.incidents.engine_lock import EngineLock
from sn_monitor.controller.incidents.escalation import Escalation
from sn_monitor.controller.incidents.fleet_state import FleetState, means_broken
from sn_monitor.controller.incidents.steps import SETTLED_ACTIONS, StepPlanner
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Store
from sn_monitor.controller.storage.writer import StoreWriter
from sn_monitor.rules.engine import Finding

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Breakage:
    """What a finding that means its node broken counts for: the fleet's faults, the breaker."""

    jobs: JobOrchestrator
    policy: SafetyPolicy
    breaker: BreakerKeeper
    fleet_size: Callable[[], int]


class IncidentPipeline:
    """Finding → incident → steps, deferred steps, resolution (module docstring)."""

    def __init__(self, *, blast: BlastRadius, escalation: Escalation, planner: StepPlanner,
                 fleet: FleetState, rules: EngineLock, writer: StoreWriter, store: Store,
                 store_health: StoreHealth, breakage: Breakage, clock: Clock, settle: float,
                 detected: Callable[[float], None]) -> None:
        """The collaborators, passed in.

        ``settle``: seconds a node-taking step waits; ``detected``: observes a
        finding's detection latency (seconds).
        """
        self._blast = blast
        self._escalation = escalation
        self._planner = planner
        self._fleet = fleet
        self._rules = rules
        self._writer = writer
        self._store = store
        self._store_health = store_health
        self._breakage = breakage
        self._clock = clock
        self._settle = settle
        self._detected = detected
        #: Guards the steps settling and the findings not recorded.
        self._lock = threading.Lock()
        self._deferred: list[tuple[float, str, Finding, int]] = []
        #: Findings whose incident the store could not record: acted on when it can.
        self._unrecorded: dict[tuple[str, str, str], Finding] = {}

    # ------------------------------------------------------------------ in

    def handle(self, findings: Sequence[Finding]) -> None:
        """Findings: noted in memory now, recorded and acted on by the writer, in order.

        The blast radius sees them first: a fault on many nodes of one job (or rack) at
        once becomes one incident of the job (or rack).
        """
        self.take(self._blast.screen(findings))

    def take(self, findings: Sequence[Finding]) -> None:
        """Findings past the blast radius: noted now, recorded and acted on by the writer."""
        for finding in findings:
            if finding.status == "firing":
                self.note_fired(finding)
                self._writer.call(partial(self.record_fired, finding))
            else:
                self._note_resolved(finding)
                self._writer.call(partial(self._record_resolved, finding))

    def clear_faults(self, node: str, gpu: int | None, why: str) -> None:
        """A repair passed its check: the event incidents it cleared close."""
        with self._rules.held() as engine:
            findings = engine.cancel(node, gpu, why)
        self.take(findings)

    # ------------------------------------------------------------------ firing

    def note_fired(self, f: Finding) -> None:
        self._fleet.fired(f)
        self._detected(max(0.0, f.detected_wall - f.observed_wall))
        log.warning("%s: %s", f.rule, f.message,
                    extra={"node": f.node, "rule": f.rule, "gpu": f.gpu})

    def record_fired(self, f: Finding) -> int | None:
        """Record the incident and start its actions (the writer); its id (None: not).

        A repeat offender's incident takes its rule's next rung (escalation) first.
        """
        escalated = self._store_health.attempt(self._escalation.escalate, f)
        if escalated is not None and escalated is not f:
            f = escalated
            self._fleet.escalated(f)
        incident_id = self._store_health.attempt(
            self._store.open_incident, f.rule, f.node, f.subject, severity=f.severity,
            message=f.message, observed_at=f.observed_wall, detected_at=f.detected_wall,
            gpu=f.gpu, value=f.value,
        )
        if incident_id is None:
            log.error("not acting on %s: the incident could not be recorded", f.rule,
                      extra={"node": f.node, "rule": f.rule})
            with self._lock:
                self._unrecorded[(f.node, f.rule, f.subject)] = f
            return None
        if means_broken(f):
            self._count_broken(f)
        due = self._clock.monotonic() + self._settle
        for step in self._planner.plan(f.node, f.actions):
            if step in SETTLED_ACTIONS and self._settle > 0:
                with self._lock:
                    self._deferred.append((due, step, f, incident_id))
            else:
                self._planner.run(step, f, incident_id)
        return int(incident_id)

    def _count_broken(self, f: Finding) -> None:
        """A node broken: the jobs' fleet faults and the breaker count it."""
        breakage = self._breakage
        breakage.jobs.note_fleet_fault()
        opened = breakage.policy.note_fault(f.node, max(1, breakage.fleet_size()))
        if opened is not None:
            self._store_health.attempt(breakage.breaker.opened, opened)

    # ------------------------------------------------------------------ settling

    def defer(self, due: float, steps: Sequence[str], f: Finding, incident_id: int) -> None:
        """``steps`` of incident ``incident_id`` run at ``due`` (monotonic) if ``f`` fires."""
        with self._lock:
            self._deferred.extend((due, step, f, incident_id) for step in steps)

    def settling(self) -> int:
        """How many steps wait for their settle time."""
        return len(self._deferred)

    def submit_settled(self) -> None:
        """Submit node-taking actions whose settle time has passed, if still wanted."""
        now = self._clock.monotonic()
        with self._lock:
            ready = [d for d in self._deferred if d[0] <= now]
        for _, action, f, incident_id in ready:
            if not self._fleet.is_firing(f):
                log.info("not running %s: %s cleared within the settle time", action, f.rule,
                         extra={"node": f.node, "rule": f.rule})
                continue
            self._writer.call(partial(self._planner.run, action, f, incident_id))
        # Left in the list until handed to the writer: an action is always counted as
        # settling or queued (sn_controller_actions_settling, the store queue).
        handed = {id(d) for d in ready}
        with self._lock:
            self._deferred = [d for d in self._deferred if id(d) not in handed]

    # ------------------------------------------------------------------ resolved

    def _note_resolved(self, f: Finding) -> None:
        self._fleet.resolved(f)
        with self._lock:
            self._unrecorded.pop((f.node, f.rule, f.subject), None)
        log.info("%s resolved: %s", f.rule, f.message,
                 extra={"node": f.node, "rule": f.rule, "gpu": f.gpu})

    def _record_resolved(self, f: Finding) -> None:
        """Close the incident (the writer); alert that it resolved, release a throttle."""
        incident_id = self._store_health.attempt(self._store.close_incident, f.rule, f.node,
                                                 f.subject, f.detected_wall)
        if incident_id is None:
            return
        if "alert" in f.actions:
            self._planner.submit("alert", f, incident_id, "resolved")
        if "throttle" in f.actions:
            self._planner.submit("release", f, incident_id, "resolved")

    # ------------------------------------------------------------------ store outage

    def retry_unrecorded(self) -> None:
        """Act on the faults seen while the store took no writes, if they still hold.

        The rules hold them as firing (an event is not seen twice), so without this a
        fault that came while the disk was full would never be acted on.
        """
        with self._lock:
            kept, self._unrecorded = self._unrecorded, {}
        if not kept:
            return
        firing = {(f.node, f.rule, f.subject) for f in self._rules.firing()}
        now = self._clock.time()
        for key, f in kept.items():
            if key in firing:
                log.warning("%s: acting now that the store takes writes", f.rule,
                            extra={"node": f.node, "rule": f.rule, "gpu": f.gpu})
                self.handle([replace(f, detected_wall=now)])
