"""Which workload is on which GPU: the sources' allocations and the processes, joined.

An allocation names its device as the platform does (see
:class:`~sn_monitor.agent.workloads.model.DeviceAllocation`): a GPU UUID (``GPU-...``),
an NVML minor number (``minor:N``, what Slurm's gres and device cgroups know), or a MIG
device UUID (``MIG-...``). :class:`AllocationIndex` holds the cycle's allocations by
those names, and each GPU, as it is read, takes those of its own names
(:func:`device_names`: its UUID, its minor number, its MIG devices' UUIDs), so that a GPU
is completed once, as NVML's read builds it.

A GPU's workloads (:func:`claimed_workloads`, then :func:`gpu_workloads` with its
processes) are:

* every workload a source allocated it (or one of its MIG instances), once however many
  sources, replicas or resources name it; an allocation whose device has no process
  still counts: the GPU is held (an idle allocation is what the platform team looks for);
* on a GPU no source claims, one workload per user of its processes (a plain process:
  its user and nothing else). Where a source claims the GPU its answer stands: a process
  knows its pod by UID only, and the pod's name, namespace and container are the
  source's to give. Each process stays visible on its own (its pid, user, container and
  pod UID) in the per-process series.

Pure: no I/O, no logging; the caller logs the device names no GPU answers to.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sn_monitor.agent.snapshot import GpuProcess, GpuSample, GpuWorkload, MigInstanceSample
from sn_monitor.agent.workloads.model import DeviceAllocation, Workload


def mig_devices(gpu: GpuSample) -> tuple[tuple[str, str], ...]:
    """The GPU's MIG devices as (MIG device UUID, instance label); () without MIG.

    The instance label is the MIG device's UUID: what the kubelet and
    ``CUDA_VISIBLE_DEVICES`` name, and the ``mig_uuid`` of the ``sn_mig_*`` families.
    """
    return tuple((mig.uuid, mig.uuid) for mig in gpu.mig_instances)


def device_names(uuid: str, minor_number: int | None,
                 instances: Sequence[MigInstanceSample]) -> tuple[tuple[str, str | None], ...]:
    """Every name an allocation may give a GPU, each with its MIG instance (None: whole)."""
    names: list[tuple[str, str | None]] = []
    if uuid:
        names.append((uuid, None))
    if minor_number is not None:
        names.append((f"minor:{minor_number}", None))
    names.extend((mig.uuid, mig.uuid) for mig in instances)
    return tuple(names)


class AllocationIndex:
    """The cycle's allocations by the device name each gives; which names a GPU took."""

    def __init__(self, allocations: Iterable[DeviceAllocation]) -> None:
        self._by_device: dict[str, list[DeviceAllocation]] = {}
        for allocation in allocations:
            self._by_device.setdefault(allocation.device, []).append(allocation)
        self._matched: set[str] = set()

    def claims(self, names: Iterable[tuple[str, str | None]]) -> set[GpuWorkload]:
        """The workloads allocated a GPU known by ``names`` (see :func:`device_names`)."""
        found: set[GpuWorkload] = set()
        for name, instance in names:
            held = self._by_device.get(name)
            if held:
                self._matched.add(name)
                found.update(workload_of(a.workload, instance) for a in held)
        return found

    def unmatched(self) -> tuple[str, ...]:
        """The allocated device names no GPU has taken so far, in the sources' order."""
        return tuple(name for name in self._by_device if name not in self._matched)


def workload_of(workload: Workload, mig_instance: str | None = None) -> GpuWorkload:
    """A source's workload as the snapshot keeps it, on ``mig_instance`` (None: whole GPU)."""
    return GpuWorkload(
        mig_instance=mig_instance,
        pod=workload.pod,
        namespace=workload.namespace,
        container=workload.container,
        slurm_job=workload.slurm_job,
        user=workload.user,
        partition=workload.partition,
        workload_job=workload.job,
    )


def _order(workload: GpuWorkload) -> tuple[str, ...]:
    return (
        workload.mig_instance or "",
        workload.namespace or "",
        workload.pod or "",
        workload.container or "",
        workload.slurm_job or "",
        workload.user or "",
        workload.partition or "",
        workload.workload_job or "",
    )


def claimed_workloads(
    gpus: Sequence[GpuSample], allocations: Iterable[DeviceAllocation]
) -> tuple[list[set[GpuWorkload]], tuple[str, ...]]:
    """What the sources allocated on each GPU, in ``gpus``' order; unmatched device names.

    The second item lists the allocated device names no GPU answers to.
    """
    index = AllocationIndex(allocations)
    claimed = [index.claims(device_names(gpu.uuid, gpu.minor_number, gpu.mig_instances))
               for gpu in gpus]
    return claimed, index.unmatched()


def gpu_workloads(
    claimed: set[GpuWorkload], processes: Iterable[GpuProcess],
    instances: Sequence[MigInstanceSample] = (),
) -> tuple[GpuWorkload, ...]:
    """A GPU's workloads, sorted: the sources' claims, else its processes' own.

    A process's own workload is its Slurm job where it runs in one, else its user.

    On a MIG-enabled GPU the users are its MIG devices' (``instances``), each on its
    instance: the parent's process list is theirs together.
    """
    if claimed:
        return tuple(sorted(claimed, key=_order))
    if instances:
        users = {_own(p, mig.uuid) for mig in instances for p in mig.processes or ()
                 if p.user or p.slurm_job}
    else:
        users = {_own(p, None) for p in processes if p.user or p.slurm_job}
    return tuple(sorted(users, key=_order))


def _own(process: GpuProcess, mig_instance: str | None) -> GpuWorkload:
    """A process's own workload: its scheduler job where it runs in one, else its user."""
    return GpuWorkload(mig_instance=mig_instance, user=process.user,
                       slurm_job=process.slurm_job, partition=process.partition,
                       workload_job=process.workload_job)

