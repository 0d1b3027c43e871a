"""What a restarted controller takes over: the nodes it knew, the incidents left open.

The nodes come back with their labels and states (a cordoned one that an eviction ran
on is evicted). Each open incident fires again in memory (its node is degraded, or
broken); an alert rule's goes back to the engine (Alertmanager says when it resolves);
the settled steps it had only in memory are deferred again. The engine starts with no memory of what
fired, so an incident whose fault cleared while the controller was down would stay open
forever: each gets a grace period (long enough for every node to report and every
``for`` timer to run again; for event rules, the rest of ``clear_after``), and if its
rule has not fired again by then it is resolved like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sn_monitor.clock import Clock
from sn_monitor.controller.incidents.engine_lock import EngineLock
from sn_monitor.controller.incidents.fleet_state import NODE_FATAL_ACTIONS, FleetState
from sn_monitor.controller.incidents.pipeline import IncidentPipeline
from sn_monitor.controller.incidents.steps import (
    LADDER_RUNGS,
    RECOVER,
    SETTLED_ACTIONS,
    StepPlanner,
)
from sn_monitor.controller.ingest.decode import NodeRegistry
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.remediation.ladder import RemediationLadder
from sn_monitor.controller.storage.store import Incident, Store
from sn_monitor.rules.engine import Finding, RuleEngine
from sn_monitor.rules.spec import AlertRule, EventRule, Rule
from sn_monitor.rules.view import NodeState

log = logging.getLogger(__name__)

#: The states a node recorded in the store may be in (anything else: healthy).
RESTORED_STATES = ("healthy", "degraded", "lost", "cordoned", "evicted")


def restart_grace(rules: Sequence[Rule]) -> float:
    """How long an incident from before a restart waits for its rule to fire again."""
    longest = max((float(getattr(rule, "hold", 0) or 0) for rule in rules), default=0.0)
    heartbeat = max((float(getattr(rule, "heartbeat_timeout", 0) or 0) for rule in rules),
                    default=0.0)
    return max(60.0, 2 * longest + 30.0, 3 * heartbeat)


def firing_finding(incident: Incident, rule: Rule) -> Finding:
    """The firing finding an open incident stands for (after a restart)."""
    return Finding(
        rule=incident.rule, kind=rule.kind, node=incident.node, subject=incident.subject,
        gpu=incident.gpu, status="firing", severity=incident.severity,
        actions=tuple(rule.actions), dry_run=rule.dry_run, value=incident.value,
        message=incident.message, observed_wall=incident.observed_at,
        detected_wall=incident.detected_at)


class InheritedIncidents:
    """The open incidents of a previous run, until each fires again or clears."""

    def __init__(self, *, engine: RuleEngine, rules: EngineLock, fleet: FleetState,
                 registry: NodeRegistry, pipeline: IncidentPipeline, planner: StepPlanner,
                 jobs: JobOrchestrator, remediation: RemediationLadder, store: Store,
                 clock: Clock, settle: float,
                 fail_slow_firing: Callable[[], set[tuple[str, str, str]]]) -> None:
        """``fail_slow_firing``: (rule, node, subject) of the fail-slow incidents standing."""
        self._engine = engine
        self._rules = rules
        self._fleet = fleet
        self._registry = registry
        self._pipeline = pipeline
        self._planner = planner
        self._jobs = jobs
        self._remediation = remediation
        self._store = store
        self._clock = clock
        self._settle = settle
        self._fail_slow_firing = fail_slow_firing
        #: By (rule, node, subject): the incident and when its grace ends (monotonic).
        self._inherited: dict[tuple[str, str, str], tuple[Incident, float]] = {}

    def take_nodes(self, evicted: Callable[[str], bool]) -> None:
        """The nodes the store remembers, with their labels and states.

        ``evicted``: whether an eviction ran on a node the controller cordoned.
        """
        for record in self._store.list_nodes():
            state: NodeState = record.state if record.state in RESTORED_STATES else "healthy"  # type: ignore[assignment]
            self._registry.restore(record.name, record.labels, state)
            self._fleet.restore_node(record.name, state, record.cordoned_by_us, evicted)

    def take_over(self) -> None:
        """The open incidents in the store: firing again in memory, each with its grace."""
        rules = {rule.name: rule for rule in self._engine.rules}
        grace = restart_grace(self._engine.rules)
        now_mono, now_wall = self._clock.monotonic(), self._clock.time()
        for incident in self._store.list_incidents(status="open", limit=100_000):
            rule = rules.get(incident.rule)
            broken = rule is not None and (rule.kind == "heartbeat"
                                           or bool(NODE_FATAL_ACTIONS & set(rule.actions)))
            self._fleet.restore_firing(incident.node, incident.rule, incident.subject,
                                       incident.detected_at if broken else None)
            self._settle_again(incident, rule)
            if isinstance(rule, AlertRule) and self._engine.restore(
                    firing_finding(incident, rule)):
                continue  # Alertmanager, not a report, says when it resolves
            wait = grace
            if isinstance(rule, EventRule):
                wait = max(0.0, incident.detected_at + rule.clear_after - now_wall)
            elif rule is None:
                wait = 0.0
            self._inherited[(incident.rule, incident.node, incident.subject)] = (
                incident, now_mono + wait)

    def close_cleared(self) -> None:
        """Close incidents from before a restart whose fault is gone (module docstring)."""
        if not self._inherited:
            return
        now = self._clock.monotonic()
        firing = {(f.rule, f.node, f.subject) for f in self._rules.firing()}
        firing |= self._fail_slow_firing()
        rules = {rule.name: rule for rule in self._engine.rules}
        for key, (incident, deadline) in list(self._inherited.items()):
            if key in firing:
                del self._inherited[key]
                continue
            if now < deadline:
                continue
            del self._inherited[key]
            rule = rules.get(incident.rule)
            self._pipeline.handle([Finding(
                rule=incident.rule, kind=rule.kind if rule else "gone", node=incident.node,
                subject=incident.subject, gpu=incident.gpu, status="resolved",
                severity=incident.severity, actions=tuple(rule.actions) if rule else (),
                dry_run=rule.dry_run if rule else False, value=incident.value,
                message=f"{incident.message} (cleared while the controller was down, or "
                        "its rule was removed)",
                observed_wall=incident.observed_at, detected_wall=self._clock.time())])

    def _settle_again(self, incident: Incident, rule: Rule | None) -> None:
        """Defer again the settled actions of ``incident`` that were never recorded.

        A controller that stopped within an incident's settle time had those actions
        only in memory, and the rule does not fire again for a fault it already reported
        (an XID is acknowledged once): without this they would never run.
        """
        if rule is None:
            return
        if self._jobs.owns_incident(incident.id):
            return  # a job recovery acted on it: it is the recovery's, never planned again
        steps = [step for step in self._planner.plan(incident.node, rule.actions)
                 if step in SETTLED_ACTIONS]
        # A job recovery is keyed by its incident inside the orchestrator: asking again
        # for one it already handled does nothing, so it is always settled again.
        missing = [step for step in steps if step == RECOVER or not self._decided(incident, step)]
        if not missing:
            return
        finding = firing_finding(incident, rule)
        due = self._clock.monotonic() + self._settle
        log.info("incident %d: %s not yet decided before the restart; settling again",
                 incident.id, ", ".join(missing),
                 extra={"node": incident.node, "rule": incident.rule})
        self._pipeline.defer(due, missing, finding, incident.id)

    def _decided(self, incident: Incident, step: str) -> bool:
        """Whether ``step`` of ``incident`` was acted on before the restart.

        A ladder rung is the ladder's (a repair keeps the incidents it took in; its
        actions are keyed by the repair); any other action is keyed by the incident.
        """
        if step in LADDER_RUNGS:
            return self._remediation.decided(incident.id)
        return self._store.get_action_by_key(f"incident:{incident.id}:{step}") is not None
