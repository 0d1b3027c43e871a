"""DRAM bandwidth and PCIe throughput: GPM where the GPU has it, else a throttled read.

No blocking reads in the cycle: GPM (``nvmlGpmMetricsGet`` between two samples) does not
block, so PCIe throughput comes from it where the GPU has GPM and its PCIe metrics; else
from the blocking ``nvmlDeviceGetPcieThroughput`` at most every
``pcie_throughput_interval`` seconds (see :meth:`GpmMetrics.pcie_throughput`). A GPU in
MIG mode is also sampled per GPU instance (``nvmlGpmMigSampleGet``): each instance's SM
and DRAM activity (:meth:`GpmMetrics.mig_activity`). Imports
:mod:`.calls`, :mod:`.device`, :mod:`.errors` and :mod:`.units`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sn_monitor.agent.nvml.calls import DriverCalls
from sn_monitor.agent.nvml.device import Device
from sn_monitor.agent.nvml.errors import ABSENT, FAULTS, SUCCESS, error_code
from sn_monitor.agent.nvml.units import GPM_PCIE_MIB, clamp_ratio, kilobytes
from sn_monitor.clock import Clock

logger = logging.getLogger(__package__)  # the adapter's one logger (see .calls)

# nvmlDeviceGetPcieThroughput blocks for its 20 ms sampling window: read it this seldom.
PCIE_THROUGHPUT_INTERVAL_SECONDS = 10.0
# GPM's PCIe metric ids are nvml.h's, used when older bindings lack the names.
_GPM_PCIE_TX_PER_SEC = 20
_GPM_PCIE_RX_PER_SEC = 21
_GPM_SM_UTIL = 2


@dataclass(slots=True)
class GpmReading:
    """What one ``nvmlGpmMetricsGet`` between two GPM samples gave; None where nothing."""

    dram_bandwidth: float | None = None
    tensor_active: float | None = None
    pcie_receive: float | None = None
    pcie_transmit: float | None = None


def pcie_from_gpm(device: Device) -> bool:
    """Whether PCIe throughput comes from GPM (decided once GPM support is known)."""
    return bool(device.gpm_supported) and not ({"gpm_pcie", "gpm_metrics"} & device.absent)


class GpmMetrics:
    """GPM samples and metrics per device, and the PCIe throughput read for those without.

    ``clock``'s monotonic time and ``pcie_interval`` (seconds; 0: every cycle) space the
    blocking PCIe throughput reads.
    """

    def __init__(self, calls: DriverCalls, clock: Clock, pcie_interval: float) -> None:
        self._calls = calls
        self._clock = clock
        self._pcie_interval = pcie_interval
        #: The ``nvmlGpmMetricsGet`` request, allocated once (under the lock, like its use).
        self._request: Any = None

    def read(self, device: Device) -> GpmReading:
        """DRAM bandwidth utilization and PCIe throughput, from one ``nvmlGpmMetricsGet``.

        The metrics are averages over the span between the previous and this cycle's GPM
        sample, and taking a sample does not block. The first cycle after start (or after
        a loss) has no previous sample: nothing.
        """
        reading = GpmReading()
        if device.gpm_supported is None:
            support = self._calls.call(device, "gpm", "nvmlGpmQueryDeviceSupport")
            if support is None and not self._calls.known_absent(
                device, "gpm", "nvmlGpmQueryDeviceSupport"
            ):
                return reading  # a transient error: ask again next cycle
            device.gpm_supported = bool(support is not None and support.isSupportedDevice)
            if not device.gpm_supported:
                device.absent.add("gpm")
        if not device.gpm_supported:
            return reading
        nvml = self._calls.nvml
        try:
            current = nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError as error:
            self._calls.classify(device, "gpm", "nvmlGpmSampleAlloc", error)
            return reading
        try:
            nvml.nvmlGpmSampleGet(device.handle, current)
        except nvml.NVMLError as error:
            self._free_sample(device, current)
            self._calls.classify(device, "gpm", "nvmlGpmSampleGet", error)
            if "gpm" in device.absent:
                device.gpm_supported = False
            return reading
        previous, device.gpm_previous = device.gpm_previous, current
        if previous is None:
            return reading
        try:
            self._metrics(device, previous, current, reading)
        finally:
            self._free_sample(device, previous)
        return reading

    def pcie_throughput(
        self, device: Device, reading: GpmReading
    ) -> tuple[float | None, float | None]:
        """PCIe receive and transmit bytes/s: from ``reading`` where GPM has them, else read.

        ``nvmlDeviceGetPcieThroughput`` samples the link over a 20 ms window and blocks
        the caller for it: two calls per GPU on an 8-GPU node are ~320 ms of a 1 s cycle,
        late samples for every other field and a busy NVML lock. So each GPU without GPM
        is read at most once per ``pcie_throughput_interval`` seconds of the clock's
        monotonic time and the last values are served in between; the value stays a 20 ms
        snapshot.
        """
        if pcie_from_gpm(device):
            return reading.pcie_receive, reading.pcie_transmit
        now = self._clock.monotonic()
        if device.pcie_read_at is not None and now - device.pcie_read_at < self._pcie_interval:
            return device.pcie_throughput
        nvml = self._calls.nvml
        device.pcie_read_at = now
        device.pcie_throughput = (
            kilobytes(
                self._calls.call(
                    device, "pcie_rx", "nvmlDeviceGetPcieThroughput", nvml.NVML_PCIE_UTIL_RX_BYTES
                )
            ),
            kilobytes(
                self._calls.call(
                    device, "pcie_tx", "nvmlDeviceGetPcieThroughput", nvml.NVML_PCIE_UTIL_TX_BYTES
                )
            ),
        )
        return device.pcie_throughput

    def mig_activity(
        self, device: Device, gpu_instance_id: int
    ) -> tuple[float | None, float | None]:
        """One GPU instance's SM and DRAM bandwidth utilization (0..1) since the last cycle.

        From two ``nvmlGpmMigSampleGet`` samples of the instance on the parent GPU, one
        kept from the last cycle; nothing on a GPU without GPM, on the first cycle that
        sees the instance, or for a metric the driver does not give.
        """
        if not device.gpm_supported or "gpm_mig" in device.absent:
            return None, None
        nvml = self._calls.nvml
        if getattr(nvml, "nvmlGpmMigSampleGet", None) is None:
            self._calls.function_missing("nvmlGpmMigSampleGet")
            device.absent.add("gpm_mig")
            return None, None
        try:
            current = nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError as error:
            self._calls.classify(device, "gpm_mig", "nvmlGpmSampleAlloc", error)
            return None, None
        try:
            nvml.nvmlGpmMigSampleGet(device.handle, gpu_instance_id, current)
        except nvml.NVMLError as error:
            self._free_sample(device, current)
            self._calls.classify(device, "gpm_mig", "nvmlGpmMigSampleGet", error)
            return None, None
        previous = device.mig_gpm_previous.get(gpu_instance_id)
        device.mig_gpm_previous[gpu_instance_id] = current
        if previous is None:
            return None, None
        sm = int(getattr(nvml, "NVML_GPM_METRIC_SM_UTIL", _GPM_SM_UTIL))
        dram = int(nvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
        try:
            results = self._metrics_get(previous, current, (sm, dram))
        except nvml.NVMLError as error:
            self._calls.classify(device, "gpm_mig", "nvmlGpmMetricsGet", error)
            return None, None
        finally:
            self._free_sample(device, previous)
        (sm_code, sm_value), (dram_code, dram_value) = results
        return (
            clamp_ratio(sm_value / 100.0) if sm_code == SUCCESS else None,
            clamp_ratio(dram_value / 100.0) if dram_code == SUCCESS else None,
        )

    def keep_mig(self, device: Device, gpu_instance_ids: set[int]) -> None:
        """Free the kept samples of GPU instances that are gone."""
        for gpu_instance_id in set(device.mig_gpm_previous) - gpu_instance_ids:
            self._free_sample(device, device.mig_gpm_previous.pop(gpu_instance_id))

    def forget(self, device: Device) -> None:
        """Free the device's kept GPM samples and forget its PCIe reads (a loss, a close)."""
        if device.gpm_previous is not None:
            self._free_sample(device, device.gpm_previous)
            device.gpm_previous = None
        self.keep_mig(device, set())
        device.pcie_read_at = None
        device.pcie_throughput = (None, None)

    def _metrics(self, device: Device, first: Any, second: Any, reading: GpmReading) -> None:
        """Fill ``reading``; a driver that refuses the PCIe metrics loses them, not DRAM."""
        nvml = self._calls.nvml
        dram = int(nvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
        tensor = int(nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL)
        rx = int(getattr(nvml, "NVML_GPM_METRIC_PCIE_RX_PER_SEC", _GPM_PCIE_RX_PER_SEC))
        tx = int(getattr(nvml, "NVML_GPM_METRIC_PCIE_TX_PER_SEC", _GPM_PCIE_TX_PER_SEC))
        with_pcie = pcie_from_gpm(device)
        try:
            results = self._metrics_get(
                first, second, (dram, tensor, rx, tx) if with_pcie else (dram, tensor))
        except nvml.NVMLError as error:
            if not with_pcie or error_code(error) in FAULTS:
                self._calls.classify(device, "gpm_metrics", "nvmlGpmMetricsGet", error)
                return
            # A driver older than the PCIe metric ids may refuse the whole request.
            try:
                results = self._metrics_get(first, second, (dram, tensor))
            except nvml.NVMLError:
                self._calls.classify(device, "gpm_metrics", "nvmlGpmMetricsGet", error)
                return
            self._pcie_absent(device, error)
        code, value = results[0]
        if code == SUCCESS:
            reading.dram_bandwidth = clamp_ratio(value / 100.0)
        code, value = results[1]
        if code == SUCCESS:
            reading.tensor_active = clamp_ratio(value / 100.0)
        if len(results) < 4:
            return
        (rx_code, rx_value), (tx_code, tx_value) = results[2], results[3]
        if rx_code in ABSENT or tx_code in ABSENT:
            absent_code = rx_code if rx_code in ABSENT else tx_code
            self._pcie_absent(device, nvml.NVMLError(absent_code))
            return
        if rx_code == SUCCESS:
            reading.pcie_receive = max(0.0, rx_value) * GPM_PCIE_MIB
        if tx_code == SUCCESS:
            reading.pcie_transmit = max(0.0, tx_value) * GPM_PCIE_MIB

    def _metrics_get(
        self, first: Any, second: Any, metric_ids: tuple[int, ...]
    ) -> list[tuple[int, float]]:
        """One ``nvmlGpmMetricsGet``: per requested metric, its return code and value."""
        nvml = self._calls.nvml
        request = self._request
        if request is None:  # one request, filled again each call: its metrics array is big
            request = self._request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        request.sample1 = first
        request.sample2 = second
        for slot, metric_id in enumerate(metric_ids):
            request.metrics[slot].metricId = metric_id
        nvml.nvmlGpmMetricsGet(request)
        return [
            (int(request.metrics[slot].nvmlReturn), float(request.metrics[slot].value))
            for slot in range(len(metric_ids))
        ]

    def _pcie_absent(self, device: Device, error: BaseException) -> None:
        """GPM without the PCIe metrics: the throttled throughput read takes over for good."""
        device.absent.add("gpm_pcie")
        self._calls.log_once(
            ("gpm_pcie", device.index),
            "GPU %d: GPM has no PCIe metrics (%s); reading nvmlDeviceGetPcieThroughput "
            "every %g s instead",
            device.index,
            error,
            self._pcie_interval,
            gpu=device.index,
        )

    def _free_sample(self, device: Device, sample: Any) -> None:
        nvml = self._calls.nvml
        try:
            nvml.nvmlGpmSampleFree(sample)
        except nvml.NVMLError as error:
            logger.debug("nvmlGpmSampleFree failed: %s", error, extra={"gpu": device.index})
