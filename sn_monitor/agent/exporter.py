"""Exposition: formats the latest :class:`NodeSnapshot` into Prometheus metric families.

A custom collector in the style of client_python's ``process_collector``: nothing is
registered globally, nothing is set in a loop, and a series missing from the snapshot
(``None``) is simply not yielded, so stale label sets never linger.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sn_monitor import __version__
from sn_monitor.agent.exposition import Family, counter, gauge, to_metric
from sn_monitor.agent.joblog_series import job_log_families
from sn_monitor.agent.snapshot import GpuSample, IbPortSample, NetDeviceSample, NodeSnapshot
from sn_monitor.agent.workload_series import workload_families

if TYPE_CHECKING:
    from prometheus_client.core import Metric

SnapshotSource = Callable[[], NodeSnapshot | None]


@dataclass(frozen=True)
class AgentStatus:
    """The guard's and the reporter's state, beside the snapshot."""

    guard_throttled: frozenset[int] = frozenset()
    guard_gpus: tuple[int, ...] = ()
    controller_configured: bool = False
    reports_total: int = 0
    report_failures_total: int = 0
    spool_pending: int = 0
    spool_dropped_total: int = 0
    #: Every controller the agent may report to, and the one that accepted the latest
    #: accepted report (None: none yet).
    controllers: tuple[str, ...] = ()
    controller_in_use: str | None = None
    controller_switches_total: int = 0
    #: Reports go on a stream to the controller now (False: they are posted).
    report_stream: bool = False


StatusSource = Callable[[], AgentStatus]

GPU_LABELS = ["gpu", "uuid"]

# (metric suffix, GpuSample attribute, help); gauges unless the name ends in _total.
_GPU_VALUES: Sequence[tuple[str, str, str]] = (
    ("utilization_ratio", "utilization_ratio", "Fraction of time one or more SMs were busy."),
    ("memory_utilization_ratio", "memory_utilization_ratio",
     "Fraction of time device memory was being read or written (NVML utilization.memory)."),
    ("memory_bandwidth_utilization_ratio", "memory_bandwidth_utilization_ratio",
     "DRAM bandwidth used against the theoretical maximum (GPM on Hopper+, else NVML)."),
    ("memory_used_bytes", "memory_used_bytes", "Framebuffer memory in use."),
    ("memory_total_bytes", "memory_total_bytes", "Framebuffer memory installed."),
    ("temperature_celsius", "temperature_celsius", "GPU core temperature."),
    ("memory_temperature_celsius", "memory_temperature_celsius", "HBM temperature."),
    ("slowdown_temperature_celsius", "slowdown_temperature_celsius",
     "Temperature at which the GPU slows its clocks (NVML threshold)."),
    ("shutdown_temperature_celsius", "shutdown_temperature_celsius",
     "Temperature at which the GPU shuts down (NVML threshold)."),
    ("max_operating_temperature_celsius", "gpu_max_temperature_celsius",
     "Highest GPU temperature for normal operation (NVML GPU_MAX threshold)."),
    ("memory_max_operating_temperature_celsius", "memory_max_temperature_celsius",
     "Highest HBM temperature for normal operation (NVML MEM_MAX threshold)."),
    ("power_watts", "power_watts", "Power draw."),
    ("power_limit_watts", "power_limit_watts", "Enforced power limit."),
    ("power_default_limit_watts", "power_default_limit_watts", "Default power limit."),
    ("power_min_limit_watts", "power_min_limit_watts", "Lowest power limit that can be set."),
    ("power_max_limit_watts", "power_max_limit_watts", "Highest power limit that can be set."),
    ("energy_joules_total", "energy_joules_total", "Energy consumed since the driver loaded."),
    ("ecc_corrected_errors_total", "ecc_corrected_errors_total",
     "Corrected ECC errors since the driver loaded (volatile)."),
    ("ecc_uncorrected_errors_total", "ecc_uncorrected_errors_total",
     "Uncorrected ECC errors since the driver loaded (volatile)."),
    ("remapped_rows_correctable", "remapped_rows_correctable",
     "HBM rows remapped because of correctable errors."),
    ("remapped_rows_uncorrectable", "remapped_rows_uncorrectable",
     "HBM rows remapped because of uncorrectable errors."),
    ("row_remap_pending", "row_remap_pending", "1 when a row remap waits for a GPU reset."),
    ("row_remap_failed", "row_remap_failed", "1 when a row remap has failed."),
    ("pcie_receive_bytes_per_second", "pcie_receive_bytes_per_second",
     "PCIe receive throughput (GPM: average over the sample interval; older GPUs: "
     "NVML's 20 ms window, read at most every 10 s)."),
    ("pcie_transmit_bytes_per_second", "pcie_transmit_bytes_per_second",
     "PCIe transmit throughput (GPM: average over the sample interval; older GPUs: "
     "NVML's 20 ms window, read at most every 10 s)."),
    ("pcie_replays_total", "pcie_replays_total", "PCIe replays (link-level retransmissions)."),
    ("pcie_link_generation", "pcie_link_generation", "Current PCIe link generation."),
    ("pcie_link_generation_max", "pcie_link_generation_max",
     "Highest PCIe generation the GPU and system support."),
    ("pcie_link_width", "pcie_link_width", "Current PCIe link width (lanes)."),
    ("pcie_link_width_max", "pcie_link_width_max", "Highest PCIe link width (lanes)."),
    ("nvlink_transmitted_bytes_total", "nvlink_transmitted_bytes_total",
     "NVLink data sent over all the GPU's links (NVML counts KiB)."),
    ("nvlink_received_bytes_total", "nvlink_received_bytes_total",
     "NVLink data received over all the GPU's links (NVML counts KiB)."),
    ("fabric_state", "fabric_state",
     "NVLink fabric registration state (NVML): 1 not started, 2 in progress, 3 completed; "
     "absent where the GPU has no fabric. Below 3 for long: Fabric Manager not running."),
    ("fabric_status", "fabric_status",
     "NVML return code of the completed fabric registration: 0 success, else the error."),
    ("fabric_clique_id", "fabric_clique_id",
     "NVLink fabric clique the GPU belongs to (GPUs of one clique share NVLink)."),
)

MIG_LABELS = [*GPU_LABELS, "mig_uuid", "gpu_instance", "compute_instance"]

# (metric name, MigInstanceSample attribute, help), one series per MIG device.
_MIG_VALUES: Sequence[tuple[str, str, str]] = (
    ("sn_mig_memory_used_bytes", "memory_used_bytes", "MIG device memory in use."),
    ("sn_mig_memory_total_bytes", "memory_total_bytes", "MIG device memory."),
    ("sn_mig_sm_utilization_ratio", "sm_utilization_ratio",
     "Fraction of the GPU instance's SMs busy over the sample interval (GPM, Hopper+)."),
    ("sn_mig_memory_bandwidth_utilization_ratio", "memory_bandwidth_utilization_ratio",
     "GPU instance's DRAM bandwidth used against its maximum (GPM, Hopper+)."),
)

_NVLINK_VALUES: Sequence[tuple[str, str, str]] = (
    ("nvlink_crc_errors_total", "crc_errors_total", "NVLink CRC errors (flit and data)."),
    ("nvlink_replay_errors_total", "replay_errors_total", "NVLink replays."),
    ("nvlink_recovery_errors_total", "recovery_errors_total", "NVLink recoveries."),
)

_NET_COUNTERS: Sequence[tuple[str, str, str]] = (
    ("receive_bytes_total", "receive_bytes_total", "Bytes received."),
    ("receive_packets_total", "receive_packets_total", "Packets received."),
    ("receive_errors_total", "receive_errors_total", "Receive errors."),
    ("receive_drops_total", "receive_drops_total", "Received packets dropped."),
    ("transmit_bytes_total", "transmit_bytes_total", "Bytes transmitted."),
    ("transmit_packets_total", "transmit_packets_total", "Packets transmitted."),
    ("transmit_errors_total", "transmit_errors_total", "Transmit errors."),
    ("transmit_drops_total", "transmit_drops_total", "Transmitted packets dropped."),
    ("carrier_changes_total", "carrier_changes_total", "Link carrier up/down transitions."),
)

_IB_HELP = {
    "received_bytes": "Data bytes received (the kernel counts 4-byte words).",
    "transmitted_bytes": "Data bytes transmitted (the kernel counts 4-byte words).",
    "symbol_errors": "Minor link errors detected on one or more physical lanes.",
    "link_downed": "Times the link error recovery process failed and the link went down.",
    "link_error_recovery": "Times the link error recovery process completed.",
}


def _value(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    return float(v)


def _family(name: str, doc: str, labels: list[str]) -> Family:
    if name.endswith("_total"):
        return counter(name[: -len("_total")], doc, labels=labels)
    return gauge(name, doc, labels=labels)


class SnapshotCollector:
    """The metric families of the latest snapshot.

    :meth:`families` for the agent's own text renderer, :meth:`collect` for a
    client_python registry (a collector is anything with ``collect``: the agent itself
    never imports prometheus_client).
    """

    def __init__(self, source: SnapshotSource, status: StatusSource | None = None) -> None:
        self._source = source
        self._status = status

    def collect(self) -> Iterator[Metric]:
        return (to_metric(family) for family in self.families())

    def families(self) -> Iterator[Family]:
        info = gauge("sn_agent_info", "The agent's version.", labels=["version"])
        info.add_metric([__version__], 1.0)
        yield info
        snapshot = self._source()
        if snapshot is None:
            return
        yield gauge(
            "sn_agent_last_sample_timestamp_seconds",
            "When the latest sample was taken (the agent samples on its own clock).",
            value=snapshot.timestamp_seconds,
        )
        yield from self._collectors(snapshot)
        yield from self._gpus(snapshot.gpus)
        yield from workload_families(snapshot)
        yield from job_log_families(snapshot)
        yield from self._xids(snapshot)
        yield from self._net(snapshot.net)
        yield from self._infiniband(snapshot.infiniband)
        yield from self._host(snapshot)
        yield from self._processes(snapshot)
        if self._status is not None:
            yield from self._agent(self._status())

    @staticmethod
    def _agent(status: AgentStatus) -> Iterator[Family]:
        throttled = gauge(
            "sn_guard_throttled", "1 while the agent's thermal guard caps the GPU's power.",
            labels=["gpu"],
        )
        for gpu in sorted({*status.guard_gpus, *status.guard_throttled}):
            throttled.add_metric([str(gpu)], 1.0 if gpu in status.guard_throttled else 0.0)
        yield throttled
        if not status.controller_configured:
            return
        yield counter("sn_agent_reports", "Reports the controller accepted.",
                      value=status.reports_total)
        yield counter("sn_agent_report_failures",
                      "Reports that failed (controller unreachable or refusing).",
                      value=status.report_failures_total)
        yield gauge("sn_agent_spool_events",
                    "Events kept on disk until the controller stores them.",
                    value=status.spool_pending)
        yield counter("sn_agent_spool_dropped_events",
                      "Events dropped because the spool was full.",
                      value=status.spool_dropped_total)
        in_use = gauge(
            "sn_agent_controller_in_use",
            "1 for the controller that accepted the latest accepted report, 0 for the others.",
            labels=["url"],
        )
        for url in status.controllers:
            in_use.add_metric([url], 1.0 if url == status.controller_in_use else 0.0)
        yield in_use
        yield counter(
            "sn_agent_controller_switches",
            "Times a report was accepted by another controller than the one before "
            "(high availability: the active one failed or handed over).",
            value=status.controller_switches_total,
        )
        yield gauge("sn_agent_report_stream",
                    "1 while reports go on a stream to the controller, 0 while they are "
                    "posted (a controller without streams, or none reachable).",
                    value=1.0 if status.report_stream else 0.0)

    @staticmethod
    def _collectors(snapshot: NodeSnapshot) -> Iterator[Family]:
        ok = gauge("sn_agent_collector_success",
                   "1 when the collector's last run succeeded.",
                   labels=["collector"])
        took = gauge("sn_agent_collector_duration_seconds",
                     "How long the collector's last run took (a stuck one: how long its "
                     "run has been going).", labels=["collector"])
        stuck = gauge("sn_agent_collector_stuck",
                      "1 while the collector's run has not returned by its deadline (a hung "
                      "driver call): the agent goes on without its values.",
                      labels=["collector"])
        for status in snapshot.collectors:
            ok.add_metric([status.name], 1.0 if status.success else 0.0)
            took.add_metric([status.name], status.duration_seconds)
            stuck.add_metric([status.name], 1.0 if status.stuck else 0.0)
        yield ok
        yield took
        yield stuck

    @staticmethod
    def _gpus(gpus: Sequence[GpuSample]) -> Iterator[Family]:
        if not gpus:
            return
        info = gauge(
            "sn_gpu_info", "Identity of each GPU.",
            labels=["gpu", "uuid", "name", "pci_bus_id", "driver_version", "serial",
                    "vbios_version"],
        )
        lost = gauge("sn_gpu_lost",
                     "1 when NVML reports the GPU lost or fallen off the bus.",
                     labels=GPU_LABELS)
        for g in gpus:
            info.add_metric([str(g.index), g.uuid, g.name, g.pci_bus_id, g.driver_version or "",
                             g.serial or "", g.vbios_version or ""], 1.0)
            lost.add_metric([str(g.index), g.uuid], 1.0 if g.lost else 0.0)
        yield info
        yield lost
        for suffix, attr, doc in _GPU_VALUES:
            family = _family(f"sn_gpu_{suffix}", doc, GPU_LABELS)
            for g in gpus:
                value = _value(getattr(g, attr))
                if value is not None:
                    family.add_metric([str(g.index), g.uuid], value)
            if family.samples:
                yield family
        processes = gauge(
            "sn_gpu_processes",
            "Compute processes using the GPU (their pids and containers are in the agent's "
            "snapshot, not in labels).",
            labels=GPU_LABELS,
        )
        for g in gpus:
            if g.processes is not None:
                processes.add_metric([str(g.index), g.uuid], float(len(g.processes)))
        if processes.samples:
            yield processes
        yield from _gpu_clocks(gpus)
        yield from _gpu_throttle(gpus)
        yield from _gpu_mig(gpus)
        yield from _gpu_nvlinks(gpus)

    @staticmethod
    def _xids(snapshot: NodeSnapshot) -> Iterator[Family]:
        family = counter(
            "sn_gpu_xid_errors",
            "XID errors by code, from NVML events and the kernel log; the codes after which "
            "NVIDIA says to reset the GPU or reboot are here at 0 before their first error.",
            labels=["gpu", "uuid", "xid"],
        )
        # gpu="" collects the XIDs that name no GPU the agent knows; it is there at 0 too
        totals: dict[tuple[str, str], float] = {}
        for count in snapshot.xid_counts:
            gpu = "" if count.gpu is None else str(count.gpu)
            family.add_metric([gpu, count.uuid, str(count.xid)], float(count.count))
            totals[(gpu, count.uuid)] = totals.get((gpu, count.uuid), 0.0) + count.count
        totals.setdefault(("", ""), 0.0)
        yield family
        every = counter(
            "sn_gpu_xid_errors_all_codes",
            "XID errors of every code, from NVML events and the kernel log: there at 0 on "
            "every GPU before the first error, so increase() counts the first XID of any code.",
            labels=GPU_LABELS,
        )
        for (gpu, uuid), n in totals.items():
            every.add_metric([gpu, uuid], n)
        yield every
        events = counter(
            "sn_agent_events", "Fault events seen since the agent started, by kind.",
            labels=["kind"],
        )
        for kind, n in snapshot.event_counts:
            events.add_metric([kind], float(n))
        yield events

    @staticmethod
    def _net(devices: Sequence[NetDeviceSample]) -> Iterator[Family]:
        if not devices:
            return
        for suffix, attr, doc in _NET_COUNTERS:
            family = _family(f"sn_network_{suffix}", doc, ["device"])
            for d in devices:
                value = _value(getattr(d, attr))
                if value is not None:
                    family.add_metric([d.device], value)
            if family.samples:
                yield family
        for suffix, attr, doc in (
            ("carrier_up", "carrier_up", "1 when the interface has a carrier."),
            ("speed_bytes_per_second", "speed_bytes_per_second", "Negotiated link speed."),
            ("mtu_bytes", "mtu_bytes", "Maximum transmission unit."),
        ):
            family = _family(f"sn_network_{suffix}", doc, ["device"])
            for d in devices:
                value = _value(getattr(d, attr))
                if value is not None:
                    family.add_metric([d.device], value)
            if family.samples:
                yield family

    @staticmethod
    def _infiniband(ports: Sequence[IbPortSample]) -> Iterator[Family]:
        if not ports:
            return
        labels = ["device", "port"]
        info = gauge("sn_infiniband_port_info", "Link layer of each port.",
                     labels=[*labels, "link_layer"])
        for p in ports:
            info.add_metric([p.device, str(p.port), p.link_layer or ""], 1.0)
        yield info
        for suffix, attr, doc in (
            ("state", "state", "Logical port state (1 down, 2 init, 3 armed, 4 active)."),
            ("phys_state", "phys_state", "Physical port state (5 link up, 3 disabled, 2 polling)."),
            ("rate_bytes_per_second", "rate_bytes_per_second", "Negotiated port data rate."),
        ):
            state = gauge(f"sn_infiniband_port_{suffix}", doc, labels=labels)
            for p in ports:
                value = _value(getattr(p, attr))
                if value is not None:
                    state.add_metric([p.device, str(p.port)], value)
            if state.samples:
                yield state
        counters: dict[str, Family] = {}
        for p in ports:
            for stem, value in p.counters:
                family = counters.get(stem)
                if family is None:
                    doc = _IB_HELP.get(stem, f"InfiniBand port counter {stem}.")
                    family = counter(f"sn_infiniband_port_{stem}", doc, labels=labels)
                    counters[stem] = family
                family.add_metric([p.device, str(p.port)], float(value))
        yield from (counters[stem] for stem in sorted(counters))

    @staticmethod
    def _processes(snapshot: NodeSnapshot) -> Iterator[Family]:
        processes = snapshot.processes
        if processes is None:
            return
        yield gauge("sn_host_processes", "Processes on the node (last /proc scan).",
                    value=float(processes.total))
        yield gauge("sn_host_processes_uninterruptible",
                    "Processes in uninterruptible sleep (D) at the last /proc scan.",
                    value=float(processes.uninterruptible))
        yield gauge("sn_host_processes_stuck",
                    "Processes in D state without using CPU time for longer than "
                    "collectors.processes.stuck_after: hung I/O or driver calls.",
                    value=float(processes.stuck_count))

    @staticmethod
    def _host(snapshot: NodeSnapshot) -> Iterator[Family]:
        host = snapshot.host
        if host is None:
            return
        if host.cpu_seconds_total:
            cpu = counter("sn_host_cpu_seconds", "CPU time spent in each mode.",
                          labels=["mode"])
            for mode, seconds in host.cpu_seconds_total:
                cpu.add_metric([mode], seconds)
            yield cpu
        for name, value, doc in (
            ("sn_host_memory_total_bytes", host.memory_total_bytes, "Installed host memory."),
            ("sn_host_memory_available_bytes", host.memory_available_bytes,
             "Host memory available for new work."),
            ("sn_host_load1", host.load1, "One-minute load average."),
        ):
            if value is not None:
                yield gauge(name, doc, value=float(value))
        if host.memory_bandwidth:
            bw = counter(
                "sn_host_memory_bandwidth_bytes",
                "Bytes moved to and from memory per resctrl domain (MBM; does not see DMA).",
                labels=["domain"],
            )
            for sample in host.memory_bandwidth:
                bw.add_metric([sample.domain], float(sample.bytes_total))
            yield bw


def _gpu_clocks(gpus: Iterable[GpuSample]) -> Iterator[Family]:
    current = gauge("sn_gpu_clock_hertz", "Current clock frequency.",
                    labels=[*GPU_LABELS, "clock"])
    highest = gauge("sn_gpu_max_clock_hertz", "Highest clock frequency.",
                    labels=[*GPU_LABELS, "clock"])
    for g in gpus:
        for family, clock, value in (
            (current, "sm", g.sm_clock_hertz),
            (current, "memory", g.memory_clock_hertz),
            (highest, "sm", g.sm_max_clock_hertz),
            (highest, "memory", g.memory_max_clock_hertz),
        ):
            if value is not None:
                family.add_metric([str(g.index), g.uuid, clock], value)
    yield from (f for f in (current, highest) if f.samples)


def _gpu_throttle(gpus: Iterable[GpuSample]) -> Iterator[Family]:
    family = gauge(
        "sn_gpu_throttle_active", "1 while the clock event (throttle) reason is active.",
        labels=[*GPU_LABELS, "reason"],
    )
    for g in gpus:
        for reason, active in g.throttle_reasons or ():
            family.add_metric([str(g.index), g.uuid, reason], 1.0 if active else 0.0)
    if family.samples:
        yield family


def _gpu_mig(gpus: Sequence[GpuSample]) -> Iterator[Family]:
    """MIG mode per GPU, and per MIG device its identity, memory, processes, activity."""
    mode = gauge("sn_gpu_mig_mode", "1 while the GPU is in MIG mode, 0 while not; absent "
                 "on GPUs without MIG.", labels=GPU_LABELS)
    pending = gauge("sn_gpu_mig_mode_pending", "MIG mode after the next GPU reset (1 on, "
                    "0 off); differs from sn_gpu_mig_mode while a change waits.",
                    labels=GPU_LABELS)
    info = gauge("sn_mig_info", "Identity of each MIG device (a compute instance of a GPU "
                 "instance): its UUID, instance ids and profile.",
                 labels=[*MIG_LABELS, "profile"])
    processes = gauge("sn_mig_processes", "Compute processes on the MIG device.",
                      labels=MIG_LABELS)
    values = [(gauge(name, doc, labels=MIG_LABELS), attr) for name, attr, doc in _MIG_VALUES]
    for g in gpus:
        gpu = [str(g.index), g.uuid]
        for family, value in ((mode, g.mig_mode), (pending, g.mig_mode_pending)):
            if value is not None:
                family.add_metric(gpu, 1.0 if value else 0.0)
        for m in g.mig_instances:
            labels = [*gpu, m.uuid, str(m.gpu_instance_id), str(m.compute_instance_id)]
            info.add_metric([*labels, m.profile or ""], 1.0)
            if m.processes is not None:
                processes.add_metric(labels, float(len(m.processes)))
            for family, attr in values:
                number = _value(getattr(m, attr))
                if number is not None:
                    family.add_metric(labels, number)
    families = [mode, pending, info, processes, *(family for family, _ in values)]
    yield from (f for f in families if f.samples)


def _gpu_nvlinks(gpus: Sequence[GpuSample]) -> Iterator[Family]:
    labels = [*GPU_LABELS, "link"]
    up = gauge("sn_gpu_nvlink_up", "1 when the NVLink is active.", labels=labels)
    for g in gpus:
        for link in g.nvlinks:
            if link.up is not None:
                up.add_metric([str(g.index), g.uuid, str(link.link)], 1.0 if link.up else 0.0)
    if up.samples:
        yield up
    for suffix, attr, doc in _NVLINK_VALUES:
        family = _family(f"sn_gpu_{suffix}", doc, labels)
        for g in gpus:
            for link in g.nvlinks:
                value = _value(getattr(link, attr))
                if value is not None:
                    family.add_metric([str(g.index), g.uuid, str(link.link)], value)
        if family.samples:
            yield family
