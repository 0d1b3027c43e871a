"""The GPU collector's attribution step: who each GPU process is, whose workload each GPU holds.

Once a cycle, as NVML's read builds each GPU's sample (:class:`CycleAttribution`, the
adapter's :class:`~sn_monitor.agent.nvml.sampling.SampleCompletion`), :class:`WorkloadAttribution`:

1. gives each GPU process its identity from /proc (command, user, container, pod UID;
   :class:`~sn_monitor.agent.workloads.processes.ProcessIdentities`, cached per (pid,
   start time));
2. asks every allocation source (:class:`~sn_monitor.agent.workloads.model.AllocationSource`:
   the kubelet, Slurm) what it has allocated. Sources fail soft: one that raises
   :class:`~sn_monitor.agent.workloads.model.SourceUnavailable` is left out of this
   cycle, logged once when it goes down (again only after it has come back and failed
   anew), and reported down (:class:`~sn_monitor.agent.snapshot.SourceStatus`, the
   ``sn_agent_source_up`` gauge); the sample goes on. A source raises nothing else:
   anything it cannot read is ``SourceUnavailable``. A source answers quickly (the
   kubelet's socket with a timeout), or is asked on a thread of its own and answers
   from its last refresh (Slurm: :class:`~sn_monitor.agent.workloads.refreshed.RefreshedSource`):
   it runs inside the nvml collector's deadline;
3. joins both to the GPUs (:mod:`sn_monitor.agent.workloads.join`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from sn_monitor.agent.nvml.sampling import Completed
from sn_monitor.agent.snapshot import GpuProcess, MigInstanceSample, SourceStatus
from sn_monitor.agent.workloads.join import AllocationIndex, device_names, gpu_workloads
from sn_monitor.agent.workloads.model import AllocationSource, DeviceAllocation, SourceUnavailable
from sn_monitor.agent.workloads.processes import (
    JobOf,
    ProcessIdentities,
    ProcessIdentity,
    UserName,
    passwd_user_name,
)

logger = logging.getLogger(__name__)

#: Allocated device names no GPU answered to, remembered so that each is logged once.
MAX_UNMATCHED_REMEMBERED = 256


class SourcePolling:
    """Asks each source once a cycle; remembers which are down, to log each outage once."""

    def __init__(self, sources: Sequence[AllocationSource]) -> None:
        names = [source.name for source in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"allocation sources need distinct names, got {names}")
        self._sources = tuple(sources)
        self._down: set[str] = set()

    def poll(self) -> tuple[list[DeviceAllocation], tuple[SourceStatus, ...]]:
        """Every allocation of the sources that answered, and each source's up/down."""
        allocations: list[DeviceAllocation] = []
        statuses: list[SourceStatus] = []
        for source in self._sources:
            try:
                allocations.extend(source.allocations())
            except SourceUnavailable as error:
                if source.name not in self._down:
                    self._down.add(source.name)
                    logger.warning("workload source %s is unavailable, GPUs are attributed "
                                   "without it until it answers: %s", source.name, error.why,
                                   extra={"source": source.name})
                statuses.append(SourceStatus(source.name, up=False))
                continue
            self._down.discard(source.name)
            statuses.append(SourceStatus(source.name, up=True))
        return allocations, tuple(statuses)

    def close(self) -> None:
        """Close every source; one failing to close does not keep the others open."""
        for source in self._sources:
            try:
                source.close()
            except Exception:
                logger.exception("closing workload source %s failed", source.name,
                                 extra={"source": source.name})


class WorkloadAttribution:
    """Processes identified, sources asked, both joined to each GPU as NVML's read builds it.

    ``procfs`` is the host's /proc (None: processes keep NVML's pid and memory only);
    ``sources`` the allocation sources, asked in order; ``user_name`` turns a uid into
    a name (default: the password database). A cycle is :meth:`begin`, then its
    :meth:`CycleAttribution.complete` for each GPU (the nvml adapter calls it), then its
    :meth:`CycleAttribution.finish`.
    """

    def __init__(
        self,
        procfs: Path | None,
        sources: Sequence[AllocationSource] = (),
        *,
        user_name: UserName = passwd_user_name,
        job_of: JobOf | None = None,
    ) -> None:
        self._identities = (None if procfs is None
                            else ProcessIdentities(procfs, user_name, job_of))
        self._polling = SourcePolling(sources)
        self._unmatched: set[str] = set()

    def begin(self) -> CycleAttribution:
        """A cycle's attribution: the sources asked once, their answers indexed."""
        allocations, statuses = self._polling.poll()
        return CycleAttribution(self._identities, AllocationIndex(allocations), statuses,
                                self._log_unmatched)

    def close(self) -> None:
        """Release the sources (threads, channels)."""
        self._polling.close()

    def _log_unmatched(self, devices: tuple[str, ...]) -> None:
        for device in devices:
            if device in self._unmatched:
                continue
            if len(self._unmatched) >= MAX_UNMATCHED_REMEMBERED:
                self._unmatched.clear()
            self._unmatched.add(device)
            logger.debug("allocated device %s is none of this node's GPUs; left out", device)


class CycleAttribution:
    """One cycle's attribution, GPU by GPU (a :class:`SampleCompletion`)."""

    def __init__(self, identities: ProcessIdentities | None, index: AllocationIndex,
                 statuses: tuple[SourceStatus, ...],
                 log_unmatched: Callable[[tuple[str, ...]], None]) -> None:
        self._identities = identities
        self._index = index
        self._statuses = statuses
        self._log_unmatched = log_unmatched

    def __call__(self, uuid: str, minor_number: int | None,
                 processes: tuple[GpuProcess, ...] | None,
                 mig_instances: tuple[MigInstanceSample, ...]) -> Completed:
        """The GPU's processes with who each is, its workloads, its MIG instances' too."""
        known = self._identify(processes, mig_instances)
        processes = _identified(processes, known)
        instances = tuple(
            replace(mig, processes=identified)
            if (identified := _identified(mig.processes, known)) is not mig.processes
            else mig
            for mig in mig_instances)
        claimed = self._index.claims(device_names(uuid, minor_number, instances))
        return processes, gpu_workloads(claimed, processes or (), instances), instances

    def finish(self) -> tuple[SourceStatus, ...]:
        """Each source's state; the allocated devices no GPU took are logged (once each)."""
        if self._identities is not None:
            self._identities.end_cycle()
        self._log_unmatched(self._index.unmatched())
        return self._statuses

    def _identify(self, processes: tuple[GpuProcess, ...] | None,
                  instances: tuple[MigInstanceSample, ...]) -> dict[int, ProcessIdentity]:
        """Who each of a GPU's processes is; {} without a procfs root."""
        if self._identities is None:
            return {}
        return self._identities.identify(
            p.pid for group in (processes, *(mig.processes for mig in instances))
            for p in group or ())


def _identified(processes: tuple[GpuProcess, ...] | None,
                known: dict[int, ProcessIdentity]) -> tuple[GpuProcess, ...] | None:
    """``processes`` with who each is; the same tuple when nothing is known."""
    if not processes or not known:
        return processes
    return tuple(_with_identity(p, known[p.pid]) if p.pid in known else p
                 for p in processes)


def _with_identity(process: GpuProcess, identity: ProcessIdentity) -> GpuProcess:
    job = identity.job
    return GpuProcess(pid=process.pid, used_memory_bytes=process.used_memory_bytes,
                      container_id=identity.container_id, pod_uid=identity.pod_uid,
                      command=identity.command,
                      user=(job.user if job is not None and job.user else identity.user),
                      sm_utilization_ratio=process.sm_utilization_ratio,
                      slurm_job=job.slurm_job if job is not None else None,
                      partition=job.partition if job is not None else None,
                      workload_job=job.job if job is not None else None)
