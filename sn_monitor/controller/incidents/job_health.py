"""The training jobs' health as incidents: hangs, fail-slow, stalled restores, topology.

A job that stops making progress is a hang incident naming who stopped first, and its
recovery; the incident closes once the job runs again. When the job's failure is its own
(the triage's root cause is an application category: a bug, a NaN loss, an OOM), the
hang suspects no node: no node is evicted for it. The triage's root causes become job
incidents (:mod:`.job_failures`). A restore that makes no progress
onto a node with a critical incident open takes that node into the recovery. Every few
seconds the jobs' paces go to the fail-slow watch, whose bottlenecks are incidents too;
the topology shows the jobs on the fabric with their paces.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from sn_monitor.clock import Clock
from sn_monitor.controller.fabric.view import (
    FabricScope,
    FleetFabric,
    JobOnFabric,
    fleet_topology,
)
from sn_monitor.controller.failslow.fabric_watch import FabricWatch
from sn_monitor.controller.failslow.watch import JobPace
from sn_monitor.controller.incidents.fleet_state import FleetState
from sn_monitor.controller.incidents.job_failures import JobFailureIncidents
from sn_monitor.controller.incidents.pipeline import IncidentPipeline
from sn_monitor.controller.ingest.decode import NodeRegistry
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.jobs.triage import JobTriage
from sn_monitor.controller.jobs.views import HangFinding
from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Store
from sn_monitor.controller.storage.writer import StoreWriter
from sn_monitor.rules.engine import Finding, RuleEngine

log = logging.getLogger(__name__)


class JobHealthWatch:
    """Hangs, fail-slow and stalled restores become incidents (module docstring)."""

    def __init__(self, *, jobs: JobOrchestrator, pipeline: IncidentPipeline, fleet: FleetState,
                 fabric: FabricWatch, engine: RuleEngine, registry: NodeRegistry,
                 writer: StoreWriter, store: Store, store_health: StoreHealth,
                 clock: Clock, triage: JobTriage) -> None:
        self._jobs = jobs
        self._triage = triage
        self._failures = JobFailureIncidents(triage, pipeline, jobs, clock)
        self._pipeline = pipeline
        self._fleet = fleet
        self._fabric = fabric
        self._engine = engine
        self._registry = registry
        self._writer = writer
        self._store = store
        self._store_health = store_health
        self._clock = clock
        #: Guards the hang incidents open, by job.
        self._lock = threading.Lock()
        self._hangs: dict[str, Finding] = {}
        #: (job, node, restored nodes) that joined a stalled restore's recovery.
        self._joined: set[tuple[str, str, tuple[str, ...]]] = set()

    def tick(self) -> None:
        """The jobs' schedules move on; a job that stopped making progress hangs."""
        for hang in self._store_health.attempt(self._jobs.tick) or ():
            self._job_hung(hang)
        self._note_lost_nodes()
        self._failures.tick()

    def _note_lost_nodes(self) -> None:
        """A job's node that stopped reporting is a node fault for the failure triage.

        Its failed nodes too: the recovery the loss started may have taken it out already.
        """
        for job, nodes in self._jobs.members().items():
            for node in dict.fromkeys(nodes):
                if self._fleet.state_of(node) == "lost":
                    view = self._registry.get(node)
                    self._triage.node_lost(job, node, view.received_wall
                                           if view is not None else self._clock.time())

    # ------------------------------------------------------------------ hangs

    def _job_hung(self, hang: HangFinding) -> None:
        """A job stopped making progress: a hang incident naming who stopped first.

        Noted now, recorded (and the job told) by the writer, after what is queued.

        When its ranks cannot tell (every one stopped together, as a collective that waits
        on one broken link does), the job's nodes with a critical incident open are the
        suspects: restarting in place on a node whose InfiniBand port is down only hangs
        again. When the triage says the job failed of its own (an application category),
        no node is: it restarts in place, and no node is evicted for its bug. When it names
        another failure of one of the job's nodes (a rank's ECC error, the node's XID), that
        node is the suspect, whatever the ranks' progress says (every rank stopped at the
        same step when they wait on each other). The triage is asked for its answer so far:
        a hang is found before its settle ends.
        """
        cause = self._triage.cause_so_far(hang.job)
        stopped = hang  # what the ranks' progress says
        own = (f"; {cause.summary()} (the job's own failure: no node suspected)"
               if cause is not None and cause.application else "")
        if own:
            hang = replace(hang, nodes=(), message=hang.message + own)
        elif (cause is not None and cause.pinpointed and cause.node is not None
              and hang.job in self._jobs.jobs_of_node(cause.node)):
            own = f"; the job's logs name {cause.node}: {cause.summary()}"
            hang = replace(hang, nodes=(cause.node,), message=hang.message + own)
        elif not hang.nodes:
            suspects = self._critical_members(hang.job)
            if suspects:
                hang = replace(hang, nodes=suspects, message=(
                    f"{hang.message}; {', '.join(suspects)} with a critical incident open"))
        node = hang.nodes[0] if hang.nodes else f"job:{hang.job}"
        who = (f"ranks {', '.join(map(str, stopped.ranks))} on {', '.join(stopped.nodes)} "
               "stopped first" if stopped.nodes else "every rank stopped together")
        finding = Finding(
            rule="job-hang", kind="hang", node=node, subject=f"job:{hang.job}", gpu=None,
            status="firing", severity="critical", actions=("alert",), dry_run=False,
            value=hang.stalled_seconds,
            message=(f"job {hang.job} hung at step {hang.step}: {who}, "
                     f"{hang.stalled_seconds:.0f} s without progress{own}"),
            observed_wall=hang.stopped_at, detected_wall=self._clock.time())
        self._pipeline.note_fired(finding)
        self._writer.call(partial(self._record_hang, finding, hang))

    def _record_hang(self, finding: Finding, hang: HangFinding) -> None:
        """The hang's incident, then the job's recovery; only then may it close.

        :meth:`close_hangs` closes a hang whose job runs: before its recovery starts the
        job still says ``running``, so the hang is kept apart until it has.
        """
        self._store_health.attempt(self._jobs.on_hang, hang, self._pipeline.record_fired(finding))
        with self._lock:
            self._hangs[hang.job] = finding

    def close_hangs(self) -> None:
        """A hang incident clears once its job runs again (recovered, or unstuck)."""
        with self._lock:
            hung = dict(self._hangs)
        for job, finding in hung.items():
            status = self._jobs.job(job)
            if status is not None and status.state not in ("running",):
                continue
            with self._lock:
                self._hangs.pop(job, None)
            self._pipeline.handle([replace(finding, status="resolved",
                                           detected_wall=self._clock.time())])

    def _critical_members(self, job: str, nodes: Sequence[str] | None = None
                          ) -> tuple[str, ...]:
        """The job's nodes (or ``nodes``) on which a critical rule is firing."""
        if nodes is None:
            status = self._jobs.job(job)
            if status is None:
                return ()
            nodes = status.nodes
        critical = {r.name for r in self._engine.rules if r.severity == "critical"}
        return self._fleet.critical_among(nodes, critical)

    def suspects_of_stalled_restores(self) -> None:
        """A restore that does not progress, onto a node with a critical incident.

        That node joins the recovery (it is evicted, a spare takes its place), once.
        """
        for job, nodes in self._store_health.attempt(self._jobs.stalled_restores) or ():
            for node in self._critical_members(job, nodes):
                key = (job, node, tuple(nodes))
                if key in self._joined:
                    continue
                self._joined.add(key)
                log.warning("job %s: the restore makes no progress and %s has a critical "
                            "incident open: it joins the recovery", job, node,
                            extra={"node": node})
                self._writer.call(partial(self._store_health.attempt, self._jobs.on_node_fault,
                                          node, "hang", None, True, None, job))

    # ------------------------------------------------------------------ fail-slow

    def watch_fail_slow(self) -> None:
        """Every few seconds: the jobs' paces to the finder, its bottlenecks as incidents."""
        now = self._clock.time()
        if not self._fabric.due(now):
            return
        paces = [JobPace(j.name, j.nodes, j.generation, j.state == "running",
                         j.recent_step_seconds or j.median_step_seconds)
                 for j in self._jobs.jobs()]
        self._pipeline.take(self._fabric.tick(paces, now))

    def topology(self, job: str | None = None) -> dict[str, Any]:
        """``GET /api/v1/topology``: the fleet graph, rates and bottlenecks (fabric.view)."""
        return fleet_topology(self.fabric(), job)

    def fabric(self, health: bool = False, scope: FabricScope | None = None) -> FleetFabric:
        """What the topology shows: the fleet graph's inputs (fabric.view).

        The jobs are read before the fabric lock (their lock may wait on a store); see
        :mod:`~sn_monitor.controller.failslow.fabric_watch` for the rest, ``health`` and
        ``scope``.
        """
        now = self._clock.time()
        incidents = [{"id": i.id, "node": i.node, "rule": i.rule, "severity": i.severity,
                      "gpu": i.gpu, "message": i.message}
                     for i in self._store_health.attempt(
                         self._store.list_incidents, status="open", limit=1000) or ()]
        views = self._registry.views()
        states = {name: self._fleet.state_of(name) for name in views}
        jobs = [JobOnFabric(name=j.name, state=j.state, nodes=j.nodes,
                            ranks=self._jobs.ranks_by_node(j.name),
                            step_time_seconds=j.recent_step_seconds or j.median_step_seconds,
                            root_cause=None if (cause := self._triage.root_cause(j.name)) is None
                            else cause.to_dict())
                for j in self._jobs.jobs()]
        return self._fabric.fabric(now=now, views=views, states=states, incidents=incidents,
                                   jobs=jobs, health=health, scope=scope)
