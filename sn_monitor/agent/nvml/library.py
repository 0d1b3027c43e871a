"""The adapter's face and life cycle: :class:`NvmlLibrary`.

``nvmlInit`` once, under a lock; ``nvmlShutdown`` on close; the driver version read once;
the devices enumerated and identified; one collect a cycle; the power cap, the running
processes and the NVLink topology on request. The reads themselves are its parts'
(:mod:`.sampling`, :mod:`.nvlink`, :mod:`.gpm`, :mod:`.events`). Imports every module of
the package but the package itself.
"""

from __future__ import annotations

import importlib
import logging
import threading
from types import ModuleType
from typing import Any

from sn_monitor.agent.nvml.calls import DriverCalls
from sn_monitor.agent.nvml.device import Device
from sn_monitor.agent.nvml.errors import (
    ABSENT,
    DRIVER_NOT_LOADED,
    LIBRARY_NOT_FOUND,
    UNREACHABLE,
    DeviceFault,
    GpuUnreachable,
    NvmlError,
    NvmlUnavailable,
    error_code,
)
from sn_monitor.agent.nvml.events import XidEvents
from sn_monitor.agent.nvml.gpm import PCIE_THROUGHPUT_INTERVAL_SECONDS, GpmMetrics
from sn_monitor.agent.nvml.mig import MigDevices
from sn_monitor.agent.nvml.nvlink import NVLINK_LINK_INTERVAL_SECONDS, NvLinks
from sn_monitor.agent.nvml.sampling import GpuSampler, SampleCompletion, identity_fields
from sn_monitor.agent.nvml.units import integer, text
from sn_monitor.agent.pci import canonical_bus_id
from sn_monitor.agent.snapshot import Collected, GpuLinks, GpuSample
from sn_monitor.clock import Clock, SystemClock
from sn_monitor.model import Event

logger = logging.getLogger(__package__)  # the adapter's one logger (see .calls)


def load_pynvml() -> ModuleType:
    """Import NVIDIA's bindings (``nvidia-ml-py``); they load libnvidia-ml at nvmlInit."""
    return importlib.import_module("pynvml")


class NvmlLibrary:
    """NVML for the agent: init once, read typed samples, drain XID events, set power caps.

    ``module`` is ``pynvml`` or :mod:`sn_monitor.sim.fake_nvml`; ``clock`` stamps events
    (wall time) and spaces the blocking PCIe throughput reads (monotonic time).
    ``pcie_throughput_interval`` is the least time in seconds between two
    ``nvmlDeviceGetPcieThroughput`` reads of one GPU without GPM (0: every cycle).
    ``nvlink_link_interval`` is the longest time in seconds a GPU's quiet NVLinks are
    served from the last per-link read (0: read every link every cycle); see
    :meth:`NvLinks.links <sn_monitor.agent.nvml.nvlink.NvLinks.links>`. Thread-safe: the
    sampler and the thermal guard may share one instance.
    """

    def __init__(
        self,
        module: Any,
        clock: Clock | None = None,
        *,
        pcie_throughput_interval: float = PCIE_THROUGHPUT_INTERVAL_SECONDS,
        nvlink_link_interval: float = NVLINK_LINK_INTERVAL_SECONDS,
    ) -> None:
        if pcie_throughput_interval < 0:
            raise ValueError("pcie_throughput_interval must be >= 0")
        if nvlink_link_interval < 0:
            raise ValueError("nvlink_link_interval must be >= 0")
        self._nvml = module
        self._clock: Clock = clock or SystemClock()
        self._calls = DriverCalls(module)
        self._nvlinks = NvLinks(self._calls, self._clock, float(nvlink_link_interval))
        self._gpm = GpmMetrics(self._calls, self._clock, float(pcie_throughput_interval))
        self._sampler = GpuSampler(
            self._calls, self._nvlinks, self._gpm, MigDevices(self._calls, self._gpm, self._clock)
        )
        self._events = XidEvents(self._calls, self._clock)
        self._lock = threading.RLock()
        self._initialized = False
        self._driver_version: str | None = None
        self._driver_version_absent = False
        self._devices: list[Device] = []

    # ---------------------------------------------------------------- life cycle

    @property
    def initialized(self) -> bool:
        return self._initialized

    @property
    def driver_version(self) -> str | None:
        """The kernel driver's version, read once at init; None before or if unreadable."""
        return self._driver_version

    def init(self) -> None:
        """``nvmlInit`` (once) and enumerate the devices.

        Raises :class:`NvmlUnavailable` when the library or the driver is missing, and
        :class:`NvmlError` for any other failure to start.
        """
        with self._lock:
            if self._initialized:
                return
            nvml_error = self._nvml.NVMLError
            try:
                self._nvml.nvmlInit()
            except nvml_error as error:
                if error_code(error) in (LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED):
                    raise NvmlUnavailable(str(error)) from error
                raise NvmlError(f"nvmlInit failed: {error}") from error
            self._initialized = True
            self._driver_version_absent = False
            self._read_driver_version()
            try:
                count = int(self._nvml.nvmlDeviceGetCount())
            except nvml_error as error:
                self._shutdown()
                raise NvmlError(f"nvmlDeviceGetCount failed: {error}") from error
            self._devices = [Device(index) for index in range(count)]
            for device in self._devices:
                try:
                    self._acquire(device)
                except DeviceFault as fault:
                    # Left unidentified: the first collect tries again and reports the loss.
                    logger.debug("GPU %d: fault at init: %s", device.index, fault)

    def _read_driver_version(self) -> None:
        """Read the driver version; after a transient error, again on the next collect."""
        try:
            self._driver_version = str(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError as error:
            self._driver_version_absent = error_code(error) in ABSENT
            self._calls.log_once(("driver_version",), "cannot read the driver version: %s", error)

    def close(self) -> None:
        """Free the event set and GPM samples, then ``nvmlShutdown``."""
        with self._lock:
            if not self._initialized:
                return
            for device in self._devices:
                self._gpm.forget(device)
            self._events.close()
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as error:
            logger.warning("nvmlShutdown failed: %s", error)
        self._initialized = False
        self._devices = []
        self._events.forget_devices()

    # ---------------------------------------------------------------- requests

    def collect(self, complete: SampleCompletion | None = None) -> Collected:
        """Sample every GPU once and drain the XID events queued since the last call.

        ``complete`` completes each GPU's processes and workloads as its sample is built
        (see :class:`~sn_monitor.agent.nvml.sampling.SampleCompletion`).
        """
        with self._lock:
            if not self._initialized:
                raise NvmlError("NVML is not initialized")
            if self._driver_version is None and not self._driver_version_absent:
                self._read_driver_version()
            self._events.forget_stale_links()
            gpus: list[GpuSample] = []
            events: list[Event] = []
            for device in self._devices:
                sample, event = self._sample_device(device, complete)
                gpus.append(sample)
                if event is not None:
                    events.append(event)
            events.extend(self._events.drain())
            return Collected(gpus=tuple(gpus), events=tuple(events))

    def wait_xid_events(self, timeout: float) -> tuple[Event, ...]:
        """Block up to ``timeout`` seconds for XID events (the fast path's waiter thread).

        Not under the adapter's lock: samples, the guard and the topology go on while it
        waits, and :meth:`close` waits at most one ``timeout`` for it. Events it returns
        are not drained by a collect again. Raises :class:`NvmlError` when the wait fails
        (logged once); the caller waits before asking again.
        """
        return tuple(self._events.wait(timeout))

    def set_power_limit_watts(self, index: int, watts: float) -> None:
        """Set GPU ``index``'s power cap (needs root); raises :class:`NvmlError` on refusal."""
        with self._lock:
            if not self._initialized or not 0 <= index < len(self._devices):
                raise NvmlError(f"no NVML device {index}")
            device = self._devices[index]
            try:
                self._nvml.nvmlDeviceSetPowerManagementLimit(device.handle, round(watts * 1000))
            except self._nvml.NVMLError as error:
                raise NvmlError(
                    f"GPU {index}: cannot set power limit to {watts} W: {error}"
                ) from error

    def running_pids(self, index: int) -> tuple[int, ...]:
        """The PIDs of the compute processes on GPU ``index``, sorted.

        Raises :class:`GpuUnreachable` when the GPU is lost or needs a reset (no process
        can use it), and :class:`NvmlError` when the list is unknown: not supported, no
        permission, a function these bindings or this driver lack.
        """
        function = "nvmlDeviceGetComputeRunningProcesses"
        with self._lock:
            if not self._initialized or not 0 <= index < len(self._devices):
                raise NvmlError(f"no NVML device {index}")
            fn = getattr(self._nvml, function, None)
            if fn is None:
                raise NvmlError(f"GPU {index}: running processes unknown: no {function}")
            try:
                handle = self._devices[index].handle
                if handle is None:
                    handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                processes = fn(handle)
            except self._nvml.NVMLError as error:
                if error_code(error) in UNREACHABLE:
                    raise GpuUnreachable(f"GPU {index}: {error}") from error
                raise NvmlError(f"GPU {index}: running processes unknown: {error}") from error
            return tuple(sorted({int(process.pid) for process in processes}))

    def nvlink_topology(self) -> tuple[GpuLinks, ...]:
        """Each GPU's NVLinks: up or not, and what is at the far end of those up.

        For the topology collector, about once a minute. The lock is taken per GPU, so a
        sample waits at most one GPU's links (~50 driver calls). A capability the GPU
        lacks (NotSupported: a PCIe GPU without NVLink, a driver without remote info)
        leaves those values None; any other error raises :class:`NvmlError`, so that a
        topology is never built from a partial read (its caller keeps the last one).
        """
        with self._lock:
            if not self._initialized:
                raise NvmlError("NVML is not initialized")
            devices = list(self._devices)
        gpus: list[GpuLinks] = []
        for device in devices:
            with self._lock:
                try:
                    gpus.append(self._gpu_links(device))
                except DeviceFault as fault:
                    code = error_code(fault.error)
                    error = GpuUnreachable if code in UNREACHABLE else NvmlError
                    raise error(f"GPU {device.index}: {fault}") from fault
        return tuple(gpus)

    def _gpu_links(self, device: Device) -> GpuLinks:
        self._acquire(device)
        if device.handle is None or device.lost:
            raise NvmlError(f"GPU {device.index} is not reachable now")
        return self._nvlinks.remotes(device)

    # ---------------------------------------------------------------- devices

    def _acquire(self, device: Device) -> None:
        """Get the handle and the identity; a GPU lost at start stays unidentified until back."""
        if device.handle is None:
            try:
                device.handle = self._nvml.nvmlDeviceGetHandleByIndex(device.index)
            except self._nvml.NVMLError as error:
                self._calls.log_once(
                    ("handle", device.index, error_code(error)),
                    "GPU %d: no NVML handle: %s",
                    device.index,
                    error,
                    gpu=device.index,
                )
                return
            self._events.track(device)
        if not device.identified:
            self._identify(device)

    def _identify(self, device: Device) -> None:
        """Read what names the GPU; each part is asked until it is read or known absent.

        A transient error on one part must not leave the GPU without a UUID for the life
        of the process.
        """
        call = self._calls.call
        if not device.uuid:
            uuid = call(device, "uuid", "nvmlDeviceGetUUID")
            device.uuid = str(uuid) if uuid is not None else ""
        if not device.name:
            name = call(device, "name", "nvmlDeviceGetName")
            device.name = str(name) if name is not None else ""
        if not device.pci_bus_id:
            pci = call(device, "pci", "nvmlDeviceGetPciInfo")
            if pci is not None:
                raw = str(pci.busId)
                device.pci_bus_id = canonical_bus_id(raw) or raw
        if device.serial is None:
            device.serial = text(call(device, "serial", "nvmlDeviceGetSerial"))
        if device.vbios_version is None:
            device.vbios_version = text(call(device, "vbios", "nvmlDeviceGetVbiosVersion"))
        if device.minor_number is None:
            device.minor_number = integer(call(device, "minor", "nvmlDeviceGetMinorNumber"))
        parts: tuple[tuple[str, str, str | int | None], ...] = (
            ("uuid", "nvmlDeviceGetUUID", device.uuid),
            ("name", "nvmlDeviceGetName", device.name),
            ("pci", "nvmlDeviceGetPciInfo", device.pci_bus_id),
            ("serial", "nvmlDeviceGetSerial", device.serial),
            ("vbios", "nvmlDeviceGetVbiosVersion", device.vbios_version),
            ("minor", "nvmlDeviceGetMinorNumber", device.minor_number),
        )
        device.identified = all(
            value not in (None, "") or self._calls.known_absent(device, key, function)
            for key, function, value in parts
        )

    def _sample_device(self, device: Device,
                       complete: SampleCompletion | None) -> tuple[GpuSample, Event | None]:
        try:
            self._acquire(device)
            if device.handle is None:
                raise DeviceFault("nvmlDeviceGetHandleByIndex", NvmlError("no handle"))
            sample = self._sampler.read(device, self._driver_version, complete)
        except DeviceFault as fault:
            return self._lost_sample(device, fault)
        device.lost = False
        device.last_sample = sample
        self._events.register(device)
        return sample, None

    def _lost_sample(self, device: Device, fault: DeviceFault) -> tuple[GpuSample, Event | None]:
        """The GPU keeps its last known identity; the loss is an event once, not every cycle."""
        sample = GpuSample(**identity_fields(device, self._driver_version), lost=True)
        self._gpm.forget(device)
        device.forget_nvlinks()
        device.forget_mig_devices()
        device.events_registered = False
        if device.lost:
            return sample, None
        device.lost = True
        logger.error(
            "GPU %d (%s) lost: %s",
            device.index,
            device.pci_bus_id or "?",
            fault,
            extra={"gpu": device.index},
        )
        event = Event(
            kind="gpu_lost",
            source="nvml",
            time_seconds=self._clock.time(),
            message=f"GPU {device.index} lost: {fault}",
            gpu=device.index,
            pci_bus_id=device.pci_bus_id or None,
        )
        return sample, event
