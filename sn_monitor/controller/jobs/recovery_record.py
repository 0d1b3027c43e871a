"""A job recovery as data: its states, what it knows of each failed node, its plan.

A :class:`Recovery` is immutable; every step makes a new one (``msgspec.structs.replace``)
and saves it before acting on it, so what a restarted controller reads from the store is
exactly what the last step decided. It is kept in the store's ``recoveries`` table
(:class:`~sn_monitor.controller.storage.store.RecoveryRow`): the columns the API and the metrics
read, and the rest under ``data`` as a typed :class:`RecoveryDetails`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from sn_monitor.controller.storage.store import RecoveryRow

RecoveryState = Literal["detected", "checkpointing", "evicting", "awaiting_approval",
                        "restoring", "done", "failed", "cancelled"]
ACTIVE_STATES: Final[frozenset[str]] = frozenset(
    {"detected", "checkpointing", "evicting", "awaiting_approval", "restoring"})
FINISHED_STATES: Final[frozenset[str]] = frozenset({"done", "failed", "cancelled"})

#: ``fatal``: a fatal XID, a lost GPU, a rule's eviction; ``lost``: no heartbeat;
#: ``hang``: its rank stopped making progress.
FaultKind = Literal["fatal", "lost", "hang"]

#: Where a failed node's eviction stands. ``done``: it ran (or had already run), the node
#: left the job; ``skipped``: it failed for good and the settings allow going on without
#: it; ``healed``: the node came back healthy before it ran, and stays in the job.
EvictionState = Literal["pending", "done", "skipped", "healed"]
SETTLED_EVICTIONS: Final[frozenset[str]] = frozenset({"done", "skipped", "healed"})

#: History entries kept per recovery.
HISTORY_KEPT: Final = 200


class FailedNode(msgspec.Struct, frozen=True):
    """One node that failed the job, the incidents that said so, and its eviction."""

    node: str
    kind: FaultKind
    incidents: tuple[int, ...] = ()
    eviction: EvictionState = "pending"


class CheckpointRef(msgspec.Struct, frozen=True):
    """The complete checkpoint a restore resumes from (chosen once per restore attempt)."""

    step: int
    path: str


class HistoryEntry(msgspec.Struct, frozen=True):
    at: float
    state: RecoveryState
    event: str
    message: str


class RecoveryDetails(msgspec.Struct, frozen=True, kw_only=True):
    """The part of a recovery the ``recoveries`` row keeps under ``data`` (no column)."""

    failed: tuple[FailedNode, ...] = ()
    #: Incidents of the whole job (a hang of every rank): no node named.
    job_incidents: tuple[int, ...] = ()
    #: The job's nodes when it started: a spare takes the place of the node it replaces.
    order: tuple[str, ...] = ()
    #: How many nodes to restore to (restart and manual: as many as before).
    target: int = 0
    checkpoint_first: bool = False
    #: The latest complete checkpoint's step when it started (a newer one is awaited).
    checkpoint_before: int = -1
    planned: bool = False
    restore_attempt: int = 1
    approved_by: str | None = None
    #: Set when the job is past maxFailures: the recovery fails instead of acting.
    give_up: str = ""


class Recovery(RecoveryDetails, frozen=True, kw_only=True):
    """One recovery of one job: a state machine's state and everything it decided.

    ``steps`` maps each step (``checkpoint``, ``evict:NODE``, ``restore``,
    ``restore:2``, ``alert``) to the id of its action. A step's key
    (``recovery:ID:STEP``) never changes: a retry, a crash or a take-over finds the same
    action and never submits a second one. Times are wall-clock seconds.
    """

    id: str
    job: str
    state: RecoveryState
    kind: FaultKind
    strategy: str
    #: The generation the restore starts (the job's generation + 1, and + 1 again for each
    #: new restore attempt: a retried restore is a new launch).
    generation: int
    fault_seen: float
    detected: float
    created_at: float
    updated_at: float
    nodes: tuple[str, ...] = ()
    replacements: tuple[str, ...] = ()
    checkpoint: CheckpointRef | None = None
    #: Retries of the current wait (evictions, progress after a restore).
    attempts: int = 0
    deadline: float | None = None
    evicted: float | None = None
    restore_sent: float | None = None
    resumed: float | None = None
    finished_at: float | None = None
    error: str = ""
    steps: Mapping[str, str] = msgspec.field(default_factory=dict)
    history: tuple[HistoryEntry, ...] = ()

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def failed_nodes(self) -> tuple[str, ...]:
        return tuple(f.node for f in self.failed)

    @property
    def out_nodes(self) -> tuple[str, ...]:
        """The failed nodes that leave the job (their eviction ran, or was given up)."""
        return tuple(f.node for f in self.failed if f.eviction in ("done", "skipped"))

    @property
    def incident_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(
            (*self.job_incidents, *(i for f in self.failed for i in f.incidents))))

    @property
    def restore_step(self) -> str:
        return "restore" if self.restore_attempt == 1 else f"restore:{self.restore_attempt}"

    def failed_node(self, node: str) -> FailedNode | None:
        return next((f for f in self.failed if f.node == node), None)

    def with_failed(self, failed: FailedNode) -> Recovery:
        """A copy with ``failed`` in place of the entry for its node (or added)."""
        if self.failed_node(failed.node) is None:
            return msgspec.structs.replace(self, failed=(*self.failed, failed))
        return msgspec.structs.replace(self, failed=tuple(
            failed if f.node == failed.node else f for f in self.failed))

    def noted(self, at: float, event: str, message: str) -> Recovery:
        """A copy with one more history entry."""
        entry = HistoryEntry(at=at, state=self.state, event=event, message=message)
        return msgspec.structs.replace(self, history=(*self.history, entry)[-HISTORY_KEPT:])


def to_row(rec: Recovery) -> RecoveryRow:
    details = RecoveryDetails(**{f: getattr(rec, f) for f in RecoveryDetails.__struct_fields__})
    return RecoveryRow(
        id=rec.id, job=rec.job, generation=rec.generation, state=rec.state, kind=rec.kind,
        strategy=rec.strategy, fault_seen=rec.fault_seen, created_at=rec.created_at,
        updated_at=rec.updated_at, failed_nodes=rec.failed_nodes,
        replacement_nodes=rec.replacements, nodes=rec.nodes, incident_ids=rec.incident_ids,
        checkpoint_step=rec.checkpoint.step if rec.checkpoint else None,
        checkpoint_path=rec.checkpoint.path if rec.checkpoint else None,
        attempts=rec.attempts, deadline=rec.deadline, detected=rec.detected,
        evicted=rec.evicted, restore_sent=rec.restore_sent, resumed=rec.resumed,
        finished_at=rec.finished_at, error=rec.error, actions=dict(rec.steps),
        data=msgspec.to_builtins(details),
        history=tuple(msgspec.to_builtins(h) for h in rec.history))


#: Bookkeeping keys of recoveries written before the typed model, and their new names.
_LEGACY_KEYS: Final = {"ckpt_before": "checkpoint_before", "restore_seq": "restore_attempt"}


def from_row(row: RecoveryRow) -> Recovery:
    """The recovery a row holds; ``msgspec.ValidationError`` when it cannot be read."""
    data: dict[str, Any] = {_LEGACY_KEYS.get(k, k): v for k, v in dict(row.data).items()}
    if "failed" not in data:  # a row from before the typed model: one entry per node
        data["failed"] = [{"node": n, "kind": row.kind if row.kind in ("fatal", "lost",
                                                                          "hang") else "fatal",
                           "incidents": list(row.incident_ids),
                           "eviction": "done" if data.get("planned") else "pending"}
                          for n in row.failed_nodes]
    details = msgspec.convert(data, RecoveryDetails, strict=False)
    checkpoint = (None if row.checkpoint_step is None else
                  CheckpointRef(step=row.checkpoint_step, path=row.checkpoint_path or ""))
    history = tuple(msgspec.convert(h, HistoryEntry, strict=False) for h in row.history
                    if isinstance(h, Mapping) and h.get("state") in (*ACTIVE_STATES,
                                                                     *FINISHED_STATES))
    return Recovery(
        **msgspec.structs.asdict(details),
        id=row.id, job=row.job, state=msgspec.convert(row.state, RecoveryState),
        kind=msgspec.convert(row.kind, FaultKind), strategy=row.strategy,
        generation=row.generation, fault_seen=row.fault_seen,
        detected=row.detected if row.detected is not None else row.fault_seen,
        created_at=row.created_at, updated_at=row.updated_at, nodes=row.nodes,
        replacements=row.replacement_nodes, checkpoint=checkpoint, attempts=row.attempts,
        deadline=row.deadline, evicted=row.evicted, restore_sent=row.restore_sent,
        resumed=row.resumed, finished_at=row.finished_at, error=row.error,
        steps=dict(row.actions), history=history)
