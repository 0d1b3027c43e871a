"""Events: what the agents reported (XIDs, GPU lost, guard actions), stored once each.

An agent drops an event from its spool only once it is here; (node, event_id, time)
identifies a retried one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sn_monitor.controller.storage.aggregates.base import StoreBase
from sn_monitor.controller.storage.query import Select
from sn_monitor.model import EventRecord


class EventStore(StoreBase):
    """The ``events`` table. Durable: an agent forgets an event once it is written."""

    def record_events(self, node: str, events: Iterable[EventRecord], at: float) -> int:
        """Store reported events durably; a retried event is stored once. How many were new."""
        return len(self.record_event_batches([(node, tuple(events), at)]))

    def record_event_batches(self, batches: Sequence[tuple[str, Sequence[EventRecord], float]]
                             ) -> list[EventRecord]:
        """Several reports' events (node, events, receive time) in one durable transaction.

        Returns the events that were new (a retried event is stored once).
        """
        rows = [((node, e.id, e.kind, e.source, e.time_seconds, at, e.gpu, e.code,
                  e.pci_bus_id, e.device, e.message), e)
                for node, events, at in batches for e in events]
        if not rows:
            return []
        with self._tx(durable=True) as db:
            return [event for row, event in rows if db.execute(
                "INSERT INTO events (node, event_id, kind, source, time, received_at,"
                " gpu, code, pci_bus_id, device, message) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT DO NOTHING", row)]

    def list_events(self, node: str | None = None, kind: str | None = None,
                    limit: int = 100) -> list[dict[str, Any]]:
        """Recent events, newest first."""
        select = (Select("events").equal("node", node).equal("kind", kind)
                  .order_by("id DESC").limit(limit))
        return [{k: v for k, v in dict(row).items() if k != "seq"}  # PostgreSQL's rowid
                for row in self._select(select)]

    def count_events(self, node: str | None = None) -> int:
        """How many events are stored (for one node)."""
        return self._count(Select("events", "COUNT(*) AS n").equal("node", node))
