"""The fleet at a glance, as ``GET /api/v1/topology/overview`` serves it: a row per node.

A pure function of the same inputs as the whole document (:class:`~.view.FleetFabric`),
judged by the same rules (:mod:`~sn_monitor.controller.fabric.health`), but with no
rates, wiring or incidents in it: what the page needs to colour a supernode of 8,192
nodes on one screen, in under a megabyte. Each row is a JSON array::

    [name, supernode, rack, health, state, gpus, rails, job]

``gpus`` has one letter per GPU (in index order) and ``rails`` one per rail the node's
NICs sit on (in rail order, the worst of the node's ports on it): ``o`` ok, ``d``
degraded, ``f`` failed, ``u`` unknown. ``job`` is the first of the node's jobs by name,
None when it is in none. Each row is encoded on its own (bytes), so that two overviews
compare row by row (:func:`changed_rows`): what a page that holds an older one needs.
The standing fail-slow bottlenecks (a handful, the whole document's ``fail_slow``) come
whole with every answer: what the page's banner and its fail-slow filter read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from sn_monitor.controller.fabric.book import NodeWiring
from sn_monitor.controller.fabric.health import (
    gpu_health,
    gpu_indexes,
    incidents_by_node,
    judged_ports,
    marked_links,
    nic_ports,
    node_health,
    rail_best,
    rail_health,
    rail_of,
    worst,
)
from sn_monitor.controller.fabric.meter import NodeValues
from sn_monitor.controller.fabric.view import FleetFabric
from sn_monitor.rules.view import NodeView

#: The letter of each health in a row's ``gpus`` and ``rails``.
LETTER = {"ok": "o", "degraded": "d", "failed": "f", "unknown": "u"}
HEALTHS = ("ok", "degraded", "failed", "unknown")

_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class FleetOverview:
    """A row per node (encoded), the counts by health, the rails, the bottlenecks."""

    rows: Mapping[str, bytes]
    counts: Mapping[str, int]
    rails: Mapping[str, str]
    fail_slow: Sequence[Mapping[str, Any]] = ()

    def same_as(self, other: FleetOverview | None) -> bool:
        """Whether ``other`` shows the same (rows, counts, rails and bottlenecks)."""
        return (other is not None and self.counts == other.counts
                and self.rails == other.rails and self.fail_slow == other.fail_slow
                and self.rows == other.rows)


@dataclass(frozen=True, slots=True)
class JudgedNode:
    """One node judged: its row, and its ports on each rail (rail, health)."""

    row: list[Any]
    on_rails: list[tuple[int, str]]


def fleet_overview(fabric: FleetFabric, job: str | None = None) -> FleetOverview:
    """The overview of every node, or with ``job`` of that job's nodes (module docstring).

    The rails' healths are the whole fleet's either way, as in the whole document.
    """
    views, wirings, readings = fabric.views, fabric.wirings, fabric.readings
    by_node = incidents_by_node(fabric.incidents)
    marked = marked_links(fabric.fail_slow)
    best = rail_best(views, wirings, readings)
    jobs_of = fabric.jobs_of()
    rows: dict[str, bytes] = {}
    counts = dict.fromkeys(HEALTHS, 0)
    on_rails: dict[int, list[str]] = {}
    for name in sorted(views):
        names = jobs_of.get(name, [])
        judged = judged_node(views[name], fabric.states.get(name, views[name].state),
                        by_node.get(name, []), wirings.get(name), readings.get(name), best,
                        marked, names[0] if names else None)
        for rail, health in judged.on_rails:
            on_rails.setdefault(rail, []).append(health)
        if job is not None and job not in names:
            continue
        rows[name] = _encoder.encode(judged.row)
        counts[judged.row[3]] += 1
    return FleetOverview(rows, counts, {str(rail): rail_health(healths)
                                        for rail, healths in sorted(on_rails.items())},
                         [dict(b) for b in fabric.fail_slow])


def judged_node(view: NodeView, state: str, incidents: Sequence[Mapping[str, Any]],
                wiring: NodeWiring | None, readings: NodeValues | None,
                best: Mapping[int, float], marked: set[tuple[str, str]],
                job: str | None) -> JudgedNode:
    """One node's row (module docstring), judged by the health rules.

    ``best``: each rail's best link rate; ``job``: the first of the node's jobs.
    """
    gpus = [gpu_health(view.name, i, readings.gpus.get(i) if readings else None, incidents,
                       marked) for i in gpu_indexes(view, wiring, readings)]
    ports: list[str] = []
    on_rails: list[tuple[int, str]] = []
    node_rails: dict[int, str] = {}
    for device, topo, values in nic_ports(view, wiring, readings):
        rail = rail_of(topo)
        for port in judged_ports(view.name, device, topo, values, best, marked):
            ports.append(port.health)
            if rail is not None:
                on_rails.append((rail, port.health))
                node_rails[rail] = _worse_known(node_rails.get(rail), port.health)
    health = node_health(view, state, incidents, gpus + ports)
    row = [view.name, view.labels.get("supernode", ""), view.labels.get("rack", ""), health,
           state, "".join(LETTER[h] for h in gpus),
           "".join(LETTER[h] for _, h in sorted(node_rails.items())), job]
    return JudgedNode(row, on_rails)


def _worse_known(held: str | None, health: str) -> str:
    """The worse of two healths, where unknown gives way to any known one."""
    if held is None or held == "unknown":
        return health
    return held if health == "unknown" else worst(held, health)


def changed_rows(old: Mapping[str, bytes], new: Mapping[str, bytes]
                 ) -> tuple[list[bytes], list[str]]:
    """What changed from ``old`` to ``new``: the rows new or not the same, the names gone."""
    changed = [row for name, row in new.items() if old.get(name) != row]
    return changed, [name for name in old if name not in new]
