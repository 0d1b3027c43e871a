"""The fleet graph as ``GET /api/v1/topology`` serves it: supernodes, racks, nodes, rails.

A pure function of what the controller knows (:func:`fleet_topology`): the nodes'
labels and states, their topologies (:meth:`~.book.TopologyBook.wirings`), their live
rates (:meth:`~.meter.FabricMeter.values`), the open incidents, the jobs and the
fail-slow bottlenecks. Every input is a copy or frozen: at thousands of nodes the
document takes a second to build, and it is built with no lock held (the reports take
the one that guards the book and the meter). Each node's part is encoded as JSON as
soon as it is made (a ``msgspec.Raw`` in ``nodes``): a whole document of a million
dicts and lists, alive while it grows, made the cyclic garbage collector walk the
process again and again, every thread (the event loop too) stopped a second each time;
encoded with any msgspec JSON encoder, the document reads the same. Each node, GPU, port
and rail gets a ``health`` the page colours: ``ok``, ``degraded``, ``failed``, or
``unknown`` (no report yet).

- a **port** is ``failed`` when its state is not ACTIVE, ``degraded`` when its rate is
  below the best of its rail, it counts errors, or a bottleneck names it;
- a **GPU** is ``failed`` when lost or a critical incident names it, ``degraded`` when
  another incident names it, a slowing throttle reason is active or a bottleneck names it;
- a **node** is ``failed`` when lost or evicted or a critical incident is open on it,
  ``degraded`` when cordoned, degraded, any incident is open, or a part of it is not ok;
- a **rail** is ``failed`` when all its ports are, ``degraded`` when any is not ok.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from sn_monitor.controller.fabric.book import NodeWiring
from sn_monitor.controller.fabric.meter import (
    SLOWING_REASONS,
    GpuValues,
    NodeValues,
    PortValues,
)
from sn_monitor.model import GpuTopology, NicPortTopology, NicTopology
from sn_monitor.natural import natural_key
from sn_monitor.rules.view import NodeView

_ACTIVE = 4
_RANK = {"ok": 0, "unknown": 0, "degraded": 1, "failed": 2}
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class JobOnFabric:
    """A job as the topology shows it."""

    name: str
    state: str
    nodes: tuple[str, ...]
    ranks: Mapping[str, Sequence[int]] = field(default_factory=dict)
    step_time_seconds: float | None = None
    baseline_step_time_seconds: float | None = None
    slowdown_ratio: float | None = None
    #: Its latest failure's root cause (``JobRootCause.to_dict``), None when none is known.
    root_cause: Mapping[str, Any] | None = None


def _worst(*healths: str) -> str:
    return max(healths, key=lambda h: _RANK[h], default="ok")


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def fleet_topology(
    *,
    now: float,
    views: Mapping[str, NodeView],
    states: Mapping[str, str],
    incidents: Iterable[Mapping[str, Any]],
    wirings: Mapping[str, NodeWiring],
    readings: Mapping[str, NodeValues],
    jobs: Sequence[JobOnFabric],
    fail_slow: Sequence[Mapping[str, Any]],
    job: str | None = None,
) -> dict[str, Any]:
    """The ``/api/v1/topology`` document (see the module docstring).

    ``nodes`` maps each node to its part, already encoded (``msgspec.Raw``).
    """
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for incident in incidents:
        by_node.setdefault(str(incident["node"]), []).append(incident)
    marked = {(str(b["node"]), str(b["link"])) for b in fail_slow}
    best = _rail_best(views, wirings, readings)
    jobs_of: dict[str, list[str]] = {}
    for j in jobs:
        for node in j.nodes:
            jobs_of.setdefault(node, []).append(j.name)
    nodes: dict[str, msgspec.Raw] = {}
    on_rails: dict[int, list[tuple[str, str, int, str]]] = {}
    tree: dict[str, dict[str, list[str]]] = {}
    for name in sorted(views):
        view = views[name]
        supernode = view.labels.get("supernode", "")
        rack = view.labels.get("rack", "")
        tree.setdefault(supernode, {}).setdefault(rack, []).append(name)
        part = _node(view, states.get(name, view.state), by_node.get(name, []),
                     wirings.get(name), readings.get(name), best, marked,
                     sorted(jobs_of.get(name, [])))
        _take_rail_ports(name, part, on_rails)
        nodes[name] = msgspec.Raw(_encoder.encode(part))
    rails = _rails(on_rails)
    return {
        "time": now,
        "job": job,
        "supernodes": [{"name": sn, "racks": [{"name": r, "nodes": members}
                                              for r, members in sorted(racks.items())]}
                       for sn, racks in sorted(tree.items())],
        "rails": rails,
        "nodes": nodes,
        "jobs": [{"name": j.name, "state": j.state, "nodes": list(j.nodes),
                  "ranks": {n: list(r) for n, r in j.ranks.items()},
                  "step_time_seconds": _round(j.step_time_seconds, 4),
                  "baseline_step_time_seconds": _round(j.baseline_step_time_seconds, 4),
                  "slowdown_ratio": _round(j.slowdown_ratio, 4),
                  "root_cause": None if j.root_cause is None else dict(j.root_cause)}
                 for j in jobs],
        "fail_slow": [dict(b) for b in fail_slow],
    }


def _rail_best(views: Mapping[str, NodeView], wirings: Mapping[str, NodeWiring],
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


#: A node's health by its state, before its report, incidents and parts are counted.
_NODE_HEALTH = {"healthy": "ok", "degraded": "degraded", "cordoned": "degraded",
                "lost": "failed", "evicted": "failed"}
#: The values a GPU's part copies from its reading, and the digits each is rounded to
#: (None: as it is), in the order the part lists them: clocks before its throttle
#: reasons, NVLink values after its link count.
_GPU_CLOCKS: tuple[tuple[str, int | None], ...] = (
    ("utilization_ratio", 3), ("temperature_celsius", None), ("sm_clock_hertz", None),
    ("sm_max_clock_hertz", None),
)
_GPU_LINKS: tuple[tuple[str, int | None], ...] = (
    ("nvlinks_down", None), ("processes", None), ("nvlink_transmit_bytes_per_second", 0),
    ("nvlink_errors_per_second", 3),
)
#: The values a port's part copies from its reading (as ``_GPU_CLOCKS``).
_PORT_RATES: tuple[tuple[str, int | None], ...] = (
    ("transmit_bytes_per_second", 0), ("receive_bytes_per_second", 0),
    ("utilization_ratio", 3), ("transmit_wait_per_second", 0), ("ecn_marked_per_second", 3),
    ("cnp_per_second", 3), ("errors_per_second", 3),
)


def _copied(reading: GpuValues | PortValues | None,
            fields: tuple[tuple[str, int | None], ...]) -> dict[str, Any]:
    """The reading's ``fields``, rounded to their digits; each None without a reading."""
    if reading is None:
        return dict.fromkeys(name for name, _ in fields)
    return {name: getattr(reading, name) if digits is None
            else _round(getattr(reading, name), digits) for name, digits in fields}


def _incident_health(incident: Mapping[str, Any]) -> str:
    return "failed" if incident.get("severity") == "critical" else "degraded"


def _node(view: NodeView, state: str, incidents: list[Mapping[str, Any]],
          wiring: NodeWiring | None, readings: NodeValues | None, best: Mapping[int, float],
          marked: set[tuple[str, str]], jobs: list[str]) -> dict[str, Any]:
    gpus = _node_gpus(view, wiring, readings, incidents, marked)
    nics = _node_nics(view, wiring, readings, best, marked)
    return {
        "name": view.name,
        "supernode": view.labels.get("supernode", ""),
        "rack": view.labels.get("rack", ""),
        "state": state,
        "health": _node_health(view, state, incidents, gpus, nics),
        "jobs": jobs,
        "incidents": [{k: i.get(k) for k in ("id", "rule", "severity", "gpu", "message")}
                      for i in incidents],
        "has_topology": wiring is not None,
        "nvswitches": wiring.topology.nvswitches if wiring else 0,
        "gpus": gpus,
        "nics": nics,
    }


def _node_gpus(view: NodeView, wiring: NodeWiring | None, readings: NodeValues | None,
               incidents: list[Mapping[str, Any]],
               marked: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The parts of every GPU the topology, the readings or the report names."""
    topo_gpus = {g.index: g for g in wiring.topology.gpus} if wiring else {}
    report = view.report
    gpu_indexes = set(topo_gpus) | set(readings.gpus if readings else ()) | {
        g.index for g in (report.gpus if report else ())}
    return [_gpu(view.name, i, topo_gpus.get(i), readings.gpus.get(i) if readings else None,
                 incidents, marked) for i in sorted(gpu_indexes)]


def _node_nics(view: NodeView, wiring: NodeWiring | None, readings: NodeValues | None,
               best: Mapping[int, float],
               marked: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The parts of every NIC the topology, the readings or the report names."""
    topo_nics = {n.device: n for n in wiring.topology.nics} if wiring else {}
    report = view.report
    ports_of: dict[str, list[PortValues]] = {}
    for (device, _), port in sorted((readings.ports if readings else {}).items()):
        ports_of.setdefault(device, []).append(port)
    for port_report in report.infiniband if report else ():
        ports_of.setdefault(port_report.device, [])
    return [_nic(view.name, device, topo_nics.get(device), ports_of.get(device, []), best,
                 marked)
            for device in sorted(set(topo_nics) | set(ports_of), key=natural_key)]


def _node_health(view: NodeView, state: str, incidents: list[Mapping[str, Any]],
                 gpus: list[dict[str, Any]], nics: list[dict[str, Any]]) -> str:
    health = _NODE_HEALTH.get(state, "unknown")
    if view.report is None:
        health = "unknown"
    for incident in incidents:
        health = _worst(health, _incident_health(incident))
    parts = [g["health"] for g in gpus] + [p["health"] for n in nics for p in n["ports"]]
    if any(h != "ok" for h in parts if h != "unknown") and health == "ok":
        health = "degraded"
    return health


def _gpu(node: str, index: int, topo: GpuTopology | None, reading: GpuValues | None,
         incidents: list[Mapping[str, Any]], marked: set[tuple[str, str]]) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": topo.uuid if topo else "",
        "pci_bus_id": topo.pci_bus_id if topo else "",
        "numa_node": topo.numa_node if topo else None,
        "health": _gpu_health(node, index, reading, incidents, marked),
        **_copied(reading, _GPU_CLOCKS),
        "throttle_reasons": list(reading.throttle_reasons) if reading else [],
        "nvlinks": topo.nvlinks if topo else None,
        **_copied(reading, _GPU_LINKS),
        "peers": [{"kind": p.kind, "links": p.links, "pci_bus_id": p.pci_bus_id, "gpu": p.gpu}
                  for p in topo.peers] if topo else [],
        "nics": dict(topo.nics) if topo else {},
    }


def _gpu_health(node: str, index: int, reading: GpuValues | None,
                incidents: list[Mapping[str, Any]], marked: set[tuple[str, str]]) -> str:
    health = "unknown" if reading is None else "ok"
    if reading is not None and reading.lost:
        health = "failed"
    for incident in incidents:
        if incident.get("gpu") == index:
            health = _worst(health, _incident_health(incident))
    reasons = reading.throttle_reasons if reading else ()
    if any(r in SLOWING_REASONS for r in reasons) or (node, f"gpu{index}") in marked or (
            node, f"gpu{index}/nvlink") in marked:
        health = _worst(health, "degraded")
    return health


def _nic(node: str, device: str, topo: NicTopology | None, ports: list[PortValues],
         best: Mapping[int, float], marked: set[tuple[str, str]]) -> dict[str, Any]:
    rail = topo.rail if topo is not None and topo.role == "rail" else None
    topo_ports = {p.port: p for p in topo.ports} if topo else {}
    numbers = sorted(set(topo_ports) | {p.port for p in ports})
    by_number = {p.port: p for p in ports}
    top = best.get(rail) if rail is not None else None
    return {
        "device": device,
        "role": topo.role if topo else "other",
        "rail": rail,
        "pci_bus_id": topo.pci_bus_id if topo else "",
        "numa_node": topo.numa_node if topo else None,
        "netdev": topo.netdev if topo else "",
        "ports": [_port(node, device, number, by_number.get(number), topo_ports.get(number),
                        top, marked) for number in numbers],
    }


def _port(node: str, device: str, number: int, reading: PortValues | None,
          tp: NicPortTopology | None, top: float | None,
          marked: set[tuple[str, str]]) -> dict[str, Any]:
    """One port's part: ``reading`` its rates, ``tp`` its wiring, ``top`` its rail's best."""
    rate = reading.rate_bytes_per_second if reading else None
    if rate is None and tp is not None:
        rate = tp.rate_bytes_per_second
    health = "unknown"
    if reading is not None:
        health = "ok"
        if reading.state is not None and reading.state != _ACTIVE:
            health = "failed"
        elif ((top and rate and rate < 0.9 * top) or (reading.errors_per_second or 0) > 0
              or (node, device) in marked):
            health = "degraded"
    return {
        "port": number,
        "guid": tp.guid if tp else "",
        "link_layer": tp.link_layer if tp else "",
        "state": reading.state if reading else None,
        "health": health,
        "rate_bytes_per_second": rate,
        "max_rate_bytes_per_second": top or rate,
        **_copied(reading, _PORT_RATES),
    }


def _take_rail_ports(name: str, node: Mapping[str, Any],
                     rails: dict[int, list[tuple[str, str, int, str]]]) -> None:
    """The node's ports on a rail onto their rail's list: (node, device, port, health).

    Tuples of strings and numbers, which the garbage collector stops tracking.
    """
    for nic in node["nics"]:
        if nic["rail"] is None:
            continue
        for port in nic["ports"]:
            rails.setdefault(nic["rail"], []).append(
                (name, nic["device"], port["port"], port["health"]))


def _rails(rails: Mapping[int, list[tuple[str, str, int, str]]]) -> list[dict[str, Any]]:
    """Each rail's health and ports (:func:`_take_rail_ports` gathered them).

    Each rail's ports are encoded at once, as the nodes' parts are.
    """
    out = []
    for rail, members in sorted(rails.items()):
        healths = [h for _, _, _, h in members]
        known = [h for h in healths if h != "unknown"]
        if known and all(h == "failed" for h in known):
            health = "failed"
        elif any(h in ("failed", "degraded") for h in known):
            health = "degraded"
        else:
            health = "ok" if known else "unknown"
        ports = [{"node": node, "device": device, "port": port}
                 for node, device, port, _ in members]
        out.append({"rail": rail, "health": health, "ports": msgspec.Raw(_encoder.encode(ports))})
    return out
