"""``sn-monitor simulate``: thousands of simulated agents in one process, against any controller.

The fleet is light enough that 8,192 simulated nodes run beside a controller on a
2-core machine, so it skips what one simulated agent has (a /proc and /sys tree, the
fake NVML, the collectors) and keeps what the controller sees: the reports.

- **Values.** A handful of base reports are made from the GPU model
  (:class:`~sn_monitor.sim.gpu_model.SimulatedGpu`, warmed up to working temperature;
  the InfiniBand ports and interfaces of :mod:`~sn_monitor.sim.node_tree` with their
  error counters at zero). A healthy node's report is one of them with its own head
  (node name, instance, sequence, sample time, labels): the JSON is pre-encoded in
  slices and joined per report, so a report costs the fleet a few microseconds. Nodes
  step through the variants, so values move from one report to the next.
- **Faults.** A node that has been hit by a fault gets its own state: each faulted GPU
  becomes a real ``SimulatedGpu`` (thermal model, power cap, ECC, NVLink, PCIe), stepped
  by the simulated time between its reports, and the same fault handlers as a simulated
  agent's ``POST /sim/fault`` (:data:`sn_monitor.sim.node.FAULTS`) act on it. Its report
  is then encoded from structs (still well under a millisecond). Only faulted nodes pay.
  Fleet-level faults: ``node-lost`` (the node stops reporting), ``node-back``,
  ``straggler`` (every GPU of the node at low utilization).
- **Events and commands.** XIDs (and a GPU falling off the bus) become events numbered
  per node, sent with every report until ``events_stored_through`` covers them.
  Commands in a reply are carried out (``throttle`` caps the GPU's power, so the thermal
  model cools it; ``release`` restores the limit) and their results go out with the
  node's next report. There is no local thermal guard: the controller's throttle is
  what cools a simulated GPU.
- **Topology.** Every node is the same simulated HGX H100 (:func:`sn_monitor.sim.hgx.
  simulated_topology`, built once): the templates carry its digest, and a node's first
  report, and the next one after a reply said ``topology_wanted``, carries the topology
  itself (encoded from structs, and asking for an answer on a stream).
- **Node-local rules.** Like an agent, each node says it takes rules; once the reply to
  one of its reports carries the controller's node-local rules, it evaluates them itself
  (:class:`~sn_monitor.agent.rules.NodeRules`, on faulted nodes; a healthy node's values
  fire none, which the templates check) and sends trimmed reports with its findings,
  pre-encoded per rules version as the full ones are. ``--full-reports`` sends full
  reports throughout, as agents before edge rules do, for the controller to evaluate.
- **Sending.** One thread, a few connections (``selectors``), each node reporting every
  ``interval`` with jitter, the first reports spread over the first interval so the
  load is even. Each connection is a reports' stream (:mod:`sn_monitor.report_stream`),
  as an agent's is: reports go out as they fall due, and a node asks for an answer as an
  agent does (its first report, one carrying events or command results, and one every
  :data:`~sn_monitor.report_stream.ASK_EVERY_SECONDS`), so a node waits only for those.
  ``--post-reports`` (or a controller without streams, which answers the upgrade 404)
  posts every report as agents of an earlier version do, one request in flight per
  keep-alive connection: a report due while every connection is busy waits. That wait
  is the *schedule lag*; a report overdue by more than an interval is not sent and
  counted (the fleet or the controller cannot keep up). Latency is from sending a report
  to reading its answer (on a stream, of the reports that asked for one). At the end
  each stream sends one more report that asks, so that the answers count every report
  the streams carried.

The scenario (:mod:`sn_monitor.sim.scenario`) plays on the fleet by node index, in
simulated time: wall time since the start times ``speed``.
"""

from __future__ import annotations

import heapq
import math
import random
import selectors
import socket
import ssl
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

import msgspec

from sn_monitor import __version__
from sn_monitor.agent.collectors.infiniband import counter_stem
from sn_monitor.agent.nvml import THROTTLE_REASONS
from sn_monitor.agent.report import is_reported_ib_counter
from sn_monitor.agent.rules import NodeRules
from sn_monitor.agent.settings import VerifySettings
from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot, NvLinkSample
from sn_monitor.agent.stream import StreamAnswer
from sn_monitor.agent.verify import snapshot_checks
from sn_monitor.clock import SystemClock
from sn_monitor.config import ConfigError
from sn_monitor.model import (
    MAX_EVENTS,
    Command,
    CommandResult,
    EdgeRules,
    EventRecord,
    GpuReport,
    HostReport,
    IbPortReport,
    NetReport,
    NodeTopology,
    Report,
    topology_digest,
)
from sn_monitor.report_stream import (
    ACK,
    ASK_EVERY_SECONDS,
    NO_STREAM_STATUSES,
    FrameReader,
    frame,
    opening,
)
from sn_monitor.rules.series import Trim
from sn_monitor.sim.gpu_model import (
    FABRIC_COMPLETED,
    H100_SXM,
    GpuProfile,
    SimulatedGpu,
    make_gpus,
)
from sn_monitor.sim.hgx import simulated_topology
from sn_monitor.sim.node import FAULTS, FaultError, SimulatedNode
from sn_monitor.sim.node_tree import DEFAULT_IB_DEVICES, IB_COUNTER_FILES, IB_HW_COUNTER_FILES
from sn_monitor.sim.scenario import NETDEVS, PlannedFault, Scenario, format_seconds
from sn_monitor.transport import describe_failure, error_text

REPORTS_PATH = "/api/v1/reports"
#: Distinct base reports the healthy nodes step through.
VARIANTS = 8
#: A request with no full response after this long fails and its connection is closed.
REQUEST_TIMEOUT_SECONDS = 10.0
#: A kept-alive connection unused this long is replaced before its next request: servers
#: close idle ones (uvicorn after 5 s), and a request sent as the server closes is lost.
STALE_AFTER_SECONDS = 4.0
#: Latencies kept for the percentiles (a uniform sample beyond this many).
MAX_SAMPLES = 200_000
_STATE_ACTIVE, _STATE_DOWN = 4, 1
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True)
class FleetOptions:
    """What ``sn-monitor simulate`` was asked to do."""

    controller: str
    nodes: int = 1000
    interval: float = 1.0
    duration: float | None = None
    speed: float = 1.0
    gpus: int = 8
    connections: int = 16
    jitter: float = 0.1
    seed: int = 0
    token: str | None = None
    #: The CA bundle an https controller's certificate must chain to (None: the system's).
    ca_file: str | None = None
    #: The index of the first node: ``--first 256 --nodes 256`` is the second supernode of
    #: 256 nodes (``sim-0256`` .., labels ``supernode: sn01``), for one fleet of several
    #: controllers (a ``simulate`` each).
    first: int = 0
    #: Send full reports throughout (agents of a version before node-local rules).
    full_reports: bool = False
    #: Post every report (agents of a version before the reports' stream).
    post_reports: bool = False


def node_name(index: int, nodes: int) -> str:
    """``sim-0007``: zero-padded to at least 4 digits, wider for fleets past 10,000."""
    return f"sim-{index:0{max(4, len(str(nodes - 1)))}d}"


def node_labels(index: int) -> dict[str, str]:
    """A node's labels: 256 nodes a supernode, 8 a rack, 32 a job (the peers group).

    Eight 8-GPU servers fill a liquid-cooled rack (an air-cooled one holds four, as the
    demo's supernode has them).
    """
    return {"job": f"job-{index // 32:03d}", "rack": f"r{index // 8:03d}",
            "supernode": f"sn{index // 256:02d}"}


# ---------------------------------------------------------------- values


def gpu_values(gpu: SimulatedGpu) -> GpuReport:
    """One simulated GPU's values as the agent would report them (no NVML in between)."""
    p = gpu.profile
    if gpu.lost:
        return GpuReport(index=gpu.index, uuid=gpu.uuid, lost=True)
    reasons = [name for name, bit in THROTTLE_REASONS if gpu.clock_event_reasons & bit]
    links = gpu.nvlinks
    return GpuReport(
        index=gpu.index, uuid=gpu.uuid,
        utilization_ratio=round(min(1.0, max(0.0, gpu.utilization)), 2),
        memory_bandwidth_utilization_ratio=round(min(1.0, max(0.0, gpu.dram_utilization)), 3),
        memory_used_bytes=gpu.memory_used_bytes, memory_total_bytes=p.memory_total_bytes,
        temperature_celsius=float(int(gpu.temperature_celsius)),
        memory_temperature_celsius=float(int(gpu.memory_temperature_celsius)),
        slowdown_temperature_celsius=p.slowdown_celsius,
        shutdown_temperature_celsius=p.shutdown_celsius,
        memory_max_temperature_celsius=p.memory_max_celsius,
        power_watts=round(gpu.power_watts, 3), power_limit_watts=gpu.power_limit_watts,
        power_default_limit_watts=p.power_default_limit_watts,
        sm_clock_hertz=gpu.sm_clock_mhz * 1e6, throttle_reasons=reasons,
        ecc_corrected_errors_total=gpu.ecc_corrected,
        ecc_uncorrected_errors_total=gpu.ecc_uncorrected,
        remapped_rows_correctable=gpu.remapped_rows_correctable,
        remapped_rows_uncorrectable=gpu.remapped_rows_uncorrectable,
        row_remap_pending=gpu.row_remap_pending, row_remap_failed=gpu.row_remap_failed,
        pcie_replays_total=gpu.pcie_replays,
        pcie_link_generation=gpu.pcie_generation, pcie_link_generation_max=p.pcie_generation,
        pcie_link_width=gpu.pcie_width, pcie_link_width_max=p.pcie_width,
        nvlink_crc_errors_total=sum(x.crc_flit_errors + x.crc_data_errors for x in links),
        nvlink_replay_errors_total=sum(x.replay_errors for x in links),
        nvlink_recovery_errors_total=sum(x.recovery_errors for x in links),
        nvlinks_down=sum(1 for x in links if not x.up),
        fabric_state=gpu.fabric_state if p.fabric_supported else None,
        fabric_status=(gpu.fabric_status if p.fabric_supported
                       and gpu.fabric_state == FABRIC_COMPLETED else None),
        processes=len(gpu.processes),
    )


def _ib_counters() -> dict[str, int]:
    out: dict[str, int] = {}
    for name in IB_COUNTER_FILES + IB_HW_COUNTER_FILES:
        stem = counter_stem(name)
        if stem is not None and is_reported_ib_counter(stem):
            out[stem] = 0
    return out


def fleet_topology(gpus: int, profile: GpuProfile = H100_SXM, seed: int = 0) -> NodeTopology:
    """The topology every simulated node of the fleet reports (GPUs as in base_reports)."""
    models = make_gpus(gpus, profile, seed=seed)
    return simulated_topology([(g.uuid, g.pci_bus_id, len(g.nvlinks)) for g in models],
                              seed=seed)


def base_reports(gpus: int, variants: int = VARIANTS, profile: GpuProfile = H100_SXM,
                 seed: int = 0, digest: str = "") -> list[Report]:
    """``variants`` reports of one healthy node at working temperature, 2 s apart.

    ``digest``: the topology digest they carry (:func:`fleet_topology`'s).
    """
    models = make_gpus(gpus, profile, seed=seed)
    for gpu in models:
        gpu.step(150.0)  # ~5 thermal time constants
    counters = _ib_counters()
    infiniband = [IbPortReport(device=d, port=1, state=_STATE_ACTIVE, counters=counters)
                  for d in DEFAULT_IB_DEVICES]
    network = [NetReport(device=d, carrier_up=True, carrier_changes_total=2,
                         receive_errors_total=0, transmit_errors_total=0,
                         receive_drops_total=0, transmit_drops_total=0) for d in NETDEVS]
    out = []
    for _ in range(variants):
        for gpu in models:
            gpu.step(2.0)
        out.append(Report(node="x", instance="x", sequence=0, sample_time_seconds=0.0,
                          agent_version=__version__, gpus=[gpu_values(g) for g in models],
                          infiniband=infiniband, network=network,
                          host=HostReport(processes_stuck=0), topology_digest=digest))
    return out


# ---------------------------------------------------------------- per-node state


class _Tree:
    """The part of :class:`~sn_monitor.sim.node_tree.SimulatedNodeTree` faults call."""

    def __init__(self) -> None:
        self.ib_down: set[str] = set()
        self.link_downed: Counter[str] = Counter()
        self.symbol_errors: Counter[str] = Counter()
        self.carrier_changes: Counter[str] = Counter()
        self.stuck_processes = 0

    @staticmethod
    def _ib(device: str) -> str:
        if device not in DEFAULT_IB_DEVICES:
            raise KeyError(f"no RDMA device {device!r}")
        return device

    def set_ib_port_down(self, device: str) -> None:
        if self._ib(device) not in self.ib_down:
            self.ib_down.add(device)
            self.link_downed[device] += 1

    def set_ib_port_up(self, device: str) -> None:
        self.ib_down.discard(self._ib(device))

    def flap_ib_port(self, device: str) -> None:
        self.link_downed[self._ib(device)] += 1

    def add_ib_symbol_errors(self, device: str, n: int) -> None:
        if n < 0:
            raise ValueError("a counter does not go backwards")
        self.symbol_errors[self._ib(device)] += n

    def _fail_slow(self, *_args: object) -> None:
        raise ValueError("port fail-slow faults are played by simulated agents "
                         "(sn-monitor agent --simulate), not by simulate's template reports")

    congest_ib_port = degrade_ib_port = _fail_slow
    ib_devices = DEFAULT_IB_DEVICES

    def clear_ib_port_fail_slow(self, device: str) -> None:
        self._ib(device)  # nothing to clear: no port fail-slow fault plays here

    def add_stuck_process(self, name: str = "python", count: int = 1) -> None:
        if count < 1:
            raise ValueError("count must be >= 1")
        self.stuck_processes += count  # no agent: stuck at once, not after stuck_after

    def clear_stuck_processes(self) -> None:
        self.stuck_processes = 0

    def flap_carrier(self, netdev: str) -> None:
        if netdev not in NETDEVS:
            raise KeyError(f"no network interface {netdev!r}")
        self.carrier_changes[netdev] += 2


class _Gpus:
    """``node.gpus[i]`` for the fault handlers: a faulted GPU's model, made on first use."""

    def __init__(self, state: _FaultState) -> None:
        self._state = state

    def __getitem__(self, index: int) -> SimulatedGpu:
        return self._state.gpu(index)

    def __len__(self) -> int:
        return self._state.gpu_count


class _FaultState:
    """What a fault changed on one node; duck-types the SimulatedNode that FAULTS expects."""

    def __init__(self, node: _Node, base: Report, gpu_count: int, sim_now: float) -> None:
        self._node = node
        self._base = base
        self.gpu_count = gpu_count
        self.models: dict[int, SimulatedGpu] = {}
        self.was_lost: set[int] = set()
        self.tree = _Tree()
        self.gpus = _Gpus(self)
        self.sim_time = sim_now
        #: NVML wedged (``nvml-hang``): the node reports no GPU values, as its agent would.
        self.nvml_hung = False

    def gpu(self, index: int) -> SimulatedGpu:
        if not 0 <= index < self.gpu_count:
            raise IndexError(f"no GPU {index}")
        model = self.models.get(index)
        if model is None:
            base = self._base.gpus[index]
            model = SimulatedGpu(index, H100_SXM, seed=self._node.index * 64 + index,
                                 uuid_text=base.uuid)
            if base.temperature_celsius is not None:
                model.temperature_celsius = base.temperature_celsius
            model.step(1.0)  # utilization, power and clocks as under load
            self.models[index] = model
        return model

    def inject_xid(self, gpu: int, code: int, message: str = "Simulated fault") -> None:
        model = self.gpu(gpu)
        self._node.event("xid", f"Xid {code}: {message}", gpu=gpu, code=code,
                         pci_bus_id=model.pci_bus_id)

    def fall_off_bus(self, gpu: int) -> None:
        self.gpu(gpu).fall_off_bus()  # queues XID 79; the next report says the rest

    def hang_nvml(self) -> None:
        if not self.nvml_hung:
            self.nvml_hung = True
            self._node.event("collector_stuck", "collector nvml has not returned for 5 s "
                             "(deadline 5 s): simulated nvml-hang", source="agent")

    def release_nvml(self) -> None:
        self.nvml_hung = False

    def advance(self, sim_now: float) -> None:
        """Step the faulted GPUs to ``sim_now``; turn what they logged into events."""
        dt = max(0.0, sim_now - self.sim_time)
        self.sim_time = sim_now
        for index, model in self.models.items():
            if dt > 0:
                model.step(dt)
            while model.xid_log:
                code = model.xid_log.pop(0)
                text = "GPU has fallen off the bus." if code == 79 else "Simulated fault"
                self._node.event("xid", f"Xid {code}: {text}", gpu=index, code=code,
                                 pci_bus_id=model.pci_bus_id)
            if model.lost and index not in self.was_lost:
                self.was_lost.add(index)
                self._node.event("gpu_fallen_off_bus", "GPU has fallen off the bus",
                                 gpu=index, pci_bus_id=model.pci_bus_id)

    def report_parts(self, base: Report) -> dict[str, Any]:
        """The gpus / infiniband / network lists of this node's report."""
        gpus = [] if self.nvml_hung else [
            gpu_values(self.models[g.index]) if g.index in self.models else g
            for g in base.gpus]
        tree = self.tree
        infiniband = base.infiniband
        if tree.ib_down or tree.link_downed or tree.symbol_errors:
            infiniband = []
            for port in base.infiniband:
                d = port.device
                if d in tree.ib_down or d in tree.link_downed or d in tree.symbol_errors:
                    counters = dict(port.counters)
                    counters["link_downed"] = counters.get("link_downed", 0) + \
                        tree.link_downed[d]
                    counters["symbol_errors"] = counters.get("symbol_errors", 0) + \
                        tree.symbol_errors[d]
                    port = msgspec.structs.replace(
                        port, counters=counters,
                        state=_STATE_DOWN if d in tree.ib_down else _STATE_ACTIVE)
                infiniband.append(port)
        network = base.network
        if tree.carrier_changes:
            network = [msgspec.structs.replace(
                n, carrier_changes_total=(n.carrier_changes_total or 0)
                + tree.carrier_changes[n.device]) for n in base.network]
        host = base.host
        if tree.stuck_processes:
            host = HostReport(processes_stuck=tree.stuck_processes)
        return {"gpus": gpus, "infiniband": infiniband, "network": network, "host": host}


def remedy(command: Command, state: _FaultState, now: float) -> CommandResult:
    """A simulated node's reset, reboot or verification, on its GPU models.

    The agent's own checks (:func:`~sn_monitor.agent.verify.snapshot_checks`) judge a
    snapshot made from the models; what a reset or a reboot clears is the models' own
    (:meth:`SimulatedGpu.reset`, :meth:`SimulatedGpu.power_cycle`).
    """
    if command.kind == "reset_gpu":
        assert command.gpu is not None
        state.gpu(command.gpu).reset()
        return CommandResult(id=command.id, ok=True, time_seconds=now,
                             message=f"reset GPU {command.gpu}: simulated reset done")
    if command.kind == "reboot":
        for index in range(state.gpu_count):
            state.gpu(index).power_cycle()
        return CommandResult(id=command.id, ok=True, time_seconds=now,
                             message="reboot: simulated reboot done (every GPU power-cycled)")
    snapshot = NodeSnapshot(node="sim", timestamp_seconds=now, gpus=tuple(
        _verified_sample(state.gpu(i)) for i in range(state.gpu_count)))
    checks = snapshot_checks(snapshot, VerifySettings(dcgm_level=0), state.gpu_count)
    failed = [c.name for c in checks if not c.ok]
    return CommandResult(id=command.id, ok=not failed, time_seconds=now, checks=checks,
                         message=("verification failed: " + ", ".join(failed)) if failed
                         else f"verification passed: {len(checks)} checks")


def _verified_sample(gpu: SimulatedGpu) -> GpuSample:
    """What the checks read of a simulated GPU (the agent reads it through NVML)."""
    return GpuSample(
        index=gpu.index, uuid=gpu.uuid, name=gpu.profile.name, pci_bus_id=gpu.pci_bus_id,
        lost=gpu.lost, utilization_ratio=gpu.utilization,
        temperature_celsius=gpu.temperature_celsius,
        slowdown_temperature_celsius=gpu.profile.slowdown_celsius,
        ecc_uncorrected_errors_total=gpu.ecc_uncorrected,
        row_remap_pending=gpu.row_remap_pending, row_remap_failed=gpu.row_remap_failed,
        pcie_link_generation=gpu.pcie_generation,
        pcie_link_generation_max=gpu.profile.pcie_generation,
        pcie_link_width=gpu.pcie_width, pcie_link_width_max=gpu.profile.pcie_width,
        nvlinks=tuple(NvLinkSample(link=i, up=link.up) for i, link in enumerate(gpu.nvlinks)))


class _Node:
    """One simulated agent: its sequence, events, command results and faults."""

    __slots__ = ("asked_at", "events", "faults", "head", "in_flight", "index", "labels",
                 "lost", "name", "next_event_id", "results", "results_in_flight", "rules",
                 "rules_version", "sequence", "topology_due")

    def __init__(self, index: int, name: str, head: bytes, labels: bytes,
                 first_event_id: int) -> None:
        self.index = index
        self.name = name
        self.head = head
        self.labels = labels
        self.sequence = 0
        self.lost = False
        self.in_flight = False
        self.faults: _FaultState | None = None
        self.events: list[EventRecord] = []
        self.next_event_id = first_event_id
        self.results: list[CommandResult] = []
        self.results_in_flight = 0
        #: The version of the node-local rules it evaluates ("": none yet), and their
        #: evaluator once the node had to evaluate them (a fault, an event).
        self.rules_version = ""
        self.rules: NodeRules | None = None
        #: Monotonic time it last asked for an answer on a stream.
        self.asked_at = -math.inf
        #: Its next report carries the topology (the first, and after topology_wanted).
        self.topology_due = True

    def event(self, kind: str, message: str, *, gpu: int | None = None,
              code: int | None = None, pci_bus_id: str | None = None,
              source: str = "kmsg") -> None:
        self.events.append(EventRecord(
            id=self.next_event_id, kind=kind, source=source,  # type: ignore[arg-type]
            time_seconds=time.time(), message=message, gpu=gpu, code=code,
            pci_bus_id=pci_bus_id))
        self.next_event_id += 1

    @property
    def slow(self) -> bool:
        """Whether this node's report must be encoded from structs (not the template)."""
        return (self.faults is not None or bool(self.events) or bool(self.results)
                or self.topology_due)


class _Reply(msgspec.Struct):
    """:class:`~sn_monitor.model.ReportReply`, commands left raw to decode one by one."""

    sequence: int = 0
    events_stored_through: int = -1
    commands: list[msgspec.Raw] = []
    edge_rules: EdgeRules | None = None
    topology_wanted: bool = False


class _CommandId(msgspec.Struct):
    id: str = ""


# ---------------------------------------------------------------- statistics


class _Samples:
    """A bounded uniform sample of measurements (reservoir), for percentiles."""

    def __init__(self, rng: random.Random) -> None:
        self.values: list[float] = []
        self.seen = 0
        self.max = 0.0
        self._rng = rng

    def add(self, value: float) -> None:
        self.seen += 1
        self.max = max(self.max, value)
        if len(self.values) < MAX_SAMPLES:
            self.values.append(value)
        else:
            slot = self._rng.randrange(self.seen)
            if slot < MAX_SAMPLES:
                self.values[slot] = value

    def summary(self) -> dict[str, float | int | None]:
        ordered = sorted(self.values)

        def pick(q: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

        return {"n": self.seen, "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99),
                "max": round(self.max, 3) if ordered else None}


@dataclass
class FleetStats:
    """What the controller answered, and what the fleet did."""

    sent: int = 0
    accepted: int = 0
    refused: Counter[int] = field(default_factory=Counter)
    server_errors: Counter[int] = field(default_factory=Counter)
    connection_errors: int = 0
    timeouts: int = 0
    not_sent: int = 0
    lost_skipped: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    events_sent: int = 0
    events_acknowledged: int = 0
    messages: Counter[str] = field(default_factory=Counter)
    faults_played: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(self.server_errors.values()) + self.connection_errors + self.timeouts

    def note(self, message: str) -> None:
        """Keep a refusal or error message (the first 20 distinct ones, counted)."""
        if message in self.messages or len(self.messages) < 20:
            self.messages[message] += 1


# ---------------------------------------------------------------- connections


class _Connection:
    __slots__ = ("buffer", "node", "opening", "retry_at", "sent_at", "sent_results", "sock",
                 "stream", "used_at", "waiting")

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.buffer = b""
        self.node: _Node | None = None
        self.sent_at = 0.0
        self.used_at = 0.0
        self.sent_results = 0
        self.retry_at = 0.0
        #: A stream: upgrade asked, not yet answered; then its frames (None: posting).
        self.opening = False
        self.stream: FrameReader | None = None
        #: A stream's reports that asked for an answer: (node index, sequence) -> when.
        self.waiting: dict[tuple[int, int], float] = {}


class Fleet:
    """N simulated agents reporting to one controller; :meth:`run` until stopped."""

    def __init__(self, options: FleetOptions, scenario: Scenario | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        if options.nodes < 1 or options.first < 0 or options.interval <= 0 or options.speed <= 0:
            raise ValueError("nodes, interval and speed must be positive, first not negative")
        self.options = options
        url = urlsplit(options.controller)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"expected an http(s)://host:port controller URL, got "
                             f"{options.controller!r}")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        if url.scheme == "https":
            try:
                self.tls: ssl.SSLContext | None = ssl.create_default_context(
                    cafile=options.ca_file)
            except (OSError, ssl.SSLError) as err:
                raise ValueError(f"--ca-file {options.ca_file}: {err}") from None
        else:
            self.tls = None
        #: The controller URL's own path, before the API's paths.
        self.prefix = url.path.rstrip("/")
        self.path = self.prefix + REPORTS_PATH
        #: Reports go on streams (False: posted, by choice or because the controller has
        #: no streams).
        self.streams = not options.post_reports
        self.progress = progress
        self.rng = random.Random(options.seed)
        self.instance = uuid.uuid4().hex
        end = options.first + options.nodes
        self.names = [node_name(options.first + i, end) for i in range(options.nodes)]
        self.plan: list[PlannedFault] = []
        if scenario is not None:
            scenario.check_gpus(options.gpus)
            self.plan = scenario.resolve(options.nodes, self.names)
        self.scenario = scenario
        self.stats = FleetStats()
        self.latency = _Samples(self.rng)
        self.lag = _Samples(self.rng)
        self.elapsed = 0.0
        self.cpu_seconds = 0.0
        self._build_templates()

    # ------------------------------------------------------------ templates

    def _build_templates(self) -> None:
        takes = not self.options.full_reports
        #: The topology every node reports, and its digest (in every template).
        self.topology = fleet_topology(self.options.gpus, seed=self.options.seed)
        self.topology_digest = topology_digest(self.topology)
        self.bases = [msgspec.structs.replace(r, takes_rules=takes)
                      for r in base_reports(self.options.gpus, seed=self.options.seed,
                                            digest=self.topology_digest)]
        #: The tails of the pre-encoded reports by rules version ("": full reports): with
        #: the values the controller's rules read, without them, and one report in how
        #: many carries them (EdgeRules.keep_every).
        whole = [_tail(r) for r in self.bases]
        self.tails: dict[str, tuple[list[bytes], list[bytes], int]] = {"": (whole, whole, 1)}
        self.edge: dict[str, EdgeRules] = {}
        sample = msgspec.structs.replace(self.bases[0], interval_seconds=self.interval_field,
                                         labels={"x": "y"})
        full = _encoder.encode(sample)
        self.mid = full[full.index(b',"agent_version":'):full.index(b',"labels":')] \
            + b',"labels":'
        first_event_id = int(time.time() * 1000)  # ids keep rising across runs
        self.nodes = [
            _Node(i, name, b'{"node":' + _encoder.encode(name) + b',"instance":'
                  + _encoder.encode(self.instance) + b',"sequence":',
                  _encoder.encode(node_labels(self.options.first + i)), first_event_id)
            for i, name in enumerate(self.names)]
        auth = f"Authorization: Bearer {self.options.token}\r\n" if self.options.token else ""
        self.header = (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                       f"Content-Type: application/json\r\nUser-Agent: sn-monitor-simulate/"
                       f"{__version__}\r\n{auth}Content-Length: ").encode()
        self.upgrade = opening(self.prefix, self.host, self.port,
                               f"sn-monitor-simulate/{__version__}", self.options.token)
        self.index_of = {name: i for i, name in enumerate(self.names)}
        # The slices must make exactly the report they stand for.
        body = self.fast_body(self.nodes[-1], 7, 1.5)
        expected = msgspec.structs.replace(
            self.bases[(self.nodes[-1].index + 7) % len(self.bases)], node=self.names[-1],
            instance=self.instance, sequence=7, sample_time_seconds=1.5,
            interval_seconds=self.interval_field,
            labels=node_labels(self.options.first + self.nodes[-1].index))
        if msgspec.json.decode(body, type=Report) != expected:
            raise RuntimeError("report template does not round-trip")

    def _take_rules(self, edge: EdgeRules) -> bool:
        """Templates for nodes evaluating ``edge``; False if a node cannot take it."""
        if edge.version in self.tails:
            return True
        node = self.nodes[0]
        try:
            rules = NodeRules(edge, node.name, {}, SystemClock())
        except ConfigError as err:
            self.stats.note(f"cannot take the node-local rules: {err}")
            return False
        for report in self.bases:  # a healthy node fires none of them
            fired = rules.evaluate(report).findings
            if fired:
                raise RuntimeError(f"a healthy simulated node fires {fired[0].rule}")
        head = {"rules_version": edge.version, "takes_rules": True}
        values, bare = Trim(edge.keep), Trim(())
        every = max(1, round(edge.keep_every / self.options.interval))
        self.edge[edge.version] = edge
        self.tails[edge.version] = (
            [_tail(msgspec.structs.replace(values(r), **head)) for r in self.bases],
            [_tail(msgspec.structs.replace(bare(r), **head)) for r in self.bases], every)
        return True

    @property
    def interval_field(self) -> float:
        return min(3600.0, self.options.interval)

    def fast_body(self, node: _Node, sequence: int, now: float) -> bytes:
        values, bare, every = self.tails[node.rules_version]
        tails = values if (node.index + sequence) % every == 0 else bare
        variant = (node.index + sequence) % len(tails)
        return b"".join((node.head, str(sequence).encode(), b',"sample_time_seconds":',
                         repr(now).encode(), self.mid, node.labels, tails[variant]))

    def slow_body(self, node: _Node, sequence: int, now: float, sim_now: float
                  ) -> tuple[bytes, int, int]:
        """(body, events sent, results sent) for a node that cannot use the templates.

        One with faults, events or command results, or whose report carries the topology.
        """
        base = self.bases[(node.index + sequence) % len(self.bases)]
        parts: dict[str, Any] = {}
        if node.faults is not None:
            node.faults.advance(sim_now)
            parts = node.faults.report_parts(base)
        if node.topology_due:
            parts["topology"] = self.topology
        events = node.events[:MAX_EVENTS]
        results = node.results[:MAX_EVENTS]
        report = msgspec.structs.replace(
            base, node=node.name, instance=self.instance, sequence=sequence,
            sample_time_seconds=now, interval_seconds=self.interval_field,
            labels=node_labels(self.options.first + node.index), events=events,
            command_results=results, **parts)
        if node.rules_version:
            if node.rules is None or node.rules.version != node.rules_version:
                node.rules = NodeRules(self.edge[node.rules_version], node.name, {},
                                       SystemClock())
            report = node.rules.evaluate(report)
        return _encoder.encode(report), len(events), len(results)

    # ------------------------------------------------------------ faults

    def apply(self, planned: PlannedFault, sim_now: float) -> None:
        """Play one scenario fault on its nodes."""
        for index in planned.nodes:
            node = self.nodes[index]
            if planned.fault == "node-lost":
                node.lost = True
            elif planned.fault == "node-back":
                node.lost = False
            else:
                state = self._faults(node, sim_now)
                try:
                    if planned.fault == "straggler":
                        for g in range(self.options.gpus):
                            state.gpu(g).set_load(planned.params["utilization"])
                    else:
                        handler = FAULTS[planned.fault]
                        handler.apply(cast(SimulatedNode, state), planned.gpu,
                                      dict(planned.params))
                except (TypeError, ValueError, KeyError, IndexError) as err:
                    raise FaultError(f"{planned.fault} on {node.name}: {err}") from None
        who = self.names[planned.nodes[0]]
        if len(planned.nodes) > 1:
            some = ", ".join(self.names[i] for i in planned.nodes[:4])
            who = f"{len(planned.nodes)} nodes ({some}{', ...' if len(planned.nodes) > 4 else ''})"
        gpu = f" GPU {planned.gpu}" if planned.gpu is not None else ""
        self.stats.faults_played.append(
            f"t={format_seconds(planned.at)}: {planned.source.describe()} on {who}{gpu}")

    def _faults(self, node: _Node, sim_now: float) -> _FaultState:
        if node.faults is None:
            node.faults = _FaultState(node, self.bases[node.index % len(self.bases)],
                                      self.options.gpus, sim_now)
            if node.rules_version:
                # A real agent evaluates its rules on every sample; this node has sent
                # templates until now. Its rules see it once as it is before the fault,
                # so that a counter's increase (ecc-uncorrectable) has a sample before it.
                self.slow_body(node, node.sequence, time.time(), sim_now)
        return node.faults

    def _commands(self, node: _Node, raw: list[msgspec.Raw], sim_now: float) -> None:
        for item in raw:
            try:
                command = msgspec.json.decode(item, type=Command)
            except msgspec.ValidationError as err:
                cid = msgspec.json.decode(item, type=_CommandId).id or "unknown"
                self.stats.commands["undecodable"] += 1
                node.results.append(CommandResult(id=cid[:128], ok=False,
                                                  time_seconds=time.time(),
                                                  message=f"not understood: {err}"))
                continue
            self.stats.commands[command.kind] += 1
            node.results.append(self._carry_out(node, command, sim_now))

    def _carry_out(self, node: _Node, command: Command, sim_now: float) -> CommandResult:
        now = time.time()
        if command.kind == "checkpoint":
            return CommandResult(id=command.id, ok=True, time_seconds=now,
                                 message="simulated node: no training job to checkpoint")
        gpus = range(self.options.gpus) if command.gpu is None else [command.gpu]
        if any(not 0 <= g < self.options.gpus for g in gpus):
            return CommandResult(id=command.id, ok=False, time_seconds=now,
                                 message=f"no GPU {command.gpu}")
        state = self._faults(node, sim_now)
        state.advance(sim_now)
        if command.kind in ("reset_gpu", "reboot", "verify"):
            return remedy(command, state, now)
        done = []
        for g in gpus:
            model = state.gpu(g)
            default = model.profile.power_default_limit_watts
            if command.kind == "release":
                watts = default
            elif command.power_watts is not None:
                watts = command.power_watts
            else:
                watts = default * (command.power_fraction or 0.7)
            done.append(f"GPU {g} {model.set_power_limit_watts(watts):.0f} W")
        return CommandResult(id=command.id, ok=True, time_seconds=now,
                             message=f"{command.kind}: " + ", ".join(done))

    # ------------------------------------------------------------ the loop

    def run(self, stop: threading.Event | None = None) -> FleetStats:
        """Report until ``duration`` (wall seconds) has passed or ``stop`` is set."""
        stop = stop or threading.Event()
        opts = self.options
        sel = selectors.DefaultSelector()
        conns = [_Connection() for _ in range(max(1, opts.connections))]
        idle: list[_Connection] = []
        busy: set[_Connection] = set()
        cpu0 = time.process_time()
        start = time.monotonic()
        end = math.inf if opts.duration is None else start + opts.duration
        # The first reports spread evenly over the first interval, in a random order.
        offsets = [(k + self.rng.random()) / opts.nodes * opts.interval
                   for k in range(opts.nodes)]
        self.rng.shuffle(offsets)
        due: list[tuple[float, int]] = [(start + offsets[i], i) for i in range(opts.nodes)]
        heapq.heapify(due)
        plan = list(self.plan)
        next_progress = start + 10.0
        last_progress = (start, 0)
        next_timeout_check = start + 1.0

        def connect(conn: _Connection, now: float) -> bool:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=5.0)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.tls is not None:
                    sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            except OSError as err:
                self.stats.connection_errors += 1
                self.stats.note(f"connect to {self.host}:{self.port}: {describe_failure(err)}")
                conn.retry_at = now + 0.5
                return False
            conn.sock = sock
            conn.buffer = b""
            conn.used_at = now
            sel.register(sock, selectors.EVENT_READ, conn)
            if not self.streams:
                return True
            try:
                sock.sendall(self.upgrade)
            except OSError as err:
                self.stats.connection_errors += 1
                self.stats.note(f"send: {err}")
                close(conn, now)
                conn.retry_at = now + 0.5
                return False
            conn.opening = True
            return False  # idle once the controller switched protocols

        def timed_out(now: float) -> None:
            """Close the streams with a report unanswered for REQUEST_TIMEOUT_SECONDS."""
            limit = time.perf_counter() - REQUEST_TIMEOUT_SECONDS
            for conn in conns:
                if conn.opening and now - conn.used_at > REQUEST_TIMEOUT_SECONDS:
                    self.stats.timeouts += 1
                    self.stats.note("stream not opened within "
                                    f"{REQUEST_TIMEOUT_SECONDS:g} s")
                    close(conn, now)
                late = sum(1 for at in conn.waiting.values() if at < limit)
                if late:
                    self.stats.timeouts += late
                    self.stats.note(f"no answer within {REQUEST_TIMEOUT_SECONDS:g} s")
                    close(conn, now)

        def close(conn: _Connection, now: float) -> None:
            if conn.sock is not None:
                sel.unregister(conn.sock)
                conn.sock.close()
            conn.sock = None
            conn.retry_at = now
            if conn.node is not None:
                conn.node.in_flight = False
                conn.node = None
            for index, _ in conn.waiting:
                self.nodes[index].in_flight = False
                self.nodes[index].results_in_flight = 0
            conn.waiting.clear()
            conn.opening = False
            conn.stream = None
            busy.discard(conn)
            if conn in idle:
                idle.remove(conn)

        def send(conn: _Connection, node: _Node, now: float, ask: bool = False) -> None:
            sim_now = (now - start) * opts.speed
            node.sequence += 1
            wall = time.time()
            sent_events = sent_results = 0
            topology = node.topology_due
            if node.slow:
                body, sent_events, sent_results = self.slow_body(node, node.sequence, wall,
                                                                 sim_now)
            else:
                body = self.fast_body(node, node.sequence, wall)
            assert conn.sock is not None
            if conn.stream is not None:
                ask = (ask or sent_events > 0 or sent_results > 0 or topology
                       or now - node.asked_at >= ASK_EVERY_SECONDS)
                data = frame(body, ACK if ask else 0)
            else:
                data = self.header + str(len(body)).encode() + b"\r\n\r\n" + body
            try:
                conn.sock.sendall(data)
            except OSError as err:
                self.stats.connection_errors += 1
                self.stats.note(f"send: {err}")
                close(conn, now)
                return
            self.stats.sent += 1
            self.stats.events_sent += sent_events
            if topology:
                node.topology_due = False  # a controller that missed it asks again
            if conn.stream is not None:
                idle.append(conn)  # a stream takes the next report at once
                if not ask:
                    return
                node.asked_at = now
                conn.waiting[(node.index, node.sequence)] = time.perf_counter()
            else:
                conn.node = node
                conn.sent_at = time.perf_counter()
                busy.add(conn)
            node.in_flight = True
            node.results_in_flight = sent_results

        def answered(conn: _Connection, status: int, body: bytes, now: float) -> None:
            node = conn.node
            conn.node = None
            conn.used_at = now
            busy.discard(conn)
            idle.append(conn)
            if node is None:
                return
            node.in_flight = False
            self.latency.add((time.perf_counter() - conn.sent_at) * 1e3)
            if 200 <= status < 300:
                self.stats.accepted += 1
                if node.results_in_flight:
                    del node.results[:node.results_in_flight]
                    node.results_in_flight = 0
                if node.events or b"commands" in body or b"edge_rules" in body:
                    self._reply(node, body, (now - start) * opts.speed)
                return
            node.results_in_flight = 0
            if status >= 500:
                self.stats.server_errors[status] += 1
            else:
                self.stats.refused[status] += 1
            self.stats.note(f"{status}: {error_text(body, 200)}")

        def opened(conn: _Connection, now: float) -> None:
            """The answer to a stream's opening, once its head is in ``conn.buffer``."""
            head_end = conn.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            try:
                status = int(conn.buffer[9:12])
            except ValueError:
                status = 0
            if status == 101:
                rest = conn.buffer[head_end + 4:]
                conn.opening, conn.buffer = False, b""
                conn.stream = FrameReader(1 << 26)
                conn.used_at = now
                idle.append(conn)
                if rest:
                    answers(conn, rest, now)
                return
            length = _content_length(conn.buffer[:head_end].lower())
            if len(conn.buffer) < head_end + 4 + length:
                return
            body = conn.buffer[head_end + 4:head_end + 4 + length]
            close(conn, now)
            if status in NO_STREAM_STATUSES:
                self.streams = False
                self.stats.note(f"the controller has no reports' stream ({status}): "
                                "posting the reports")
                return
            conn.retry_at = now + 0.5
            counted = self.stats.server_errors if status >= 500 else self.stats.refused
            counted[status] += 1
            self.stats.note(f"{status}: {error_text(body, 200)} (opening a stream)")

        def answers(conn: _Connection, data: bytes, now: float) -> None:
            """A stream's answers: counts, the nodes that waited, what the replies carry."""
            assert conn.stream is not None
            for _, payload in conn.stream.feed(data):
                try:
                    answer = msgspec.json.decode(payload, type=StreamAnswer)
                except msgspec.DecodeError as err:
                    self.stats.note(f"undecodable stream answer: {err}")
                    continue
                self.stats.accepted += answer.accepted
                index = self.index_of.get(answer.node)
                node = self.nodes[index] if index is not None else None
                sent_at = (conn.waiting.pop((index, answer.sequence), None)
                           if index is not None else None)
                if node is not None and sent_at is not None:
                    node.in_flight = False
                    self.latency.add((time.perf_counter() - sent_at) * 1e3)
                if answer.status != 200:
                    if node is not None:
                        node.results_in_flight = 0
                    counted = (self.stats.server_errors if answer.status >= 500
                               else self.stats.refused)
                    counted[answer.status] += 1
                    self.stats.note(f"{answer.status}: {answer.error[:200]}")
                    continue
                if node is None or not len(answer.reply):
                    continue
                if sent_at is not None and node.results_in_flight:
                    del node.results[:node.results_in_flight]
                    node.results_in_flight = 0
                self._reply(node, bytes(answer.reply), (now - start) * opts.speed)
            if conn.stream.too_large is not None:
                self.stats.note(f"stream answer: {conn.stream.too_large}")
                close(conn, now)

        def read(conn: _Connection, now: float) -> None:
            sock = conn.sock
            assert sock is not None
            tls = sock if isinstance(sock, ssl.SSLSocket) else None
            if tls is not None:
                # Readable is not "application data" over TLS: a TLS 1.3 server sends
                # session tickets after the handshake. Read without blocking.
                tls.setblocking(False)
            try:
                data = sock.recv(65536)
                while tls is not None and tls.pending():
                    data += tls.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError):
                return
            except OSError as err:
                data = b""
                self.stats.note(f"receive: {err}")
            finally:
                if tls is not None:
                    tls.settimeout(5.0)  # sendall blocks, within a bound
            if not data:
                if conn.node is not None or conn.waiting or conn.opening:
                    self.stats.connection_errors += 1
                close(conn, now)
                return
            if conn.stream is not None:
                answers(conn, data, now)
                return
            conn.buffer += data
            if conn.opening:
                opened(conn, now)
                return
            while True:
                head_end = conn.buffer.find(b"\r\n\r\n")
                if head_end < 0:
                    return
                head = conn.buffer[:head_end].lower()
                length = _content_length(head)
                if len(conn.buffer) < head_end + 4 + length:
                    return
                try:
                    status = int(conn.buffer[9:12])
                except ValueError:
                    status = 0
                body = conn.buffer[head_end + 4:head_end + 4 + length]
                conn.buffer = conn.buffer[head_end + 4 + length:]
                answered(conn, status, body, now)
                if b"connection: close" in head:
                    close(conn, now)
                    return

        try:
            while True:
                now = time.monotonic()
                if stop.is_set() or now >= end:
                    break
                sim_now = (now - start) * opts.speed
                while plan and plan[0].at <= sim_now:
                    self.apply(plan.pop(0), sim_now)
                for conn in [c for c in idle if c.stream is None
                             and now - c.used_at > STALE_AFTER_SECONDS]:
                    close(conn, now)  # reconnected just below
                for conn in conns:
                    if conn.sock is None and conn.retry_at <= now and connect(conn, now):
                        idle.append(conn)
                for conn in list(busy):
                    if time.perf_counter() - conn.sent_at > REQUEST_TIMEOUT_SECONDS:
                        self.stats.timeouts += 1
                        self.stats.note("no response within "
                                        f"{REQUEST_TIMEOUT_SECONDS:g} s")
                        close(conn, now)
                if now >= next_timeout_check:
                    next_timeout_check = now + 1.0
                    timed_out(now)
                # Reports overdue by more than an interval are not sent: counted.
                while due and due[0][0] < now - opts.interval:
                    _, i = heapq.heappop(due)
                    self.stats.not_sent += 1
                    heapq.heappush(due, (self._next(now), i))
                while idle and due and due[0][0] <= now:
                    at, i = heapq.heappop(due)
                    node = self.nodes[i]
                    heapq.heappush(due, (self._next(at), i))
                    if node.lost:
                        self.stats.lost_skipped += 1
                        continue
                    if node.in_flight:  # its previous report is still unanswered
                        self.stats.not_sent += 1
                        continue
                    self.lag.add((now - at) * 1e3)
                    send(idle.pop(0), node, now)  # in turn: none sits idle
                timeout = 0.05
                if due and idle:
                    timeout = max(0.0, min(timeout, due[0][0] - time.monotonic()))
                if plan:
                    timeout = max(0.0, min(timeout, start + plan[0].at / opts.speed
                                           - time.monotonic()))
                timeout = max(0.0, min(timeout, end - time.monotonic()))
                if sel.get_map():
                    for key, _ in sel.select(timeout):
                        read(cast(_Connection, key.data), time.monotonic())
                else:
                    time.sleep(timeout)
                if self.progress is not None and now >= next_progress:
                    t0, sent0 = last_progress
                    rate = (self.stats.sent - sent0) / max(1e-9, now - t0)
                    self.progress(self._progress_line(now - start, rate))
                    last_progress = (now, self.stats.sent)
                    next_progress += 10.0
            # One last report that asks on each stream (its answer counts what the stream
            # carried), then wait briefly for the answers still in flight.
            for k, conn in enumerate(c for c in conns if c.stream is not None):
                node = self.nodes[k % len(self.nodes)]
                if not node.in_flight and not node.lost:
                    send(conn, node, time.monotonic(), ask=True)
            drain_until = time.monotonic() + 5.0
            while ((busy or any(c.waiting for c in conns))
                   and time.monotonic() < drain_until):
                for key, _ in sel.select(0.1):
                    read(cast(_Connection, key.data), time.monotonic())
            for conn in conns:
                if conn in busy or conn.waiting:
                    self.stats.timeouts += len(conn.waiting) or 1
                    close(conn, time.monotonic())
        finally:
            self.elapsed = time.monotonic() - start
            self.cpu_seconds = time.process_time() - cpu0
            for conn in conns:
                if conn.sock is not None:
                    conn.sock.close()
            sel.close()
        return self.stats

    def _next(self, after: float) -> float:
        jitter = self.options.jitter
        return after + self.options.interval * (1.0 + self.rng.uniform(-jitter, jitter))

    def _reply(self, node: _Node, body: bytes, sim_now: float) -> None:
        try:
            reply = msgspec.json.decode(body, type=_Reply)
        except msgspec.DecodeError as err:
            self.stats.note(f"undecodable reply: {err}")
            return
        if reply.events_stored_through >= 0 and node.events:
            kept = [e for e in node.events if e.id > reply.events_stored_through]
            self.stats.events_acknowledged += len(node.events) - len(kept)
            node.events = kept
        if reply.commands:
            self._commands(node, reply.commands, sim_now)
        if reply.edge_rules is not None and self._take_rules(reply.edge_rules):
            node.rules_version = reply.edge_rules.version
        if reply.topology_wanted:
            node.topology_due = True

    def _progress_line(self, t: float, rate: float) -> str:
        s = self.stats
        lat = self.latency.summary()
        return (f"t={t:5.0f}s  sent {s.sent} ({rate:.0f}/s)  accepted {s.accepted}  "
                f"refused {sum(s.refused.values())}  failed {s.failed}  not sent "
                f"{s.not_sent}  p99 {lat['p99']} ms")

    # ------------------------------------------------------------ results

    def summary(self) -> dict[str, Any]:
        """Everything :meth:`run` measured, as plain data (``--json``)."""
        s, opts = self.stats, self.options
        seconds = max(1e-9, self.elapsed)
        return {
            "controller": opts.controller, "nodes": opts.nodes, "gpus": opts.gpus,
            "interval_seconds": opts.interval, "speed": opts.speed,
            "connections": opts.connections,
            "scenario": self.scenario.name if self.scenario is not None else None,
            "seconds": round(self.elapsed, 3),
            "sent": s.sent, "accepted": s.accepted,
            "refused": {str(k): v for k, v in sorted(s.refused.items())},
            "failed": {"connection": s.connection_errors, "timeout": s.timeouts,
                       "server": {str(k): v for k, v in sorted(s.server_errors.items())}},
            "not_sent": s.not_sent, "skipped_lost": s.lost_skipped,
            "sent_per_second": round(s.sent / seconds, 1),
            "accepted_per_second": round(s.accepted / seconds, 1),
            "target_per_second": round(opts.nodes / opts.interval, 1),
            "latency_ms": self.latency.summary(),
            "schedule_lag_ms": self.lag.summary(),
            "commands": dict(s.commands),
            "events": {"sent": s.events_sent, "acknowledged": s.events_acknowledged},
            "faults_played": list(s.faults_played),
            "messages": dict(s.messages),
            "simulator_cpu_seconds": round(self.cpu_seconds, 3),
            "simulator_cpu_percent": round(100 * self.cpu_seconds / seconds, 1),
        }


def _tail(report: Report) -> bytes:
    """What follows the labels in ``report``'s JSON (the part nodes share)."""
    full = _encoder.encode(msgspec.structs.replace(report, labels={"x": "y"}))
    mark = b'"labels":{"x":"y"}'
    return full[full.index(mark) + len(mark):]


def _content_length(head: bytes) -> int:
    """The Content-Length of a response head (lower-cased); 0 when there is none."""
    at = head.find(b"content-length:")
    if at < 0:
        return 0
    line_end = head.find(b"\r\n", at)
    try:
        return int(head[at + 15:line_end if line_end >= 0 else None])
    except ValueError:
        return 0


def render_summary(summary: dict[str, Any]) -> str:
    """The summary table ``sn-monitor simulate`` prints at the end."""
    s = summary
    lat, lag = s["latency_ms"], s["schedule_lag_ms"]
    refused = sum(s["refused"].values())
    failed = s["failed"]["connection"] + s["failed"]["timeout"] + sum(
        s["failed"]["server"].values())

    def detail(counts: dict[str, int]) -> str:
        return ", ".join(f"{k}: {v}" for k, v in counts.items())

    lines = [
        f"sn-monitor simulate: {s['nodes']} nodes x {s['gpus']} GPUs -> {s['controller']}, "
        f"every {format_seconds(s['interval_seconds'])} ({s['target_per_second']:g} "
        f"reports/s), {s['seconds']:.1f} s"
        + (f", scenario {s['scenario']} at x{s['speed']:g}" if s["scenario"] else ""),
        "",
        f"  {'reports sent':<26}{s['sent']:>10}   {s['sent_per_second']:>9.1f}/s",
        f"  {'accepted (2xx)':<26}{s['accepted']:>10}   {s['accepted_per_second']:>9.1f}/s",
        f"  {'refused (4xx)':<26}{refused:>10}   {detail(s['refused'])}",
        f"  {'failed (5xx, connection)':<26}{failed:>10}   "
        + detail({**s["failed"]["server"], "connection": s["failed"]["connection"],
                  "timeout": s["failed"]["timeout"]}),
        f"  {'not sent (behind)':<26}{s['not_sent']:>10}",
        "",
        f"  {'ms':<26}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}",
        f"  {'latency':<26}{_ms(lat['p50'])}{_ms(lat['p90'])}{_ms(lat['p99'])}{_ms(lat['max'])}",
        f"  {'schedule lag':<26}{_ms(lag['p50'])}{_ms(lag['p90'])}{_ms(lag['p99'])}"
        f"{_ms(lag['max'])}",
        "",
        f"  commands received: {detail(s['commands']) or 'none'}; events sent "
        f"{s['events']['sent']}, acknowledged {s['events']['acknowledged']}; "
        f"simulator CPU {s['simulator_cpu_percent']:.0f} % of a core",
    ]
    if s["faults_played"]:
        lines.append("  faults played:")
        lines.extend(f"    {f}" for f in s["faults_played"])
    if s["messages"]:
        lines.append("  what the controller said (or what failed):")
        lines.extend(f"    {n} x {m}" for m, n in s["messages"].items())
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return f"{'-' if value is None else f'{value:.1f}':>10}"
