"""One GPU's sample a cycle: every per-GPU field, in NVML's units turned into the snapshot's.

:class:`GpuSampler` reads one device into a :class:`~sn_monitor.agent.snapshot.GpuSample`,
the first fault ending the read (:class:`~sn_monitor.agent.nvml.errors.DeviceFault`). The
HBM temperature and the GPU-wide NVLink totals and data come from one batched
``nvmlDeviceGetFieldValues``; the compute processes on the GPU are read every cycle. The
driver calls are made in one fixed order (a fault names the first call that failed),
the MIG mode first: a mode changed since the last cycle probes every field again (see
:mod:`.mig`). Imports :mod:`.calls`, :mod:`.device`, :mod:`.errors`, :mod:`.fabric`,
:mod:`.gpm`, :mod:`.mig`, :mod:`.nvlink`, :mod:`.process_utilization`, :mod:`.processes`
and :mod:`.units`.
"""

from __future__ import annotations

from typing import Any, Protocol

from sn_monitor.agent.nvml.calls import DriverCalls
from sn_monitor.agent.nvml.device import Device
from sn_monitor.agent.nvml.errors import SUCCESS
from sn_monitor.agent.nvml.fabric import read_fabric
from sn_monitor.agent.nvml.gpm import GpmMetrics
from sn_monitor.agent.nvml.mig import MigDevices
from sn_monitor.agent.nvml.nvlink import NvLinks, nvlink_field_ids, nvlink_totals
from sn_monitor.agent.nvml.process_utilization import ProcessUtilization
from sn_monitor.agent.nvml.processes import read_processes
from sn_monitor.agent.nvml.units import (
    field_value,
    integer,
    kib_total,
    mhz,
    milli,
    percent,
    real,
)
from sn_monitor.agent.snapshot import GpuProcess, GpuSample, GpuWorkload, MigInstanceSample

#: A GPU's processes, workloads and MIG instances, as a :class:`SampleCompletion` gives them.
Completed = tuple[tuple[GpuProcess, ...] | None, tuple[GpuWorkload, ...],
                  tuple[MigInstanceSample, ...]]


class SampleCompletion(Protocol):
    """What completes a GPU's processes and workloads as its sample is built.

    Injected from above the adapter (the collector's attribution: who each process is,
    whose workloads hold the GPU), so that a GPU's sample is built once, with them:
    rebuilding a finished sample of ~60 fields for three of them cost more than the
    attribution itself. Given the GPU's UUID, minor number, NVML's processes and its MIG
    instances; answers the three completed.
    """

    def __call__(self, uuid: str, minor_number: int | None,
                 processes: tuple[GpuProcess, ...] | None,
                 mig_instances: tuple[MigInstanceSample, ...]) -> Completed:
        ...

# Clocks-event ("throttle") reason bits, identical under both NVML function names.
THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
#: A group of :class:`GpuSample` fields, by keyword.
SampleFields = dict[str, Any]


def identity_fields(device: Device, driver_version: str | None) -> SampleFields:
    """The fields that name the GPU, as last read (a lost GPU keeps them)."""
    return {
        "index": device.index,
        "uuid": device.uuid,
        "name": device.name,
        "pci_bus_id": device.pci_bus_id,
        "serial": device.serial,
        "vbios_version": device.vbios_version,
        "driver_version": driver_version,
        "minor_number": device.minor_number,
    }


class GpuSampler:
    """Reads a device's fields through ``calls``; NVLinks, GPM, MIG through their readers."""

    def __init__(self, calls: DriverCalls, nvlinks: NvLinks, gpm: GpmMetrics,
                 mig: MigDevices) -> None:
        self._calls = calls
        self._nvlinks = nvlinks
        self._gpm = gpm
        self._mig = mig
        self._utilization = ProcessUtilization(calls)
        self._reasons_function: str | None = "nvmlDeviceGetCurrentClocksEventReasons"

    def read(self, device: Device, driver_version: str | None,
             complete: SampleCompletion | None = None) -> GpuSample:
        """One full read, completed by ``complete``.

        Raises :class:`DeviceFault` on the first fault.
        """
        call = self._calls.call
        mig_mode, mig_pending = self._mig.mode(device)
        if device.nvlink_count is None:
            device.nvlink_count = self._nvlinks.probe(device)  # None: probe again next cycle
        fields = self._field_values(device)
        util = call(device, "utilization", "nvmlDeviceGetUtilizationRates")
        memory = call(device, "memory", "nvmlDeviceGetMemoryInfo")
        memory_ratio = percent(util.memory) if util is not None else None
        gpm = self._gpm.read(device)
        bandwidth = gpm.dram_bandwidth
        if bandwidth is None and device.gpm_supported is False:
            bandwidth = memory_ratio
        pcie = self._gpm.pcie_throughput(device, gpm)
        constraints = self._calls.static(
            device, "power_constraints", "nvmlDeviceGetPowerManagementLimitConstraints"
        )
        reasons = self._throttle_reasons(device)
        remapped = call(device, "remapped_rows", "nvmlDeviceGetRemappedRows")
        fabric = read_fabric(self._calls, device)
        processes = read_processes(self._calls, device, self._utilization)
        instances = self._mig.instances(device)
        workloads: tuple[GpuWorkload, ...] = ()
        if complete is not None:
            processes, workloads, instances = complete(device.uuid, device.minor_number,
                                                       processes, instances)
        return GpuSample(
            **identity_fields(device, driver_version),
            utilization_ratio=percent(util.gpu) if util is not None else None,
            memory_utilization_ratio=memory_ratio,
            tensor_active_ratio=gpm.tensor_active,
            memory_bandwidth_utilization_ratio=bandwidth,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            **self._temperatures(device, fields),
            **self._power(device, constraints),
            **self._clocks(device),
            throttle_reasons=reasons,
            **self._memory_errors(device, remapped),
            **self._pcie(device, pcie),
            nvlinks=self._nvlinks.links(device, nvlink_totals(fields)),
            fabric_state=fabric.state if fabric is not None else None,
            fabric_status=fabric.status if fabric is not None else None,
            fabric_clique_id=fabric.clique_id if fabric is not None else None,
            fabric_cluster_uuid=fabric.cluster_uuid if fabric is not None else None,
            processes=processes,
            workloads=workloads,
            nvlink_transmitted_bytes_total=kib_total(fields.get("nvlink_transmitted_kib")),
            nvlink_received_bytes_total=kib_total(fields.get("nvlink_received_kib")),
            mig_mode=mig_mode,
            mig_mode_pending=mig_pending,
            mig_instances=instances,
        )

    # ------------------------------------------------------------ field groups

    def _temperatures(self, device: Device, fields: dict[str, float]) -> SampleFields:
        nvml = self._calls.nvml
        return {
            "temperature_celsius": real(
                self._calls.call(
                    device, "temperature", "nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU
                )
            ),
            "memory_temperature_celsius": real(fields.get("memory_temperature")),
            "slowdown_temperature_celsius": self._threshold(
                device, "slowdown", nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            "shutdown_temperature_celsius": self._threshold(
                device, "shutdown", nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
            ),
            "gpu_max_temperature_celsius": self._threshold(
                device, "gpu_max", nvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX
            ),
            "memory_max_temperature_celsius": self._threshold(
                device, "mem_max", nvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX
            ),
        }

    def _power(self, device: Device, constraints: Any) -> SampleFields:
        call, static = self._calls.call, self._calls.static
        return {
            "power_watts": milli(call(device, "power", "nvmlDeviceGetPowerUsage")),
            "power_limit_watts": milli(
                call(device, "power_limit", "nvmlDeviceGetEnforcedPowerLimit")
            ),
            "power_default_limit_watts": milli(
                static(device, "power_default", "nvmlDeviceGetPowerManagementDefaultLimit")
            ),
            "power_min_limit_watts": milli(constraints[0]) if constraints is not None else None,
            "power_max_limit_watts": milli(constraints[1]) if constraints is not None else None,
            "energy_joules_total": milli(
                call(device, "energy", "nvmlDeviceGetTotalEnergyConsumption")
            ),
        }

    def _clocks(self, device: Device) -> SampleFields:
        nvml = self._calls.nvml
        call, static = self._calls.call, self._calls.static
        return {
            "sm_clock_hertz": mhz(
                call(device, "sm_clock", "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM)
            ),
            "memory_clock_hertz": mhz(
                call(device, "mem_clock", "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM)
            ),
            "sm_max_clock_hertz": mhz(
                static(device, "sm_max_clock", "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM)
            ),
            "memory_max_clock_hertz": mhz(
                static(device, "mem_max_clock", "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_MEM)
            ),
        }

    def _memory_errors(self, device: Device, remapped: Any) -> SampleFields:
        nvml = self._calls.nvml

        def ecc(key: str, error_type: int) -> int | None:
            return integer(
                self._calls.call(
                    device, key, "nvmlDeviceGetTotalEccErrors", error_type, nvml.NVML_VOLATILE_ECC
                )
            )

        return {
            "ecc_corrected_errors_total": ecc(
                "ecc_corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
            ),
            "ecc_uncorrected_errors_total": ecc(
                "ecc_uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            ),
            "remapped_rows_correctable": int(remapped[0]) if remapped is not None else None,
            "remapped_rows_uncorrectable": int(remapped[1]) if remapped is not None else None,
            "row_remap_pending": bool(remapped[2]) if remapped is not None else None,
            "row_remap_failed": bool(remapped[3]) if remapped is not None else None,
        }

    def _pcie(
        self, device: Device, throughput: tuple[float | None, float | None]
    ) -> SampleFields:
        call, static = self._calls.call, self._calls.static
        return {
            "pcie_receive_bytes_per_second": throughput[0],
            "pcie_transmit_bytes_per_second": throughput[1],
            "pcie_replays_total": integer(
                call(device, "pcie_replays", "nvmlDeviceGetPcieReplayCounter")
            ),
            "pcie_link_generation": integer(
                call(device, "pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration")
            ),
            "pcie_link_generation_max": self._pcie_max_generation(device),
            "pcie_link_width": integer(
                call(device, "pcie_width", "nvmlDeviceGetCurrPcieLinkWidth")
            ),
            "pcie_link_width_max": integer(
                static(device, "pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")
            ),
        }

    # ------------------------------------------------------------ single fields

    def _threshold(self, device: Device, name: str, threshold: int) -> float | None:
        return real(
            self._calls.static(
                device, f"threshold_{name}", "nvmlDeviceGetTemperatureThreshold", threshold
            )
        )

    def _field_values(self, device: Device) -> dict[str, float]:
        """The cycle's field values, from one ``nvmlDeviceGetFieldValues`` for the GPU.

        The HBM temperature (``NVML_FI_DEV_MEMORY_TEMP``) and, on a GPU with NVLinks, the
        four GPU-wide NVLink error totals and the data sent and received over all links
        (KiB), keyed ``memory_temperature``, ``nvlink_total_<counter>`` and
        ``nvlink_{transmitted,received}_kib``. Each value has its own ``nvmlReturn``: one
        that is not supported is left out and never asked again, the others stay. Missing
        from the result: not available this cycle.
        """
        nvml = self._calls.nvml
        wanted: list[tuple[str, int | tuple[int, int]]] = [
            ("memory_temperature", int(nvml.NVML_FI_DEV_MEMORY_TEMP))
        ]
        if device.nvlink_count:
            wanted.extend(nvlink_field_ids(nvml))
        wanted = [(key, field_id) for key, field_id in wanted if key not in device.absent]
        if not wanted:
            return {}
        entries = self._calls.call(
            device,
            "field_values",
            "nvmlDeviceGetFieldValues",
            [field_id for _, field_id in wanted],
        )
        if not entries:
            return {}
        values: dict[str, float] = {}
        for (key, _), entry in zip(wanted, entries, strict=False):
            code = int(entry.nvmlReturn)
            if code != SUCCESS:
                self._calls.classify(
                    device, key, "nvmlDeviceGetFieldValues", nvml.NVMLError(code)
                )
                continue
            value = field_value(nvml, entry)
            if value is not None:
                values[key] = value
        return values

    def _throttle_reasons(self, device: Device) -> tuple[tuple[str, bool], ...] | None:
        """Clock event reasons; drivers before r535 only have the "throttle" name."""
        function = self._reasons_function
        if function is None:
            return None
        mask = self._calls.call(device, "throttle_reasons", function)
        if mask is None and self._calls.is_missing(function):
            fallback = "nvmlDeviceGetCurrentClocksThrottleReasons"
            self._reasons_function = fallback if function != fallback else None
            if self._reasons_function is None:
                return None
            mask = self._calls.call(device, "throttle_reasons", fallback)
        if mask is None:
            return None
        return tuple((name, bool(int(mask) & bit)) for name, bit in THROTTLE_REASONS)

    def _pcie_max_generation(self, device: Device) -> int | None:
        """The GPU's own max generation; the older call also caps it by the slot's."""
        static = self._calls.static
        generation = static(device, "pcie_gen_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration")
        if generation is None:
            generation = static(device, "pcie_gen_max_slot", "nvmlDeviceGetMaxPcieLinkGeneration")
        return integer(generation)
