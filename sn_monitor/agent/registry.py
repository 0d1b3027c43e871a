"""The collector registry: every collector by name, built from settings when enabled.

Like node_exporter's ``collector.go``: adding a source means one entry here, and each
one is switched on or off by name in the config file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from sn_monitor.agent.collectors.base import Collector
from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.collectors.host import HostCollector
from sn_monitor.agent.collectors.infiniband import InfinibandCollector
from sn_monitor.agent.collectors.kmsg import KmsgCollector
from sn_monitor.agent.collectors.net import NetCollector
from sn_monitor.agent.collectors.processes import ProcessesCollector
from sn_monitor.agent.settings import AgentSettings, AttributionSettings
from sn_monitor.agent.workloads.kubelet import KubeletSource
from sn_monitor.agent.workloads.model import AllocationSource
from sn_monitor.agent.workloads.processes import JobOf
from sn_monitor.agent.workloads.slurm.allocations import SlurmAllocations
from sn_monitor.agent.workloads.slurm.commands import SlurmCommands
from sn_monitor.agent.workloads.slurm.directory import JobDirectory, SlurmProcessJobs
from sn_monitor.clock import Clock

#: The NVML module the nvml collector calls: real ``pynvml`` or the simulator's fake.
NvmlModule = ModuleType | Any

Factory = Callable[[AgentSettings, NvmlModule, Clock], Collector]

def allocation_sources(settings: AttributionSettings, clock: Clock) -> list[AllocationSource]:
    """The attribution sources the config file enables, in a fixed order."""
    sources: list[AllocationSource] = []
    if settings.kubelet.enabled:
        sources.append(KubeletSource(
            Path(settings.kubelet.socket), resources=tuple(settings.kubelet.resources),
            timeout_seconds=float(settings.kubelet.timeout)))
    if settings.slurm.enabled:
        sources.append(SlurmAllocations(
            SlurmCommands(timeout=float(settings.slurm.timeout)), clock,
            node=settings.slurm.node, refresh=float(settings.slurm.refresh)))
    return sources


def process_jobs(settings: AgentSettings, clock: Clock) -> JobOf | None:
    """Which scheduler's job a GPU process runs in (Slurm's, when enabled)."""
    slurm = settings.attribution.slurm
    if not slurm.enabled:
        return None
    return SlurmProcessJobs(Path(settings.paths.procfs), JobDirectory(
        SlurmCommands(timeout=float(slurm.timeout)), clock))


COLLECTORS: dict[str, Factory] = {
    "nvml": lambda s, nvml, clock: NvmlCollector(
        nvml, clock, procfs=Path(s.paths.procfs),
        sources=allocation_sources(s.attribution, clock), job_of=process_jobs(s, clock)),
    "net": lambda s, nvml, clock: NetCollector(
        Path(s.paths.procfs), Path(s.paths.sysfs),
        include=s.collectors.net.include, exclude=s.collectors.net.exclude,
    ),
    "infiniband": lambda s, nvml, clock: InfinibandCollector(Path(s.paths.sysfs)),
    "host": lambda s, nvml, clock: HostCollector(Path(s.paths.procfs), Path(s.paths.sysfs)),
    "kmsg": lambda s, nvml, clock: KmsgCollector(Path(s.paths.kmsg), clock),
    "processes": lambda s, nvml, clock: ProcessesCollector(
        Path(s.paths.procfs), clock,
        interval=s.collectors.processes.interval,
        stuck_after=s.collectors.processes.stuck_after,
    ),
}


def build_collectors(settings: AgentSettings, nvml: NvmlModule, clock: Clock) -> list[Collector]:
    """The enabled collectors, in registry order."""
    return [
        factory(settings, nvml, clock)
        for name, factory in COLLECTORS.items()
        if getattr(settings.collectors, name).enabled
    ]
