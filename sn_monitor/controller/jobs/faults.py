"""What a fault does to the jobs on its node: a checkpoint, a recovery, a spare out.

- a node that degrades (a rule with a ``checkpoint`` action fired on it): every job on
  it checkpoints now (:meth:`JobFaults.on_node_degrading`);
- a node that fails: every job on it starts (or joins) a recovery, a spare that fails
  leaves its job's pool, and a failed job's node is evicted all the same
  (:meth:`JobFaults.on_node_fault`);
- a hang: the nodes that stopped first fail; none named: the job restarts in place
  (:meth:`JobFaults.on_hang`).

The orchestrator's lock guards the jobs' state; it is never held over the file system
work of :mod:`.scans`.

Imports the recovery engine, the schedule, the scans, the registry and the data below.
"""

from __future__ import annotations

import logging
import threading
import uuid

from sn_monitor.clock import Clock
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.jobs.checkpoints import Checkpoint
from sn_monitor.controller.jobs.ports import JobActions
from sn_monitor.controller.jobs.recovery.engine import RecoveryEngine
from sn_monitor.controller.jobs.recovery_record import FaultKind, Recovery
from sn_monitor.controller.jobs.registry import JobRecord, JobRegistry
from sn_monitor.controller.jobs.scans import CHECKPOINTING_SCAN_SECONDS, latest, scan_due
from sn_monitor.controller.jobs.schedule import REQUESTER, CheckpointSchedule
from sn_monitor.controller.jobs.views import (
    RECOVERY_RULE,
    CheckpointRequest,
    HangFinding,
    RecoveryStatus,
)
from sn_monitor.controller.storage.store import Store

log = logging.getLogger(__name__)


class JobFaults:
    """Turns faults on nodes into checkpoints and recoveries of the jobs on them."""

    def __init__(self, lock: threading.RLock, store: Store, clock: Clock,
                 actions: JobActions, registry: JobRegistry, schedule: CheckpointSchedule,
                 engine: RecoveryEngine) -> None:
        self._lock = lock
        self.store = store
        self.clock = clock
        self.actions = actions
        self.registry = registry
        self.schedule = schedule
        self.engine = engine

    def on_node_degrading(self, node: str, rule: str,
                          incident_id: int | None = None) -> list[CheckpointRequest]:
        """A rule with a ``checkpoint`` action fired on ``node`` (degrading, still alive).

        Every job on it checkpoints now, unless one was requested within the last
        ``preemptive_min_interval`` (then that request is returned).
        """
        with self._lock:
            out = []
            for name in self.registry.jobs_of_node(node):
                j = self.registry.get(name)
                if j.row.state != "failed":
                    request = self.schedule.preemptive(j, rule, incident_id)
                    if request is not None:
                        out.append(request)
            return out

    def on_node_fault(self, node: str, kind: FaultKind, incident_id: int | None,
                      alive: bool, observed_at: float | None = None,
                      job: str | None = None) -> list[RecoveryStatus]:
        """``node`` failed: start (or join) a recovery of every job on it.

        ``kind``: ``fatal`` (a fatal XID, a lost GPU, a rule's eviction), ``lost`` (no
        heartbeat) or ``hang``; ``alive``: the node still answers (then a checkpoint is
        tried first, for ``fatal``). ``observed_at``: when the fault happened (default:
        the incident's observed time, else now); ``job``: only this job. A spare that
        fails leaves its job's pool. The controller calls this instead of evicting a
        job's node itself: the recovery evicts it, once.
        """
        seen, detected = self._fault_times(incident_id, observed_at)
        with self._lock:
            affected = [j for j in self.registry.records() if job in (None, j.name)
                        and (node in j.nodes or node in j.pool
                             or self.engine.recovering(j.name, node))]
        points = {j.name: latest(j, scan=scan_due(j, CHECKPOINTING_SCAN_SECONDS,
                                                  self.clock.monotonic()))
                  for j in affected if node in j.nodes}
        out: list[RecoveryStatus] = []
        with self._lock:
            for j in affected:
                if node in j.row.pool:
                    self.registry.spare_failed(j, node)
                    log.warning("job %s: spare %s failed (%s); out of the pool", j.name,
                                node, kind)
                elif node in j.row.nodes or self.engine.recovering(j.name, node):
                    rec = self._fault(j, node, kind, incident_id, alive, seen, detected,
                                      points.get(j.name))
                    if rec is not None:
                        out.append(RecoveryStatus.of(rec))
        return out

    def on_hang(self, finding: HangFinding, incident_id: int | None) -> list[RecoveryStatus]:
        """Recover from a hang: the nodes that stopped first fail; none: restart in place."""
        if finding.nodes:
            out: dict[str, RecoveryStatus] = {}
            for node in finding.nodes:
                for status in self.on_node_fault(node, "hang", incident_id, alive=True,
                                                 observed_at=finding.stopped_at,
                                                 job=finding.job):
                    out[status.id] = status
            return list(out.values())
        with self._lock:
            j = self.registry.find(finding.job)
        if j is None:
            return []
        point = latest(j, scan=False)
        with self._lock:
            rec = self.engine.on_fault(j, None, "hang", incident_id, False,
                                       finding.stopped_at, finding.detected_at, point)
            return [] if rec is None else [RecoveryStatus.of(rec)]

    def _fault(self, j: JobRecord, node: str, kind: FaultKind, incident_id: int | None,
               alive: bool, seen: float, detected: float,
               point: Checkpoint | None) -> Recovery | None:
        if j.row.state != "failed":
            return self.engine.on_fault(j, node, kind, incident_id, alive, seen, detected,
                                        point)
        # A failed job is not recovered any more, but its broken node is still taken out.
        log.warning("job %s is failed (not recovered): %s fault on %s", j.name, kind, node)
        self.actions.submit(ActionRequest(
            id=uuid.uuid4().hex, key=f"job:{j.name}:evict:{node}:{incident_id}",
            action="evict", node=node, rule=RECOVERY_RULE, incident_id=incident_id,
            reason=f"{kind} fault on {node} (job {j.name} is failed, not recovered)",
            params={"job": j.name, "status": "firing"}, requested_by=REQUESTER,
            created_seconds=self.clock.time()))
        self.registry.evict(j, node)
        return None

    def _fault_times(self, incident_id: int | None,
                     observed_at: float | None) -> tuple[float, float]:
        now = self.clock.time()
        incident = self.store.get_incident(incident_id) if incident_id is not None else None
        detected = incident.detected_at if incident is not None else now
        seen = observed_at if observed_at is not None else (
            incident.observed_at if incident is not None else now)
        return min(seen, detected), detected
