"""Incidents: the faults the rules found, one open at a time per (rule, node, subject)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sn_monitor.controller.storage.aggregates.base import StoreBase
from sn_monitor.controller.storage.database.base import Row
from sn_monitor.controller.storage.query import Select

IncidentStatus = Literal["open", "closed"]


@dataclass(frozen=True)
class Incident:
    """A fault the rules found, open until its rule clears.

    ``observed_at`` is when the agent first saw the fault, ``detected_at`` when the
    controller opened the incident: the gap is the detection latency.
    """

    id: int
    rule: str
    node: str
    subject: str
    gpu: int | None
    severity: str
    status: IncidentStatus
    message: str
    observed_at: float
    detected_at: float
    closed_at: float | None
    value: float | None


class IncidentStore(StoreBase):
    """The ``incidents`` table (not durable: the next reports open them again)."""

    def open_incident(self, rule: str, node: str, subject: str = "", *, severity: str,
                      message: str, observed_at: float, detected_at: float,
                      gpu: int | None = None, value: float | None = None) -> int:
        """Open an incident, or return the id of the one already open for (rule, node, subject).

        ``subject`` tells apart faults of one rule on one node (``gpu3``, ``mlx5_0/1``);
        it is empty for node-wide rules.
        """
        with self._tx() as db:
            row = db.one(
                "SELECT id FROM incidents WHERE rule = ? AND node = ? AND subject = ?"
                " AND status = 'open'", (rule, node, subject))
            if row is not None:
                return int(row["id"])
            new = db.one(
                "INSERT INTO incidents (rule, node, subject, gpu, severity, status, message,"
                " observed_at, detected_at, value) VALUES (?, ?, ?, ?, ?, 'open', ?, ?, ?, ?)"
                " RETURNING id",
                (rule, node, subject, gpu, severity, message, observed_at, detected_at, value))
            assert new is not None  # RETURNING of an INSERT that ran
            return int(new["id"])

    def close_incident(self, rule: str, node: str, subject: str, at: float) -> int | None:
        """Close the open incident for (rule, node, subject); its id, or None if none was open."""
        with self._tx() as db:
            row = db.one(
                "SELECT id FROM incidents WHERE rule = ? AND node = ? AND subject = ?"
                " AND status = 'open'", (rule, node, subject))
            if row is None:
                return None
            db.execute("UPDATE incidents SET status = 'closed', closed_at = ? WHERE id = ?",
                       (at, row["id"]))
            return int(row["id"])

    @staticmethod
    def _incident(row: Row) -> Incident:
        return Incident(
            id=row["id"], rule=row["rule"], node=row["node"], subject=row["subject"],
            gpu=row["gpu"], severity=row["severity"], status=row["status"],
            message=row["message"], observed_at=row["observed_at"],
            detected_at=row["detected_at"], closed_at=row["closed_at"], value=row["value"],
        )

    def get_incident(self, incident_id: int) -> Incident | None:
        """One incident, or None."""
        rows = self._query("SELECT * FROM incidents WHERE id = ?", (incident_id,))
        return self._incident(rows[0]) if rows else None

    def list_incidents(self, status: IncidentStatus | None = None, node: str | None = None,
                       limit: int = 100) -> list[Incident]:
        """Incidents, newest first, optionally only one status or one node."""
        rows = self._select(Select("incidents").equal("status", status).equal("node", node)
                            .order_by("id DESC").limit(limit))
        return [self._incident(r) for r in rows]

    def count_closed_incidents(self, rule: str, node: str, subject: str, since: float) -> int:
        """How many closed incidents of (rule, node, subject) were detected since ``since``."""
        return int(self._query(
            "SELECT COUNT(*) AS n FROM incidents WHERE node = ? AND detected_at >= ?"
            " AND rule = ? AND subject = ? AND status = 'closed'",
            (node, since, rule, subject))[0]["n"])

    def open_incident_count(self) -> int:
        """How many incidents are open (``sn_incidents_open``)."""
        return int(self._query(
            "SELECT COUNT(*) AS n FROM incidents WHERE status = 'open'")[0]["n"])
