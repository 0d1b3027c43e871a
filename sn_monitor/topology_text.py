"""``sn-monitor topology`` for a terminal: the controller's ``/api/v1/topology`` as lines of text.

The fail-slow bottlenecks come first (they are why one looks), then each supernode's racks
and their nodes with health and state (a job's nodes marked ``*``), then one line per rail
naming its unhealthy ports. A pure function of the API's JSON, like the page that draws it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sn_monitor.natural import natural_key

#: Worst first.
_HEALTH_RANK = {"failed": 0, "degraded": 1, "unknown": 2, "ok": 3}
_PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}


def render_topology(doc: Mapping[str, Any], job: str | None = None) -> list[str]:
    """The lines to print for one ``GET /api/v1/topology`` answer.

    ``job`` (default: the answer's own ``job``) marks that job's nodes.
    """
    job = job if job is not None else doc.get("job")
    nodes: Mapping[str, Mapping[str, Any]] = doc.get("nodes") or {}
    members = _job_nodes(doc, job)
    rails = sorted(doc.get("rails") or [], key=lambda r: r.get("rail", 0))
    head = (f"topology at {_when(doc.get('time'))} · {len(nodes)} node"
            f"{'' if len(nodes) == 1 else 's'} · {len(rails)} rail{'' if len(rails) == 1 else 's'}")
    lines = [head + (f" · job {job} ({len(members)} nodes, marked *)" if job else "")]
    lines += _fail_slow(doc.get("fail_slow") or [])
    width = max((len(name) for name in nodes), default=4)
    slow: dict[str, list[str]] = {}
    for f in doc.get("fail_slow") or []:
        slow.setdefault(str(f.get("node")), []).append(str(f.get("link")))
    for supernode in _tree(doc):
        lines.append(f"supernode {supernode['name'] or '(none)'}")
        for rack in supernode["racks"]:
            lines.append(f"  rack {rack['name'] or '(none)'}")
            lines += [_node_line(nodes[name], name, width, name in members, slow.get(name, []))
                      for name in rack["nodes"]]
    lines += _rails(rails, nodes)
    return lines


def _fail_slow(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    found = sorted(entries, key=lambda f: -(f.get("slowdown_ratio") or 0.0))
    if not found:
        return []
    lines = [f"FAIL-SLOW ({len(found)})"]
    for f in found:
        rail = f" (rail {f['rail']})" if f.get("rail") is not None else ""
        lines.append(f"  ! job {f.get('job')} {_percent(f.get('slowdown_ratio'))}: "
                     f"{f.get('node')} {f.get('link')}{rail} {f.get('kind')} since "
                     f"{_when(f.get('since'), clock_only=True)}")
        if f.get("message"):
            lines.append(f"    {f['message']}")
    return lines


def _tree(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Supernodes and racks as the answer lists them, then any node they leave out."""
    nodes = doc.get("nodes") or {}
    tree = [{"name": sn.get("name", ""),
             "racks": [{"name": r.get("name", ""), "nodes": [n for n in r.get("nodes", [])
                                                            if n in nodes]}
                       for r in sn.get("racks") or []]}
            for sn in doc.get("supernodes") or []]
    placed = {n for sn in tree for r in sn["racks"] for n in r["nodes"]}
    loose = sorted(set(nodes) - placed, key=natural_key)
    if loose:
        tree.append({"name": "", "racks": [{"name": "", "nodes": loose}]})
    return tree


def _node_line(node: Mapping[str, Any], name: str, width: int, member: bool,
               slow_links: Sequence[str]) -> str:
    health = str(node.get("health") or "unknown")
    shown = health.upper() if health in ("failed", "degraded") else health
    parts = [f"   {'*' if member else ' '} {name:<{width}}  {shown:<8}  "
             f"{node.get('state') or '-':<9}"]
    if slow_links:
        parts.append("FAIL-SLOW " + ", ".join(slow_links))
    bad = [f"{p['device']} {p['health']} ({_port_state(p)})" for p in _ports(node)
           if p.get("health") in ("failed", "degraded")]
    if bad:
        parts.append("ports: " + ", ".join(bad))
    gpus = [f"gpu{g.get('index')} {g.get('health')}" for g in node.get("gpus") or []
            if g.get("health") in ("failed", "degraded")]
    if gpus:
        parts.append("gpus: " + ", ".join(gpus))
    incidents = node.get("incidents") or []
    if incidents:
        parts.append(f"{len(incidents)} incident{'' if len(incidents) == 1 else 's'}: "
                     + ", ".join(str(i.get("rule")) for i in incidents))
    if not node.get("has_topology", True):
        parts.append("(no topology yet)")
    return "  ".join(parts).rstrip()


def _ports(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every port of the node's NICs, each with its NIC's device, role and rail."""
    return [{**port, "device": nic.get("device"), "role": nic.get("role"),
             "rail": nic.get("rail")}
            for nic in node.get("nics") or [] for port in nic.get("ports") or []]


def _rails(rails: Sequence[Mapping[str, Any]],
           nodes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    if not rails:
        return []
    lines = ["rails"]
    for rail in rails:
        ports = []
        for ref in rail.get("ports") or []:
            found = next((p for p in _ports(nodes.get(ref.get("node"), {}))
                          if p["device"] == ref.get("device")
                          and p.get("port", 1) == ref.get("port", 1)), None)
            ports.append((ref, found or {}))
        healthy = sum(1 for _, p in ports if p.get("health") == "ok")
        utils = [p["utilization_ratio"] for _, p in ports
                 if p.get("utilization_ratio") is not None]
        mean = _percent(sum(utils) / len(utils), sign=False) if utils else "-"
        bad = sorted(((ref, p) for ref, p in ports if p.get("health") != "ok"),
                     key=lambda rp: (_HEALTH_RANK.get(str(rp[1].get("health")), 2),
                                     natural_key(str(rp[0].get("node")))))
        named = ", ".join(f"{ref.get('node')}/{ref.get('device')} "
                          f"{p.get('health') or 'unknown'} ({_port_state(p)})"
                          for ref, p in bad)
        health = str(rail.get("health") or "unknown")
        lines.append(f"  rail {rail.get('rail'):<3} {health:<8}  {healthy}/{len(ports)} ports "
                     f"ok  util {mean:>5}" + (f"  {named}" if named else ""))
    return lines


def _job_nodes(doc: Mapping[str, Any], job: str | None) -> set[str]:
    if not job:
        return set()
    members = {str(n) for j in doc.get("jobs") or [] if j.get("name") == job
               for n in j.get("nodes") or []}
    members |= {name for name, node in (doc.get("nodes") or {}).items()
                if job in (node.get("jobs") or [])}
    return members


def _port_state(port: Mapping[str, Any]) -> str:
    state = port.get("state")
    text = _PORT_STATES.get(state, f"state {state}") if state is not None else "state ?"
    rate, top = port.get("rate_bytes_per_second"), port.get("max_rate_bytes_per_second")
    if rate is not None and top and rate < top:
        text += f", {rate * 8 / 1e9:g} of {top * 8 / 1e9:g} Gb/s"
    if port.get("errors_per_second"):
        text += f", {port['errors_per_second']:g} errors/s"
    return text


def _percent(ratio: float | None, sign: bool = True) -> str:
    if ratio is None:
        return "-"
    return f"{'+' if sign and ratio >= 0 else ''}{ratio * 100:.0f} %"


def _when(seconds: float | None, clock_only: bool = False) -> str:
    if seconds is None:
        return "-"
    return time.strftime("%H:%M:%S" if clock_only else "%Y-%m-%d %H:%M:%S UTC",
                         time.gmtime(seconds))


