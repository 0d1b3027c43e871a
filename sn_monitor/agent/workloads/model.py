"""The shared words of attribution: a workload, a device allocated to it, a source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class SourceUnavailable(Exception):
    """A source cannot answer this cycle (its socket is missing, a file is denied).

    ``source`` names it (``kubelet``, ``slurm``); the message says what failed.
    """

    def __init__(self, source: str, why: str) -> None:
        super().__init__(f"{source}: {why}")
        self.source = source
        self.why = why


@dataclass(frozen=True, slots=True)
class Workload:
    """Who uses a device; each field None where the source does not say.

    ``pod``/``namespace``/``container``: Kubernetes; ``slurm_job``/``user``/``partition``:
    Slurm (``user`` also a plain process's owner); ``job``: the workload's job name
    (a Slurm job's name, a pod's owning job or JobSet), when the source knows it.
    """

    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    slurm_job: str | None = None
    user: str | None = None
    partition: str | None = None
    job: str | None = None


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """A device a platform gave a workload.

    ``device``: a GPU UUID (``GPU-...``) or a MIG device UUID (``MIG-...``), or for a
    source that knows only indices the NVML minor number as text (``minor:N``);
    ``replica``: the time-sliced replica (the ``::N`` of ``<uuid>::N``), None for a whole
    device; ``resource``: the platform's resource name (``nvidia.com/gpu``,
    ``nvidia.com/mig-1g.10gb``, ``gres/gpu``).
    """

    device: str
    resource: str
    workload: Workload
    source: str
    replica: int | None = None


class AllocationSource(Protocol):
    """A platform's record of which workload holds which device."""

    name: str

    def allocations(self) -> tuple[DeviceAllocation, ...]:
        """Every allocation the platform records now; :class:`SourceUnavailable` if none."""
        ...

    def close(self) -> None:
        """Release what the source holds (a channel, a thread)."""
        ...
