"""Recoveries: each recovery of a job, a state machine persisted before every step."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sn_monitor.controller.storage.aggregates.base import StoreBase
from sn_monitor.controller.storage.aggregates.columns import from_json
from sn_monitor.controller.storage.database.base import Row
from sn_monitor.controller.storage.query import Select


@dataclass(frozen=True)
class RecoveryRow:
    """One recovery of a job: a persisted state machine (see the orchestrator).

    Times are wall-clock seconds; ``actions`` maps each step (``evict:node-3``,
    ``restore``) to the id of the action submitted for it.
    """

    id: str
    job: str
    generation: int
    state: str
    kind: str
    strategy: str
    fault_seen: float
    created_at: float
    updated_at: float
    failed_nodes: tuple[str, ...] = ()
    replacement_nodes: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    incident_ids: tuple[int, ...] = ()
    checkpoint_step: int | None = None
    checkpoint_path: str | None = None
    attempts: int = 0
    deadline: float | None = None
    detected: float | None = None
    evicted: float | None = None
    restore_sent: float | None = None
    resumed: float | None = None
    finished_at: float | None = None
    error: str = ""
    actions: Mapping[str, str] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)
    history: tuple[Mapping[str, Any], ...] = ()


_RECOVERY_COLUMNS: Final = (
    "id", "job", "generation", "state", "kind", "strategy", "failed_nodes",
    "replacement_nodes", "nodes", "incident_ids", "checkpoint_step", "checkpoint_path",
    "attempts", "deadline", "fault_seen", "detected", "evicted", "restore_sent", "resumed",
    "finished_at", "error", "actions", "data", "history", "created_at", "updated_at",
)
_RECOVERY_JSON: Final = frozenset(
    {"failed_nodes", "replacement_nodes", "nodes", "incident_ids", "actions", "data",
     "history"})


class RecoveryStore(StoreBase):
    """The ``recoveries`` table. Durable: a recovery is written before it acts."""

    def save_recovery(self, row: RecoveryRow) -> None:
        """Insert or replace a recovery's row. Committed durably: written before acting."""
        self._replace("recoveries", _RECOVERY_COLUMNS, _RECOVERY_JSON, row)

    @staticmethod
    def _recovery(row: Row) -> RecoveryRow:
        values = {c: from_json(row[c]) if c in _RECOVERY_JSON else row[c]
                  for c in _RECOVERY_COLUMNS}
        values["incident_ids"] = tuple(int(i) for i in values["incident_ids"])
        return RecoveryRow(**values)

    def get_recovery(self, recovery_id: str) -> RecoveryRow | None:
        """One recovery, or None."""
        rows = self._query("SELECT * FROM recoveries WHERE id = ?", (recovery_id,))
        return self._recovery(rows[0]) if rows else None

    def list_recoveries(self, *, job: str | None = None,
                        states: Iterable[str] | None = None,
                        limit: int = 1000) -> list[RecoveryRow]:
        """Recoveries, oldest first (the newest ``limit``), optionally of one job / states."""
        newest = (Select("recoveries").equal("job", job)
                  .one_of("state", None if states is None else set(states))
                  .order_by("created_at DESC", "id DESC").limit(limit))
        if newest.matches_nothing:
            return []
        rows = self._query(*newest.reordered("created_at", "id"))
        return [self._recovery(r) for r in rows]
