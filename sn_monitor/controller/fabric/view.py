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
and rail gets a ``health`` the page colours, by the rules of
:mod:`~sn_monitor.controller.fabric.health`.

A :class:`FabricScope` narrows the document to one supernode's nodes or one rack's (what
a page zoomed into a rack draws, a few hundred KB where the whole is ~100 MB): its nodes,
its racks and the rails' ports on them; every health is judged against the whole fleet
(a port's expected rate is its rail's best anywhere), so a node reads the same in both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from sn_monitor.controller.fabric.book import NodeWiring
from sn_monitor.controller.fabric.health import (
    JudgedPort,
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
)
from sn_monitor.controller.fabric.meter import GpuValues, NodeValues, PortValues
from sn_monitor.model import GpuTopology, NicTopology
from sn_monitor.rules.view import NodeView

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


@dataclass(frozen=True, slots=True)
class FleetFabric:
    """What the topology shows, gathered under the locks, then read with none held."""

    now: float
    views: Mapping[str, NodeView]
    states: Mapping[str, str]
    incidents: Sequence[Mapping[str, Any]]
    wirings: Mapping[str, NodeWiring]
    readings: Mapping[str, NodeValues]
    jobs: Sequence[JobOnFabric]
    fail_slow: Sequence[Mapping[str, Any]]

    def jobs_of(self) -> dict[str, list[str]]:
        """Each node's jobs, by name, in order."""
        jobs_of: dict[str, list[str]] = {}
        for j in self.jobs:
            for node in j.nodes:
                jobs_of.setdefault(node, []).append(j.name)
        return {node: sorted(names) for node, names in jobs_of.items()}


@dataclass(frozen=True, slots=True)
class FabricScope:
    """The nodes a document shows: those of a supernode, of a rack, or both (None: any)."""

    supernode: str | None = None
    rack: str | None = None

    def holds(self, view: NodeView) -> bool:
        """Whether the node ``view`` is in the scope (an unlabelled node's label is "")."""
        return ((self.supernode is None or view.labels.get("supernode", "") == self.supernode)
                and (self.rack is None or view.labels.get("rack", "") == self.rack))

    def to_dict(self) -> dict[str, str | None]:
        return {"supernode": self.supernode, "rack": self.rack}


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def fleet_topology(fabric: FleetFabric, job: str | None = None,
                   scope: FabricScope | None = None) -> dict[str, Any]:
    """The ``/api/v1/topology`` document (see the module docstring), of ``scope``'s nodes.

    ``nodes`` maps each node to its part, already encoded (``msgspec.Raw``).
    """
    views, wirings, readings = fabric.views, fabric.wirings, fabric.readings
    by_node = incidents_by_node(fabric.incidents)
    marked = marked_links(fabric.fail_slow)
    best = rail_best(views, wirings, readings)
    jobs_of = fabric.jobs_of()
    nodes: dict[str, msgspec.Raw] = {}
    on_rails: dict[int, list[tuple[str, str, int, str]]] = {}
    tree: dict[str, dict[str, list[str]]] = {}
    for name in sorted(views):
        view = views[name]
        if scope is not None and not scope.holds(view):
            continue
        supernode = view.labels.get("supernode", "")
        rack = view.labels.get("rack", "")
        tree.setdefault(supernode, {}).setdefault(rack, []).append(name)
        part = _node(view, fabric.states.get(name, view.state), by_node.get(name, []),
                     wirings.get(name), readings.get(name), best, marked,
                     jobs_of.get(name, []))
        _take_rail_ports(name, part, on_rails)
        nodes[name] = msgspec.Raw(_encoder.encode(part))
    rails = _rails(on_rails)
    return {
        "time": fabric.now,
        "job": job,
        "scope": None if scope is None else scope.to_dict(),
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
                 for j in fabric.jobs],
        "fail_slow": [dict(b) for b in fabric.fail_slow],
    }


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
        "health": node_health(view, state, incidents,
                              [g["health"] for g in gpus]
                              + [p["health"] for n in nics for p in n["ports"]]),
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
    return [_gpu(view.name, i, topo_gpus.get(i), readings.gpus.get(i) if readings else None,
                 incidents, marked) for i in gpu_indexes(view, wiring, readings)]


def _node_nics(view: NodeView, wiring: NodeWiring | None, readings: NodeValues | None,
               best: Mapping[int, float],
               marked: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The parts of every NIC the topology, the readings or the report names."""
    return [_nic(view.name, device, topo, ports, best, marked)
            for device, topo, ports in nic_ports(view, wiring, readings)]


def _gpu(node: str, index: int, topo: GpuTopology | None, reading: GpuValues | None,
         incidents: list[Mapping[str, Any]], marked: set[tuple[str, str]]) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": topo.uuid if topo else "",
        "pci_bus_id": topo.pci_bus_id if topo else "",
        "numa_node": topo.numa_node if topo else None,
        "health": gpu_health(node, index, reading, incidents, marked),
        **_copied(reading, _GPU_CLOCKS),
        "throttle_reasons": list(reading.throttle_reasons) if reading else [],
        "nvlinks": topo.nvlinks if topo else None,
        **_copied(reading, _GPU_LINKS),
        "peers": [{"kind": p.kind, "links": p.links, "pci_bus_id": p.pci_bus_id, "gpu": p.gpu}
                  for p in topo.peers] if topo else [],
        "nics": dict(topo.nics) if topo else {},
    }


def _nic(node: str, device: str, topo: NicTopology | None, ports: list[PortValues],
         best: Mapping[int, float], marked: set[tuple[str, str]]) -> dict[str, Any]:
    return {
        "device": device,
        "role": topo.role if topo else "other",
        "rail": rail_of(topo),
        "pci_bus_id": topo.pci_bus_id if topo else "",
        "numa_node": topo.numa_node if topo else None,
        "netdev": topo.netdev if topo else "",
        "ports": [_port(p) for p in judged_ports(node, device, topo, ports, best, marked)],
    }


def _port(port: JudgedPort) -> dict[str, Any]:
    """One port's part."""
    tp = port.wiring
    return {
        "port": port.number,
        "guid": tp.guid if tp else "",
        "link_layer": tp.link_layer if tp else "",
        "state": port.reading.state if port.reading else None,
        "health": port.health,
        "rate_bytes_per_second": port.rate,
        "max_rate_bytes_per_second": port.top or port.rate,
        **_copied(port.reading, _PORT_RATES),
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
        health = rail_health([h for _, _, _, h in members])
        ports = [{"node": node, "device": device, "port": port}
                 for node, device, port, _ in members]
        out.append({"rail": rail, "health": health, "ports": msgspec.Raw(_encoder.encode(ports))})
    return out
