"""The steps a firing rule's actions mean for its node, and running one.

A rule names actions (``cordon``, ``failover``, ``reset_gpu``...); what they mean depends
on the node: on a node of a DistributedJob ``failover`` and ``evict`` are the job's
recovery and ``checkpoint`` asks the job for one; ``reset_gpu`` and ``reboot`` are rungs
of the remediation ladder, which runs and verifies them; the rest go to the action
runner, through the safety policy, each with its audit record keyed by the incident.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import cast

from sn_monitor.clock import Clock
from sn_monitor.controller.actions.policy import ClusterSummary
from sn_monitor.controller.actions.runner import ActionRunner
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.incidents.fleet_state import FleetState
from sn_monitor.controller.ingest.decode import NodeRegistry
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.remediation.ladder import RemediationLadder, Rung, first_rung
from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.model import ActionName
from sn_monitor.rules.engine import Finding, RuleEngine
from sn_monitor.rules.spec import EventRule
from sn_monitor.rules.xid_catalog import XidCatalog

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
#: Steps that wait ``settle`` seconds before they run.
SETTLED_ACTIONS = frozenset({"cordon", "evict", "failover", "reset_gpu", "reboot", RECOVER})
#: Actions that are rungs of the remediation ladder: the ladder runs them, and verifies.
LADDER_RUNGS = frozenset({"reset_gpu", "reboot"})


class StepPlanner:
    """Plans a firing rule's steps for its node and runs each (module docstring)."""

    def __init__(self, *, engine: RuleEngine, xids: XidCatalog, jobs: JobOrchestrator,
                 fleet: FleetState, registry: NodeRegistry, remediation: RemediationLadder,
                 runner: ActionRunner, store_health: StoreHealth, clock: Clock,
                 cluster: Callable[[], ClusterSummary], failover_elsewhere: bool) -> None:
        """The collaborators, passed in.

        ``failover_elsewhere``: a controller-wide job control may run jobs this
        controller does not know: a node in none of its jobs is failed over there too.
        """
        self._engine = engine
        self._xids = xids
        self._jobs = jobs
        self._fleet = fleet
        self._registry = registry
        self._remediation = remediation
        self._runner = runner
        self._store_health = store_health
        self._clock = clock
        self._cluster = cluster
        self._failover_elsewhere = failover_elsewhere

    def plan(self, node: str, actions: Sequence[str]) -> list[str]:
        """The steps a firing rule's actions mean for this node.

        On a job's node (or one its active recovery is evicting, or one of its spares)
        ``failover`` and ``evict`` are the recovery's (RECOVER: a spare leaves the pool).
        Elsewhere ``failover`` is an eviction, and a ``failover`` to the controller-wide
        job control when one is configured (it may run jobs the controller does not know).
        A node already evicted is not evicted again.
        """
        in_job = bool(self._jobs.jobs_of_node(node))
        recovering = (in_job or self._jobs.recovering(node)
                      or "spare" in self._jobs.roles_of(node).values())
        evicted = self._fleet.is_evicted(node)
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

    def run(self, step: str, f: Finding, incident_id: int) -> None:
        if step in LADDER_RUNGS:
            self._store_health.attempt(
                self._remediation.start, f.node, f.gpu, self._first_rung(step, f), rule=f.rule,
                reason=f.message, incident_id=incident_id)
        elif step == RECOVER:
            self._store_health.attempt(self._jobs.on_node_fault, f.node,
                                       "lost" if f.kind == "heartbeat" else "fatal", incident_id,
                                       self._ranks_alive(f), f.observed_wall)
        elif step == CHECKPOINT_JOBS:
            self._store_health.attempt(self._jobs.on_node_degrading, f.node, f.rule, incident_id)
        else:
            self.submit(cast(ActionName, step), f, incident_id, "firing")

    def _first_rung(self, step: str, f: Finding) -> Rung:
        """The rung a rule asks for, or higher where NVIDIA's catalogue says the XID needs it."""
        rule = self._engine.rule(f.rule)
        entry = None
        if isinstance(rule, EventRule) and rule.event == "xid" and f.value is not None:
            entry = self._xids.get(int(f.value))
        return first_rung(cast(Rung, step), entry.resolution if entry is not None else None)

    def _ranks_alive(self, f: Finding) -> bool:
        """Whether the job's ranks on ``f``'s node may still run (and so checkpoint).

        Not on a lost node, nor after an XID or a lost GPU: the catalogue's action for
        those kills the application on that GPU (and a synchronous job with it).
        """
        if f.kind == "heartbeat":
            return False
        rule = next((r for r in self._engine.rules if r.name == f.rule), None)
        return not (isinstance(rule, EventRule) and rule.event in RANK_KILLING_EVENTS)

    def submit(self, action: ActionName, f: Finding, incident_id: int, status: str) -> None:
        """``action`` of incident ``incident_id`` to the runner, keyed by the incident."""
        suffix = ":resolved" if status == "resolved" and action == "alert" else ""
        request = ActionRequest(
            id=uuid.uuid4().hex, key=f"incident:{incident_id}:{action}{suffix}",
            action=action, node=f.node, reason=f.message, rule=f.rule,
            incident_id=incident_id, gpu=f.gpu, severity=f.severity,
            labels=self._finding_labels(f),
            params={"status": status, "subject": f.subject, "value": f.value,
                    "observed_at": f.observed_wall, "detected_at": f.detected_wall},
            requested_by=f"rule:{f.rule}" + (f" via {f.source}" if f.source else ""),
            created_seconds=self._clock.time(),
        )
        self._store_health.attempt(self._runner.submit, request, self._cluster(), f.dry_run)

    def _finding_labels(self, f: Finding) -> dict[str, str]:
        """An action's labels: its node's, or for a job's incident the job's (its owner)."""
        if f.node.startswith("job:"):
            job = f.node[len("job:"):]
            spec = self._jobs.spec(job)
            return {**(spec.metadata.labels if spec is not None else {}), "job": job}
        view = self._registry.get(f.node)
        return dict(view.labels) if view else {}
