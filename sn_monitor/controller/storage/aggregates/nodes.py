"""Nodes: what the store knows of each node, and the history of its state."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sn_monitor.controller.storage.aggregates.base import StoreBase
from sn_monitor.controller.storage.aggregates.columns import dumps
from sn_monitor.controller.storage.database.base import Row, Transaction
from sn_monitor.controller.storage.query import Select


@dataclass(frozen=True)
class NodeRecord:
    """A node as the store knows it; times are wall-clock seconds."""

    name: str
    labels: Mapping[str, str]
    state: str
    state_reason: str
    cordoned_by_us: bool
    first_seen: float
    last_seen: float


@dataclass(frozen=True)
class Transition:
    """One change of a node's state."""

    node: str
    from_state: str | None
    to_state: str
    reason: str
    at: float


class NodeStore(StoreBase):
    """The ``nodes`` and ``node_transitions`` tables (not durable: reports rebuild them)."""

    def upsert_node(self, name: str, labels: Mapping[str, str], seen_wall: float) -> None:
        """Note that ``name`` reported at ``seen_wall``; a new node starts healthy."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO nodes (name, labels, first_seen, last_seen) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET labels = excluded.labels,"
                " last_seen = CASE WHEN excluded.last_seen > nodes.last_seen"
                " THEN excluded.last_seen ELSE nodes.last_seen END",
                (name, dumps(labels), seen_wall, seen_wall),
            )

    def set_node_state(self, name: str, state: str, reason: str, at: float, *,
                       cordoned_by_us: bool | None = None) -> bool:
        """Set a node's state; a change is also written to ``node_transitions``.

        Returns True when the state changed. ``cordoned_by_us`` (when not None) records
        whether sn-monitor holds the node's cordon: only then may it uncordon the node.
        An unknown node is created (a node can be cordoned by hand before it reports).
        """
        with self._tx() as db:
            return self._set_node_state(db, name, state, reason, at, cordoned_by_us)

    def set_node_states(self, states: Sequence[tuple[str, str, str]], at: float) -> None:
        """(name, state, reason) of many nodes in one transaction (a fleet's first sweep)."""
        with self._tx() as db:
            for name, state, reason in states:
                self._set_node_state(db, name, state, reason, at, None)

    @staticmethod
    def _set_node_state(db: Transaction, name: str, state: str, reason: str, at: float,
                        cordoned_by_us: bool | None) -> bool:
        row = db.one("SELECT state FROM nodes WHERE name = ?", (name,))
        previous = None if row is None else str(row["state"])
        if row is None:
            db.execute(
                "INSERT INTO nodes (name, state, state_reason, first_seen, last_seen)"
                " VALUES (?, ?, ?, ?, ?)", (name, state, reason, at, at))
        else:
            db.execute("UPDATE nodes SET state = ?, state_reason = ? WHERE name = ?",
                       (state, reason, name))
        if cordoned_by_us is not None:
            db.execute("UPDATE nodes SET cordoned_by_us = ? WHERE name = ?",
                       (int(cordoned_by_us), name))
        changed = previous != state
        if changed:
            db.execute(
                "INSERT INTO node_transitions (node, from_state, to_state, reason, at)"
                " VALUES (?, ?, ?, ?, ?)", (name, previous, state, reason, at))
        return changed

    def set_cordoned_by_us(self, name: str, value: bool, at: float) -> None:
        """Record whether sn-monitor holds the node's cordon (set by the action runner)."""
        with self._tx(durable=True) as db:
            db.execute(
                "INSERT INTO nodes (name, cordoned_by_us, first_seen, last_seen)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE"
                " SET cordoned_by_us = excluded.cordoned_by_us", (name, int(value), at, at))

    @staticmethod
    def _node(row: Row) -> NodeRecord:
        return NodeRecord(
            name=row["name"], labels=json.loads(row["labels"]), state=row["state"],
            state_reason=row["state_reason"], cordoned_by_us=bool(row["cordoned_by_us"]),
            first_seen=row["first_seen"], last_seen=row["last_seen"],
        )

    def get_node(self, name: str) -> NodeRecord | None:
        """One node, or None."""
        rows = self._query("SELECT * FROM nodes WHERE name = ?", (name,))
        return self._node(rows[0]) if rows else None

    def list_nodes(self) -> list[NodeRecord]:
        """Every node, by name."""
        return [self._node(r) for r in self._query("SELECT * FROM nodes ORDER BY name")]

    def cordoned_by_us(self) -> set[str]:
        """The nodes whose cordon sn-monitor holds (read before every disruptive action)."""
        return {r["name"] for r in self._query(
            "SELECT name FROM nodes WHERE cordoned_by_us = 1")}

    def transitions(self, node: str, limit: int = 100) -> list[Transition]:
        """The node's last ``limit`` state changes, oldest first."""
        newest = Select("node_transitions").equal("node", node).order_by("id DESC")
        rows = self._query(*newest.limit(limit).reordered("id"))
        return [Transition(node=r["node"], from_state=r["from_state"],
                           to_state=r["to_state"], reason=r["reason"], at=r["at"])
                for r in rows]
