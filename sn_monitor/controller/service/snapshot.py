"""What the controller's own metrics show, read from its parts at each scrape.

The telemetry formats a :class:`~sn_monitor.controller.telemetry.metrics.ControllerState`
(nothing is kept in the global registry); this gathers one from the fleet state, the
store, the runner, the policy, the writer, the pipeline, the jobs, the fabric and the
workloads.
"""

from __future__ import annotations

from collections.abc import Mapping

from sn_monitor.clock import Clock
from sn_monitor.controller.actions.policy import SafetyPolicy
from sn_monitor.controller.actions.runner import ActionRunner
from sn_monitor.controller.failslow.fabric_watch import FabricWatch
from sn_monitor.controller.incidents.fleet_state import FleetState
from sn_monitor.controller.incidents.pipeline import IncidentPipeline
from sn_monitor.controller.ingest.decode import NodeRegistry
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.jobs.triage import JobTriage
from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Store
from sn_monitor.controller.storage.writer import StoreWriter
from sn_monitor.controller.supervision.stall import StallWatch
from sn_monitor.controller.telemetry.metrics import ControllerState
from sn_monitor.controller.workloads.accounting import WorkloadAccounting


class MetricsSnapshot:
    """Gathers the controller's state for its metrics (module docstring)."""

    def __init__(self, *, fleet: FleetState, registry: NodeRegistry, store: Store,
                 store_health: StoreHealth, runner: ActionRunner, policy: SafetyPolicy,
                 writer: StoreWriter, pipeline: IncidentPipeline, stalls: StallWatch | None,
                 jobs: JobOrchestrator, fabric: FabricWatch, workloads: WorkloadAccounting,
                 clock: Clock, triage: JobTriage) -> None:
        self._fleet = fleet
        self._registry = registry
        self._store = store
        self._store_health = store_health
        self._runner = runner
        self._policy = policy
        self._writer = writer
        self._pipeline = pipeline
        self._stalls = stalls
        self._jobs = jobs
        self._fabric = fabric
        self._workloads = workloads
        self._clock = clock
        self._triage = triage

    def take(self, *, workers: Mapping[str, bool], sweeps: int,
             rules: dict[str, int]) -> ControllerState:
        """The state now; ``workers``, ``sweeps`` and ``rules`` are the controller's own."""
        firing = self._fleet.firing_pairs()
        count = self._store_health.attempt(self._store.open_incident_count)
        return ControllerState(
            node_states={n: self._fleet.state_of(n) for n in self._registry.views()},
            firing=firing,
            open_incidents=count,
            action_outcomes=self._runner.outcomes(),
            breaker_open=self._policy.breaker_state().open,
            store_up=self._store_health.ok,
            workers=dict(workers),
            store_queue=self._writer.depth,
            settling=self._pipeline.settling(),
            sweeps=sweeps,
            ingest_lag=self._stalls.ingest_lag() if self._stalls is not None else None,
            jobs=self._jobs.metrics(),
            rules=rules,
            workloads=tuple(self._workloads.usage()),
            job_root_causes=tuple(
                (c.job, c.node or "", "" if c.rank is None else str(c.rank), c.category)
                for c in self._triage.causes()),
            **self._fabric.paces(self._clock.time()),
        )
