"""Each GPU's holders and activity from the reports, summed per workload across the fleet.

**The workload's key.** A Kubernetes workload is its pod: ``(namespace, pod)``; a Slurm
workload its job id (``slurm_job``); any other its user (the processes' user, on a GPU
no allocation source claims). An attribution with none of these is not accounted. The
other names (container, partition, job name) describe a workload, they do not key it.

**Held and idle.** A GPU counts for every workload that holds it (its own or one of its
MIG instances: a GPU shared by two workloads counts for both). A held GPU is idle when
its utilization stayed below ``idle_below`` since its holders took it or since it was
last busy, for ``idle_after`` or more; one whose utilization is unknown (a MIG parent)
is never idle. Times are the injected clock's (monotonic), taken at ingest.

**Energy.** The difference of a GPU's energy counter between two reports goes to the
workloads that held it during that interval (those of the earlier report), split evenly
between them; a counter that went back (a driver reload) counts from 0, never negative.
A workload's energy is a counter: it only grows while the workload is listed.

**Forgetting.** A GPU not reported for ``stale_after`` (its node silent, or the GPU
gone) counts for nobody; a workload that has held no GPU for ``forget_after`` leaves
the list (and its energy with it).

Ingest is the hot path (thousands of reports a second): :meth:`WorkloadAccounting.take`
does a few comparisons per GPU and builds nothing for a GPU nobody holds;
:meth:`WorkloadAccounting.usage` does the summing, at a scrape or an API call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sn_monitor.clock import Clock
from sn_monitor.config import Duration, fraction, positive, setting
from sn_monitor.model import GpuReport, GpuWorkloadReport

#: The metrics the accounting reads besides the GPUs' workloads and energy (which trimmed
#: reports always carry): agents that evaluate rules keep sending them.
WORKLOAD_METRICS: tuple[str, ...] = ("gpu_utilization_ratio", "gpu_memory_used_bytes")


@dataclass(frozen=True)
class WorkloadSettings:
    """How workloads are judged (the controller's ``workloads:`` setting)."""

    #: A held GPU below this utilization (0-1) is not working.
    idle_below: float = setting(default=0.05, check=fraction)
    #: ... and idle once it has not worked for this long.
    idle_after: Duration = setting(default=Duration(600.0), check=positive)
    #: A GPU not reported for this long counts for nobody.
    stale_after: Duration = setting(default=Duration(300.0), check=positive)
    #: A workload that held no GPU for this long leaves the list.
    forget_after: Duration = setting(default=Duration(900.0), check=positive)


class WorkloadKey(NamedTuple):
    """Who a workload is (module docstring): the names not part of the key are empty.

    A named tuple: ingest hashes one per held GPU per report.
    """

    namespace: str = ""
    pod: str = ""
    slurm_job: str = ""
    user: str = ""

    @property
    def kind(self) -> str:
        """``kubernetes``, ``slurm`` or ``user``."""
        return "kubernetes" if self.pod else "slurm" if self.slurm_job else "user"


def workload_key(workload: GpuWorkloadReport) -> WorkloadKey | None:
    """The key of one attribution; None when it names no pod, job or user."""
    if workload.pod:
        return WorkloadKey(namespace=workload.namespace or "", pod=workload.pod)
    if workload.slurm_job:
        return WorkloadKey(slurm_job=workload.slurm_job)
    if workload.user:
        return WorkloadKey(user=workload.user)
    return None


class HeldGpu(NamedTuple):
    """One GPU a workload holds: where, and since when it has been idle (None: working)."""

    node: str
    gpu: int
    idle_seconds: float | None


@dataclass(frozen=True, slots=True)
class WorkloadUsage:
    """One workload across the fleet, now."""

    key: WorkloadKey
    gpus: tuple[HeldGpu, ...]
    idle_gpus: int
    #: Mean utilization of its GPUs that report one (None: none does).
    sm_utilization_ratio: float | None
    memory_used_bytes: int
    energy_joules_total: float
    #: The descriptive names its GPUs' reports gave last (``workload_job``, ``partition``).
    job: str = ""
    partition: str = ""


class _Gpu:
    """One GPU's latest holders and activity."""

    __slots__ = ("active_since", "attributions", "energy", "holders", "memory_used", "names",
                 "seen", "utilization")

    def __init__(self) -> None:
        self.holders: tuple[WorkloadKey, ...] = ()
        self.attributions: Sequence[GpuWorkloadReport] = ()
        #: Each holder's job name and partition, as the attributions give them.
        self.names: dict[WorkloadKey, tuple[str, str]] = {}
        self.energy: float | None = None
        self.utilization: float | None = None
        self.memory_used: int | None = None
        #: Since when the GPU has been below ``idle_below`` for its current holders.
        self.active_since = 0.0
        self.seen = 0.0


@dataclass
class _Tally:
    gpus: list[HeldGpu] = field(default_factory=list)
    idle: int = 0
    utilizations: list[float] = field(default_factory=list)
    memory: int = 0
    job: str = ""
    partition: str = ""


def _holders(workloads: Iterable[GpuWorkloadReport]
             ) -> tuple[tuple[WorkloadKey, ...], dict[WorkloadKey, tuple[str, str]]]:
    """The workloads' keys, sorted, and each one's job name and partition."""
    names: dict[WorkloadKey, tuple[str, str]] = {}
    for workload in workloads:
        key = workload_key(workload)
        if key is not None:
            job, partition = names.get(key, ("", ""))
            names[key] = (workload.workload_job or job, workload.partition or partition)
    return tuple(sorted(names)), names


class WorkloadAccounting:
    """The GPUs' holders and activity, taken at ingest; per-workload usage on demand."""

    def __init__(self, clock: Clock, settings: WorkloadSettings | None = None) -> None:
        self._clock = clock
        self.settings = settings if settings is not None else WorkloadSettings()
        self._lock = threading.Lock()
        #: Each node's GPUs as its latest report with GPUs gave them.
        self._latest: dict[str, Sequence[GpuReport]] = {}
        #: The held GPUs of each node that has some, by index.
        self._held: dict[str, dict[int, _Gpu]] = {}
        self._energy: dict[WorkloadKey, float] = {}
        #: When each workload last held a GPU.
        self._last_held: dict[WorkloadKey, float] = {}

    def take(self, node: str, gpus: Sequence[GpuReport]) -> None:
        """A report's GPUs (a trimmed report without GPUs is no news: not called).

        A node none of whose GPUs is held, before or now, costs a look at each GPU's
        workloads: its GPUs are kept as they came (for the energy a GPU taken later had).
        """
        now = self._clock.monotonic()
        with self._lock:
            before = self._latest.get(node)
            self._latest[node] = gpus
            held = self._held.get(node)
            if held is None:
                if not any(gpu.workloads for gpu in gpus):
                    return
                held = self._held[node] = {}
            for report in gpus:
                self._take_gpu(held, report, before, now)
            if not held:
                del self._held[node]

    def _take_gpu(self, held: dict[int, _Gpu], report: GpuReport,
                  before: Sequence[GpuReport] | None, now: float) -> None:
        gpu = held.get(report.index)
        if gpu is None:
            if not report.workloads:
                return  # nobody's GPU, before and now
            gpu = held[report.index] = _Gpu()
            gpu.energy = _energy_of(before, report.index)
        energy = report.energy_joules_total
        if gpu.holders and energy is not None and gpu.energy is not None:
            used = energy - gpu.energy if energy >= gpu.energy else energy  # reset: from 0
            share = used / len(gpu.holders)
            for holder in gpu.holders:
                self._energy[holder] = self._energy.get(holder, 0.0) + share
        taken = False
        if report.workloads != gpu.attributions:  # else (most reports): the same holders
            holders, gpu.names = _holders(report.workloads)
            if not holders:
                del held[report.index]  # given back: its energy no longer counts for anyone
                return
            taken = holders != gpu.holders
            gpu.holders, gpu.attributions = holders, report.workloads
        utilization = report.utilization_ratio
        if taken or utilization is None or utilization >= self.settings.idle_below:
            gpu.active_since = now
        gpu.energy = energy
        gpu.seen = now
        gpu.utilization = utilization
        gpu.memory_used = report.memory_used_bytes
        for holder in gpu.holders:
            self._last_held[holder] = now

    def usage(self) -> list[WorkloadUsage]:
        """Every workload listed now, by key (module docstring).

        Under the lock (which ingest takes) only each node's held GPUs are listed; their
        fields are read after it, while ingest may be setting them: a GPU may be summed
        with one report's utilization and the next one's holders (a report's worth of
        skew), never with a value no report had.
        """
        now = self._clock.monotonic()
        settings = self.settings
        with self._lock:
            nodes = [(node, list(held.items())) for node, held in self._held.items()]
            for holder, last in list(self._last_held.items()):
                if now - last >= settings.forget_after:
                    del self._last_held[holder]
                    self._energy.pop(holder, None)
            listed = list(self._last_held)
            energy = dict(self._energy)
        tallies: dict[WorkloadKey, _Tally] = {}
        gone: list[tuple[str, int]] = []
        for node, held in nodes:
            for index, gpu in held:
                if now - gpu.seen >= settings.forget_after:
                    gone.append((node, index))  # a node removed, or a GPU that left it
                elif now - gpu.seen < settings.stale_after:
                    self._count(tallies, node, index, gpu, now)
        if gone:
            self._forget(gone, now)
        return [_usage(key, tallies.get(key, _Tally()), energy.get(key, 0.0))
                for key in sorted(set(listed) | set(tallies))]

    def _forget(self, gone: list[tuple[str, int]], now: float) -> None:
        """Drop these GPUs, unless a report came for one since."""
        with self._lock:
            for node, index in gone:
                held = self._held.get(node, {})
                gpu = held.get(index)
                if gpu is not None and now - gpu.seen >= self.settings.forget_after:
                    del held[index]
                if not held:
                    self._held.pop(node, None)

    def _count(self, tallies: dict[WorkloadKey, _Tally], node: str, index: int, gpu: _Gpu,
               now: float) -> None:
        """One held GPU, counted for each of its holders."""
        holders, names = gpu.holders, gpu.names
        utilization, memory = gpu.utilization, gpu.memory_used or 0
        quiet = now - gpu.active_since
        idle = quiet >= self.settings.idle_after
        held = HeldGpu(node, index, quiet if idle else None)
        for holder in holders:
            tally = tallies.setdefault(holder, _Tally())
            tally.gpus.append(held)
            tally.idle += idle
            if utilization is not None:
                tally.utilizations.append(utilization)
            tally.memory += memory
            job, partition = names.get(holder, ("", ""))
            tally.job, tally.partition = job or tally.job, partition or tally.partition


def _energy_of(gpus: Sequence[GpuReport] | None, index: int) -> float | None:
    """GPU ``index``'s energy counter in ``gpus`` (None: not there, or not reported)."""
    for gpu in gpus or ():
        if gpu.index == index:
            return gpu.energy_joules_total
    return None


def _usage(key: WorkloadKey, tally: _Tally, energy: float) -> WorkloadUsage:
    utilizations = tally.utilizations
    return WorkloadUsage(
        key=key, gpus=tuple(sorted(tally.gpus, key=lambda g: (g.node, g.gpu))),
        idle_gpus=tally.idle,
        sm_utilization_ratio=sum(utilizations) / len(utilizations) if utilizations else None,
        memory_used_bytes=tally.memory, energy_joules_total=energy, job=tally.job,
        partition=tally.partition)


def workload_document(usage: WorkloadUsage) -> dict[str, Any]:
    """One workload as ``GET /api/v1/workloads`` lists it."""
    key = usage.key
    return {
        "kind": key.kind, "namespace": key.namespace, "pod": key.pod,
        "slurm_job": key.slurm_job, "user": key.user, "job": usage.job,
        "partition": usage.partition, "gpus": len(usage.gpus), "idle_gpus": usage.idle_gpus,
        "sm_utilization_ratio": usage.sm_utilization_ratio,
        "memory_used_bytes": usage.memory_used_bytes,
        "energy_joules_total": usage.energy_joules_total,
        "held": [{"node": g.node, "gpu": g.gpu, "idle": g.idle_seconds is not None,
                  "idle_seconds": g.idle_seconds} for g in usage.gpus],
    }
