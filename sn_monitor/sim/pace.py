"""The demo job's pace under fail-slow faults, as :mod:`sn_monitor.sim.failslow` models it.

The demo's ranks (:mod:`sn_monitor.sim.train`) are processes that sleep a step time; a
fail-slow fault played on a simulated agent (``POST /sim/fault``) slows that node's GPU
or port in the agent's counters, not the rank. So the supernode writes the fail-slow
faults standing on its nodes to a small JSON file as it plays them (:class:`PaceBook`),
and every rank reads it (:class:`Pace`): its step time is the healthy one times the
slowdown of the faults on the job's nodes, computed by
:func:`~sn_monitor.sim.failslow.fault_slowdown` (compute, inter-node and intra-node
phases, each at the pace of its slowest GPU or link: collectives are synchronous, so one
slow node slows every rank alike). A fault on a node outside the job (a spare) slows
nothing.

The file: ``{"faults": [{"node", "kind", "link", "severity", "gpu", "rail"}, ...]}``,
replaced atomically.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Final, cast

from sn_monitor.sim.failslow import FAIL_SLOW_KINDS, FailSlowFault, FailSlowKind, fault_slowdown
from sn_monitor.sim.node_tree import congestion_share

#: What each ``*-cleared`` fault clears on its node (by kind; the port ones clear the
#: port's every fail-slow fault, as the simulated node does).
CLEARED: Final[Mapping[str, tuple[FailSlowKind, ...]]] = {
    "congested-link-cleared": ("congested-link", "nic-degraded"),
    "nic-degraded-cleared": ("congested-link", "nic-degraded"),
    "nvlink-slow-cleared": ("nvlink-slow",),
    "gpu-throttled-cleared": ("gpu-throttled",),
    "noisy-neighbour-cleared": ("noisy-neighbour",),
    "fail-slow-clear": FAIL_SLOW_KINDS,
}


def standing_fault(fault: str, node: str, gpu: int | None,
                   params: Mapping[str, Any]) -> FailSlowFault | None:
    """The model's fault for a ``POST /sim/fault`` of a fail-slow kind (else None).

    Parameters and defaults as the simulated node takes them (:mod:`sn_monitor.sim.node`);
    ``link`` as the bottleneck finder names it.
    """
    if fault not in FAIL_SLOW_KINDS:
        return None
    kind: FailSlowKind = fault
    if kind in ("congested-link", "nic-degraded"):
        device = str(params.get("device", "mlx5_0"))
        suffix = device.removeprefix("mlx5_")
        rail = int(suffix) if suffix.isdigit() else None
        severity = (1.0 / congestion_share(float(params.get("factor", 20.0))))\
            if kind == "congested-link" else float(params.get("rate_gbps", 200.0))
        return FailSlowFault(kind, node, device, 0.0, math.inf, severity, rail=rail)
    if gpu is None:
        raise ValueError(f"{fault} needs a gpu")
    if kind == "nvlink-slow":
        return FailSlowFault(kind, node, f"gpu{gpu}/nvlink", 0.0, math.inf,
                             float(params.get("bandwidth_ratio", 0.6)), gpu=gpu,
                             nvlinks_down=int(params.get("links_down", 1)))
    severity = float(params.get("ratio", 0.7)) if kind == "gpu-throttled" \
        else float(params.get("share", 0.3))
    return FailSlowFault(kind, node, f"gpu{gpu}", 0.0, math.inf, severity, gpu=gpu)


def slowdown(faults: Collection[FailSlowFault], nodes: Collection[str] | None) -> float:
    """Step time over the healthy one, ``faults`` standing on a job over ``nodes``.

    ``nodes`` None: every node is the job's.
    """
    mine = [f for f in faults if nodes is None or f.node in nodes]
    return 1.0 + fault_slowdown(mine) if mine else 1.0


class PaceBook:
    """The supernode's side: the fail-slow faults standing, written to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._standing: dict[tuple[str, str, str], FailSlowFault] = {}
        self._write()

    @property
    def standing(self) -> list[FailSlowFault]:
        return list(self._standing.values())

    def play(self, node: str, fault: str, gpu: int | None, params: Mapping[str, Any]) -> None:
        """A fault delivered to ``node``: remember it, or what it cleared; write the file."""
        added = standing_fault(fault, node, gpu, params)
        if added is not None:
            self._standing[(node, added.kind, added.link)] = added
        elif fault in CLEARED:
            kinds = CLEARED[fault]
            device = params.get("device")
            for key, standing in list(self._standing.items()):
                if standing.node != node or standing.kind not in kinds:
                    continue
                if fault == "fail-slow-clear" or (
                        standing.gpu == gpu if device is None else standing.link == device):
                    del self._standing[key]
        else:
            return
        self._write()

    def _write(self) -> None:
        doc = {"faults": [{"node": f.node, "kind": f.kind, "link": f.link,
                           "severity": f.severity, "gpu": f.gpu, "rail": f.rail}
                          for f in self._standing.values()]}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.path)


def read_faults(path: Path) -> list[FailSlowFault]:
    """The faults a :class:`PaceBook` wrote (ValueError on a file that is not one)."""
    try:
        doc = json.loads(path.read_text())
        return [FailSlowFault(cast(FailSlowKind, f["kind"]), str(f["node"]), str(f["link"]),
                              0.0, math.inf, float(f["severity"]), rail=f.get("rail"),
                              gpu=f.get("gpu")) for f in doc["faults"]]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a pace file: {err}") from None


class Pace:
    """A rank's side: the slowdown of the job now, read again when the file changes."""

    def __init__(self, path: Path, nodes: Collection[str] | None) -> None:
        self.path = path
        self.nodes = nodes
        self._seen: tuple[int, int] | None = None
        self._factor = 1.0

    def factor(self) -> float:
        """Step time over the healthy one (1.0 while the file is missing)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return 1.0
        changed = (stat.st_ino, stat.st_mtime_ns)  # replaced, not rewritten: a new inode
        if changed != self._seen:
            self._seen = changed
            self._factor = slowdown(read_faults(self.path), self.nodes)
        return self._factor
