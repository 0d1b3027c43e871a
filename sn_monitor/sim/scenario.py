"""Scenario files: which fault hits which simulated node, and when.

A scenario is a YAML mapping with ``kind: Scenario`` (that is how ``check-config`` tells
it from the other files) and a list of timed faults::

    kind: Scenario
    name: default                  # default: the file's name
    description: what it shows
    duration: 10m                  # simulated time it covers (optional)
    gpus: 8                        # GPUs per simulated node (default 8)
    faults:
      - {at: 30s, node: 3, gpu: 5, fault: overheat, factor: 1.8}
      - {at: 2m, node: sim-0007, gpu: 2, fault: xid, code: 79}
      - {at: 3m, node: 11, fault: node-lost}            # the agent stops reporting
      - {at: 4m, node: "*", count: 6, fault: node-lost}  # six nodes at once
      - {at: 5m, node: 0-23, gpu: 1, fault: xid, code: 13}  # 24 nodes at once
      - {at: 6m, node: 2, gpu: 0, fault: xid, code: 95,
         repeat: {count: 300, every: 1s}}                  # once a second for 5 minutes

Each fault has ``at`` (simulated time from the start: ``30s``, ``2m``, a number of
seconds), ``node`` (an index into the simulated fleet, 0-based; a node name such as
``sim-0007``; a range of indices such as ``0-23``, both ends included; or ``"*"``:
``count`` nodes picked at random, a number or a share of the fleet such as ``25%``,
every node without ``count``), ``fault`` (a name from
:data:`FAULT_SPECS`), ``gpu`` when the fault needs one, and the fault's parameters,
inline or under ``params:``. ``count`` next to ``node: "*"``
is the number of nodes; a fault's own ``count`` parameter (``ecc-uncorrectable``,
``ib-symbol-errors``, ``stuck-process``) then goes under ``params:``. Parameters left out
take the defaults listed in :data:`FAULT_SPECS`. ``repeat: {count, every}`` plays the
fault ``count`` times in all, ``every`` apart (a storm).

``nvml-hang`` wedges the node's NVML (every call blocks, as with a hung driver) until
``nvml-release``: the agent's nvml collector goes stuck past its deadline, the node
reports without GPU values and sends one ``collector_stuck`` event.

The node faults are those of :data:`sn_monitor.sim.node.FAULTS` (what ``POST /sim/fault``
takes on a simulated agent); ``node-lost``, ``node-back`` and ``straggler`` act on a whole
agent; ``rank-error`` on the demo's training job (its rank on the node fails for real and
prints why), so only ``sn-monitor demo`` plays it.

Every error is a :class:`~sn_monitor.config.ConfigError` naming file, line and key path
(``scenario.yaml:7: faults[3].gpu: overheat needs a gpu from 0 to 7``). Whether a node
index or name exists depends on the fleet: :meth:`Scenario.resolve` checks that, with
the same kind of message, once the fleet's size is known.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from sn_monitor.config import (
    ConfigError,
    Document,
    KeyPath,
    load_yaml,
    parse_duration,
    parse_yaml,
    unknown_key,
)
from sn_monitor.sim.node import FAULTS
from sn_monitor.sim.node_tree import DEFAULT_IB_DEVICES, DEFAULT_NETDEVS

ParamKind = Literal["int", "number", "ratio", "string", "choice"]

#: Network interfaces a carrier fault may name (``lo`` has no carrier to lose).
NETDEVS: tuple[str, ...] = tuple(d for d in DEFAULT_NETDEVS if d != "lo")
#: NVLinks per GPU (H100 SXM).
NVLINKS = 18


@dataclass(frozen=True)
class FaultParam:
    """One parameter of a fault: its type, range, default and what it means."""

    kind: ParamKind
    default: Any = None
    required: bool = False
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False
    doc: str = ""


@dataclass(frozen=True)
class FaultSpec:
    """What a fault needs: a GPU or not, which parameters, what it acts on.

    ``fleet_only``: a whole agent; ``job_only``: the demo's training job (``sn-monitor
    demo`` only).
    """

    needs_gpu: bool
    params: dict[str, FaultParam] = field(default_factory=dict)
    fleet_only: bool = False
    job_only: bool = False
    doc: str = ""


def _count(doc: str, default: int = 1) -> FaultParam:
    return FaultParam("int", default=default, low=1, high=1_000_000, doc=doc)


def _device(doc: str = "the RDMA device, port 1") -> FaultParam:
    return FaultParam("choice", default=DEFAULT_IB_DEVICES[0], choices=DEFAULT_IB_DEVICES,
                      doc=doc)


def _link() -> FaultParam:
    return FaultParam("int", default=0, low=0, high=NVLINKS - 1, doc="NVLink index")


#: Every fault a scenario may name. The node faults mirror :data:`sn_monitor.sim.node.FAULTS`
#: (``needs_gpu`` is taken from there; a unit test keeps the two lists equal); FAULTS
#: knows how to inject them but not their parameters' names and ranges, which live here.
FAULT_SPECS: dict[str, FaultSpec] = {
    "overheat": FaultSpec(FAULTS["overheat"].needs_gpu, {
        "factor": FaultParam("number", default=1.7, low=0.1, high=10.0,
                             doc="thermal resistance multiplier (a failed fan: 1.5-2)")},
        doc="the GPU's cooling fails: it heats towards its slowdown temperature"),
    "cooling-repaired": FaultSpec(FAULTS["cooling-repaired"].needs_gpu,
                                  doc="the cooling works again"),
    "gpu-reset": FaultSpec(FAULTS["gpu-reset"].needs_gpu,
                           doc="a person resets the GPU (nvidia-smi --gpu-reset): pending "
                               "row remaps take effect, ECC counts start again"),
    "xid": FaultSpec(FAULTS["xid"].needs_gpu, {
        "code": FaultParam("int", required=True, low=1, high=1023, doc="the XID number"),
        "message": FaultParam("string", default="Simulated fault", doc="driver text")},
        doc="an XID as the driver reports it"),
    "ecc-uncorrectable": FaultSpec(FAULTS["ecc-uncorrectable"].needs_gpu, {
        "count": _count("uncorrectable ECC errors")},
        doc="uncorrectable ECC errors; a row remap is then pending"),
    "row-remap-pending": FaultSpec(FAULTS["row-remap-pending"].needs_gpu,
                                   doc="an HBM row remap waits for the next GPU reset"),
    "row-remap-failure": FaultSpec(FAULTS["row-remap-failure"].needs_gpu,
                                   doc="HBM ran out of spare rows"),
    "nvlink-errors": FaultSpec(FAULTS["nvlink-errors"].needs_gpu, {
        "link": _link(),
        "crc": FaultParam("int", default=100, low=0, high=10**12, doc="flit CRC errors"),
        "replay": FaultParam("int", default=0, low=0, high=10**12, doc="replay errors"),
        "recovery": FaultParam("int", default=0, low=0, high=10**12, doc="recoveries")},
        doc="error counters of one NVLink jump"),
    "nvlink-down": FaultSpec(FAULTS["nvlink-down"].needs_gpu, {"link": _link()},
                             doc="one NVLink goes down"),
    "pcie-downgrade": FaultSpec(FAULTS["pcie-downgrade"].needs_gpu, {
        "generation": FaultParam("int", default=4, low=1, high=5, doc="PCIe generation"),
        "width": FaultParam("int", default=8, low=1, high=16, doc="lanes")},
        doc="the GPU's PCIe link retrains below its maximum"),
    "fall-off-bus": FaultSpec(FAULTS["fall-off-bus"].needs_gpu,
                              doc="the GPU vanishes (XID 79)"),
    "load": FaultSpec(FAULTS["load"].needs_gpu, {
        "utilization": FaultParam("ratio", default=None, low=0.0, high=1.0, nullable=True,
                                  doc="held utilization 0-1; null: the training pattern")},
        doc="hold one GPU's utilization"),
    "ib-port-down": FaultSpec(FAULTS["ib-port-down"].needs_gpu, {"device": _device()},
                              doc="an InfiniBand port goes down and stays down"),
    "ib-port-up": FaultSpec(FAULTS["ib-port-up"].needs_gpu, {"device": _device()},
                            doc="the port trains up again"),
    "ib-flap": FaultSpec(FAULTS["ib-flap"].needs_gpu, {"device": _device()},
                         doc="the port goes down and up within one sample (link_downed +1)"),
    "ib-symbol-errors": FaultSpec(FAULTS["ib-symbol-errors"].needs_gpu, {
        "device": _device(), "count": _count("symbol errors", 100)},
        doc="physical-layer symbol errors on a port"),
    "carrier-flap": FaultSpec(FAULTS["carrier-flap"].needs_gpu, {
        "device": FaultParam("choice", default=NETDEVS[0], choices=NETDEVS,
                             doc="the network interface")},
        doc="an interface loses carrier and gets it back"),
    "nvml-hang": FaultSpec(FAULTS["nvml-hang"].needs_gpu,
                           doc="the driver wedges: every NVML call hangs (the agent's nvml "
                               "collector becomes stuck) until nvml-release"),
    "nvml-release": FaultSpec(FAULTS["nvml-release"].needs_gpu,
                              doc="the wedged driver answers again: the hung calls return"),
    "fabric-not-ready": FaultSpec(FAULTS["fabric-not-ready"].needs_gpu, {
        "state": FaultParam("int", default=1, low=1, high=3,
                            doc="NVML fabric state: 1 not started (Fabric Manager down), "
                                "2 in progress, 3 completed (with an error status)"),
        "status": FaultParam("int", default=0, low=0, high=999,
                             doc="NVML return code once completed (0 success)")},
        doc="the GPU's NVLink fabric registration does not complete"),
    "fabric-ready": FaultSpec(FAULTS["fabric-ready"].needs_gpu,
                              doc="the fabric registration completes (Fabric Manager back)"),
    "stuck-process": FaultSpec(FAULTS["stuck-process"].needs_gpu, {
        "name": FaultParam("string", default="python", doc="the processes' name (comm)"),
        "count": _count("processes left in D state")},
        doc="processes hang in uninterruptible sleep (D), as on a dead NFS mount"),
    "stuck-process-gone": FaultSpec(FAULTS["stuck-process-gone"].needs_gpu,
                                    doc="the stuck processes are gone"),
    # Fail-slow: the node keeps working, slower. Port ones play on simulated agents only.
    "congested-link": FaultSpec(FAULTS["congested-link"].needs_gpu, {
        "device": _device(), "factor": FaultParam(
            "number", default=20.0, low=1.0, high=1000.0,
            doc="how many times longer the port waits to send (port_xmit_wait)")},
        doc="a port congested: it waits to send, RoCE marks ECN, it moves less"),
    "congested-link-cleared": FaultSpec(FAULTS["congested-link-cleared"].needs_gpu,
                                        {"device": _device()}, doc="the congestion is gone"),
    "nic-degraded": FaultSpec(FAULTS["nic-degraded"].needs_gpu, {
        "device": _device(), "rate_gbps": FaultParam(
            "number", default=200.0, low=1.0, high=399.0,
            doc="the rate the link trained at, Gb/s (full: 400)")},
        doc="a port's link trains below its full rate (fewer lanes, a lower speed)"),
    "nic-degraded-cleared": FaultSpec(FAULTS["nic-degraded-cleared"].needs_gpu,
                                      {"device": _device()},
                                      doc="the link trains at its full rate again"),
    "nvlink-slow": FaultSpec(FAULTS["nvlink-slow"].needs_gpu, {
        "links_down": FaultParam("int", default=1, low=0, high=NVLINKS - 1,
                                 doc="NVLinks that go down"),
        "errors_per_second": FaultParam("number", default=100.0, low=0.0, high=1e9,
                                        doc="replay errors a second (CRC errors 3x)"),
        "bandwidth_ratio": FaultParam("ratio", default=0.6, low=0.01, high=1.0,
                                      doc="the GPU's NVLink data rate against its peers'")},
        doc="an NVLink error storm: errors climb, links drop, the GPU's NVLink slows"),
    "nvlink-slow-cleared": FaultSpec(FAULTS["nvlink-slow-cleared"].needs_gpu,
                                     doc="the NVLinks are healthy and up again"),
    "gpu-throttled": FaultSpec(FAULTS["gpu-throttled"].needs_gpu, {
        "reason": FaultParam("string", default="hw_slowdown",
                             doc="throttle reasons, comma-separated: sw_power_cap, "
                                 "hw_slowdown, sw_thermal_slowdown, hw_thermal_slowdown, "
                                 "hw_power_brake_slowdown"),
        "ratio": FaultParam("ratio", default=0.7, low=0.05, high=1.0,
                            doc="the SM clock's share of its maximum")},
        doc="the GPU's clocks held low with a throttle reason"),
    "gpu-throttled-cleared": FaultSpec(FAULTS["gpu-throttled-cleared"].needs_gpu,
                                       doc="the clocks are free again"),
    "noisy-neighbour": FaultSpec(FAULTS["noisy-neighbour"].needs_gpu, {
        "share": FaultParam("ratio", default=0.3, low=0.01, high=0.99,
                            doc="the share of the GPU the other tenant takes")},
        doc="another tenant's compute process on the GPU"),
    "noisy-neighbour-cleared": FaultSpec(FAULTS["noisy-neighbour-cleared"].needs_gpu,
                                         doc="the other tenant's process is gone"),
    "fail-slow-clear": FaultSpec(FAULTS["fail-slow-clear"].needs_gpu,
                                 doc="every fail-slow fault on the node cleared"),
    # Fleet-level faults: they act on the whole (simulated) agent.
    "node-lost": FaultSpec(False, fleet_only=True,
                           doc="the node stops reporting (server, agent or network gone)"),
    "node-back": FaultSpec(False, fleet_only=True, doc="a lost node reports again"),
    "straggler": FaultSpec(False, {
        "utilization": FaultParam("ratio", default=0.3, low=0.0, high=1.0,
                                  doc="every GPU's utilization, 0-1")},
        fleet_only=True, doc="every GPU of the node runs at low utilization"),
    # A fault of the demo's training job: the rank on the node fails for real.
    "rank-error": FaultSpec(False, {
        "error": FaultParam("choice", default="app-bug", choices=("app-bug", "ecc-error"),
                            doc="app-bug: an IndexError in the training code; ecc-error: "
                                "PyTorch's 'CUDA error: uncorrectable ECC error "
                                "encountered'")},
        job_only=True, doc="the job's rank on the node fails at its next step, its "
                           "traceback in its log (the demo only)"),
}

def demo_job_faults(scenario: Scenario) -> list[str]:
    """The faults of ``scenario`` that act on the demo's training job (only the demo's)."""
    return sorted({f.fault for f in scenario.faults if FAULT_SPECS[f.fault].job_only})


_TOP_KEYS = ("kind", "name", "description", "duration", "gpus", "faults")
_FAULT_KEYS = ("at", "node", "count", "gpu", "fault", "params", "repeat")
#: ``node: 0-23``: a range of node indices, both ends included.
_NODE_RANGE = re.compile(r"(\d+)-(\d+)")


@dataclass(frozen=True)
class ScenarioFault:
    """One fault of a scenario.

    ``node`` is an index, a name, or ``"*"`` (``count`` nodes, or a ``share`` of the
    fleet; neither: every node). ``params`` are complete: defaults filled in, checked.
    """

    at: float
    fault: str
    node: int | str
    count: int | None = None
    share: float | None = None
    gpu: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    line: int | None = None
    position: int = 0
    #: ``repeat: {count, every}``: the fault again ``repeats - 1`` times, ``every`` apart.
    repeats: int = 1
    every: float = 0.0

    def describe(self) -> str:
        """``overheat factor=1.8`` (the node and GPU are said by whoever plays it)."""
        extra = " ".join(f"{k}={v}" for k, v in self.params.items() if v is not None)
        return f"{self.fault} {extra}".rstrip()


@dataclass(frozen=True)
class PlannedFault:
    """A fault bound to fleet node indices: what the simulator plays at ``at``."""

    at: float
    fault: str
    nodes: tuple[int, ...]
    gpu: int | None
    params: dict[str, Any]
    source: ScenarioFault


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario file; faults sorted by time (ties keep the file's order)."""

    name: str
    path: str
    faults: tuple[ScenarioFault, ...]
    description: str = ""
    duration: float | None = None
    gpus: int = 8

    def resolve(self, nodes: int, names: list[str] | None = None) -> list[PlannedFault]:
        """Bind every fault to node indices of a fleet of ``nodes`` nodes named ``names``.

        ``"*"`` picks ``count`` distinct nodes (a share: rounded up), the same ones every
        run (the pick is seeded by the scenario's name and the fault's position). Raises
        ConfigError naming the fault when an index or name is not in the fleet.
        """
        by_name = {name: i for i, name in enumerate(names or [])}
        planned: list[PlannedFault] = []
        for fault in self.faults:
            where = f"faults[{fault.position}]"
            if fault.node == "*":
                count = fault.count
                if fault.share is not None:
                    count = max(1, math.ceil(fault.share * nodes))
                if count is None:
                    chosen: tuple[int, ...] = tuple(range(nodes))
                else:
                    if count > nodes:
                        raise ConfigError(self.path, f"{where}.count", fault.line,
                                          f"{count} nodes asked for, the fleet has {nodes}")
                    rng = random.Random(f"{self.name}/{fault.position}")
                    chosen = tuple(sorted(rng.sample(range(nodes), count)))
            elif isinstance(fault.node, str) and (span := _NODE_RANGE.fullmatch(fault.node)):
                first, last = int(span.group(1)), int(span.group(2))
                if last >= nodes:
                    raise ConfigError(self.path, f"{where}.node", fault.line,
                                      f"nodes {first}-{last} are not all in a fleet of "
                                      f"{nodes} nodes (0 to {nodes - 1})")
                chosen = tuple(range(first, last + 1))
            elif isinstance(fault.node, int):
                if fault.node >= nodes:
                    raise ConfigError(self.path, f"{where}.node", fault.line,
                                      f"node {fault.node} is not in a fleet of {nodes} "
                                      f"nodes (0 to {nodes - 1})")
                chosen = (fault.node,)
            else:
                index = by_name.get(fault.node)
                if index is None:
                    known = f" ({names[0]} to {names[-1]})" if names else ""
                    raise ConfigError(self.path, f"{where}.node", fault.line,
                                      f"no node named {fault.node!r} in the fleet{known}")
                chosen = (index,)
            planned.extend(PlannedFault(at=fault.at + k * fault.every, fault=fault.fault,
                                        nodes=chosen, gpu=fault.gpu,
                                        params=dict(fault.params), source=fault)
                           for k in range(fault.repeats))
        planned.sort(key=lambda p: (p.at, p.source.position))  # ties: the file's order
        return planned

    def check_gpus(self, gpus: int) -> None:
        """Every fault's GPU exists on nodes with ``gpus`` GPUs; ConfigError if not."""
        for fault in self.faults:
            if fault.gpu is not None and fault.gpu >= gpus:
                raise ConfigError(self.path, f"faults[{fault.position}].gpu", fault.line,
                                  f"{fault.fault} needs a gpu from 0 to {gpus - 1}")


def format_seconds(seconds: float) -> str:
    """``90`` -> ``1m30s``; ``0.5`` -> ``500ms``: durations as a scenario writes them."""
    if seconds < 1 and seconds != 0:
        return f"{seconds * 1000:g}ms"
    out = ""
    rest = seconds
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if rest >= size:
            whole = math.floor(rest / size)
            out += f"{whole}{unit}"
            rest -= whole * size
    if rest or not out:
        out += f"{rest:g}s"
    return out


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; ConfigError on any problem."""
    return parse_scenario(load_yaml(path))


def parse_scenario(doc: Document) -> Scenario:
    """Validate a parsed scenario file (see the module's docstring for the format)."""
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "a scenario is a mapping with kind: Scenario and faults: [...]")
    unknown = [k for k in data if k not in _TOP_KEYS]
    if unknown:
        raise unknown_key(doc, (unknown[0],), _TOP_KEYS)
    if data.get("kind") != "Scenario":
        raise doc.error(("kind",), f"must be Scenario; got {data.get('kind')!r}")
    name = data.get("name", Path(doc.path).stem)
    if not isinstance(name, str) or not name:
        raise doc.error(("name",), f"expected a name, got {name!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise doc.error(("description",), f"expected text, got {description!r}")
    duration = None
    if "duration" in data:
        duration = _duration(doc, ("duration",), data["duration"])
        if duration <= 0:
            raise doc.error(("duration",), "must be greater than 0")
    gpus = data.get("gpus", 8)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 64:
        raise doc.error(("gpus",), f"expected a GPU count from 1 to 64, got {gpus!r}")
    if "faults" not in data:
        raise doc.error((), "missing required key 'faults'")
    faults_data = data["faults"]
    if faults_data is None:
        faults_data = []
    if not isinstance(faults_data, list):
        raise doc.error(("faults",), "expected a list of faults")
    faults = [_fault(doc, i, item, gpus, duration) for i, item in enumerate(faults_data)]
    faults.sort(key=lambda f: f.at)
    return Scenario(name=name, path=doc.path, faults=tuple(faults), description=description,
                    duration=duration, gpus=gpus)


def _duration(doc: Document, key: KeyPath, value: Any) -> float:
    try:
        return parse_duration(value)
    except ValueError as err:
        raise doc.error(key, str(err)) from None


def _fault(doc: Document, i: int, item: Any, gpus: int, duration: float | None
           ) -> ScenarioFault:
    """``faults[i]`` checked: its kind, time, nodes, GPU, parameters and repeats."""
    key: KeyPath = ("faults", i)
    fault, spec = _fault_kind(doc, key, item)
    at = _duration(doc, (*key, "at"), item["at"])
    if duration is not None and at > duration:
        raise doc.error((*key, "at"), f"{format_seconds(at)} is after the scenario's "
                                      f"duration ({format_seconds(duration)})")
    node = item["node"]
    if isinstance(node, bool) or not (
            (isinstance(node, int) and node >= 0) or (isinstance(node, str) and node)):
        raise doc.error((*key, "node"), 'expected a node index (0, 1, ...), a node name '
                                        f'or "*", got {node!r}')
    count, share = None, None
    if node == "*" and "count" in item:
        count, share = _node_count(doc, (*key, "count"), item["count"])
    gpu = _fault_gpu(doc, key, item, fault, spec, gpus)
    given, params_key = _given_params(doc, key, item, node_count=node == "*")
    params = _params(doc, key, params_key, fault, spec, given, item)
    if isinstance(node, str) and (span := _NODE_RANGE.fullmatch(node)) and (
            int(span.group(1)) > int(span.group(2))):
        raise doc.error((*key, "node"), f"a range runs from low to high (2-5), got {node!r}")
    repeats, every = _repeat(doc, (*key, "repeat"), item.get("repeat"), at, duration)
    return ScenarioFault(at=at, fault=fault, node=node, count=count, share=share,
                         gpu=gpu, params=params, line=doc.line(key), position=i,
                         repeats=repeats, every=every)


def _fault_kind(doc: Document, key: KeyPath, item: Any) -> tuple[str, FaultSpec]:
    """A fault's mapping has its required keys and names a known fault: (name, spec)."""
    if not isinstance(item, dict):
        raise doc.error(key, "expected a mapping such as {at: 30s, node: 3, gpu: 5, "
                             "fault: overheat}")
    for required in ("at", "node", "fault"):
        if required not in item:
            raise doc.error(key, f"missing required key '{required}'")
    fault = item["fault"]
    spec = FAULT_SPECS.get(fault) if isinstance(fault, str) else None
    if spec is None:
        raise doc.error((*key, "fault"), f"unknown fault {fault!r} (known: "
                                         f"{', '.join(sorted(FAULT_SPECS))})")
    return str(fault), spec


def _fault_gpu(doc: Document, key: KeyPath, item: dict[str, Any], fault: str,
               spec: FaultSpec, gpus: int) -> int | None:
    """The fault's GPU: one from 0 to ``gpus - 1`` if it needs one, else none."""
    gpu = item.get("gpu")
    if spec.needs_gpu:
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < gpus:
            raise doc.error((*key, "gpu") if "gpu" in item else key,
                            f"{fault} needs a gpu from 0 to {gpus - 1}")
        return gpu
    if gpu is not None:
        raise doc.error((*key, "gpu"), f"{fault} takes no gpu")
    return None


def _given_params(doc: Document, key: KeyPath, item: dict[str, Any], *, node_count: bool
                  ) -> tuple[dict[str, Any], KeyPath]:
    """The parameters given inline and under ``params:``, and the key path of the latter.

    ``node_count``: a ``count`` beside the fault is the number of nodes (``node: "*"``),
    not the fault's own parameter.
    """
    given = {k: v for k, v in item.items() if k not in _FAULT_KEYS}
    if "count" in item and not node_count:
        given["count"] = item["count"]
    if "params" not in item:
        return given, key
    extra = item["params"]
    if not isinstance(extra, dict):
        raise doc.error((*key, "params"), "expected a mapping of the fault's parameters")
    for name in extra:
        if name in given:
            raise doc.error((*key, "params", name), "given both inline and in params")
    given.update(extra)
    return given, (*key, "params")


def _repeat(doc: Document, key: KeyPath, value: Any, at: float, duration: float | None
            ) -> tuple[int, float]:
    """``repeat: {count: 600, every: 1s}``: (how many times in all, seconds apart)."""
    if value is None:
        return 1, 0.0
    if not isinstance(value, dict) or set(value) != {"count", "every"}:
        raise doc.error(key, "expected {count: N, every: DURATION} (the fault N times in "
                             "all, DURATION apart)")
    count = value["count"]
    if isinstance(count, bool) or not isinstance(count, int) or not 2 <= count <= 100_000:
        raise doc.error((*key, "count"), f"expected a count from 2 to 100000, got {count!r}")
    every = _duration(doc, (*key, "every"), value["every"])
    if every <= 0:
        raise doc.error((*key, "every"), "must be greater than 0")
    last = at + (count - 1) * every
    if duration is not None and last > duration:
        raise doc.error(key, f"the last repeat ({format_seconds(last)}) is after the "
                             f"scenario's duration ({format_seconds(duration)})")
    return count, every


def _node_count(doc: Document, key: KeyPath, value: Any) -> tuple[int | None, float | None]:
    """``count`` next to ``node: "*"``: a number of nodes, or a share such as ``25%``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value, None
    if isinstance(value, str) and value.endswith("%"):
        try:
            percent = float(value[:-1])
        except ValueError:
            percent = math.nan
        if 0 < percent <= 100:
            return None, percent / 100
    raise doc.error(key, f"expected a number of nodes (1 or more) or a share of the fleet "
                         f"such as 25%, got {value!r}")


def _params(doc: Document, key: KeyPath, params_key: KeyPath, fault: str, spec: FaultSpec,
            given: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in given.items():
        where = (*key, name) if name in item else (*params_key, name)
        param = spec.params.get(str(name))
        if param is None:
            takes = ", ".join(spec.params) or "no parameters"
            raise doc.error(where, f"{fault} takes no parameter {name!r} (it takes: {takes})")
        out[str(name)] = _param_value(doc, where, param, value)
    for name, param in spec.params.items():
        if name not in out:
            if param.required:
                raise doc.error(key, f"{fault} needs {name} ({param.doc})")
            out[name] = param.default
    return out


def _param_value(doc: Document, where: KeyPath, param: FaultParam, value: Any) -> Any:
    if value is None and param.nullable:
        return None
    if param.kind == "string":
        if not isinstance(value, str):
            raise doc.error(where, f"expected text, got {value!r}")
        return value
    if param.kind == "choice":
        if value not in param.choices:
            raise doc.error(where, f"must be one of {', '.join(param.choices)}; got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            param.kind == "int" and not isinstance(value, int)):
        wanted = "a whole number" if param.kind == "int" else "a number"
        raise doc.error(where, f"expected {wanted}, got {value!r}")
    low = param.low if param.low is not None else -math.inf
    high = param.high if param.high is not None else math.inf
    if not low <= value <= high:
        raise doc.error(where, f"must be from {low:g} to {high:g}, got {value!r}")
    return int(value) if param.kind == "int" else float(value)


# ---------------------------------------------------------------- the packaged scenarios


def packaged_scenario_names() -> list[str]:
    """Names of the scenarios shipped in the package (``default``, ``thermal``, ...)."""
    folder = resources.files("sn_monitor.sim").joinpath("scenarios")
    return sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir()
                  if entry.name.endswith(".yaml"))


def packaged_scenario(name: str) -> Scenario:
    """A scenario shipped in the package, by name; ConfigError if there is none."""
    entry = resources.files("sn_monitor.sim").joinpath("scenarios").joinpath(f"{name}.yaml")
    if not entry.is_file():
        raise ConfigError(name, "", None, "no such scenario file, and no packaged scenario "
                                          f"of that name (packaged: "
                                          f"{', '.join(packaged_scenario_names())})")
    return parse_scenario(parse_yaml(entry.read_text(encoding="utf-8"), str(entry)))


def find_scenario(name_or_path: str) -> Scenario:
    """A scenario file by path, else a packaged scenario by name."""
    path = Path(name_or_path)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        return load_scenario(path)
    return packaged_scenario(name_or_path)
