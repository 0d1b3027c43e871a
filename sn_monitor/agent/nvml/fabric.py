"""A GPU's NVLink fabric registration: state, status, clique and cluster.

``nvmlDeviceGetGpuFabricInfoV``, else the older ``nvmlDeviceGetGpuFabricInfo``: one call
per GPU a cycle. A GPU whose fabric state is ``NOT_SUPPORTED`` has no fabric values, like
one whose driver answers NotSupported. Imports :mod:`.calls` and :mod:`.device`.
"""

from __future__ import annotations

import ctypes
import uuid
from dataclasses import dataclass
from typing import Any

from sn_monitor.agent.nvml.calls import DriverCalls
from sn_monitor.agent.nvml.device import Device

# NVML's GPU fabric states (nvml.h ``NVML_GPU_FABRIC_STATE_*``); stable ABI values.
FABRIC_STATE_NOT_SUPPORTED = 0
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_IN_PROGRESS = 2
FABRIC_STATE_COMPLETED = 3
# The fabric calls, newest first: (function, the struct it fills).
_FABRIC_CALLS: tuple[tuple[str, str], ...] = (
    ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
    ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
)


@dataclass(frozen=True, slots=True)
class Fabric:
    """One GPU's fabric registration, as :func:`read_fabric` read it."""

    state: int
    status: int | None = None
    clique_id: int | None = None
    cluster_uuid: str | None = None


def read_fabric(calls: DriverCalls, device: Device) -> Fabric | None:
    """The GPU's NVLink fabric registration; None where the GPU or driver has none.

    ``status`` (an NVML return code) and the clique and cluster are only meaningful
    once the state is COMPLETED (nvml.h), so they are None before. A state of
    NOT_SUPPORTED is an absent capability, remembered like a NotSupported error.
    """
    for function, struct in _FABRIC_CALLS:
        if calls.is_missing(function):
            continue
        make = getattr(calls.nvml, struct, None)
        if make is None:
            calls.function_missing(function)
            continue
        info = make()
        if calls.call(device, "fabric", function, ctypes.byref(info)) is not None:
            return _fabric_of(device, info)
        if not calls.is_missing(function):
            return None  # absent, or failed this cycle
    return None


def _fabric_of(device: Device, info: Any) -> Fabric | None:
    """A filled ``c_nvmlGpuFabricInfo(V)_t`` -> :class:`Fabric`; None for NOT_SUPPORTED."""
    state = int(info.state)
    if state == FABRIC_STATE_NOT_SUPPORTED:
        device.absent.add("fabric")
        return None
    if state != FABRIC_STATE_COMPLETED:
        return Fabric(state)
    raw = bytes(info.clusterUuid)
    cluster = str(uuid.UUID(bytes=raw)) if len(raw) == 16 else None
    return Fabric(state, int(info.status), int(info.cliqueId), cluster)
