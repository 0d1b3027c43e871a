"""MIG: a GPU's MIG mode and, while it is on, its MIG devices and what each holds.

NVML's semantics, as the adapter reads them:

* ``nvmlDeviceGetMigMode`` gives the current and the pending mode; NotSupported (a GPU
  without MIG) is an absent capability like any other, never asked again. The mode
  changes only when a GPU reset applies a pending change (and an operator sets that), so
  it is read at most every ``mode_interval`` seconds (10 by default), not every cycle.
* With the mode on, ``nvmlDeviceGetMaxMigDeviceCount`` slots are asked with
  ``nvmlDeviceGetMigDeviceHandleByIndex``: NotFound is an empty slot (skipped, no log
  line), each other handle a MIG device, read as a :class:`Device` of its own (its UUID,
  GPU and compute instance ids and name once; memory and processes every cycle).
* A GPU in MIG mode does not give some values for the whole GPU (utilization:
  NotSupported); those are absent capabilities, as on any GPU. The mode changing from
  one cycle to the next (a reset applied a pending change) is a new configuration of the
  device: what was absent is asked again, GPM support probed again, the MIG handles
  and kept GPM samples dropped.
* Per GPU instance activity comes from GPM (:meth:`GpmMetrics.mig_activity
  <sn_monitor.agent.nvml.gpm.GpmMetrics.mig_activity>`), where the GPU has it.

Imports :mod:`.calls`, :mod:`.device`, :mod:`.errors`, :mod:`.gpm` and :mod:`.processes`.
"""

from __future__ import annotations

import logging

from sn_monitor.agent.nvml.calls import DriverCalls
from sn_monitor.agent.nvml.device import Device, handle_key
from sn_monitor.agent.nvml.errors import NOT_FOUND, error_code
from sn_monitor.agent.nvml.gpm import GpmMetrics
from sn_monitor.agent.nvml.processes import read_processes
from sn_monitor.agent.snapshot import MigInstanceSample
from sn_monitor.clock import Clock

logger = logging.getLogger(__package__)  # the adapter's one logger (see .calls)

_HANDLE_FUNCTION = "nvmlDeviceGetMigDeviceHandleByIndex"
_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
#: Seconds between two reads of a GPU's MIG mode.
MODE_INTERVAL_SECONDS = 10.0


def mig_profile(name: str | None) -> str | None:
    """The profile in a MIG device's NVML name (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``)."""
    if not name or " MIG " not in name:
        return None
    return name.rsplit(" MIG ", 1)[1].strip() or None


class MigDevices:
    """Reads a GPU's MIG mode and MIG devices through ``calls``; activity through ``gpm``."""

    def __init__(self, calls: DriverCalls, gpm: GpmMetrics, clock: Clock,
                 mode_interval: float = MODE_INTERVAL_SECONDS) -> None:
        self._calls = calls
        self._gpm = gpm
        self._clock = clock
        self._mode_interval = mode_interval

    def mode(self, device: Device) -> tuple[bool | None, bool | None]:
        """The current and pending MIG mode; None, None on a GPU without MIG.

        Read before the GPU's other fields: a mode changed since the last cycle probes
        them all again this cycle. A transient error leaves the mode unknown this cycle
        and the last one remembered.
        """
        now = self._clock.monotonic()
        read_at = device.mig_mode_read_at
        if read_at is not None and now - read_at < self._mode_interval:
            return device.mig_mode, device.mig_mode_pending
        value = self._calls.call(device, "mig_mode", "nvmlDeviceGetMigMode")
        if value is None:
            return None, None
        device.mig_mode_read_at = now
        current, pending = int(value[0]) == _ENABLED, int(value[1]) == _ENABLED
        if device.mig_mode is not None and current != device.mig_mode:
            self._mode_changed(device, current)
        device.mig_mode, device.mig_mode_pending = current, pending
        return current, pending

    def instances(self, device: Device) -> tuple[MigInstanceSample, ...]:
        """The MIG devices of a GPU in MIG mode, in slot order; () otherwise."""
        if not device.mig_mode or "mig_devices" in device.absent:
            return ()
        count = self._calls.call(device, "mig_count", "nvmlDeviceGetMaxMigDeviceCount")
        samples: list[MigInstanceSample] = []
        activity: dict[int, tuple[float | None, float | None]] = {}
        for slot in range(int(count or 0)):
            child = self._mig_device(device, slot)
            sample = None if child is None else self._read(device, child, activity)
            if sample is not None:
                samples.append(sample)
        self._gpm.keep_mig(device, {sample.gpu_instance_id for sample in samples})
        return tuple(samples)

    def _mode_changed(self, device: Device, current: bool) -> None:
        logger.info(
            "GPU %d: MIG mode %s; probing its capabilities again",
            device.index,
            "enabled" if current else "disabled",
            extra={"gpu": device.index},
        )
        device.absent.clear()
        device.gpm_supported = None
        self._gpm.forget(device)
        device.forget_mig_devices()

    def _mig_device(self, device: Device, slot: int) -> Device | None:
        """The MIG device in ``slot`` (kept while NVML hands out the same handle), or None."""
        nvml = self._calls.nvml
        function = getattr(nvml, _HANDLE_FUNCTION, None)
        if function is None:
            self._calls.function_missing(_HANDLE_FUNCTION)
            device.absent.add("mig_devices")
            return None
        try:
            handle = function(device.handle, slot)
        except nvml.NVMLError as error:
            device.mig_devices.pop(slot, None)
            if error_code(error) != NOT_FOUND:  # NotFound: an empty slot
                self._calls.classify(device, "mig_devices", _HANDLE_FUNCTION, error)
            return None
        child = device.mig_devices.get(slot)
        if child is None or handle_key(child.handle) != handle_key(handle):
            child = device.mig_devices[slot] = Device(device.index, handle=handle)
        return child

    def _read(
        self,
        device: Device,
        child: Device,
        activity: dict[int, tuple[float | None, float | None]],
    ) -> MigInstanceSample | None:
        """One MIG device's sample; None while its identity cannot be read.

        ``activity``: this cycle's GPM reading per GPU instance, read once for the
        compute instances that share one.
        """
        static = self._calls.static
        uuid = static(child, "uuid", "nvmlDeviceGetUUID")
        gpu_instance = static(child, "gpu_instance", "nvmlDeviceGetGpuInstanceId")
        compute_instance = static(child, "compute_instance", "nvmlDeviceGetComputeInstanceId")
        if uuid is None or gpu_instance is None or compute_instance is None:
            return None
        name = static(child, "name", "nvmlDeviceGetName")
        memory = self._calls.call(child, "memory", "nvmlDeviceGetMemoryInfo")
        if int(gpu_instance) not in activity:
            activity[int(gpu_instance)] = self._gpm.mig_activity(device, int(gpu_instance))
        sm, bandwidth = activity[int(gpu_instance)]
        return MigInstanceSample(
            uuid=str(uuid),
            gpu_instance_id=int(gpu_instance),
            compute_instance_id=int(compute_instance),
            profile=mig_profile(None if name is None else str(name)),
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            processes=read_processes(self._calls, child),
            sm_utilization_ratio=sm,
            memory_bandwidth_utilization_ratio=bandwidth,
        )
