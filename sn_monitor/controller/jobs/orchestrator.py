"""The jobs layer as the controller sees it: one object, its calls, one lock.

The controller owns one :class:`JobOrchestrator`; nothing here speaks HTTP or runs a
driver. Every outside effect is an action given to the :class:`~.ports.JobActions` port.
The parts, each its own module:

- :mod:`.registry`: the jobs, their members and spare pools, persisted;
- :mod:`.progress` and :mod:`.hangs`: what the ranks report, ETTR, a job that hangs;
- :mod:`.checkpoints` and :mod:`.schedule`: the checkpoint catalogue (only complete
  ones count) and when a job is asked for one;
- :mod:`.recovery`: the recovery state machine and the engine that drives it;
- :mod:`.faults`: what a fault on a node (or a hang) does to the jobs on it;
- :mod:`.scans`: when a job's checkpoint directory is scanned, which checkpoint is latest;
- :mod:`.status`: what the API and the metrics read of a job.

Locking. One lock guards the jobs' state; it is never held over file system work: the
checkpoint directories (shared storage, maybe slow) are scanned and checkpoints verified
before the lock is taken, on the caller's thread (the sweep's, or the API's worker
pool: never the event loop, whose progress calls only touch memory).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

from sn_monitor.clock import Clock
from sn_monitor.controller.jobs.advisor import FleetFaults
from sn_monitor.controller.jobs.checkpoints import Checkpoint
from sn_monitor.controller.jobs.faults import JobFaults
from sn_monitor.controller.jobs.hangs import find_hang
from sn_monitor.controller.jobs.ports import JobActions
from sn_monitor.controller.jobs.progress import on_controller_clock
from sn_monitor.controller.jobs.recovery.engine import RecoveryEngine
from sn_monitor.controller.jobs.recovery_record import FaultKind
from sn_monitor.controller.jobs.registry import JobRecord, JobRegistry, NodeLabels, NodeRole
from sn_monitor.controller.jobs.scans import (
    CHECKPOINTING_SCAN_SECONDS,
    freshest,
    latest,
    scan_due,
)
from sn_monitor.controller.jobs.schedule import CheckpointSchedule
from sn_monitor.controller.jobs.settings import JobSettings
from sn_monitor.controller.jobs.spec import DistributedJob
from sn_monitor.controller.jobs.status import job_metrics, job_status
from sn_monitor.controller.jobs.views import (
    CheckpointRequest,
    HangFinding,
    JobMetrics,
    JobStatus,
    ProgressReply,
    RecoveryStatus,
    RestoreInfo,
    RestorePoint,
)
from sn_monitor.controller.storage.store import Store, StoreError

log = logging.getLogger(__name__)


class JobOrchestrator:
    """Job checkpoints, hang detection and recovery; see the module docstring."""

    def __init__(self, store: Store, clock: Clock, actions: JobActions,
                 node_labels: NodeLabels, settings: JobSettings | None = None) -> None:
        self.store = store
        self.clock = clock
        self.settings = settings or JobSettings()
        self._lock = threading.RLock()
        #: A worker runs :meth:`scan_checkpoints`; :meth:`tick` does not.
        self.scans_elsewhere = False
        self.actions = actions
        self.registry = JobRegistry(store, clock, self.settings, node_labels)
        self.fleet = FleetFaults()
        self.schedule = CheckpointSchedule(self.registry, clock, self.settings, actions,
                                           self.fleet)
        self.engine = RecoveryEngine(store, clock, self.settings, actions, self.registry,
                                     self.schedule)
        self.faults = JobFaults(self._lock, store, clock, actions, self.registry,
                                self.schedule, self.engine)

    def save_all(self) -> None:
        """Write every job's row now (progress counters included): before a planned stop."""
        with self._lock:
            for j in self.registry.records():
                self.registry.save(j)

    def load_from_store(self) -> None:
        """Jobs, nodes and recoveries; active recoveries carry on at the next tick."""
        with self._lock:
            self.registry.load()
            self.engine.load()

    # ------------------------------------------------------------------ jobs

    def add_job(self, job: DistributedJob, source: str) -> JobStatus:
        """Watch ``job`` (``source``: the file or ``api``); a known one gets the new spec."""
        with self._lock:
            j = self.registry.add(job, source)
            log.info("job %s: watching %d nodes, %d spares (%s)", job.name, len(j.nodes),
                     len(j.pool), source)
            return self._status(j)

    def remove_job(self, name: str) -> bool:
        """Stop watching a job; its active recovery is cancelled. False if unknown."""
        with self._lock:
            if self.registry.find(name) is None:
                return False
            self.engine.cancel(name, "the job was removed")
            self.registry.remove(name)
            return True

    def jobs(self) -> list[JobStatus]:
        with self._lock:
            return [self._status(j) for j in self.registry.records()]

    def job(self, name: str) -> JobStatus | None:
        with self._lock:
            j = self.registry.find(name)
            return None if j is None else self._status(j)

    def ranks_by_node(self, name: str) -> dict[str, list[int]]:
        """The ranks of the job's current generation on each node, as they reported."""
        with self._lock:
            j = self.registry.find(name)
            if j is None:
                return {}
            out: dict[str, list[int]] = {}
            for rank, progress in sorted(j.progress.ranks.items()):
                out.setdefault(progress.node, []).append(rank)
            return out

    def spec(self, name: str) -> DistributedJob | None:
        """The job's DistributedJob as added (its ``control`` says how to reach its launcher)."""
        with self._lock:
            j = self.registry.find(name)
            return None if j is None else j.job

    def jobs_of_node(self, node: str) -> list[str]:
        """The jobs running on ``node`` (not those holding it as a spare).

        Without the lock: the event loop asks for every report, and the lock is held
        around store writes. The registry reads a copy of its records.
        """
        return self.registry.jobs_of_node(node)

    def members(self) -> dict[str, tuple[str, ...]]:
        """Each job's nodes and the nodes it took out (evicted, failed spares).

        Unlike :meth:`jobs`, it reads nothing that a read may move: a job's status asks
        the checkpoint advisor, whose estimate is cached from when it is asked.
        """
        with self._lock:
            return {j.name: (*j.row.nodes, *j.row.excluded) for j in self.registry.records()}

    def exists(self, name: str) -> bool:
        """Whether a job of that name is known (a read without side effects, as :meth:`members`)."""
        with self._lock:
            return self.registry.find(name) is not None

    def excluding(self, node: str) -> list[str]:
        """The jobs that took ``node`` out (evicted, or a failed spare): it may return."""
        with self._lock:
            return [j.name for j in self.registry.records() if node in j.row.excluded]

    def roles_of(self, node: str) -> dict[str, NodeRole]:
        """What ``node`` is to each job that knows it: member, spare or evicted."""
        with self._lock:
            return self.registry.roles_of(node)

    @property
    def membership_version(self) -> int:
        """Changes whenever a job's members or spares change (relabel the nodes then)."""
        return self.registry.version

    def note_node(self, node: str, labels: Mapping[str, str]) -> None:
        """A node reported (new, or its labels changed): label selectors may pick it up."""
        with self._lock:
            self.registry.note_node(node, labels)

    def return_to_pool(self, job: str, node: str) -> JobStatus:
        """A failed node is healthy again (operator, health probe): a spare of ``job``."""
        with self._lock:
            j = self.registry.get(job)
            self.registry.return_to_pool(j, node)
            log.info("job %s: %s back in the spare pool", job, node)
            return self._status(j)

    def recovering(self, node: str) -> bool:
        """An active recovery counts ``node`` among its failed nodes (evicted or not)."""
        with self._lock:
            return any(self.engine.recovering(j.name, node) for j in self.registry.records())

    def stalled_restores(self) -> list[tuple[str, tuple[str, ...]]]:
        """Jobs whose restore went out twice the hang timeout ago without progress since.

        With the nodes each was restored on. The controller looks there for a node that
        broke meanwhile in a way that does not take a node out by itself (a link down): a
        restore onto it only hangs.
        """
        now = self.clock.time()
        out = []
        with self._lock:
            for j in self.registry.records():
                rec = self.engine.active(j.name)
                if rec is None or rec.state != "restoring" or rec.restore_sent is None:
                    continue
                wait = 2 * j.job.spec.effective_hang_timeout(j.progress.median_step_time())
                if j.progress.last_advance is None and now - rec.restore_sent >= wait:
                    out.append((j.name, tuple(rec.nodes)))
        return out

    def owns_incident(self, incident_id: int) -> bool:
        """A recovery acted on this incident: the controller must not plan it again."""
        with self._lock:
            return self.engine.owns_incident(incident_id)

    # ------------------------------------------------------------------ progress

    def progress(self, job: str, rank: int, node: str, world_size: int,
                 updates: Sequence[tuple[int, float]],
                 step_time: float | None = None) -> ProgressReply:
        """One rank's progress (steps with their wall times); the reply for the client.

        Raises UnknownJob, or ValueError for a rank outside the world or a negative step.
        """
        now = self.clock.time()
        with self._lock:
            j = self.registry.get(job)
            batch = [(step, on_controller_clock(when, now))  # the rank's clock, bounded
                     for step, when in list(updates)[-self.settings.max_updates:]]
            j.progress.update(rank, node, world_size, batch, step_time, now)
            if j.job.spec.nodes_from_progress and node not in j.row.nodes:
                self.registry.refresh(j)
            if batch:
                self.engine.progress(j, node, batch)
            return self._reply(j)

    def _reply(self, j: JobRecord) -> ProgressReply:
        request = self.schedule.current(j)
        rec = self.engine.active(j.name)
        restore = None
        if rec is not None and rec.state == "restoring" and rec.restore_sent is not None:
            restore = RestoreInfo(
                step=rec.checkpoint.step if rec.checkpoint else 0,
                path=rec.checkpoint.path if rec.checkpoint else "", nodes=rec.nodes,
                generation=rec.generation)
        return ProgressReply(checkpoint_requested=request is not None,
                             checkpoint_id=request.checkpoint_id if request else None,
                             restore=restore)

    def should_checkpoint(self, job: str) -> CheckpointRequest | None:
        """The job's outstanding checkpoint request, if any."""
        with self._lock:
            return self.schedule.current(self.registry.get(job))

    def checkpoint_saved(self, job: str, rank: int, node: str, step: int,
                         path: str, save_seconds: float | None = None) -> Checkpoint:
        """The client wrote a checkpoint; it counts (and satisfies a request) if complete.

        It is verified on disk before the lock is taken. ``save_seconds``: how long
        training stood still for it: the interval advisor's input, and not productive
        time (:mod:`sn_monitor.ettr`).
        """
        with self._lock:
            known = self.registry.get(job)
            catalogue = known.catalogue
            if save_seconds is not None:
                known.saves.add(save_seconds)
                known.progress.saved(step, save_seconds)
        record = catalogue.report(step, path)
        log.info("job %s: checkpoint of step %d reported by rank %d on %s: %s", job, step,
                 rank, node, "complete" if record.complete else f"not complete ({record.reason})")
        if record.complete:
            with self._lock:
                j = self.registry.find(job)
                if j is not None:
                    self.schedule.found(j, record)
        return record

    def restore_point(self, job: str) -> RestorePoint | None:
        """The latest complete checkpoint (verified on disk) and the job's generation."""
        with self._lock:
            j = self.registry.get(job)
        point = latest(j, scan=j.catalogue.latest_complete() is None)
        if point is None:
            return None
        with self._lock:
            self.schedule.found(j, point)
            return RestorePoint(point.step, str(point.path), j.row.generation)

    def observe_fleet(self, nodes: int) -> None:
        """Every sweep: ``nodes`` are watched (the fleet's fault rate's denominator)."""
        with self._lock:
            self.fleet.observe(nodes, self.clock.time())

    def note_fleet_fault(self) -> None:
        """A fault took a node out (any node): the fleet's fault rate's numerator."""
        with self._lock:
            self.fleet.note_fault()

    # ------------------------------------------------------------------ faults

    def on_node_degrading(self, node: str, rule: str,
                          incident_id: int | None = None) -> list[CheckpointRequest]:
        """A rule with a ``checkpoint`` action fired on ``node``: see :class:`.JobFaults`."""
        return self.faults.on_node_degrading(node, rule, incident_id)

    def on_node_fault(self, node: str, kind: FaultKind, incident_id: int | None,
                      alive: bool, observed_at: float | None = None,
                      job: str | None = None) -> list[RecoveryStatus]:
        """``node`` failed: start (or join) a recovery of every job on it (:class:`.JobFaults`)."""
        return self.faults.on_node_fault(node, kind, incident_id, alive, observed_at, job)

    def on_hang(self, finding: HangFinding, incident_id: int | None) -> list[RecoveryStatus]:
        """Recover from a hang: the nodes that stopped first fail; none: restart in place."""
        return self.faults.on_hang(finding, incident_id)

    def approve_recovery(self, recovery_id: str, who: str) -> RecoveryStatus:
        """A person approved a manual recovery: the restore goes out."""
        with self._lock:
            jobs = self.registry.records()
        points = {j.name: latest(j, scan=False) for j in jobs}
        with self._lock:
            return RecoveryStatus.of(self.engine.approve(recovery_id, who, points))

    def recoveries(self, job: str | None = None, limit: int = 100) -> list[RecoveryStatus]:
        """Recoveries from the store, newest first."""
        return [RecoveryStatus.of(r) for r in self.engine.recoveries(job, limit)]

    def recovery(self, recovery_id: str) -> RecoveryStatus | None:
        rec = self.engine.recovery(recovery_id)
        return None if rec is None else RecoveryStatus.of(rec)

    # ------------------------------------------------------------------ tick

    def scan_checkpoints(self) -> None:
        """Look through the checkpoint directories that are due, verify each job's latest.

        File system work, on shared storage that may be slow: no lock is held meanwhile.
        The controller's ``checkpoints`` worker runs it (set :attr:`scans_elsewhere`), so
        that a slow mount delays neither the sweep nor a report; otherwise :meth:`tick`
        runs it first.
        """
        with self._lock:
            jobs = [(j, scan_due(j, self._scan_every(j), self.clock.monotonic()))
                    for j in self.registry.records()]
        for j, scan in jobs:
            j.verified = latest(j, scan=scan)

    def tick(self) -> list[HangFinding]:
        """Every sweep: scheduled checkpoints, hang detection, recovery steps.

        Each job's latest complete checkpoint is the last one :meth:`scan_checkpoints`
        verified.
        """
        if not self.scans_elsewhere:
            self.scan_checkpoints()
        with self._lock:
            jobs = list(self.registry.records())
        findings: list[HangFinding] = []
        for j in jobs:
            with self._lock:
                if self.registry.find(j.name) is not j:
                    continue  # removed meanwhile
                try:
                    self._tick_job(j, freshest(j), findings)
                except StoreError as err:
                    log.error("job %s: store unavailable, trying again: %s", j.name, err)
        return findings

    def _scan_every(self, j: JobRecord) -> float:
        rec = self.engine.active(j.name)
        if rec is not None and rec.state == "checkpointing":
            return min(float(self.settings.scan_interval), CHECKPOINTING_SCAN_SECONDS)
        return float(self.settings.scan_interval)

    def _tick_job(self, j: JobRecord, point: Checkpoint | None,
                  findings: list[HangFinding]) -> None:
        if point is not None:
            self.schedule.found(j, point)
        self.schedule.submit_pending(j)  # a request saved just before a crash
        if self.engine.active(j.name) is not None:
            self.engine.tick(j, point)
        elif j.row.state == "running":
            self.schedule.scheduled(j)
            finding = find_hang(j, self.clock.time())
            if finding is not None:
                findings.append(finding)
        self.registry.save_if_due(j)

    # ------------------------------------------------------------------ views

    def _status(self, j: JobRecord) -> JobStatus:
        rec = self.engine.active(j.name)
        return job_status(j, self.clock.time(), recovery=rec.id if rec else None,
                          request=self.schedule.current(j), interval=self.schedule.interval(j),
                          advice=self.schedule.advice(j))

    def metrics(self) -> JobMetrics:
        """Per job state, generation, failures, checkpoint age, ETTR; finished recoveries."""
        with self._lock:
            return JobMetrics(jobs=job_metrics(self.registry.records(), self.clock.time(),
                                               self.schedule.advice),
                              recoveries=self.engine.finished())

