"""The GPU collector's attribution step: who each GPU process is, whose workload each GPU holds.

Once a cycle, after NVML's read, :class:`WorkloadAttribution`:

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
   kubelet's socket with a timeout): it runs inside the nvml collector's deadline;
3. joins both to the GPUs (:func:`~sn_monitor.agent.workloads.join.join_workloads`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sn_monitor.agent.snapshot import GpuProcess, GpuSample, SourceStatus
from sn_monitor.agent.workloads.join import join_workloads
from sn_monitor.agent.workloads.model import AllocationSource, DeviceAllocation, SourceUnavailable
from sn_monitor.agent.workloads.processes import (
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


class WorkloadAttribution:
    """Processes identified, sources asked, both joined to the cycle's GPUs.

    ``procfs`` is the host's /proc (None: processes keep NVML's pid and memory only);
    ``sources`` the allocation sources, asked in order; ``user_name`` turns a uid into
    a name (default: the password database).
    """

    def __init__(
        self,
        procfs: Path | None,
        sources: Sequence[AllocationSource] = (),
        *,
        user_name: UserName = passwd_user_name,
    ) -> None:
        self._identities = None if procfs is None else ProcessIdentities(procfs, user_name)
        self._polling = SourcePolling(sources)
        self._unmatched: set[str] = set()

    def attribute(
        self, gpus: tuple[GpuSample, ...]
    ) -> tuple[tuple[GpuSample, ...], tuple[SourceStatus, ...]]:
        """The GPUs with their processes' identities and their workloads; each source's state."""
        if self._identities is not None:
            gpus = self._identified(gpus, self._identities)
        allocations, statuses = self._polling.poll()
        joined, unmatched = join_workloads(gpus, allocations)
        self._log_unmatched(unmatched)
        return joined, statuses

    @staticmethod
    def _identified(
        gpus: tuple[GpuSample, ...], identities: ProcessIdentities
    ) -> tuple[GpuSample, ...]:
        pids = [p.pid for gpu in gpus for p in gpu.processes or ()]
        if not pids:
            identities.identify(())  # forget the processes of the cycles before
            return gpus
        known = identities.identify(pids)
        return tuple(
            gpu if not gpu.processes else replace(
                gpu, processes=tuple(_with_identity(p, known[p.pid]) for p in gpu.processes))
            for gpu in gpus
        )

    def _log_unmatched(self, devices: tuple[str, ...]) -> None:
        for device in devices:
            if device in self._unmatched:
                continue
            if len(self._unmatched) >= MAX_UNMATCHED_REMEMBERED:
                self._unmatched.clear()
            self._unmatched.add(device)
            logger.debug("allocated device %s is none of this node's GPUs; left out", device)


def _with_identity(process: GpuProcess, identity: ProcessIdentity) -> GpuProcess:
    return replace(process, command=identity.command, user=identity.user,
                   container_id=identity.container_id, pod_uid=identity.pod_uid)
