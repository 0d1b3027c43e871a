"""The compute processes on a device (a whole GPU or one MIG device), one call a cycle.

Imports :mod:`.calls`, :mod:`.device` and :mod:`.process_utilization`.
"""

from __future__ import annotations

from sn_monitor.agent.nvml.calls import DriverCalls
from sn_monitor.agent.nvml.device import Device
from sn_monitor.agent.nvml.process_utilization import ProcessUtilization
from sn_monitor.agent.snapshot import GpuProcess

# The running-process calls, newest first: pynvml's plain name calls the _v3 symbol,
# which drivers before r510 lack.
PROCESS_FUNCTIONS = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
)


def read_processes(calls: DriverCalls, device: Device,
                   utilization: ProcessUtilization | None = None
                   ) -> tuple[GpuProcess, ...] | None:
    """The compute processes on ``device``: pid, memory, SM utilisation (who: later).

    :class:`~sn_monitor.agent.collectors.gpu.NvmlCollector` adds who each is from
    /proc; NVML knows pids only. None where NVML cannot list them. ``utilization``
    (a whole GPU's; None for a MIG device) gives each process's SM share.
    """
    for function in PROCESS_FUNCTIONS:
        if calls.is_missing(function):
            continue
        found = calls.call(device, "processes", function)
        if found is not None:
            sm = utilization.sm_ratios(device) if found and utilization is not None else {}
            return tuple(
                GpuProcess(
                    pid=int(p.pid),
                    used_memory_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                    sm_utilization_ratio=sm.get(int(p.pid)),
                )
                for p in found
            )
        if not calls.is_missing(function):
            return None
    return None
