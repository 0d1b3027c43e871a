"""What the jobs layer answers: job and recovery status for the API, metrics, replies.

Plain frozen dataclasses with ``to_dict`` for the JSON the API serves; nothing here
changes a job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from sn_monitor.controller.jobs.recovery_record import (
    ACTIVE_STATES,
    FaultKind,
    Recovery,
    RecoveryState,
)

#: ``pending``: no rank has reported progress yet (the store's row says ``running``).
JobState = Literal["pending", "running", "recovering", "awaiting_approval", "failed"]

#: The rule names the jobs layer's own actions and incidents carry.
RECOVERY_RULE: Final = "job-recovery"
JOB_FAILED_RULE: Final = "job-failed"
HANG_RULE: Final = "job-hang"


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
    kind: FaultKind
    strategy: str
    failed_nodes: tuple[str, ...]
    #: Each failed node's eviction: pending, done, skipped or healed.
    evictions: Mapping[str, str]
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
    def of(cls, rec: Recovery) -> RecoveryStatus:
        checkpoint = (None if rec.checkpoint is None else
                      {"step": rec.checkpoint.step, "path": rec.checkpoint.path})
        return cls(
            id=rec.id, job=rec.job, generation=rec.generation, state=rec.state,
            kind=rec.kind, strategy=rec.strategy, failed_nodes=rec.failed_nodes,
            evictions={f.node: f.eviction for f in rec.failed},
            replacement_nodes=rec.replacements, nodes=rec.nodes,
            incident_ids=rec.incident_ids, checkpoint=checkpoint, attempts=rec.attempts,
            deadline=rec.deadline, fault_seen=rec.fault_seen, detected=rec.detected,
            evicted=rec.evicted, restore_sent=rec.restore_sent, resumed=rec.resumed,
            finished_at=rec.finished_at, error=rec.error, actions=dict(rec.steps),
            history=tuple(msgspec.to_builtins(h) for h in rec.history))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "job": self.job, "generation": self.generation,
            "state": self.state, "kind": self.kind, "strategy": self.strategy,
            "failed_nodes": list(self.failed_nodes), "evictions": dict(self.evictions),
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
    #: Seconds per step over the last 30 s (the job's pace now; None: too few steps).
    recent_step_seconds: float | None
    effective_training_ratio: float | None
    #: The interval the schedule uses, and the one the job's history recommends.
    checkpoint_interval_seconds: float
    checkpoint_interval_recommended_seconds: float | None
    checkpoint_save_seconds: float | None
    mtbf_seconds: float | None
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
            "recent_step_seconds": self.recent_step_seconds,
            "effective_training_ratio": self.effective_training_ratio,
            "checkpoint_interval_seconds": self.checkpoint_interval_seconds,
            "checkpoint_interval_recommended_seconds":
                self.checkpoint_interval_recommended_seconds,
            "checkpoint_save_seconds": self.checkpoint_save_seconds,
            "mtbf_seconds": self.mtbf_seconds,
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
    #: See :mod:`sn_monitor.ettr` for the definition.
    effective_training_ratio: float | None
    productive_seconds: float
    nodes: int
    spares: int
    median_step_seconds: float | None
    last_step: int | None
    checkpoint_interval_recommended_seconds: float | None = None


@dataclass(frozen=True)
class JobMetrics:
    """What the controller exports about jobs: per job, and every finished recovery."""

    jobs: Mapping[str, JobMetric] = field(default_factory=dict)
    #: Finished (done) recoveries, oldest first; each id once (observe each id once).
    recoveries: tuple[RecoveryDuration, ...] = ()


def recovery_duration(rec: Recovery) -> RecoveryDuration | None:
    """The MTTR split of a recovery that is done (None otherwise)."""
    if rec.state != "done" or rec.resumed is None:
        return None
    seen = rec.fault_seen
    detected = rec.detected
    evicted = rec.evicted if rec.evicted is not None else detected
    sent = rec.restore_sent if rec.restore_sent is not None else evicted
    resumed = rec.resumed
    return RecoveryDuration(
        id=rec.id, job=rec.job, kind=rec.kind, total=max(0.0, resumed - seen),
        detection=max(0.0, detected - seen), eviction=max(0.0, evicted - detected),
        restart=max(0.0, sent - evicted), reload=max(0.0, resumed - sent),
        finished_at=rec.finished_at if rec.finished_at is not None else resumed)
