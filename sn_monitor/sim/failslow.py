"""A data-parallel training job in simulated time, and the fail-slow faults that slow it.

:class:`FailSlowJob` models one synchronous job on N HGX H100 nodes (8 GPUs on 4
NVSwitches, 8 rail NICs ``mlx5_0``..``mlx5_7`` at 400 Gb/s on a rail-optimised fabric:
NIC *i* of every node on rail *i*; 2 storage NICs ``mlx5_8``/``mlx5_9``, RoCE 200 Gb/s)
plus a few spare nodes outside the job. Nothing runs: :meth:`FailSlowJob.tick` moves
time by one report interval and returns, per node, the :class:`~sn_monitor.model.Report`
its agent would send (cumulative counters, rates, clocks, throttle reasons, processes;
the node's :class:`~sn_monitor.model.NodeTopology` on its first report and when it
changed), and the job's step time.

A step is compute, then the collectives. Compute on a GPU takes longer when its SM clock
is lower or another tenant's process takes a share of it; the inter-node all-reduce on
rail *r* goes at the pace of the slowest NIC of that rail (its rate, divided by its
congestion); the intra-node part at the pace of the slowest GPU's NVLinks. Every rank
waits for the slowest (synchronous collectives), so one slow GPU or link slows the whole
job alike, and the step time says *that* the job is slow; the node's counters say where.

The five fail-slow kinds (:data:`FAIL_SLOW_KINDS`) and what they leave in the counters
are the contract's table (``congested-link``, ``nic-degraded``, ``nvlink-slow``,
``gpu-throttled``, ``noisy-neighbour``). Benign distractors (:data:`DISTRACTOR_KINDS`)
look alarming but do not slow the job: a congested storage NIC, a throttled GPU on a
spare node. The healthy noise includes one-report ``transmit_wait`` bursts on random
ports, brief power-cap clock dips, stray NVLink CRC errors, and back-pressure: the
ring's upstream neighbour of a congested port waits a few times more than its rail.

Noise comes from one seeded :class:`random.Random`: a run is reproducible. The cost is
mostly building the reports (about 20 msgspec structs per node per tick).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

from sn_monitor.model import (
    GpuReport,
    GpuTopology,
    IbPortReport,
    NicPortTopology,
    NicTopology,
    NodeTopology,
    NvLinkPeer,
    Report,
    topology_digest,
)
from sn_monitor.sim.gpu_model import HGX_BUS_NUMBERS

FailSlowKind = Literal["congested-link", "nic-degraded", "nvlink-slow", "gpu-throttled",
                       "noisy-neighbour"]
FAIL_SLOW_KINDS: Final[tuple[FailSlowKind, ...]] = get_args(FailSlowKind)
DistractorKind = Literal["storage-congestion", "spare-gpu-throttled"]
DISTRACTOR_KINDS: Final[tuple[DistractorKind, ...]] = get_args(DistractorKind)

GPUS_PER_NODE: Final = 8
RAILS: Final = 8
STORAGE_NICS: Final = ("mlx5_8", "mlx5_9")
NVLINKS_PER_GPU: Final = 18
NVSWITCH_LINKS: Final = (5, 4, 4, 5)
RAIL_RATE_BYTES_PER_SECOND: Final = 400e9 / 8
STORAGE_RATE_BYTES_PER_SECOND: Final = 200e9 / 8
NVLINK_BYTES_PER_SECOND: Final = 25e9 * NVLINKS_PER_GPU  # 450 GB/s one way (H100)
SM_MAX_CLOCK_HERTZ: Final = 1.98e9
SM_IDLE_CLOCK_HERTZ: Final = 345e6
THROTTLE_REASON_SETS: Final[tuple[tuple[str, ...], ...]] = (
    ("hw_slowdown",),
    ("sw_power_cap",),
    ("sw_thermal_slowdown",),
    ("hw_slowdown", "hw_power_brake_slowdown"),
    ("hw_slowdown", "hw_thermal_slowdown"),
)

# A healthy step: compute, inter-node all-reduce over the rails, intra-node NVLink part.
COMPUTE_SECONDS: Final = 2.2
INTER_NODE_SECONDS: Final = 1.2
INTRA_NODE_SECONDS: Final = 0.6
#: Bytes a rail NIC sends (and receives) per step, and a GPU over its NVLinks.
RAIL_BYTES_PER_STEP: Final = INTER_NODE_SECONDS * RAIL_RATE_BYTES_PER_SECOND * 0.9
NVLINK_BYTES_PER_STEP: Final = INTRA_NODE_SECONDS * NVLINK_BYTES_PER_SECOND * 0.7
STEP_JITTER: Final = 0.015
#: A healthy port's ``transmit_wait`` ticks a second at the job's load.
WAIT_TICKS_PER_SECOND: Final = 3e5
WAIT_NOISE_SIGMA: Final = 0.35
#: Chance that a port has a one-report ``transmit_wait`` burst (x10..40), per report.
WAIT_BURST_CHANCE: Final = 2e-4
ECN_PER_SECOND: Final = 40.0
CLOCK_DIP_CHANCE: Final = 5e-4
CRC_NOISE_CHANCE: Final = 1e-3
TOPOLOGY_INTERVAL_SECONDS: Final = 60.0

_RAIL_DEVICES: Final = tuple(f"mlx5_{i}" for i in range(RAILS))
_NIC_BUS: Final = (0x19, 0x2B, 0x3B, 0x5E, 0x9B, 0xAC, 0xBB, 0xDC)
_STORAGE_BUS: Final = (0x0C, 0x8C)
_SWITCH_BUS: Final = (0x05, 0x06, 0x07, 0x08)
_ZERO_COUNTERS: Final = ("link_downed", "link_error_recovery", "receive_errors",
                         "transmit_discards", "local_link_integrity_errors",
                         "excessive_buffer_overrun_errors", "out_of_buffer", "out_of_sequence",
                         "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err")
_GAUSS_TABLE_SIZE: Final = 1 << 12


@dataclass(frozen=True, slots=True)
class FailSlowFault:
    """One fail-slow fault: where, when, how bad; ``link`` as the finder names it.

    ``severity`` by kind: congested-link the factor its bandwidth is divided by;
    nic-degraded the link's rate in Gb/s; nvlink-slow the fraction of NVLink bandwidth
    left; gpu-throttled the clock ratio; noisy-neighbour the neighbour's share of the GPU.
    """

    kind: FailSlowKind
    node: str
    link: str
    start: float
    end: float
    severity: float
    rail: int | None = None
    gpu: int | None = None
    reasons: tuple[str, ...] = ()
    nvlinks_down: int = 0

    def standing(self, now: float) -> bool:
        return self.start <= now < self.end


@dataclass(frozen=True, slots=True)
class Distractor:
    """Something that looks wrong on a node but does not slow the job."""

    kind: DistractorKind
    node: str
    link: str
    start: float
    end: float
    severity: float


@dataclass(frozen=True, slots=True)
class Tick:
    """One report interval: the reports of every node and the job's step time."""

    time: float
    step_time_seconds: float
    reports: list[Report]


@dataclass(slots=True)
class _Port:
    """One NIC port's state and cumulative counters (bytes, ticks, packets)."""

    device: str
    rail: int | None
    nominal_rate: float
    rate: float
    roce: bool
    transmitted: int
    received: int
    wait: int
    ecn: int = 0
    cnp_sent: int = 0
    cnp_handled: int = 0
    symbol_errors: int = 0
    bandwidth_divisor: float = 1.0
    wait_factor: float = 1.0
    ecn_factor: float = 1.0
    throughput_share: float = 1.0


@dataclass(slots=True)
class _Gpu:
    """One GPU's state and cumulative NVLink counters."""

    index: int
    uuid: str
    clock_ratio: float = 1.0
    reasons: tuple[str, ...] = ()
    neighbour_share: float = 0.0
    nvlink_ratio: float = 1.0
    nvlinks_down: int = 0
    error_storm: bool = False
    nvlink_transmitted: int = 0
    nvlink_received: int = 0
    crc: int = 0
    replay: int = 0
    recovery: int = 0


@dataclass(slots=True)
class _Node:
    name: str
    in_job: bool
    labels: dict[str, str]
    instance: str
    ports: list[_Port]
    gpus: list[_Gpu]
    sequence: int = 0
    topology_version: int = 0
    topology_sent_version: int = -1
    topology_collect_at: float = 0.0
    topology: NodeTopology | None = None
    digest: str = ""
    ring_upstream_of: set[int] = field(default_factory=set)


class FailSlowJob:
    """One simulated job of ``nodes`` nodes (plus ``spare_nodes`` outside it).

    Nodes are named ``node-0000``..; spares ``spare-00``... Time starts at
    ``start_time`` (wall seconds, as reports carry) and moves ``report_interval_seconds``
    per :meth:`tick`. ``rail_link_layer`` ``Ethernet`` makes the rails RoCE (ECN/CNP
    counters on them too).
    """

    def __init__(
        self,
        nodes: int = 256,
        *,
        seed: int = 0,
        job: str = "llm",
        spare_nodes: int = 4,
        start_time: float = 1_733_000_000.0,
        report_interval_seconds: float = 5.0,
        rail_link_layer: Literal["InfiniBand", "Ethernet"] = "InfiniBand",
    ) -> None:
        if nodes < 2:
            raise ValueError("a job needs at least 2 nodes")
        self.job = job
        self.now = start_time
        self.interval = report_interval_seconds
        self.rail_link_layer = rail_link_layer
        self._rng = random.Random(seed)
        self._gauss = [self._rng.gauss(0.0, 1.0) for _ in range(_GAUSS_TABLE_SIZE)]
        names = [f"node-{i:04d}" for i in range(nodes)]
        names += [f"spare-{i:02d}" for i in range(spare_nodes)]
        self._nodes = [self._new_node(name, i, i < nodes) for i, name in enumerate(names)]
        self._by_name = {node.name: node for node in self._nodes}
        self.job_nodes: tuple[str, ...] = tuple(names[:nodes])
        self.spare_nodes: tuple[str, ...] = tuple(names[nodes:])
        self._faults: list[FailSlowFault] = []
        self._distractors: list[Distractor] = []
        self._active: list[FailSlowFault] = []
        self._active_distractors: list[Distractor] = []
        self.step_time_seconds = COMPUTE_SECONDS + INTER_NODE_SECONDS + INTRA_NODE_SECONDS
        self._base_step = self.step_time_seconds
        self._slowdown = 1.0

    # ---------------------------------------------------------------- construction

    def _new_node(self, name: str, index: int, in_job: bool) -> _Node:
        rng = self._rng
        ib = self.rail_link_layer == "InfiniBand"
        ports = [_Port(device, rail, RAIL_RATE_BYTES_PER_SECOND, RAIL_RATE_BYTES_PER_SECOND,
                       not ib, rng.randrange(4 * 10**13, 10**15) * 4,
                       rng.randrange(4 * 10**13, 10**15) * 4, rng.randrange(10**9, 5 * 10**9))
                 for rail, device in enumerate(_RAIL_DEVICES)]
        ports += [_Port(device, None, STORAGE_RATE_BYTES_PER_SECOND,
                        STORAGE_RATE_BYTES_PER_SECOND, True, rng.randrange(10**12, 10**14) * 4,
                        rng.randrange(10**12, 10**14) * 4, rng.randrange(10**8, 10**9))
                  for device in STORAGE_NICS]
        gpus = [_Gpu(i, f"GPU-{hashlib.sha256(f'{name}/{i}'.encode()).hexdigest()[:32]}")
                for i in range(GPUS_PER_NODE)]
        for gpu in gpus:
            gpu.nvlink_transmitted = rng.randrange(10**14, 10**16)
            gpu.nvlink_received = gpu.nvlink_transmitted
        labels = {"rack": f"r{index // 8:03d}", "supernode": f"sn{index // 32:02d}"}
        if in_job:
            labels["job"] = self.job
        node = _Node(name, in_job, labels, f"sim-{rng.getrandbits(48):012x}", ports, gpus)
        node.topology_collect_at = self.now + rng.uniform(0, TOPOLOGY_INTERVAL_SECONDS)
        return node

    # ---------------------------------------------------------------- topology

    def topology(self, node: str) -> NodeTopology:
        """The node's topology as its agent would collect it now."""
        return _node_topology(self._by_name[node])

    # ---------------------------------------------------------------- faults

    def random_fault(self, kind: FailSlowKind, rng: random.Random, start: float,
                     duration: float, node: str | None = None) -> FailSlowFault:
        """A fault of ``kind`` at a random place (or on ``node``) with a realistic severity."""
        name = node or rng.choice(self.job_nodes)
        end = start + duration
        if kind == "congested-link":
            rail = rng.randrange(RAILS)
            return FailSlowFault(kind, name, _RAIL_DEVICES[rail], start, end,
                                 rng.uniform(1.25, 2.3), rail=rail)
        if kind == "nic-degraded":
            rail = rng.randrange(RAILS)
            gbps = rng.choices((200.0, 100.0), weights=(0.7, 0.3))[0]
            return FailSlowFault(kind, name, _RAIL_DEVICES[rail], start, end, gbps, rail=rail)
        gpu = rng.randrange(GPUS_PER_NODE)
        if kind == "nvlink-slow":
            down = rng.choice((0, 1, 1, 2, 4))
            left = (NVLINKS_PER_GPU - down) / NVLINKS_PER_GPU * rng.uniform(0.4, 0.75)
            return FailSlowFault(kind, name, f"gpu{gpu}/nvlink", start, end, left, gpu=gpu,
                                 nvlinks_down=down)
        if kind == "gpu-throttled":
            return FailSlowFault(kind, name, f"gpu{gpu}", start, end, rng.uniform(0.6, 0.85),
                                 gpu=gpu, reasons=rng.choice(THROTTLE_REASON_SETS))
        return FailSlowFault(kind, name, f"gpu{gpu}", start, end, rng.uniform(0.2, 0.5),
                             gpu=gpu)

    def random_distractor(self, kind: DistractorKind, rng: random.Random, start: float,
                          duration: float) -> Distractor:
        """A benign look-alike: a storage NIC congested, a spare node's GPU throttled."""
        if kind == "storage-congestion":
            return Distractor(kind, rng.choice(self.job_nodes), rng.choice(STORAGE_NICS),
                              start, start + duration, rng.uniform(20.0, 80.0))
        if not self.spare_nodes:
            raise ValueError("no spare node to throttle a GPU on")
        return Distractor(kind, rng.choice(self.spare_nodes), f"gpu{rng.randrange(8)}",
                          start, start + duration, rng.uniform(0.5, 0.8))

    def schedule(self, item: FailSlowFault | Distractor) -> None:
        """Start ``item`` at its start time and clear it at its end (as :meth:`tick` passes)."""
        if item.node not in self._by_name:
            raise ValueError(f"no node {item.node!r}")
        if isinstance(item, FailSlowFault):
            self._faults.append(item)
        else:
            self._distractors.append(item)

    def standing_faults(self) -> list[FailSlowFault]:
        """The fail-slow faults in effect now."""
        return list(self._active)

    # ---------------------------------------------------------------- time

    def tick(self) -> Tick:
        """Advance one report interval; every node's report and the job's step time."""
        self.now += self.interval
        self._apply_schedule()
        dt = self.interval
        jitter = 1.0 + STEP_JITTER * self._gauss[self._rng.getrandbits(12)]
        if self._rng.random() < 0.01:  # a data-loader stall or a GC pause: benign
            jitter += self._rng.uniform(0.03, 0.1)
        self.step_time_seconds = self._base_step * self._slowdown * jitter
        steps = dt / self.step_time_seconds
        reports = [self._report(node, dt, steps) for node in self._nodes]
        return Tick(self.now, self.step_time_seconds, reports)

    def _apply_schedule(self) -> None:
        now = self.now
        changed = False
        for fault in [f for f in self._active if f.end <= now]:
            self._active.remove(fault)
            self._effect(fault, on=False)
            changed = True
        for fault in [f for f in self._faults if f.start <= now]:
            self._faults.remove(fault)
            if fault.end > now:
                self._active.append(fault)
                self._effect(fault, on=True)
                changed = True
        for distractor in [d for d in self._active_distractors if d.end <= now]:
            self._active_distractors.remove(distractor)
            self._distract(distractor, on=False)
        for distractor in [d for d in self._distractors if d.start <= now]:
            self._distractors.remove(distractor)
            if distractor.end > now:
                self._active_distractors.append(distractor)
                self._distract(distractor, on=True)
        if changed:
            self._slowdown = self._job_slowdown()

    def _effect(self, fault: FailSlowFault, *, on: bool) -> None:
        node = self._by_name[fault.node]
        if fault.rail is not None:
            port = node.ports[fault.rail]
            upstream = self._ring_upstream(fault.node, fault.rail)
            if fault.kind == "congested-link":
                port.bandwidth_divisor = fault.severity if on else 1.0
                port.wait_factor = self._rng.uniform(15.0, 60.0) if on else 1.0
                port.ecn_factor = self._rng.uniform(30.0, 300.0) if on else 1.0
                port.throughput_share = self._rng.uniform(0.8, 0.95) if on else 1.0
                upstream.wait_factor = self._rng.uniform(1.5, 3.0) if on else 1.0
            else:
                port.rate = fault.severity * 1e9 / 8 if on else port.nominal_rate
                port.wait_factor = self._rng.uniform(3.0, 8.0) if on else 1.0
                node.topology_version += 1
            return
        assert fault.gpu is not None
        gpu = node.gpus[fault.gpu]
        if fault.kind == "nvlink-slow":
            gpu.nvlink_ratio = fault.severity if on else 1.0
            gpu.nvlinks_down = fault.nvlinks_down if on else 0
            gpu.error_storm = on
            if fault.nvlinks_down:
                node.topology_version += 1
        elif fault.kind == "gpu-throttled":
            gpu.clock_ratio = fault.severity if on else 1.0
            gpu.reasons = fault.reasons if on else ()
        else:
            gpu.neighbour_share = fault.severity if on else 0.0

    def _distract(self, distractor: Distractor, *, on: bool) -> None:
        node = self._by_name[distractor.node]
        if distractor.kind == "storage-congestion":
            port = next(p for p in node.ports if p.device == distractor.link)
            port.wait_factor = distractor.severity if on else 1.0
            port.ecn_factor = distractor.severity * 5 if on else 1.0
        else:
            gpu = node.gpus[int(distractor.link.removeprefix("gpu"))]
            gpu.clock_ratio = distractor.severity if on else 1.0
            gpu.reasons = ("hw_slowdown", "hw_thermal_slowdown") if on else ()

    def _ring_upstream(self, name: str, rail: int) -> _Port:
        """The port that sends to ``name`` on ``rail`` in the ring (back-pressure)."""
        index = self.job_nodes.index(name) if name in self.job_nodes else 0
        upstream = self.job_nodes[index - 1]
        return self._by_name[upstream].ports[rail]

    def _job_slowdown(self) -> float:
        """Step time over the healthy one: the slowest rank sets each phase's pace."""
        compute = inter = intra = 1.0
        for fault in self._active:
            node = self._by_name[fault.node]
            if fault.rail is not None:
                port = node.ports[fault.rail]
                inter = max(inter, port.nominal_rate / port.rate * port.bandwidth_divisor)
            elif fault.gpu is not None:
                gpu = node.gpus[fault.gpu]
                compute = max(compute, 1.0 / (gpu.clock_ratio * (1.0 - gpu.neighbour_share)))
                intra = max(intra, 1.0 / gpu.nvlink_ratio)
        return (COMPUTE_SECONDS * compute + INTER_NODE_SECONDS * inter
                + INTRA_NODE_SECONDS * intra) / self._base_step

    # ---------------------------------------------------------------- reports

    def _noise(self, sigma: float) -> float:
        return math.exp(sigma * self._gauss[self._rng.getrandbits(12)])

    def _report(self, node: _Node, dt: float, steps: float) -> Report:
        node.sequence += 1
        topology = None
        if node.topology is None or (self.now >= node.topology_collect_at
                                     and node.topology_version != node.topology_sent_version):
            node.topology = _node_topology(node)
            node.digest = topology_digest(node.topology)
            node.topology_sent_version = node.topology_version
            topology = node.topology
        if self.now >= node.topology_collect_at:
            node.topology_collect_at += TOPOLOGY_INTERVAL_SECONDS
        return Report(
            node=node.name, instance=node.instance, sequence=node.sequence,
            sample_time_seconds=self.now, agent_version="sim", interval_seconds=self.interval,
            labels=node.labels,
            gpus=[self._gpu_report(node, gpu, dt, steps) for gpu in node.gpus],
            infiniband=[self._port_report(node, port, dt, steps) for port in node.ports],
            topology_digest=node.digest, topology=topology,
        )

    def _port_report(self, node: _Node, port: _Port, dt: float, steps: float) -> IbPortReport:
        rand = self._rng.random
        if port.rail is None:  # storage: checkpoint and data-set reads, bursty
            load = 0.04 * self._noise(0.8)
            moved = int(port.rate * min(load, 0.9) * dt)
            port.transmitted += moved // 4 * 4
            port.received += int(moved * 1.5) // 4 * 4
            busy = 0.3
        elif node.in_job:
            moved = int(RAIL_BYTES_PER_STEP * steps * port.throughput_share
                        * (1.0 + 0.01 * self._gauss[self._rng.getrandbits(12)]))
            port.transmitted += moved // 4 * 4
            port.received += moved // 4 * 4
            busy = 1.0
        else:
            port.transmitted += int(1e6 * dt) // 4 * 4
            port.received += int(1e6 * dt) // 4 * 4
            busy = 0.01
        wait = WAIT_TICKS_PER_SECOND * busy * dt * port.wait_factor * self._noise(WAIT_NOISE_SIGMA)
        if rand() < WAIT_BURST_CHANCE:
            wait *= self._rng.uniform(10.0, 40.0)
        port.wait += int(wait)
        if rand() < 1e-4:
            port.symbol_errors += 1
        counters = dict.fromkeys(_ZERO_COUNTERS, 0)
        counters["transmitted_bytes"] = port.transmitted
        counters["received_bytes"] = port.received
        counters["transmit_wait"] = port.wait
        counters["symbol_errors"] = port.symbol_errors
        if port.roce:
            marked = int(ECN_PER_SECOND * busy * dt * port.ecn_factor * self._noise(0.5))
            port.ecn += marked
            port.cnp_sent += int(marked * 0.9)
            port.cnp_handled += int(marked * 0.85 * self._noise(0.2))
            counters["np_ecn_marked_roce_packets"] = port.ecn
            counters["np_cnp_sent"] = port.cnp_sent
            counters["rp_cnp_handled"] = port.cnp_handled
            counters["rp_cnp_ignored"] = 0
        return IbPortReport(device=port.device, port=1, state=4,
                            rate_bytes_per_second=port.rate, counters=counters)

    def _gpu_report(self, node: _Node, gpu: _Gpu, dt: float, steps: float) -> GpuReport:
        rand = self._rng.random
        gauss = self._gauss
        bits = self._rng.getrandbits
        busy = node.in_job or gpu.clock_ratio < 1.0
        reasons: list[str] = list(gpu.reasons)
        if not busy:
            clock = SM_IDLE_CLOCK_HERTZ
            utilization = 0.0
            reasons = ["gpu_idle"]
            power = 70.0
        else:
            clock = SM_MAX_CLOCK_HERTZ * gpu.clock_ratio * (1.0 - 0.004 * abs(gauss[bits(12)]))
            if not reasons and rand() < CLOCK_DIP_CHANCE:  # a brief power-cap dip: benign
                clock *= self._rng.uniform(0.88, 0.97)
                reasons = ["sw_power_cap"]
            utilization = min(1.0, 0.96 + 0.015 * gauss[bits(12)])
            power = min(700.0, 640.0 * gpu.clock_ratio + 20.0 * gauss[bits(12)])
        clock = round(clock / 1e6) * 1e6  # NVML reports MHz
        if node.in_job:
            nvlink = int(NVLINK_BYTES_PER_STEP * steps * min(1.0, gpu.nvlink_ratio * 1.2)
                         * (1.0 + 0.01 * gauss[bits(12)]))
            gpu.nvlink_transmitted += nvlink
            gpu.nvlink_received += nvlink
        if gpu.error_storm:
            burst = dt * self._rng.uniform(40.0, 400.0)
            gpu.replay += int(burst)
            gpu.crc += int(burst * self._rng.uniform(2.0, 5.0))
            if rand() < 0.2 * dt / 5.0:
                gpu.recovery += 1
        elif rand() < CRC_NOISE_CHANCE:
            gpu.crc += 1
        processes = (2 if gpu.neighbour_share > 0 else 1) if busy else 0
        return GpuReport(
            index=gpu.index, uuid=gpu.uuid, utilization_ratio=max(0.0, utilization),
            memory_used_bytes=72 * 2**30 if busy else 2**29, memory_total_bytes=80 * 2**30,
            temperature_celsius=round(35.0 + 0.05 * power, 1), power_watts=round(power, 1),
            power_limit_watts=700.0, sm_clock_hertz=clock, sm_max_clock_hertz=SM_MAX_CLOCK_HERTZ,
            throttle_reasons=reasons, nvlink_crc_errors_total=gpu.crc,
            nvlink_replay_errors_total=gpu.replay, nvlink_recovery_errors_total=gpu.recovery,
            nvlinks_down=gpu.nvlinks_down, nvlink_transmitted_bytes_total=gpu.nvlink_transmitted,
            nvlink_received_bytes_total=gpu.nvlink_received, processes=processes,
        )


def _bus(number: int) -> str:
    return f"0000:{number:02x}:00.0"


def _node_topology(node: _Node) -> NodeTopology:
    """An HGX H100 node's topology, laid out as the contract's simulated node.

    GPU i and NIC i share a PCIe switch (PIX), GPUs and NICs 0-3 are on NUMA 0 and 4-7
    on NUMA 1, storage NICs on root ports (NODE from GPUs of their socket, else SYS).
    """
    gpus = []
    for gpu in node.gpus:
        numa = gpu.index // 4
        nics: dict[str, Literal["PIX", "PXB", "PHB", "NODE", "SYS"]] = {}
        for rail, device in enumerate(_RAIL_DEVICES):
            nics[device] = "PIX" if rail == gpu.index else (
                "NODE" if rail // 4 == numa else "SYS")
        for socket, device in enumerate(STORAGE_NICS):
            nics[device] = "NODE" if socket == numa else "SYS"
        up = NVLINKS_PER_GPU - gpu.nvlinks_down
        peers = []
        down = gpu.nvlinks_down
        for links, bus in zip(NVSWITCH_LINKS, _SWITCH_BUS, strict=True):
            lost = min(down, links)
            down -= lost
            peers.append(NvLinkPeer(kind="switch", links=links - lost, pci_bus_id=_bus(bus)))
        gpus.append(GpuTopology(index=gpu.index, uuid=gpu.uuid,
                                pci_bus_id=_bus(HGX_BUS_NUMBERS[gpu.index]), numa_node=numa,
                                nvlinks=up, peers=peers, nics=nics))
    nic_list = []
    for port in node.ports:
        if port.rail is not None:
            nic_list.append(NicTopology(
                device=port.device, pci_bus_id=_bus(_NIC_BUS[port.rail]),
                numa_node=port.rail // 4, netdev=f"ibp{_NIC_BUS[port.rail]}s0", role="rail",
                rail=port.rail, ports=[NicPortTopology(
                    port=1, guid=_guid(node.name, port.device),
                    link_layer="Ethernet" if port.roce else "InfiniBand",
                    rate_bytes_per_second=port.rate)]))
        else:
            socket = STORAGE_NICS.index(port.device)
            nic_list.append(NicTopology(
                device=port.device, pci_bus_id=_bus(_STORAGE_BUS[socket]), numa_node=socket,
                netdev=f"ens{socket + 1}f0np0", role="storage", ports=[NicPortTopology(
                    port=1, guid=_guid(node.name, port.device), link_layer="Ethernet",
                    rate_bytes_per_second=port.rate)]))
    return NodeTopology(gpus=gpus, nics=nic_list, nvswitches=len(_SWITCH_BUS))


def _guid(node: str, device: str) -> str:
    digits = hashlib.sha256(f"{node}/{device}".encode()).hexdigest()[:16]
    return ":".join(digits[i:i + 4] for i in range(0, 16, 4))


def fault_slowdown(faults: Sequence[FailSlowFault]) -> float:
    """The step time's rise (ratio - 1) these faults alone cause.

    As :class:`FailSlowJob` computes it; for a bench's table of severities.
    """
    compute = inter = intra = 1.0
    for fault in faults:
        if fault.kind == "congested-link":
            inter = max(inter, fault.severity)
        elif fault.kind == "nic-degraded":
            inter = max(inter, RAIL_RATE_BYTES_PER_SECOND / (fault.severity * 1e9 / 8))
        elif fault.kind == "nvlink-slow":
            intra = max(intra, 1.0 / fault.severity)
        elif fault.kind == "gpu-throttled":
            compute = max(compute, 1.0 / fault.severity)
        else:
            compute = max(compute, 1.0 / (1.0 - fault.severity))
    base = COMPUTE_SECONDS + INTER_NODE_SECONDS + INTRA_NODE_SECONDS
    return (COMPUTE_SECONDS * compute + INTER_NODE_SECONDS * inter
            + INTRA_NODE_SECONDS * intra) / base - 1.0
