"""Jobs: the training jobs the orchestrator watches, one durable row each."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sn_monitor.controller.storage.aggregates.base import StoreBase
from sn_monitor.controller.storage.aggregates.columns import from_json
from sn_monitor.controller.storage.database.base import Row


@dataclass(frozen=True)
class JobRow:
    """A training job as the store keeps it (see :mod:`sn_monitor.controller.jobs.orchestrator`).

    ``spec`` is the DistributedJob as plain data (``spec.job_to_dict``); ``nodes`` the
    job's members when last computed; ``added`` the replacement nodes taken into the job,
    ``excluded`` the nodes failed out of it (back only through ``return_to_pool``),
    ``pool`` the spares left; ``data`` the orchestrator's own bookkeeping.
    """

    name: str
    spec: Mapping[str, Any]
    source: str
    state: str
    created_at: float
    updated_at: float
    state_reason: str = ""
    generation: int = 0
    failures: int = 0
    nodes: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    pool: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)


_JOB_COLUMNS: Final = (
    "name", "spec", "source", "state", "state_reason", "generation", "failures", "nodes",
    "added", "excluded", "pool", "data", "created_at", "updated_at",
)
_JOB_JSON: Final = frozenset({"spec", "nodes", "added", "excluded", "pool", "data"})


class JobStore(StoreBase):
    """The ``jobs`` table. Durable: a job's row carries its recovery state."""

    def save_job(self, row: JobRow) -> None:
        """Insert or replace a job's row. Committed durably (it carries recovery state)."""
        self._replace("jobs", _JOB_COLUMNS, _JOB_JSON, row)

    @staticmethod
    def _job(row: Row) -> JobRow:
        values = {c: from_json(row[c]) if c in _JOB_JSON else row[c] for c in _JOB_COLUMNS}
        return JobRow(**values)

    def get_job(self, name: str) -> JobRow | None:
        """One job, or None."""
        rows = self._query("SELECT * FROM jobs WHERE name = ?", (name,))
        return self._job(rows[0]) if rows else None

    def list_jobs(self) -> list[JobRow]:
        """Every job, by name."""
        return [self._job(r) for r in self._query("SELECT * FROM jobs ORDER BY name")]

    def delete_job(self, name: str) -> bool:
        """Forget a job (its recoveries stay, as history). True if it existed."""
        with self._tx(durable=True) as db:
            return db.execute("DELETE FROM jobs WHERE name = ?", (name,)) > 0
