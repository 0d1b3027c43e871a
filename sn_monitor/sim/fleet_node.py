"""One node of ``sn-monitor simulate``'s fleet: what it reports and what faults did to it.

A :class:`FleetNode` is one simulated agent as the fleet keeps it: its sequence, its
events and command results waiting to be sent, the node-local rules it evaluates. A
node hit by a fault gets :class:`NodeFaults`: each faulted GPU becomes a real
:class:`~sn_monitor.sim.gpu_model.SimulatedGpu`, and the fault handlers of
:data:`sn_monitor.sim.node.FAULTS` act on it as on a simulated agent (it duck-types the
:class:`~sn_monitor.sim.node.SimulatedNode` they expect); :func:`remedy` carries out a
reset, a reboot or a verification on those models. :func:`gpu_values` is a simulated
GPU's values as the agent would report them.

It knows nothing of connections or of the schedule (:mod:`sn_monitor.sim.fleet`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any

import msgspec

from sn_monitor import __version__
from sn_monitor.agent.nvml import THROTTLE_REASONS
from sn_monitor.agent.rules import NodeRules
from sn_monitor.agent.settings import VerifySettings
from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot, NvLinkSample
from sn_monitor.agent.verify import snapshot_checks
from sn_monitor.model import (
    MAX_EVENTS,
    Command,
    CommandResult,
    EventRecord,
    GpuReport,
    HostReport,
    Report,
)
from sn_monitor.sim.gpu_model import FABRIC_COMPLETED, H100_SXM, SimulatedGpu
from sn_monitor.sim.node_tree import DEFAULT_IB_DEVICES
from sn_monitor.sim.scenario import NETDEVS

#: The InfiniBand port states a report carries (the ``state`` file's number).
IB_ACTIVE, IB_DOWN = 4, 1


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

    def __init__(self, state: NodeFaults) -> None:
        self._state = state

    def __getitem__(self, index: int) -> SimulatedGpu:
        return self._state.gpu(index)

    def __len__(self) -> int:
        return self._state.gpu_count


class NodeFaults:
    """What a fault changed on one node; duck-types the SimulatedNode that FAULTS expects."""

    def __init__(self, node: FleetNode, base: Report, gpu_count: int, sim_now: float) -> None:
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
                        state=IB_DOWN if d in tree.ib_down else IB_ACTIVE)
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


def remedy(command: Command, state: NodeFaults, now: float) -> CommandResult:
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


class FleetNode:
    """One simulated agent: its sequence, events, command results and faults."""

    __slots__ = ("asked_at", "events", "faults", "head", "in_flight", "index", "labels",
                 "lost", "name", "next_event_id", "results", "results_in_flight", "rules",
                 "rules_version", "sequence", "topology_due", "urgent")

    def __init__(self, index: int, name: str, head: bytes, labels: bytes,
                 first_event_id: int) -> None:
        self.index = index
        self.name = name
        self.head = head
        self.labels = labels
        self.sequence = 0
        self.lost = False
        self.in_flight = False
        self.faults: NodeFaults | None = None
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
        #: Its next report is an events-only one: its new events, at once (the fast path).
        self.urgent = False

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


def events_only_report(node: FleetNode, instance: str, now: float, interval: float,
                       labels: dict[str, str]) -> Report:
    """``node``'s events-only report (:attr:`Report.events_only`): its events, no sample."""
    return Report(node=node.name, instance=instance, sequence=node.sequence,
                  sample_time_seconds=now, interval_seconds=interval,
                  agent_version=__version__, events=node.events[:MAX_EVENTS], labels=labels,
                  events_only=True)
