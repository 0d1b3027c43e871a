"""The controller-side brain of job recovery: checkpoints, hangs, failover, restore.

The controller owns one :class:`JobOrchestrator` and calls it; nothing here speaks HTTP
or runs a driver. Every outside effect is an action (``checkpoint``, ``evict``,
``restore``, ``alert``) handed to ``submit``, which records it in the audit trail and
runs it through the safety policy (the controller passes a function wrapping
``ActionRunner.submit``).

What it does:

- **Jobs.** Added from DistributedJob specs, kept in the store (``jobs`` table). A job's
  nodes are its list, or every known node whose labels match its selector; plus the
  spares it took, minus the nodes failed out of it and the spares still in its pool. A
  failed node does not come back (to the job or to the pool) until
  :meth:`JobOrchestrator.return_to_pool`.
- **Progress** from the training client (:mod:`sn_monitor.client`): per-rank last step,
  the median step time, the effective training time ratio (see :mod:`.progress`). The
  reply tells the ranks to checkpoint, or where to restore from.
- **Checkpoints.** Every ``checkpointInterval`` a ``checkpoint`` action (to job control)
  and a request in the progress replies; also at once when a node of the job degrades
  (:meth:`~JobOrchestrator.on_node_degrading`), at most once a minute. A request is
  satisfied by a complete checkpoint of a newer step.
- **Hangs.** :meth:`~JobOrchestrator.tick` finds a job whose ranks all reported but
  whose progress stopped for its hang timeout, and returns a :class:`HangFinding` naming
  the ranks and nodes that stopped first. The controller opens an incident and calls
  :meth:`~JobOrchestrator.on_hang`.
- **Recovery** (:meth:`~JobOrchestrator.on_node_fault`): a state machine persisted in
  the ``recoveries`` table, one per job at a time (a second fault joins it)::

      detected -> [checkpointing] -> evicting -> [awaiting_approval] -> restoring -> done
                                                     (any step) -> failed

  ``checkpointing`` only when the faulty node is alive and the job was still making
  progress: a ``checkpoint`` action, then up to ``checkpoint_wait`` for a newer complete
  checkpoint. ``evicting``: an ``evict`` action per failed node, waited for. Then the
  plan by ``recoveryStrategy``: ``restart`` takes spares from the pool (too few left:
  continue elastic if ``minReplicas`` allows, else fail); ``elastic`` continues on the
  nodes left while there are at least ``minReplicas``; ``manual`` plans like restart
  and waits in ``awaiting_approval`` for :meth:`~JobOrchestrator.approve_recovery`.
  ``restoring``: a ``restore`` action with ``{job, checkpoint: {step, path}, nodes,
  generation}`` (the latest *complete* checkpoint; generation + 1), the same in the
  progress replies, then wait for progress from the new generation (a step at or past
  the checkpoint's, reported after the launcher took the restore (its action
  succeeded: until then the old ranks may still run), from one of the new nodes):
  ``done``. MTTR = resumed - fault seen, split into detection (fault seen -> detected),
  eviction (-> evicted, the pre-fault checkpoint included), restart (-> restore sent:
  planning, approval) and reload (-> resumed: relaunch and checkpoint load).

Idempotency. Each step's action has the key ``recovery:{id}:{step}`` (``checkpoint``,
``evict:{node}``, ``restore``, ``alert``; a retry appends ``:{n}``) and its id is saved
in the recovery's row: a restarted controller (:meth:`~JobOrchestrator.load_from_store`)
carries on from the saved state and never submits a step twice (an action recorded just
before a crash, and not yet in the row, is found by its key by the action store).

Errors. Every step has a timeout (:class:`JobSettings`); a step whose action fails, is
refused or times out is retried ``step_retries`` times, then the recovery fails: the job
becomes ``failed`` and a critical ``alert`` (rule ``job-failed``) is submitted. A job
that needs more than ``maxFailures`` recoveries is failed the same way, and is no longer
recovered automatically (re-adding the job starts it afresh).

Eviction. The orchestrator owns the eviction of job nodes: the controller should not
also run its rules' ``failover`` expansion (evict + failover) for a node of a job, but
call :meth:`~JobOrchestrator.on_node_fault` instead (see the module's wiring notes in
:meth:`JobOrchestrator.on_node_fault`). Were both to evict, the keys differ and the
eviction drivers are idempotent, so the worst case is a second, harmless request.

Thread safety: one lock; submits (one durable store write each) happen under it.
Progress calls never write to the store except when they finish a recovery.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from sn_monitor.clock import Clock
from sn_monitor.config import ConfigError, Duration, non_negative, positive, setting
from sn_monitor.controller.audit import ActionName, ActionRecord, ActionRequest
from sn_monitor.controller.jobs.checkpoints import Checkpoint, CheckpointRegistry
from sn_monitor.controller.jobs.progress import JobProgress
from sn_monitor.controller.jobs.spec import DistributedJob, job_from_json, job_to_dict
from sn_monitor.controller.store import JobRow, RecoveryRow, Store, StoreError

log = logging.getLogger(__name__)

SubmitAction = Callable[[ActionRequest], ActionRecord]
NodeLabels = Callable[[str], Mapping[str, str] | None]
FaultKind = Literal["fatal", "lost", "hang"]
JobState = Literal["running", "recovering", "awaiting_approval", "failed"]
RecoveryState = Literal["detected", "checkpointing", "evicting", "awaiting_approval",
                        "restoring", "done", "failed", "cancelled"]

ACTIVE_STATES: Final[frozenset[str]] = frozenset(
    {"detected", "checkpointing", "evicting", "awaiting_approval", "restoring"})
FINISHED_STATES: Final[frozenset[str]] = frozenset({"done", "failed", "cancelled"})
#: Action states that mean the action will not happen.
_BAD: Final = frozenset({"failed", "refused", "cancelled"})
#: Action states that mean it happened (a dry run is as good as done for the plan).
_GOOD: Final = frozenset({"succeeded", "dry_run"})
_REQUESTER: Final = "job-orchestrator"
JOB_FAILED_RULE: Final = "job-failed"
RECOVERY_RULE: Final = "job-recovery"
HANG_RULE: Final = "job-hang"
_HISTORY_KEPT: Final = 200


class JobError(Exception):
    """A job request that cannot be done (the API answers 409)."""


class UnknownJob(JobError, KeyError):
    """No job by that name (the API answers 404)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown job"


class UnknownRecovery(JobError, KeyError):
    """No recovery by that id (the API answers 404)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown recovery"


#: How often a recovery held by an open circuit breaker asks again to evict.
BREAKER_RECHECK_SECONDS: Final = 15.0


@dataclass(frozen=True)
class JobSettings:
    """Timeouts and limits of job recovery (the controller's ``jobs:`` section)."""

    #: How long a recovery waits for a checkpoint before evicting a node still alive.
    checkpoint_wait: Duration = setting(default=Duration(120.0), check=non_negative)
    #: How long the evictions of a recovery may take, per try.
    evict_timeout: Duration = setting(default=Duration(300.0), check=positive)
    #: How long after the restore is sent the new generation has to make progress.
    restore_timeout: Duration = setting(default=Duration(900.0), check=positive)
    #: Retries of a failed, refused or timed-out step before the recovery fails.
    step_retries: int = setting(default=2, check=non_negative)
    #: False: an eviction that failed for good is noted and the recovery goes on (the
    #: node is out of the job's node list either way).
    require_eviction: bool = True
    #: A pre-emptive checkpoint is not requested again within this time of the last.
    preemptive_min_interval: Duration = setting(default=Duration(60.0), check=non_negative)
    #: How often a job's checkpoint directory is scanned (at most).
    scan_interval: Duration = setting(default=Duration(30.0), check=positive)
    #: How often a job's progress counters (ETTR) are saved.
    save_interval: Duration = setting(default=Duration(10.0), check=positive)
    #: ETTR: a gap between new steps counted whole while the step time is unknown.
    unknown_gap: Duration = setting(default=Duration(60.0), check=positive)
    max_ranks: int = setting(default=1 << 20, check=positive)
    #: Progress updates taken from one post (the latest ones).
    max_updates: int = setting(default=64, check=positive)
    #: Finished recoveries kept in memory for the duration histogram.
    finished_kept: int = setting(default=10_000, check=positive)


# --- what callers get back -------------------------------------------------------------


@dataclass(frozen=True)
class RestoreInfo:
    """Where the ranks of a new generation resume (``path`` empty: from scratch)."""

    step: int
    path: str
    nodes: tuple[str, ...]
    generation: int

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "path": self.path, "nodes": list(self.nodes),
                "generation": self.generation}


@dataclass(frozen=True)
class ProgressReply:
    """The answer to a progress post (the wire shape :mod:`sn_monitor.client` reads)."""

    checkpoint_requested: bool = False
    checkpoint_id: str | None = None
    restore: RestoreInfo | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint_requested": self.checkpoint_requested,
                "checkpoint_id": self.checkpoint_id,
                "restore": self.restore.to_dict() if self.restore else None}


@dataclass(frozen=True)
class RestorePoint:
    """The latest complete checkpoint of a job, and the job's generation."""

    step: int
    path: str
    generation: int

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "path": self.path, "generation": self.generation}


@dataclass(frozen=True)
class CheckpointRequest:
    """A checkpoint the orchestrator asked a job for."""

    job: str
    checkpoint_id: str
    reason: str
    requested_at: float
    #: Satisfied by a complete checkpoint of a step after this one.
    after_step: int
    action_id: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "checkpoint_id": self.checkpoint_id, "reason": self.reason,
                "requested_at": self.requested_at, "after_step": self.after_step,
                "action_id": self.action_id}


@dataclass(frozen=True)
class HangFinding:
    """A job stopped making progress: the ranks (and their nodes) that stopped first.

    ``nodes`` is empty when every node of the job stopped together (no single culprit):
    :meth:`JobOrchestrator.on_hang` then restarts the job in place.
    """

    job: str
    generation: int
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    step: int
    #: The client's wall time of the last progress of the first rank that stopped.
    stopped_at: float
    stalled_seconds: float
    timeout_seconds: float
    detected_at: float
    message: str

    @property
    def rule(self) -> str:
        return HANG_RULE

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "generation": self.generation, "ranks": list(self.ranks),
                "nodes": list(self.nodes), "step": self.step, "stopped_at": self.stopped_at,
                "stalled_seconds": self.stalled_seconds,
                "timeout_seconds": self.timeout_seconds, "detected_at": self.detected_at,
                "message": self.message}


@dataclass(frozen=True)
class RecoveryStatus:
    """One recovery as the API shows it."""

    id: str
    job: str
    generation: int
    state: RecoveryState
    kind: str
    strategy: str
    failed_nodes: tuple[str, ...]
    replacement_nodes: tuple[str, ...]
    nodes: tuple[str, ...]
    incident_ids: tuple[int, ...]
    checkpoint: Mapping[str, Any] | None
    attempts: int
    deadline: float | None
    fault_seen: float
    detected: float | None
    evicted: float | None
    restore_sent: float | None
    resumed: float | None
    finished_at: float | None
    error: str
    actions: Mapping[str, str]
    history: tuple[Mapping[str, Any], ...]

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def mttr_seconds(self) -> float | None:
        """Resumed - fault seen (None until the job resumed)."""
        return None if self.resumed is None else max(0.0, self.resumed - self.fault_seen)

    @classmethod
    def of(cls, row: RecoveryRow) -> RecoveryStatus:
        checkpoint = (None if row.checkpoint_step is None else
                      {"step": row.checkpoint_step, "path": row.checkpoint_path or ""})
        return cls(
            id=row.id, job=row.job, generation=row.generation,
            state=row.state,  # type: ignore[arg-type]
            kind=row.kind, strategy=row.strategy, failed_nodes=row.failed_nodes,
            replacement_nodes=row.replacement_nodes, nodes=row.nodes,
            incident_ids=row.incident_ids, checkpoint=checkpoint, attempts=row.attempts,
            deadline=row.deadline, fault_seen=row.fault_seen, detected=row.detected,
            evicted=row.evicted, restore_sent=row.restore_sent, resumed=row.resumed,
            finished_at=row.finished_at, error=row.error, actions=dict(row.actions),
            history=row.history)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "job": self.job, "generation": self.generation,
            "state": self.state, "kind": self.kind, "strategy": self.strategy,
            "failed_nodes": list(self.failed_nodes),
            "replacement_nodes": list(self.replacement_nodes), "nodes": list(self.nodes),
            "incident_ids": list(self.incident_ids), "checkpoint": self.checkpoint,
            "attempts": self.attempts, "deadline": self.deadline,
            "times": {"fault_seen": self.fault_seen, "detected": self.detected,
                      "evicted": self.evicted, "restore_sent": self.restore_sent,
                      "resumed": self.resumed, "finished": self.finished_at},
            "mttr_seconds": self.mttr_seconds, "error": self.error,
            "actions": dict(self.actions), "history": [dict(h) for h in self.history],
        }


REDACTED = "<redacted>"


def redacted(document: Mapping[str, Any]) -> dict[str, Any]:
    """A job's document for the API: its webhook control's secret and header values out."""
    doc = dict(document)
    spec = doc.get("spec")
    control = spec.get("control") if isinstance(spec, Mapping) else None
    if isinstance(control, Mapping) and isinstance(control.get("webhook"), Mapping):
        hook = dict(control["webhook"])
        if hook.get("secret") is not None:
            hook["secret"] = REDACTED
        if isinstance(hook.get("headers"), Mapping):
            hook["headers"] = {name: REDACTED for name in hook["headers"]}
        doc["spec"] = {**spec, "control": {**control, "webhook": hook}}  # type: ignore[dict-item]
    return doc


@dataclass(frozen=True)
class JobStatus:
    """One job as the API shows it."""

    name: str
    source: str
    state: JobState
    state_reason: str
    generation: int
    failures: int
    max_failures: int
    strategy: str
    replicas: int
    min_replicas: int
    nodes: tuple[str, ...]
    spares: tuple[str, ...]
    failed_nodes: tuple[str, ...]
    checkpoint: Mapping[str, Any] | None
    checkpoint_request: CheckpointRequest | None
    recovery: str | None
    world_size: int
    ranks_reporting: int
    last_step: int | None
    median_step_seconds: float | None
    effective_training_ratio: float | None
    created_at: float
    updated_at: float
    spec: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "source": self.source, "state": self.state,
            "state_reason": self.state_reason, "generation": self.generation,
            "failures": self.failures, "max_failures": self.max_failures,
            "strategy": self.strategy, "replicas": self.replicas,
            "min_replicas": self.min_replicas, "nodes": list(self.nodes),
            "spares": list(self.spares), "failed_nodes": list(self.failed_nodes),
            "checkpoint": self.checkpoint,
            "checkpoint_request": (self.checkpoint_request.to_dict()
                                   if self.checkpoint_request else None),
            "recovery": self.recovery, "world_size": self.world_size,
            "ranks_reporting": self.ranks_reporting, "last_step": self.last_step,
            "median_step_seconds": self.median_step_seconds,
            "effective_training_ratio": self.effective_training_ratio,
            "created_at": self.created_at, "updated_at": self.updated_at,
            "spec": redacted(self.spec),
        }


@dataclass(frozen=True)
class RecoveryDuration:
    """A finished recovery's MTTR and its split (for ``sn_recovery_duration_seconds``)."""

    id: str
    job: str
    kind: str
    total: float
    detection: float
    eviction: float
    restart: float
    reload: float
    finished_at: float


@dataclass(frozen=True)
class JobMetric:
    state: JobState
    generation: int
    failures_total: int
    checkpoint_age_seconds: float | None
    #: See :mod:`sn_monitor.controller.jobs.progress` for the definition.
    effective_training_ratio: float | None
    productive_seconds: float
    nodes: int
    spares: int
    median_step_seconds: float | None
    last_step: int | None


@dataclass(frozen=True)
class JobMetrics:
    """What the controller exports about jobs: per job, and every finished recovery."""

    jobs: Mapping[str, JobMetric] = field(default_factory=dict)
    #: Finished (done) recoveries, oldest first; each id once (observe each id once).
    recoveries: tuple[RecoveryDuration, ...] = ()


def recovery_duration(row: RecoveryRow) -> RecoveryDuration | None:
    """The MTTR split of a recovery that is done (None otherwise)."""
    if row.state != "done" or row.resumed is None:
        return None
    seen = row.fault_seen
    detected = row.detected if row.detected is not None else seen
    evicted = row.evicted if row.evicted is not None else detected
    sent = row.restore_sent if row.restore_sent is not None else evicted
    resumed = row.resumed
    return RecoveryDuration(
        id=row.id, job=row.job, kind=row.kind, total=max(0.0, resumed - seen),
        detection=max(0.0, detected - seen), eviction=max(0.0, evicted - detected),
        restart=max(0.0, sent - evicted), reload=max(0.0, resumed - sent),
        finished_at=row.finished_at if row.finished_at is not None else resumed)


# --- the orchestrator -------------------------------------------------------------------


class _Job:
    """A job in memory: its row, parsed spec, checkpoints and progress."""

    def __init__(self, row: JobRow, job: DistributedJob, registry: CheckpointRegistry,
                 progress: JobProgress) -> None:
        self.row = row
        self.job = job
        self.registry = registry
        self.progress = progress
        self.last_scan = -math.inf
        self.last_saved = -math.inf
        self.dirty = False

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def data(self) -> Mapping[str, Any]:
        return self.row.data


class JobOrchestrator:
    """Job checkpoints, hang detection and recovery; see the module docstring."""

    def __init__(self, store: Store, clock: Clock, submit: SubmitAction,
                 node_labels: NodeLabels, settings: JobSettings | None = None) -> None:
        self.store = store
        self.clock = clock
        self.submit = submit
        self.node_labels = node_labels
        self.settings = settings or JobSettings()
        self._lock = threading.RLock()
        self._jobs: dict[str, _Job] = {}
        self._labels: dict[str, dict[str, str]] = {}
        self._active: dict[str, RecoveryRow] = {}  # job -> its active recovery
        self._finished: list[RecoveryDuration] = []
        #: (job, incident id, node or "") already acted upon: a re-fired incident (the
        #: controller settles again after a restart) does not start a second recovery.
        self._handled: set[tuple[str, int, str]] = set()
        #: restore action id -> when it succeeded (see :meth:`_restore_taken`).
        self._restore_taken_at: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle

    def load_from_store(self) -> None:
        """Load jobs, nodes and recoveries; active recoveries carry on at the next tick."""
        with self._lock:
            for node in self.store.list_nodes():
                self._labels[node.name] = dict(node.labels)
            for row in self.store.list_jobs():
                try:
                    job = job_from_json(json.dumps(dict(row.spec)).encode())
                except ConfigError as err:  # a hand-edited database, or an older spec
                    log.error("job %s in the store cannot be read, skipped: %s", row.name, err)
                    continue
                j = self._new_job(row, job)
                self._jobs[row.name] = j
                last = row.data.get("last_checkpoint")
                if isinstance(last, dict) and "path" in last:
                    try:
                        j.registry.report(int(last["step"]), str(last["path"]))
                    except (ValueError, OSError) as err:
                        log.warning("job %s: last checkpoint %s: %s", row.name, last, err)
            for rec in self.store.list_recoveries(limit=self.settings.finished_kept * 2):
                for incident, node in rec.data.get("handled", ()):
                    self._handled.add((rec.job, int(incident), str(node)))
                if rec.state in ACTIVE_STATES and rec.job in self._jobs:
                    self._active[rec.job] = rec
                    if rec.data.get("planned"):
                        self._apply_plan(self._jobs[rec.job], rec)
                duration = recovery_duration(rec)
                if duration is not None:
                    self._finished.append(duration)
            del self._finished[:-self.settings.finished_kept]
            if self._active:
                log.info("resuming %d job recoveries: %s", len(self._active),
                         ", ".join(f"{r.job} ({r.state})" for r in self._active.values()))

    def _new_job(self, row: JobRow, job: DistributedJob) -> _Job:
        registry = CheckpointRegistry(job.name, job.spec.checkpoint_dir,
                                      job.spec.checkpoint_marker, clock=self.clock)
        progress = JobProgress(self.settings.max_ranks, float(self.settings.unknown_gap))
        data = row.data
        if data.get("frontier") is not None:
            progress.frontier = int(data["frontier"])
            progress.frontier_time = float(data.get("frontier_time") or 0.0)
        progress.productive = float(data.get("productive") or 0.0)
        return _Job(row, job, registry, progress)

    # ------------------------------------------------------------------ jobs

    def add_job(self, job: DistributedJob, source: str) -> JobStatus:
        """Watch ``job`` (``source``: the file or ``api``).

        An existing job gets the new spec and keeps its state, generation, failures and
        the spares it used (remove it first to start afresh).
        """
        now = self.clock.time()
        with self._lock:
            old = self._jobs.get(job.name)
            spec = job_to_dict(job)
            if old is None:
                row = JobRow(name=job.name, spec=spec, source=source, state="running",
                             created_at=now, updated_at=now, pool=tuple(job.spec.spares))
                j = self._new_job(row, job)
            else:
                row = old.row
                used = set(row.added) | set(row.excluded) | set(row.pool)
                pool = tuple(row.pool) + tuple(s for s in job.spec.spares if s not in used)
                j = old
                if (job.spec.checkpoint_dir, job.spec.checkpoint_marker) != (
                        j.job.spec.checkpoint_dir, j.job.spec.checkpoint_marker):
                    j.registry = CheckpointRegistry(
                        job.name, job.spec.checkpoint_dir, job.spec.checkpoint_marker,
                        clock=self.clock)
                j.job = job
                j.row = replace(row, spec=spec, source=source, pool=pool)
            self._jobs[job.name] = j
            self._refresh_members(j)
            self._save_job(j)
            log.info("job %s: watching %d nodes, %d spares (%s)", job.name,
                     len(j.row.nodes), len(j.row.pool), source)
            return self._status(j)

    def remove_job(self, name: str) -> bool:
        """Stop watching a job; its active recovery is cancelled. False if unknown."""
        with self._lock:
            j = self._jobs.pop(name, None)
            if j is None:
                return False
            rec = self._active.pop(name, None)
            if rec is not None:
                rec = self._history(rec, "cancelled", "the job was removed")
                self._save_rec(replace(rec, state="cancelled",
                                       finished_at=self.clock.time(), deadline=None))
            self.store.delete_job(name)
            self._handled = {h for h in self._handled if h[0] != name}
            return True

    def jobs(self) -> list[JobStatus]:
        with self._lock:
            return [self._status(j) for _, j in sorted(self._jobs.items())]

    def job(self, name: str) -> JobStatus | None:
        with self._lock:
            j = self._jobs.get(name)
            return None if j is None else self._status(j)

    def spec(self, name: str) -> DistributedJob | None:
        """The job's DistributedJob as added (its ``control`` says how to reach its launcher)."""
        with self._lock:
            j = self._jobs.get(name)
            return None if j is None else j.job

    def jobs_of_node(self, node: str) -> list[str]:
        """The jobs running on ``node`` (not those holding it as a spare)."""
        with self._lock:
            return sorted(name for name, j in self._jobs.items() if node in j.row.nodes)

    def note_node(self, node: str, labels: Mapping[str, str]) -> None:
        """A node reported (new, or its labels changed): label selectors may pick it up."""
        with self._lock:
            if self._labels.get(node) == dict(labels):
                return
            self._labels[node] = dict(labels)
            for j in self._jobs.values():
                if j.job.spec.node_selector is not None:
                    self._refresh_members(j)

    def return_to_pool(self, job: str, node: str) -> JobStatus:
        """A failed node is healthy again (operator, health probe): a spare of ``job``."""
        with self._lock:
            j = self._job(job)
            if node in j.row.pool:
                return self._status(j)
            if node in j.row.nodes:
                raise JobError(f"{node} is running job {job}, not a failed node")
            j.row = replace(j.row, excluded=tuple(n for n in j.row.excluded if n != node),
                            added=tuple(n for n in j.row.added if n != node),
                            pool=(*j.row.pool, node))
            self._refresh_members(j)
            self._save_job(j)
            log.info("job %s: %s back in the spare pool", job, node)
            return self._status(j)

    def _job(self, name: str) -> _Job:
        j = self._jobs.get(name)
        if j is None:
            raise UnknownJob(f"no job {name!r}")
        return j

    def _node_labels(self, node: str) -> Mapping[str, str]:
        labels = self.node_labels(node)
        return labels if labels is not None else self._labels.get(node, {})

    def _members(self, j: _Job) -> tuple[str, ...]:
        listed = j.job.spec.node_names
        if listed is not None:
            base = list(listed)
        elif j.job.spec.nodes_from_progress:
            # No nodes given: the job runs where its ranks report from (and stays there
            # until a node is failed out of it).
            base = sorted({*j.row.nodes, *(r.node for r in j.progress.ranks.values())})
        else:
            selector = j.job.spec.node_selector or {}
            base = sorted(n for n in self._labels
                          if all(self._node_labels(n).get(k) == v for k, v in selector.items()))
        out = set(base) | set(j.row.added)
        out -= set(j.row.excluded) | set(j.row.pool)
        ordered: list[str] = []
        for node in (*j.row.nodes, *base, *j.row.added):
            if node in out and node not in ordered:
                ordered.append(node)
        return tuple(ordered)

    def _refresh_members(self, j: _Job) -> None:
        members = self._members(j)
        if members != j.row.nodes:
            j.row = replace(j.row, nodes=members)
            j.dirty = True

    def _save_job(self, j: _Job, **changes: Any) -> None:
        data = dict(j.row.data)
        data.update(frontier=j.progress.frontier, frontier_time=j.progress.frontier_time,
                    productive=j.progress.productive)
        j.row = replace(j.row, **changes, data=data, updated_at=self.clock.time())
        self.store.save_job(j.row)
        j.dirty = False
        j.progress.dirty = False
        j.last_saved = self.clock.monotonic()

    def _set_data(self, j: _Job, **items: Any) -> None:
        j.row = replace(j.row, data={**j.row.data, **items})

    def _status(self, j: _Job) -> JobStatus:
        latest = j.registry.latest_complete()
        rec = self._active.get(j.name)
        spec = j.job.spec
        return JobStatus(
            name=j.name, source=j.row.source,
            state=j.row.state,  # type: ignore[arg-type]
            state_reason=j.row.state_reason, generation=j.row.generation,
            failures=j.row.failures, max_failures=spec.max_failures,
            strategy=spec.recovery_strategy, replicas=spec.replicas,
            min_replicas=spec.min_replicas, nodes=j.row.nodes, spares=j.row.pool,
            failed_nodes=j.row.excluded,
            checkpoint=None if latest is None else {"step": latest.step,
                                                    "path": str(latest.path)},
            checkpoint_request=self._request_of(j), recovery=rec.id if rec else None,
            world_size=j.progress.world_size, ranks_reporting=len(j.progress.ranks),
            last_step=j.progress.last_step(),
            median_step_seconds=j.progress.median_step_time(),
            effective_training_ratio=self._ettr(j), created_at=j.row.created_at,
            updated_at=j.row.updated_at, spec=j.row.spec)

    # ------------------------------------------------------------------ progress

    def progress(self, job: str, rank: int, node: str, world_size: int,
                 updates: Sequence[tuple[int, float]],
                 step_time: float | None = None) -> ProgressReply:
        """One rank's progress (steps with their wall times); the reply for the client.

        Raises UnknownJob, or ValueError for a rank outside the world or a negative step.
        """
        now = self.clock.time()
        with self._lock:
            j = self._job(job)
            batch = list(updates)[-self.settings.max_updates:]
            j.progress.update(rank, node, world_size, batch, step_time, now)
            if j.job.spec.nodes_from_progress and node not in j.row.nodes:
                self._refresh_members(j)
            rec = self._active.get(job)
            if (rec is not None and rec.state == "restoring" and rec.restore_sent is not None
                    and node in rec.nodes and batch):
                floor = rec.checkpoint_step if rec.checkpoint_step is not None else 0
                # Only progress after the launcher took the restore is the new generation's:
                # the old ranks (on the nodes that stay) run on until it stops them, and
                # the restore action runs in a worker, after restore_sent.
                taken = self._restore_taken(rec)
                if taken is not None and any(step >= floor and when > taken
                                             for step, when in batch):
                    self._resumed(j, rec, now, f"rank {rank} on {node} made progress")
            return self._reply(j)

    def _restore_taken(self, rec: RecoveryRow) -> float | None:
        """When the current restore action succeeded (the launcher took it), else None.

        A store read, once per restore (then remembered); never a write.
        """
        seq = int(rec.data.get("restore_seq") or 1)
        action_id = rec.actions.get("restore" if seq == 1 else f"restore:{seq}")
        if action_id is None:
            return None
        taken = self._restore_taken_at.get(action_id)
        if taken is None:
            try:
                record = self.store.get_action(action_id)
            except StoreError:
                return None
            if record is None or record.state not in _GOOD:
                return None
            taken = self._restore_taken_at[action_id] = record.updated_at
        return taken

    def _reply(self, j: _Job) -> ProgressReply:
        request = self._request_of(j)
        rec = self._active.get(j.name)
        restore = None
        if rec is not None and rec.state == "restoring" and rec.restore_sent is not None:
            restore = RestoreInfo(
                step=rec.checkpoint_step if rec.checkpoint_step is not None else 0,
                path=rec.checkpoint_path or "", nodes=rec.nodes, generation=rec.generation)
        return ProgressReply(checkpoint_requested=request is not None,
                             checkpoint_id=request.checkpoint_id if request else None,
                             restore=restore)

    def should_checkpoint(self, job: str) -> CheckpointRequest | None:
        """The job's outstanding checkpoint request, if any."""
        with self._lock:
            return self._request_of(self._job(job))

    def checkpoint_saved(self, job: str, rank: int, node: str, step: int,
                         path: str) -> Checkpoint:
        """The client wrote a checkpoint; it counts (and satisfies a request) if complete."""
        with self._lock:
            j = self._job(job)
            record = j.registry.report(step, path)
            log.info("job %s: checkpoint of step %d reported by rank %d on %s: %s",
                     job, step, rank, node,
                     "complete" if record.complete else f"not complete ({record.reason})")
            if record.complete:
                self._checkpoint_found(j, record)
            return record

    def _checkpoint_found(self, j: _Job, record: Checkpoint) -> None:
        last = j.data.get("last_checkpoint")
        if isinstance(last, dict) and int(last.get("step", -1)) >= record.step:
            return
        request = j.data.get("request")
        now = self.clock.time()
        written = record.written_at if record.written_at is not None else record.found_at
        items: dict[str, Any] = {
            "last_checkpoint": {"step": record.step, "path": str(record.path)},
            "last_checkpoint_at": min(now, written)}
        if isinstance(request, dict) and record.step > int(request["after_step"]):
            items["request"] = None
            log.info("job %s: checkpoint request %s satisfied by step %d", j.name,
                     request["id"], record.step)
        self._set_data(j, **items)
        self._save_job(j)

    def restore_point(self, job: str) -> RestorePoint | None:
        """The latest complete checkpoint (verified on disk) and the job's generation."""
        with self._lock:
            j = self._job(job)
            point = self._latest(j, scan=j.registry.latest_complete() is None)
            if point is None:
                return None
            return RestorePoint(point.step, str(point.path), j.row.generation)

    def _latest(self, j: _Job, scan: bool) -> Checkpoint | None:
        if scan:
            self._scan(j)
        return j.registry.latest_complete(verify=True)

    def _scan(self, j: _Job) -> None:
        j.last_scan = self.clock.monotonic()
        for record in j.registry.scan():
            if record.complete:
                latest = j.registry.latest_complete()
                if latest is not None:
                    self._checkpoint_found(j, latest)
                break

    # ------------------------------------------------------------------ checkpoints

    def _request_of(self, j: _Job) -> CheckpointRequest | None:
        raw = j.data.get("request")
        if not isinstance(raw, dict):
            return None
        return CheckpointRequest(job=j.name, checkpoint_id=raw["id"], reason=raw["reason"],
                                 requested_at=raw["at"], after_step=raw["after_step"],
                                 action_id=raw.get("action_id"))

    def _request_checkpoint(self, j: _Job, reason: str, key: str | None = None,
                            incident_id: int | None = None,
                            rule: str | None = None) -> CheckpointRequest:
        now = self.clock.time()
        seq = int(j.data.get("request_seq") or 0) + 1
        checkpoint_id = f"{j.name}-{seq}"
        latest = j.registry.latest_complete()
        request = {"id": checkpoint_id, "reason": reason, "at": now,
                   "after_step": latest.step if latest is not None else -1,
                   "key": key or f"job:{j.name}:checkpoint:{checkpoint_id}",
                   "incident_id": incident_id, "rule": rule, "action_id": None}
        self._set_data(j, request=request, request_seq=seq, last_request_at=now)
        self._save_job(j)  # the request first: a crash now resubmits it (same key)
        self._submit_request(j)
        out = self._request_of(j)
        assert out is not None
        log.info("job %s: %s checkpoint requested (%s)", j.name, reason, checkpoint_id)
        return out

    def _submit_request(self, j: _Job) -> None:
        raw = j.data.get("request")
        if not isinstance(raw, dict) or raw.get("action_id"):
            return
        request = ActionRequest(
            id=uuid.uuid4().hex, key=raw["key"], action="checkpoint", node=None,
            reason=f"{raw['reason']} checkpoint of job {j.name}", rule=raw.get("rule"),
            incident_id=raw.get("incident_id"), severity="info", labels={"job": j.name},
            params={"job": j.name, "checkpoint_id": raw["id"], "reason": raw["reason"]},
            requested_by=_REQUESTER, created_seconds=self.clock.time())
        record = self.submit(request)
        self._set_data(j, request={**raw, "action_id": record.id})
        self._save_job(j)

    def on_node_degrading(self, node: str, rule: str,
                          incident_id: int | None = None) -> list[CheckpointRequest]:
        """A rule with a ``checkpoint`` action fired on ``node`` (degrading, still alive).

        Every job on it checkpoints now, unless one was requested within the last
        ``preemptive_min_interval`` (then that request is returned).
        """
        now = self.clock.time()
        out: list[CheckpointRequest] = []
        with self._lock:
            for name in self.jobs_of_node(node):
                j = self._jobs[name]
                if j.row.state == "failed":
                    continue
                last = j.data.get("last_request_at")
                if last is not None and now - float(last) < self.settings.preemptive_min_interval:
                    current = self._request_of(j)
                    if current is not None:
                        out.append(current)
                    continue
                key = (f"job:{name}:checkpoint:incident:{incident_id}"
                       if incident_id is not None else None)
                out.append(self._request_checkpoint(j, "pre-emptive", key=key,
                                                    incident_id=incident_id, rule=rule))
        return out

    # ------------------------------------------------------------------ tick

    def tick(self) -> list[HangFinding]:
        """Every second: scheduled checkpoints, hang detection, recovery steps."""
        findings: list[HangFinding] = []
        with self._lock:
            for j in list(self._jobs.values()):
                try:
                    self._tick_job(j, findings)
                except StoreError as err:
                    log.error("job %s: store unavailable, trying again: %s", j.name, err)
        return findings

    def _tick_job(self, j: _Job, findings: list[HangFinding]) -> None:
        now, mono = self.clock.time(), self.clock.monotonic()
        self._submit_request(j)  # a request saved just before a crash
        rec = self._active.get(j.name)
        every = float(self.settings.scan_interval)
        if rec is not None and rec.state == "checkpointing":
            every = min(every, 5.0)  # waiting for one: look more often
        if mono - j.last_scan >= every:
            self._scan(j)
        if rec is not None:
            self._drive(j, rec)
        elif j.row.state == "running":
            self._schedule_checkpoint(j, now)
            finding = self._hang(j, now)
            if finding is not None:
                findings.append(finding)
        if (j.dirty or j.progress.dirty) and mono - j.last_saved >= self.settings.save_interval:
            self._save_job(j)

    def _schedule_checkpoint(self, j: _Job, now: float) -> None:
        if j.progress.frontier is None:
            return  # the job has not started
        since = max(float(j.data.get("last_request_at") or j.row.created_at),
                    float(j.data.get("last_checkpoint_at") or -math.inf))
        if now - since >= float(j.job.spec.checkpoint_interval):
            self._request_checkpoint(j, "scheduled")

    def _hang(self, j: _Job, now: float) -> HangFinding | None:
        p = j.progress
        if p.hang_reported or p.last_advance is None or not p.all_reported():
            return None
        median = p.median_step_time()
        timeout = j.job.spec.effective_hang_timeout(median)
        stalled = now - p.last_advance
        if stalled < timeout:
            return None
        p.hang_reported = True
        first = p.first_stopped()
        ranks = tuple(rank for rank, _ in first)
        nodes = tuple(sorted({r.node for _, r in first}))
        everyone = {r.node for r in p.ranks.values()}
        culprit = set(nodes) != everyone
        step = min(r.step for _, r in first)
        stopped_at = min(r.time for _, r in first)
        if culprit:
            message = (f"job {j.name} hung: no progress for {stalled:.0f}s (timeout "
                       f"{timeout:.0f}s); rank(s) {_ranks(ranks)} on {', '.join(nodes)} "
                       f"stopped first, at step {step}")
        else:
            message = (f"job {j.name} hung: no progress for {stalled:.0f}s (timeout "
                       f"{timeout:.0f}s); every rank stopped at step {step} together")
        log.warning("%s", message)
        return HangFinding(job=j.name, generation=j.row.generation, ranks=ranks,
                           nodes=nodes if culprit else (), step=step, stopped_at=stopped_at,
                           stalled_seconds=stalled, timeout_seconds=timeout,
                           detected_at=now, message=message)

    # ------------------------------------------------------------------ faults

    def on_hang(self, finding: HangFinding, incident_id: int | None) -> list[RecoveryStatus]:
        """Recover from a hang the controller opened an incident for.

        The nodes that stopped first are handled like failed nodes; with no culprit
        (every node stopped together) the job restarts in place from its checkpoint.
        """
        if finding.nodes:
            out: list[RecoveryStatus] = []
            for node in finding.nodes:
                out.extend(self.on_node_fault(node, "hang", incident_id, alive=True,
                                              observed_at=finding.stopped_at,
                                              job=finding.job))
            return _unique(out)
        with self._lock:
            j = self._jobs.get(finding.job)
            if j is None:
                return []
            rec = self._fault(j, None, "hang", incident_id, False, finding.stopped_at,
                              finding.detected_at)
            return [] if rec is None else [RecoveryStatus.of(rec)]

    def on_node_fault(self, node: str, kind: FaultKind, incident_id: int | None,
                      alive: bool, observed_at: float | None = None,
                      job: str | None = None) -> list[RecoveryStatus]:
        """``node`` failed: start (or join) a recovery of every job on it.

        ``kind``: ``fatal`` (a fatal XID, a lost GPU), ``lost`` (no heartbeat) or ``hang``;
        ``alive``: the node still answers (then a checkpoint is tried first, for ``fatal``).
        ``observed_at``: when the fault happened (default: the incident's observed time,
        else now); ``job``: only this job. The same incident is acted on once per job.

        Wiring: the controller calls this where a rule's ``failover`` would have been
        submitted (after ``settle``), for nodes with :meth:`jobs_of_node`, and skips its
        own evict/failover for them: the orchestrator evicts job nodes itself. A node
        that is a spare of a job leaves that job's pool (until :meth:`return_to_pool`).
        """
        with self._lock:
            seen, detected = self._fault_times(incident_id, observed_at)
            out: list[RecoveryStatus] = []
            for name, j in sorted(self._jobs.items()):
                if job is not None and name != job:
                    continue
                if node in j.row.pool:
                    j.row = replace(j.row, pool=tuple(n for n in j.row.pool if n != node),
                                    excluded=(*j.row.excluded, node))
                    self._save_job(j)
                    log.warning("job %s: spare %s failed (%s); out of the pool", name, node,
                                kind)
                    continue
                if node not in j.row.nodes:
                    continue
                rec = self._fault(j, node, kind, incident_id, alive, seen, detected)
                if rec is not None:
                    out.append(RecoveryStatus.of(rec))
            return out

    def _fault_times(self, incident_id: int | None,
                     observed_at: float | None) -> tuple[float, float]:
        now = self.clock.time()
        incident = self.store.get_incident(incident_id) if incident_id is not None else None
        detected = incident.detected_at if incident is not None else now
        if observed_at is not None:
            seen = observed_at
        elif incident is not None:
            seen = incident.observed_at
        else:
            seen = now
        return min(seen, detected), detected

    def _fault(self, j: _Job, node: str | None, kind: FaultKind, incident_id: int | None,
               alive: bool, seen: float, detected: float) -> RecoveryRow | None:
        now = self.clock.time()
        order = j.row.nodes
        handled = None if incident_id is None else (j.name, incident_id, node or "")
        if handled is not None and handled in self._handled:
            log.info("job %s: incident %d on %s already acted upon", j.name, incident_id,
                     node or "the job")
            return self._active.get(j.name)
        if handled is not None:
            self._handled.add(handled)
        if node is not None:  # out of the job at once: it never comes back by itself
            j.row = replace(j.row, excluded=(*j.row.excluded, node))
        rec = self._active.get(j.name)
        if rec is not None:
            return self._join(j, rec, node, kind, incident_id)
        if j.row.state == "failed":
            if node is not None:
                self._submit_simple(
                    f"job:{j.name}:evict:{node}:{incident_id}", "evict", node,
                    f"{kind} fault on {node} (job {j.name} is failed, not recovered)",
                    {"job": j.name, "status": "firing"}, incident_id)
            self._refresh_members(j)
            self._save_job(j)
            return None
        failures = j.row.failures + 1
        give_up = ""
        if failures > j.job.spec.max_failures:
            give_up = (f"more than maxFailures ({j.job.spec.max_failures}) recoveries: "
                       f"given up, no automatic recovery")
        progressing = (j.progress.last_advance is not None and now - j.progress.last_advance
                       < j.job.spec.effective_hang_timeout(j.progress.median_step_time()))
        if self.clock.monotonic() - j.last_scan >= 5.0:
            self._scan(j)  # know the latest checkpoint: a newer one is waited for below
        latest = j.registry.latest_complete()
        rec = RecoveryRow(
            id=uuid.uuid4().hex[:16], job=j.name, generation=j.row.generation + 1,
            state="detected", kind=kind, strategy=j.job.spec.recovery_strategy,
            fault_seen=seen, detected=detected, created_at=now, updated_at=now,
            failed_nodes=() if node is None else (node,),
            incident_ids=() if incident_id is None else (incident_id,),
            data={"checkpoint_first": bool(alive and kind == "fatal" and progressing
                                           and not give_up and node is not None),
                  "ckpt_before": latest.step if latest is not None else -1,
                  "target": len(order), "order": list(order),
                  "restore_seq": 1, "give_up": give_up, "evict_tries": {},
                  "handled": [] if handled is None else [[incident_id, node or ""]]})
        rec = self._history(rec, "detected", f"{kind} fault on {node}" if node else
                            f"{kind}: the whole job, restarted in place")
        self._save_rec(rec)  # the recovery exists before anything is done for it
        self._refresh_members(j)
        self._save_job(j, failures=failures, state="failed" if give_up else "recovering",
                       state_reason=give_up or f"recovering from a {kind} fault"
                       + (f" on {node}" if node else ""))
        log.warning("job %s: recovery %s started: %s fault on %s", j.name, rec.id, kind,
                    node or "every node")
        return self._drive(j, rec)

    def _join(self, j: _Job, rec: RecoveryRow, node: str | None, kind: str,
              incident_id: int | None) -> RecoveryRow:
        data = dict(rec.data)
        if incident_id is not None:
            data["handled"] = [*data.get("handled", ()), [incident_id, node or ""]]
        incidents = rec.incident_ids if incident_id is None or incident_id in \
            rec.incident_ids else (*rec.incident_ids, incident_id)
        if node is None or node in rec.failed_nodes:
            return self._save_rec(replace(rec, incident_ids=incidents, data=data))
        rec = self._history(rec, "joined", f"{kind} fault on {node} joins the recovery")
        changes: dict[str, Any] = {"failed_nodes": (*rec.failed_nodes, node),
                                   "incident_ids": incidents}
        if data.get("planned"):  # plan again, from the last plan, without the node
            data.update(planned=False, order=list(rec.nodes))
            if rec.restore_sent is not None or rec.state == "restoring":
                data["restore_seq"] = int(data.get("restore_seq") or 1) + 1
                changes["generation"] = rec.generation + 1
                changes["restore_sent"] = None
            changes.update(state="evicting", attempts=0,
                           deadline=self.clock.time() + self.settings.evict_timeout)
        rec = self._save_rec(replace(rec, **changes, data=data))
        self._refresh_members(j)
        if j.row.state == "failed":
            self._save_job(j)
        else:
            self._save_job(j, state="recovering",
                           state_reason=f"recovering; {kind} fault on {node} joined")
        return self._drive(j, rec)

    # ------------------------------------------------------------------ recovery steps

    def approve_recovery(self, recovery_id: str, who: str) -> RecoveryStatus:
        """A person approved a manual recovery: the restore goes out."""
        with self._lock:
            rec = next((r for r in self._active.values() if r.id == recovery_id), None)
            if rec is None:
                row = self.store.get_recovery(recovery_id)
                if row is None:
                    raise UnknownRecovery(f"no recovery {recovery_id!r}")
                raise JobError(f"recovery {recovery_id} is {row.state}, not awaiting approval")
            if rec.state != "awaiting_approval":
                raise JobError(f"recovery {recovery_id} is {rec.state}, not awaiting approval")
            j = self._jobs[rec.job]
            rec = self._history(rec, "approved", f"approved by {who}")
            rec = self._save_rec(replace(rec, state="restoring", attempts=0, deadline=None,
                                         data={**rec.data, "approved_by": who}))
            self._save_job(j, state="recovering", state_reason=f"restore approved by {who}")
            return RecoveryStatus.of(self._drive(j, rec))

    def recoveries(self, job: str | None = None, limit: int = 100) -> list[RecoveryStatus]:
        """Recoveries from the store, newest first."""
        rows = self.store.list_recoveries(job=job, limit=limit)
        return [RecoveryStatus.of(r) for r in reversed(rows)]

    def recovery(self, recovery_id: str) -> RecoveryStatus | None:
        row = self.store.get_recovery(recovery_id)
        return None if row is None else RecoveryStatus.of(row)

    def _drive(self, j: _Job, rec: RecoveryRow) -> RecoveryRow:
        """Take every step that can be taken now; the recovery as it stands after.

        A step returns the recovery (saved) and whether to go on at once.
        """
        for _ in range(32):
            if rec.state not in ACTIVE_STATES:
                break
            step: Callable[[_Job, RecoveryRow], tuple[RecoveryRow, bool]] = getattr(
                self, f"_step_{rec.state}")
            rec, again = step(j, rec)
            if not again:
                break
        return rec

    def _step_detected(self, j: _Job, rec: RecoveryRow) -> tuple[RecoveryRow, bool]:
        now = self.clock.time()
        if not rec.data.get("checkpoint_first"):
            return self._to_evicting(rec, now), True
        if "checkpoint" not in rec.actions:
            self._request_checkpoint(j, "recovery", key=f"recovery:{rec.id}:checkpoint",
                                     incident_id=_first(rec.incident_ids), rule=RECOVERY_RULE)
            request = self._request_of(j)
            if request is not None and request.action_id is not None:
                rec = replace(rec, actions={**rec.actions, "checkpoint": request.action_id})
        rec = self._history(rec, "checkpointing",
                            f"the node is alive: waiting up to "
                            f"{self.settings.checkpoint_wait:g}s for a checkpoint")
        return self._save_rec(replace(rec, state="checkpointing",
                                      deadline=now + self.settings.checkpoint_wait)), True

    def _to_evicting(self, rec: RecoveryRow, now: float) -> RecoveryRow:
        return self._save_rec(replace(rec, state="evicting", attempts=0,
                                      deadline=now + self.settings.evict_timeout))

    def _step_checkpointing(self, j: _Job, rec: RecoveryRow) -> tuple[RecoveryRow, bool]:
        now = self.clock.time()
        latest = j.registry.latest_complete()
        if latest is not None and latest.step > int(rec.data.get("ckpt_before", -1)):
            rec = self._history(rec, "checkpointed", f"checkpoint of step {latest.step}")
            return self._to_evicting(rec, now), True
        if rec.deadline is not None and now >= rec.deadline:
            rec = self._history(rec, "checkpoint-timeout",
                                "no new checkpoint in time: the latest complete one is used")
            return self._to_evicting(rec, now), True
        return rec, False

    def _step_evicting(self, j: _Job, rec: RecoveryRow) -> tuple[RecoveryRow, bool]:
        now = self.clock.time()
        tries: dict[str, int] = dict(rec.data.get("evict_tries") or {})
        skipped: list[str] = list(rec.data.get("evict_skipped") or ())
        held: dict[str, list[float]] = dict(rec.data.get("evict_held") or {})
        waiting = approval = False
        for node in rec.failed_nodes:
            if node in skipped:
                continue
            n = tries.get(node, 0)
            times_held, recheck_at = held.get(node, [0, 0.0])
            key = f"evict:{node}" if n == 0 else f"evict:{node}:{n + 1}"
            if times_held:
                key += f":held{int(times_held)}"
            if times_held and now < recheck_at:
                waiting = True
                continue
            rec, record = self._submit_step(
                rec, key, "evict", node,
                f"{rec.kind} fault on {node}: out of job {j.name} (recovery {rec.id})",
                {"job": j.name, "recovery": rec.id, "status": "firing"})
            state = record.state if record is not None else "pending"
            if state in _GOOD:
                continue
            if (state == "refused" and record is not None
                    and "circuit breaker" in record.verdict_reason):
                # Evictions are frozen because many nodes failed together: that is not
                # this recovery failing. Hold it (no retry counted, no timeout) and ask
                # again a little later; it goes on when the breaker closes.
                held[node] = [times_held + 1, now + BREAKER_RECHECK_SECONDS]
                rec = self._history(rec, "held", f"evicting {node}: {record.verdict_reason}")
                rec = self._save_rec(replace(rec, data={**rec.data, "evict_held": held},
                                             deadline=now + self.settings.evict_timeout))
                waiting = True
                continue
            if state in _BAD:
                detail = (record.outcome_message or record.verdict_reason) if record else ""
                why = f"evicting {node}: {state}" + (f": {detail}" if detail else "")
                if n >= self.settings.step_retries:
                    if self.settings.require_eviction:
                        return self._fail(j, rec, why), False
                    rec = self._history(rec, "evict-failed", why + "; going on without it")
                    skipped.append(node)
                    rec = self._save_rec(replace(rec, data={**rec.data,
                                                            "evict_skipped": skipped}))
                    continue
                tries[node] = n + 1
                rec = self._history(rec, "retry", why)
                return self._save_rec(replace(rec, data={**rec.data, "evict_tries": tries},
                                              deadline=now + self.settings.evict_timeout)), True
            waiting = True
            approval = approval or state == "awaiting_approval"
        if waiting:
            if approval:  # a person decides: no timeout meanwhile
                return self._save_rec(replace(rec, deadline=now + self.settings.evict_timeout
                                              )), False
            if rec.deadline is not None and now >= rec.deadline:
                attempts = rec.attempts + 1
                if attempts > self.settings.step_retries:
                    return self._fail(j, rec, "evictions did not finish in time"), False
                rec = self._history(rec, "timeout", "evictions not finished yet; waiting again")
                return self._save_rec(replace(rec, attempts=attempts,
                                              deadline=now + self.settings.evict_timeout)), False
            return rec, False
        if rec.evicted is None or not rec.data.get("planned"):
            rec = replace(rec, evicted=now, attempts=0)
        if rec.data.get("give_up"):
            return self._fail(j, rec, str(rec.data["give_up"])), False
        return self._plan(j, rec), True

    def _plan(self, j: _Job, rec: RecoveryRow) -> RecoveryRow:
        spec = j.job.spec
        members = [n for n in self._members(j) if n not in rec.failed_nodes]
        target = int(rec.data.get("target") or len(members))
        pool = [n for n in j.row.pool if n not in rec.failed_nodes]
        take: list[str] = []
        note = ""
        strategy = rec.strategy
        if strategy in ("restart", "manual"):
            need = max(0, target - len(members))
            take = pool[:need]
            if len(take) < need:
                if len(members) + len(take) >= spec.min_replicas:
                    note = (f"only {len(take)} of {need} spares left: continuing elastic on "
                            f"{len(members) + len(take)} nodes (minReplicas "
                            f"{spec.min_replicas})")
                else:
                    return self._fail(j, rec, (
                        f"no spare left ({len(take)} of {need}) and "
                        f"{len(members) + len(take)} nodes are below minReplicas "
                        f"({spec.min_replicas})"))
        elif len(members) < spec.min_replicas:
            return self._fail(j, rec, f"{len(members)} nodes left, below minReplicas "
                                      f"({spec.min_replicas})")
        if not members and not take:
            return self._fail(j, rec, "no node left to run on")
        spares = iter(take)
        nodes: list[str] = []
        for node in (*rec.data.get("order", ()), *members):
            if node in nodes:
                continue
            if node in members:
                nodes.append(node)
            elif node in rec.failed_nodes:
                spare = next(spares, None)
                if spare is not None:
                    nodes.append(spare)
        nodes.extend(spares)
        rec = replace(rec, replacement_nodes=tuple(dict.fromkeys(
                          (*rec.replacement_nodes, *take))),
                      nodes=tuple(nodes), data={**rec.data, "planned": True})
        detail = f"{len(nodes)} nodes" + (f", spares {', '.join(take)}" if take else "")
        rec = self._history(rec, "planned", note or f"{strategy}: {detail}")
        waiting = strategy == "manual" and not rec.data.get("approved_by")
        rec = self._save_rec(replace(rec, state="awaiting_approval" if waiting else
                                     "restoring", deadline=None))
        self._apply_plan(j, rec)  # after the plan is saved: re-applied on a restart
        self._save_job(j, state="awaiting_approval" if waiting else "recovering",
                       state_reason=("waiting for approval: " if waiting else "") + detail)
        return rec

    def _apply_plan(self, j: _Job, rec: RecoveryRow) -> None:
        """Idempotent: the recovery's spares leave the pool and join the job."""
        taken = set(rec.replacement_nodes)
        excluded = tuple(dict.fromkeys((*j.row.excluded, *rec.failed_nodes)))
        added = tuple(dict.fromkeys(
            (*(n for n in j.row.added if n not in rec.failed_nodes), *rec.replacement_nodes)))
        j.row = replace(j.row, pool=tuple(n for n in j.row.pool if n not in taken),
                        added=added, excluded=excluded, nodes=rec.nodes or j.row.nodes)
        self._refresh_members(j)

    def _step_awaiting_approval(self, j: _Job, rec: RecoveryRow) -> tuple[RecoveryRow, bool]:
        return rec, False

    def _step_restoring(self, j: _Job, rec: RecoveryRow) -> tuple[RecoveryRow, bool]:
        now = self.clock.time()
        seq = int(rec.data.get("restore_seq") or 1)
        step = "restore" if seq == 1 else f"restore:{seq}"
        if step not in rec.actions:  # the checkpoint is chosen (and saved) before it is sent
            point = self._latest(j, scan=True)
            rec = replace(rec, checkpoint_step=point.step if point is not None else None,
                          checkpoint_path=str(point.path) if point is not None else None)
            if point is None:
                rec = self._history(rec, "no-checkpoint",
                                    "no complete checkpoint: the job restarts from scratch")
            rec = self._save_rec(rec)
        checkpoint = (None if rec.checkpoint_step is None else
                      {"step": rec.checkpoint_step, "path": rec.checkpoint_path})
        rec, record = self._submit_step(
            rec, step, "restore", None,
            f"restore job {j.name} on {len(rec.nodes)} nodes from "
            + (f"step {rec.checkpoint_step}" if checkpoint else "scratch")
            + f" (generation {rec.generation}, recovery {rec.id})",
            {"job": j.name, "checkpoint": checkpoint, "nodes": list(rec.nodes),
             "failed_nodes": list(rec.failed_nodes), "generation": rec.generation,
             "recovery": rec.id})
        state = record.state if record is not None else "pending"
        if state in _BAD:
            detail = (record.outcome_message or record.verdict_reason) if record else ""
            return self._retry_restore(j, rec, f"restore {state}" + (
                f": {detail}" if detail else ""))
        if state == "awaiting_approval":
            return rec, False
        if state == "dry_run":  # nothing was restored: the ranks must not be told either
            rec = self._history(rec, "dry-run", "the restore was a dry run: not sent")
            rec = self._save_rec(replace(rec, state="cancelled", deadline=None,
                                         finished_at=now,
                                         error="dry run: the restore was not sent"))
            self._active.pop(j.name, None)
            self._save_job(j, state="running", state_reason="dry run: recovery not carried out")
            return rec, False
        if rec.restore_sent is None:
            rec = self._history(rec, "restore-sent", f"generation {rec.generation} on "
                                                     f"{', '.join(rec.nodes)}")
            rec = self._save_rec(replace(rec, restore_sent=now,
                                         deadline=now + self.settings.restore_timeout))
            j.progress.reset_ranks()
            self._save_job(j, generation=rec.generation)
            return rec, False
        if rec.deadline is not None and now >= rec.deadline:
            return self._retry_restore(j, rec, f"no progress from generation "
                                               f"{rec.generation} within "
                                               f"{self.settings.restore_timeout:g}s")
        return rec, False

    def _retry_restore(self, j: _Job, rec: RecoveryRow, why: str) -> tuple[RecoveryRow, bool]:
        attempts = rec.attempts + 1
        if attempts > self.settings.step_retries:
            return self._fail(j, rec, why), False
        rec = self._history(rec, "retry", why)
        return self._save_rec(replace(
            rec, attempts=attempts, restore_sent=None, deadline=None,
            generation=rec.generation + 1,
            data={**rec.data, "restore_seq": int(rec.data.get("restore_seq") or 1) + 1})), True

    def _resumed(self, j: _Job, rec: RecoveryRow, now: float, what: str) -> None:
        rec = self._history(rec, "resumed", what)
        rec = replace(rec, state="done", resumed=now, finished_at=now, deadline=None)
        self._save_rec(rec)
        self._active.pop(j.name, None)
        self._restore_taken_at.clear()  # only the active recoveries' restores matter
        duration = recovery_duration(rec)
        if duration is not None:
            self._finished.append(duration)
            del self._finished[:-self.settings.finished_kept]
        self._save_job(j, state="running", state_reason="")
        log.info("job %s: recovery %s done, generation %d resumed (MTTR %.1fs)", j.name,
                 rec.id, rec.generation, duration.total if duration else float("nan"))

    def _fail(self, j: _Job, rec: RecoveryRow, why: str) -> RecoveryRow:
        rec, _ = self._submit_step(
            rec, "alert", "alert", None, f"job {j.name} failed: {why}",
            {"job": j.name, "recovery": rec.id, "status": "firing", "subject": j.name},
            severity="critical", rule=JOB_FAILED_RULE)
        rec = self._history(rec, "failed", why)
        rec = self._save_rec(replace(rec, state="failed", error=why,
                                     finished_at=self.clock.time(), deadline=None))
        self._active.pop(j.name, None)
        self._save_job(j, state="failed", state_reason=why)
        log.error("job %s: recovery %s failed: %s", j.name, rec.id, why)
        return rec

    # ------------------------------------------------------------------ helpers

    def _submit_step(self, rec: RecoveryRow, step: str, action: ActionName,
                     node: str | None, reason: str, params: Mapping[str, Any], *,
                     severity: str = "warning",
                     rule: str = RECOVERY_RULE) -> tuple[RecoveryRow, ActionRecord | None]:
        """The action of one step, submitted once: known -> its current record."""
        known = rec.actions.get(step)
        if known is not None:
            return rec, self.store.get_action(known)
        request = ActionRequest(
            id=uuid.uuid4().hex, key=f"recovery:{rec.id}:{step}", action=action, node=node,
            reason=reason, rule=rule, incident_id=_first(rec.incident_ids),
            severity=severity, labels={"job": rec.job}, params=dict(params),
            requested_by=_REQUESTER, created_seconds=self.clock.time())
        record = self.submit(request)
        rec = self._save_rec(replace(rec, actions={**rec.actions, step: record.id}))
        return rec, record

    def _submit_simple(self, key: str, action: ActionName, node: str | None, reason: str,
                       params: Mapping[str, Any], incident_id: int | None) -> ActionRecord:
        return self.submit(ActionRequest(
            id=uuid.uuid4().hex, key=key, action=action, node=node, reason=reason,
            rule=RECOVERY_RULE, incident_id=incident_id, params=dict(params),
            requested_by=_REQUESTER, created_seconds=self.clock.time()))

    def _save_rec(self, rec: RecoveryRow) -> RecoveryRow:
        rec = replace(rec, updated_at=self.clock.time())
        self.store.save_recovery(rec)
        if rec.state in ACTIVE_STATES:
            self._active[rec.job] = rec
        return rec

    def _history(self, rec: RecoveryRow, event: str, message: str) -> RecoveryRow:
        entry = {"at": self.clock.time(), "state": rec.state, "event": event,
                 "message": message}
        return replace(rec, history=(*rec.history, entry)[-_HISTORY_KEPT:])

    # ------------------------------------------------------------------ metrics

    def _ettr(self, j: _Job) -> float | None:
        wall = self.clock.time() - j.row.created_at
        if wall <= 0:
            return None
        return min(1.0, j.progress.productive / wall)

    def metrics(self) -> JobMetrics:
        """Per job state, generation, failures, checkpoint age, ETTR; finished recoveries."""
        with self._lock:
            jobs = {
                name: JobMetric(
                    state=j.row.state,  # type: ignore[arg-type]
                    generation=j.row.generation, failures_total=j.row.failures,
                    checkpoint_age_seconds=j.registry.age_seconds(),
                    effective_training_ratio=self._ettr(j),
                    productive_seconds=j.progress.productive, nodes=len(j.row.nodes),
                    spares=len(j.row.pool), median_step_seconds=j.progress.median_step_time(),
                    last_step=j.progress.last_step())
                for name, j in sorted(self._jobs.items())}
            return JobMetrics(jobs=jobs, recoveries=tuple(self._finished))


def _first(values: Iterable[int]) -> int | None:
    return next(iter(values), None)


def _unique(statuses: list[RecoveryStatus]) -> list[RecoveryStatus]:
    latest: dict[str, RecoveryStatus] = {}
    for status in statuses:
        latest[status.id] = status
    return list(latest.values())


def _ranks(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return shown + (f" (+{len(ranks) - 8} more)" if len(ranks) > 8 else "")


__all__ = [
    "ACTIVE_STATES",
    "FINISHED_STATES",
    "HANG_RULE",
    "JOB_FAILED_RULE",
    "CheckpointRequest",
    "FaultKind",
    "HangFinding",
    "JobError",
    "JobMetric",
    "JobMetrics",
    "JobOrchestrator",
    "JobSettings",
    "JobState",
    "JobStatus",
    "ProgressReply",
    "RecoveryDuration",
    "RecoveryState",
    "RecoveryStatus",
    "RestoreInfo",
    "RestorePoint",
    "SubmitAction",
    "UnknownJob",
    "UnknownRecovery",
    "recovery_duration",
]
