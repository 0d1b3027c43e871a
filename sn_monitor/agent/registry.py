"""The collector registry: every collector by name, built from settings when enabled.

Like node_exporter's ``collector.go``: adding a source means one entry here, and each
one is switched on or off by name in the config file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
from sn_monitor.agent.settings import AgentSettings
from sn_monitor.agent.workloads.kubelet import KubeletSource
from sn_monitor.agent.workloads.model import AllocationSource
from sn_monitor.agent.workloads.processes import JobOf
from sn_monitor.agent.workloads.refreshed import RefreshedSource
from sn_monitor.agent.workloads.slurm.allocations import SlurmAllocations
from sn_monitor.agent.workloads.slurm.commands import SlurmCommands
from sn_monitor.agent.workloads.slurm.directory import JobDirectory, SlurmProcessJobs
from sn_monitor.clock import Clock

#: The NVML module the nvml collector calls: real ``pynvml`` or the simulator's fake.
NvmlModule = ModuleType | Any

Factory = Callable[[AgentSettings, NvmlModule, Clock], Collector]

@dataclass(frozen=True)
class Attribution:
    """What the nvml collector attributes GPUs with: allocation sources, a process's job."""

    sources: list[AllocationSource]
    job_of: JobOf | None


def attribution(settings: AgentSettings, clock: Clock) -> Attribution:
    """The attribution sources the config file enables, in a fixed order.

    Each is asked on a thread of its own every ``refresh`` seconds (a kubelet's answer or
    Slurm's commands cost more than a sample may spend); Slurm's also tells the process
    lookup's job directory every job it lists.
    """
    chosen = settings.attribution
    sources: list[AllocationSource] = []
    if chosen.kubelet.enabled:
        sources.append(RefreshedSource(KubeletSource(
            Path(chosen.kubelet.socket), resources=tuple(chosen.kubelet.resources),
            timeout_seconds=float(chosen.kubelet.timeout)), float(chosen.kubelet.refresh)))
    if not chosen.slurm.enabled:
        return Attribution(sources, None)
    commands = SlurmCommands(timeout=float(chosen.slurm.timeout))
    directory = JobDirectory(commands, clock)
    sources.append(RefreshedSource(
        SlurmAllocations(commands, node=chosen.slurm.node, directory=directory),
        float(chosen.slurm.refresh)))
    return Attribution(sources, SlurmProcessJobs(Path(settings.paths.procfs), directory))


def _nvml_collector(settings: AgentSettings, nvml: NvmlModule, clock: Clock) -> Collector:
    chosen = attribution(settings, clock)
    return NvmlCollector(nvml, clock, procfs=Path(settings.paths.procfs),
                         sources=chosen.sources, job_of=chosen.job_of)


COLLECTORS: dict[str, Factory] = {
    "nvml": _nvml_collector,
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
    """The enabled collectors, in registry order; the job's logs last (``job_logs``)."""
    collectors: list[Collector] = [
        factory(settings, nvml, clock)
        for name, factory in COLLECTORS.items()
        if getattr(settings.collectors, name).enabled
    ]
    if settings.job_logs.enabled:
        # imported only when on: the recognition's modules cost an agent without job logs
        # ~1 MB of RSS for nothing (the 40 MB budget of bench.agent_bench)
        from sn_monitor.agent.joblogs.collector import build_job_log_collector

        collectors.append(build_job_log_collector(settings, clock))
    return collectors
