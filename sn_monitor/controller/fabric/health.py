"""The topology's health rules: what makes a node, a GPU, a port or a rail not ok.

Both views of the fleet graph judge with these functions, so that they always agree:
the whole document (:mod:`~sn_monitor.controller.fabric.view`) and the overview of one
row per node (:mod:`~sn_monitor.controller.fabric.overview`). A health is ``ok``,
``degraded``, ``failed`` or ``unknown`` (no report yet):

- a **port** is ``failed`` when its state is not ACTIVE, ``degraded`` when its rate is
  below the best of its rail, it counts errors, or a bottleneck names it;
- a **GPU** is ``failed`` when lost or a critical incident names it, ``degraded`` when
  another incident names it, a slowing throttle reason is active or a bottleneck names it;
- a **node** is ``failed`` when lost or evicted or a critical incident is open on it,
  ``degraded`` when cordoned, degraded, any incident is open, or a part of it is not ok;
- a **rail** is ``failed`` when all its ports are, ``degraded`` when any is not ok.

Which parts a node has is decided here too (:func:`gpu_indexes`, :func:`nic_ports`):
those its topology, its readings or its report name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

from sn_monitor.controller.fabric.book import NodeWiring
from sn_monitor.controller.fabric.meter import (
    SLOWING_REASONS,
    GpuValues,
    NodeValues,
    PortValues,
)
from sn_monitor.model import NicPortTopology, NicTopology
from sn_monitor.natural import natural_key
from sn_monitor.rules.view import NodeView

_ACTIVE = 4
_RANK = {"ok": 0, "unknown": 0, "degraded": 1, "failed": 2}
#: A node's health by its state, before its report, incidents and parts are counted.
_NODE_HEALTH = {"healthy": "ok", "degraded": "degraded", "cordoned": "degraded",
                "lost": "failed", "evicted": "failed"}
#: A device's place among its node's NICs: a few names, the same on every node (cached).
_device_key = lru_cache(maxsize=4096)(natural_key)
#: A port whose link rate is below this share of its rail's best is degraded.
_SLOW_LINK_SHARE = 0.9


def worst(*healths: str) -> str:
    """The worst of ``healths`` (``ok`` when none)."""
    return max(healths, key=lambda h: _RANK[h], default="ok")


def incidents_by_node(incidents: Iterable[Mapping[str, Any]]
                      ) -> dict[str, list[Mapping[str, Any]]]:
    """The open incidents, by the node they name."""
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for incident in incidents:
        by_node.setdefault(str(incident["node"]), []).append(incident)
    return by_node


def marked_links(fail_slow: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """(node, link) of each standing bottleneck."""
    return {(str(b["node"]), str(b["link"])) for b in fail_slow}


def rail_best(views: Mapping[str, NodeView], wirings: Mapping[str, NodeWiring],
              readings: Mapping[str, NodeValues]) -> dict[int, float]:
    """Each rail's best link rate among the nodes that report one."""
    best: dict[int, float] = {}
    for name in views:
        values = readings.get(name)
        if values is None:
            continue
        wiring = wirings.get(name)
        for (device, _), port in values.ports.items():
            rail = wiring.rail(device) if wiring is not None else None
            if rail is not None and port.rate_bytes_per_second:
                best[rail] = max(best.get(rail, 0.0), port.rate_bytes_per_second)
    return best


def gpu_indexes(view: NodeView, wiring: NodeWiring | None,
                readings: NodeValues | None) -> list[int]:
    """Every GPU the topology, the readings or the report names, in order."""
    indexes = {g.index for g in wiring.topology.gpus} if wiring else set()
    indexes |= set(readings.gpus if readings else ())
    indexes |= {g.index for g in (view.report.gpus if view.report else ())}
    return sorted(indexes)


def nic_ports(view: NodeView, wiring: NodeWiring | None, readings: NodeValues | None
              ) -> list[tuple[str, NicTopology | None, list[PortValues]]]:
    """Every NIC the topology, the readings or the report names: (device, wiring, ports)."""
    topo_nics = {n.device: n for n in wiring.topology.nics} if wiring else {}
    ports_of: dict[str, list[PortValues]] = {}
    for (device, _), port in sorted((readings.ports if readings else {}).items()):
        ports_of.setdefault(device, []).append(port)
    for port_report in view.report.infiniband if view.report else ():
        ports_of.setdefault(port_report.device, [])
    return [(device, topo_nics.get(device), ports_of.get(device, []))
            for device in sorted(set(topo_nics) | set(ports_of), key=_device_key)]


class JudgedPort(NamedTuple):
    """One port of a NIC as both views show it: its reading, wiring, rates and health."""

    number: int
    reading: PortValues | None
    wiring: NicPortTopology | None
    #: Its link rate: the latest report's, else its wiring's.
    rate: float | None
    #: Its rail's best link rate; None off the rails.
    top: float | None
    health: str


def judged_ports(node: str, device: str, topo: NicTopology | None, ports: Sequence[PortValues],
                 best: Mapping[int, float], marked: set[tuple[str, str]]) -> list[JudgedPort]:
    """Every port of a NIC its wiring or readings name, in order, with its health."""
    rail = rail_of(topo)
    top = best.get(rail) if rail is not None else None
    wired = {p.port: p for p in topo.ports} if topo else {}
    by_number = {p.port: p for p in ports}
    judged = []
    for number in sorted(set(wired) | set(by_number)):
        reading, tp = by_number.get(number), wired.get(number)
        rate = reading.rate_bytes_per_second if reading else None
        if rate is None and tp is not None:
            rate = tp.rate_bytes_per_second
        judged.append(JudgedPort(number, reading, tp, rate, top,
                                 port_health(node, device, reading, rate, top, marked)))
    return judged


def rail_of(topo: NicTopology | None) -> int | None:
    """The rail a NIC is wired to; None for a storage or other NIC, or an unknown one."""
    return topo.rail if topo is not None and topo.role == "rail" else None


def incident_health(incident: Mapping[str, Any]) -> str:
    return "failed" if incident.get("severity") == "critical" else "degraded"


def gpu_health(node: str, index: int, reading: GpuValues | None,
               incidents: Sequence[Mapping[str, Any]], marked: set[tuple[str, str]]) -> str:
    """One GPU's health (``reading``: its values, None without them)."""
    health = "unknown" if reading is None else "ok"
    if reading is not None and reading.lost:
        health = "failed"
    for incident in incidents:
        if incident.get("gpu") == index:
            health = worst(health, incident_health(incident))
    reasons = reading.throttle_reasons if reading else ()
    if any(r in SLOWING_REASONS for r in reasons) or (node, f"gpu{index}") in marked or (
            node, f"gpu{index}/nvlink") in marked:
        health = worst(health, "degraded")
    return health


def port_health(node: str, device: str, reading: PortValues | None, rate: float | None,
                top: float | None, marked: set[tuple[str, str]]) -> str:
    """One port's health: ``rate`` its link rate, ``top`` its rail's best."""
    if reading is None:
        return "unknown"
    if reading.state is not None and reading.state != _ACTIVE:
        return "failed"
    if ((top and rate and rate < _SLOW_LINK_SHARE * top) or (reading.errors_per_second or 0) > 0
            or (node, device) in marked):
        return "degraded"
    return "ok"


def node_health(view: NodeView, state: str, incidents: Sequence[Mapping[str, Any]],
                parts: Iterable[str]) -> str:
    """A node's health: its state, report and incidents, and its parts' healths."""
    health = _NODE_HEALTH.get(state, "unknown")
    if view.report is None:
        health = "unknown"
    for incident in incidents:
        health = worst(health, incident_health(incident))
    if health == "ok" and any(h not in ("ok", "unknown") for h in parts):
        health = "degraded"
    return health


def rail_health(healths: Sequence[str]) -> str:
    """A rail's health from its ports' healths."""
    known = [h for h in healths if h != "unknown"]
    if known and all(h == "failed" for h in known):
        return "failed"
    if any(h in ("failed", "degraded") for h in known):
        return "degraded"
    return "ok" if known else "unknown"
