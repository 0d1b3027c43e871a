"""Reading the kubelet's ``List`` answer: which container holds which device.

Pure functions over the decoded message, no I/O. The kubelet reports every device a
device plugin handed out; :class:`ResourceNames` says which resources are GPUs, and
:func:`device_of` splits the device plugin's id: a GPU UUID (``GPU-...``), a MIG device
UUID (``MIG-...``), either with the time-sliced replica appended (``<uuid>::N``). With the
NVIDIA device plugin's ``index`` id strategy the id is an index, and it comes through as
written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sn_monitor.agent.workloads.model import DeviceAllocation, Workload

if TYPE_CHECKING:
    from sn_monitor.agent.workloads.kubelet.message import ListPodResourcesResponse

SOURCE = "kubelet"
#: What the NVIDIA device plugin advertises: whole GPUs, time-sliced GPUs under their
#: renamed resource, and MIG devices (``mixed`` strategy: one resource per profile).
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")
REPLICA_SEPARATOR = "::"


class MalformedAnswer(ValueError):
    """The answer holds something no device plugin writes (an empty id, a bad replica)."""


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """The resources read as GPUs: exact names, and prefixes (written ``prefix*``)."""

    names: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def of(cls, patterns: tuple[str, ...]) -> ResourceNames:
        """``nvidia.com/gpu`` matches itself; ``nvidia.com/mig-*`` every name it starts."""
        names = frozenset(p for p in patterns if not p.endswith("*"))
        prefixes = tuple(p.removesuffix("*") for p in patterns if p.endswith("*"))
        return cls(names, prefixes)

    def __contains__(self, resource: object) -> bool:
        return isinstance(resource, str) and (
            resource in self.names or resource.startswith(self.prefixes))


def device_of(device_id: str) -> tuple[str, int | None]:
    """``GPU-1::3`` -> ``("GPU-1", 3)``; ``MIG-2`` -> ``("MIG-2", None)``.

    Raises MalformedAnswer for an empty id or a replica that is not a count.
    """
    device, separator, replica = device_id.partition(REPLICA_SEPARATOR)
    if not device:
        raise MalformedAnswer(f"device id {device_id!r} names no device")
    if not separator:
        return device, None
    if not replica.isdecimal():
        raise MalformedAnswer(f"device id {device_id!r}: replica {replica!r} is not a number")
    return device, int(replica)


def allocations_from(answer: ListPodResourcesResponse,
                     resources: ResourceNames) -> tuple[DeviceAllocation, ...]:
    """Every device of ``resources`` in ``answer``, once each, in the answer's order.

    Raises MalformedAnswer (see :func:`device_of`).
    """
    found: dict[DeviceAllocation, None] = {}
    for pod in answer.pod_resources:
        for container in pod.containers:
            workload = Workload(pod=pod.name or None, namespace=pod.namespace or None,
                                container=container.name or None)
            for devices in container.devices:
                if devices.resource_name not in resources:
                    continue
                for device_id in devices.device_ids:
                    device, replica = device_of(device_id)
                    found[DeviceAllocation(device=device, resource=devices.resource_name,
                                           workload=workload, source=SOURCE,
                                           replica=replica)] = None
    return tuple(found)
