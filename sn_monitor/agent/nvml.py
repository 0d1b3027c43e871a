"""The one adapter between the agent and NVML.

Every NVML call the agent makes goes through :class:`NvmlLibrary`, built from an NVML
module passed in: the real ``pynvml`` (:func:`load_pynvml`) or
:mod:`sn_monitor.sim.fake_nvml`. It owns what a long-running daemon must get right:

* ``nvmlInit`` once, under a lock; ``nvmlShutdown`` on close; the driver version read once.
* Capability versus fault. ``NotSupported``, ``NoPermission``, ``Deprecated``,
  ``ArgumentVersionMismatch``, ``VgpuEccNotSupported``, ``FunctionNotFound`` and a function
  missing from the bindings mean the capability is absent: the field is None, remembered
  per (device, field) and never asked again (a missing function: on no device); all but
  ``NotSupported`` are logged once. ``GpuIsLost``, ``Unknown``, ``DriverNotLoaded``,
  ``InsufficientPower``, ``GpuNotFound`` and the like (``_FAULTS``) are faults: the GPU's
  sample is returned with ``lost=True`` and a ``gpu_lost`` event is emitted once per loss.
  Any other error (``Timeout``, ``Memory``, ``InsufficientResources``, ...) is transient:
  the field is left out for this cycle only, asked again the next, and logged once per
  (device, field, error). No decision that is kept for good (the NVLink count, GPM
  support, the identity, the XID event set) is taken on a transient error.
* Init: ``LibraryNotFound`` and ``DriverNotLoaded`` from ``nvmlInit`` mean no NVML on the
  node (:class:`NvmlUnavailable`); any other error is :class:`NvmlError`. A GPU that
  faults while being identified at init is reported lost by the first collect.
* Units: NVML's mW, mJ, MHz, KB/s, MiB/s (GPM) and percent become watts, joules, hertz,
  bytes/s and 0..1 ratios here, nowhere else.
* No blocking reads in the cycle: PCIe throughput comes from GPM where the GPU has it,
  else from the blocking ``nvmlDeviceGetPcieThroughput`` at most every
  ``pcie_throughput_interval`` seconds (see :meth:`NvmlLibrary._pcie_throughput`).
* NVLink without ~700 driver calls a cycle: every cycle one batched
  ``nvmlDeviceGetFieldValues`` per GPU reads the GPU-wide NVLink error totals (with the
  HBM temperature); the per-link state and counters are read again only when those totals
  moved, a link was down, XID 74 arrived, or ``nvlink_link_interval`` seconds have passed
  (see :meth:`NvmlLibrary._nvlinks`).
* XID events from an NVML event set, drained without blocking on every collect.
* The NVLink fabric's registration (``nvmlDeviceGetGpuFabricInfoV``, else the older
  ``nvmlDeviceGetGpuFabricInfo``) and the compute processes on each GPU, every cycle:
  one call each per GPU. A GPU whose fabric state is ``NOT_SUPPORTED`` has no fabric
  values, like one whose driver answers NotSupported.

Nothing else in the agent imports pynvml.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from sn_monitor.agent.pci import canonical_bus_id
from sn_monitor.agent.snapshot import (
    Collected,
    GpuLinks,
    GpuProcess,
    GpuSample,
    NvLinkRemote,
    NvLinkSample,
)
from sn_monitor.clock import Clock, SystemClock
from sn_monitor.errors import SnMonitorError
from sn_monitor.model import Event

logger = logging.getLogger(__name__)

# NVML return codes (nvml.h); stable ABI values, so they need no lookup in the module.
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_INVALID_ARGUMENT = 2
_DRIVER_NOT_LOADED = 9
_TIMEOUT = 10
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_SUCCESS = 0

# Errors that say the capability is not there: leave the field out, for good.
_ABSENT = frozenset(
    {
        _NOT_SUPPORTED,
        _NO_PERMISSION,
        _FUNCTION_NOT_FOUND,
        22,  # VgpuEccNotSupported
        25,  # ArgumentVersionMismatch: the bindings' struct version is not this driver's
        26,  # Deprecated
    }
)
# Errors that say the GPU (or the driver under it) is broken: an event, never "N/A".
_FAULTS = frozenset(
    {
        1,  # Uninitialized: NVML was torn down under us after init
        8,  # InsufficientPower: external power cables not properly attached
        _DRIVER_NOT_LOADED,
        11,  # IrqIssue
        14,  # CorruptedInforom
        15,  # GpuIsLost
        16,  # ResetRequired
        17,  # OperatingSystem
        18,  # LibRmVersionMismatch
        28,  # GpuNotFound: the device is gone
        999,  # Unknown
    }
)

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

# NVML reports PCIe throughput in "KB/s" (nvml.h); nvitop and DCGM read that as KiB/s,
# so 1 KB = 1024 bytes here.
_PCIE_KB = 1024
# GPM's PCIe metrics are MiB/s (pynvml: "PCIe traffic from/to this GPU in MiB/sec"); their
# ids are nvml.h's, used when older bindings lack the names.
_GPM_PCIE_MIB = 1024 * 1024
_GPM_PCIE_TX_PER_SEC = 20
_GPM_PCIE_RX_PER_SEC = 21
# nvmlDeviceGetPcieThroughput blocks for its 20 ms sampling window: read it this seldom.
PCIE_THROUGHPUT_INTERVAL_SECONDS = 10.0
# Quiet NVLinks: the per-link state and counters are read again this seldom.
NVLINK_LINK_INTERVAL_SECONDS = 10.0
# The GPU-wide NVLink error totals (sums over the links), as field values: (the per-link
# key they stand for, pynvml's name, nvml.h's id for bindings that lack the name).
_NVLINK_TOTAL_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("crc_flit", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 38),
    ("crc_data", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 45),
    ("replay", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 52),
    ("recovery", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 59),
)
# NVLink data over all the GPU's links, in KiB, as field values: (key, pynvml's name,
# nvml.h's id). Asked with scope :data:`_ALL_LINKS` (the sum over every link): a bare id
# means scope 0, link 0 alone.
_NVLINK_DATA_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("nvlink_transmitted_kib", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138),
    ("nvlink_received_kib", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139),
)
_ALL_LINKS = 0xFFFFFFFF
_KIB = 1024
# What is at an NVLink's far end: nvml.h's NVML_NVLINK_DEVICE_TYPE_* (IBMNPU: a POWER
# CPU's NVLink port).
_NVLINK_REMOTE_KINDS = {0: "gpu", 1: "cpu", 2: "switch"}
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
# The running-process calls, newest first: pynvml's plain name calls the _v3 symbol,
# which drivers before r510 lack.
_PROCESS_FUNCTIONS = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
)
# XID 74: an NVLink error (a link went down, or errors past the threshold).
_XID_NVLINK = 74
_MAX_EVENTS_PER_COLLECT = 1000
_NVLINK_MAX_LINKS_FALLBACK = 36


class NvmlError(SnMonitorError):
    """NVML could not do what was asked."""


class NvmlUnavailable(NvmlError):
    """No NVML on this node: the library is absent or the kernel driver is not loaded."""


class GpuUnreachable(NvmlError):
    """NVML cannot reach the GPU: lost, gone from the bus, or waiting for a reset."""


# GpuIsLost, ResetRequired, GpuNotFound: the GPU is out of every process's reach until
# it is reset; other faults (DriverNotLoaded, Unknown) say nothing about who uses it.
_UNREACHABLE = frozenset({15, 16, 28})


class _DeviceFault(Exception):
    """A fault error from a device call; ends this cycle's read of that device."""

    def __init__(self, function: str, error: BaseException) -> None:
        super().__init__(f"{function}: {error}")
        self.function = function
        self.error = error


def load_pynvml() -> ModuleType:
    """Import NVIDIA's bindings (``nvidia-ml-py``); they load libnvidia-ml at nvmlInit."""
    return importlib.import_module("pynvml")


def _error_code(error: BaseException) -> int | None:
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


def _handle_key(handle: Any) -> object:
    """A hashable key for a device handle: the address for ctypes pointers, else identity."""
    if isinstance(handle, ctypes._Pointer):
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    return ("obj", id(handle))


@dataclass(slots=True)
class _Device:
    """What the adapter remembers about one NVML device between cycles."""

    index: int
    handle: Any = None
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    serial: str | None = None
    vbios_version: str | None = None
    identified: bool = False
    absent: set[str] = field(default_factory=set)
    static: dict[str, Any] = field(default_factory=dict)
    nvlink_count: int | None = None
    nvlink_links: tuple[NvLinkSample, ...] = ()
    nvlink_read_at: float | None = None
    nvlink_totals: tuple[int, ...] | None = None
    nvlink_settled: bool = False
    gpm_supported: bool | None = None
    gpm_previous: Any = None
    pcie_read_at: float | None = None
    pcie_throughput: tuple[float | None, float | None] = (None, None)
    events_registered: bool = False
    lost: bool = False
    last_sample: GpuSample | None = None


@dataclass(frozen=True, slots=True)
class _Fabric:
    """One GPU's fabric registration, as :meth:`NvmlLibrary._fabric` read it."""

    state: int
    status: int | None = None
    clique_id: int | None = None
    cluster_uuid: str | None = None


def _fabric_of(device: _Device, info: Any) -> _Fabric | None:
    """A filled ``c_nvmlGpuFabricInfo(V)_t`` -> :class:`_Fabric`; None for NOT_SUPPORTED."""
    state = int(info.state)
    if state == FABRIC_STATE_NOT_SUPPORTED:
        device.absent.add("fabric")
        return None
    if state != FABRIC_STATE_COMPLETED:
        return _Fabric(state)
    raw = bytes(info.clusterUuid)
    cluster = str(uuid.UUID(bytes=raw)) if len(raw) == 16 else None
    return _Fabric(state, int(info.status), int(info.cliqueId), cluster)


@dataclass(slots=True)
class _GpmReading:
    """What one ``nvmlGpmMetricsGet`` between two GPM samples gave; None where nothing."""

    dram_bandwidth: float | None = None
    pcie_receive: float | None = None
    pcie_transmit: float | None = None


class NvmlLibrary:
    """NVML for the agent: init once, read typed samples, drain XID events, set power caps.

    ``module`` is ``pynvml`` or :mod:`sn_monitor.sim.fake_nvml`; ``clock`` stamps events
    (wall time) and spaces the blocking PCIe throughput reads (monotonic time).
    ``pcie_throughput_interval`` is the least time in seconds between two
    ``nvmlDeviceGetPcieThroughput`` reads of one GPU without GPM (0: every cycle).
    ``nvlink_link_interval`` is the longest time in seconds a GPU's quiet NVLinks are
    served from the last per-link read (0: read every link every cycle); see
    :meth:`_nvlinks`. Thread-safe: the sampler and the thermal guard may share one instance.
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
        self._pcie_interval = float(pcie_throughput_interval)
        self._nvlink_interval = float(nvlink_link_interval)
        self._lock = threading.RLock()
        self._initialized = False
        self._driver_version: str | None = None
        self._driver_version_absent = False
        self._devices: list[_Device] = []
        self._by_handle: dict[object, _Device] = {}
        self._missing_functions: set[str] = set()
        self._logged: set[tuple[object, ...]] = set()
        self._event_set: Any = None
        self._event_set_failed = False
        self._reasons_function: str | None = "nvmlDeviceGetCurrentClocksEventReasons"
        #: The ``nvmlGpmMetricsGet`` request, allocated once (under the lock, like its use).
        self._gpm_request: Any = None

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
                if _error_code(error) in (_LIBRARY_NOT_FOUND, _DRIVER_NOT_LOADED):
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
            self._devices = [_Device(index) for index in range(count)]
            for device in self._devices:
                try:
                    self._acquire(device)
                except _DeviceFault as fault:
                    # Left unidentified: the first collect tries again and reports the loss.
                    logger.debug("GPU %d: fault at init: %s", device.index, fault)

    def _read_driver_version(self) -> None:
        """Read the driver version; after a transient error, again on the next collect."""
        try:
            self._driver_version = str(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError as error:
            self._driver_version_absent = _error_code(error) in _ABSENT
            self._log_once(("driver_version",), "cannot read the driver version: %s", error)

    def close(self) -> None:
        """Free the event set and GPM samples, then ``nvmlShutdown``."""
        with self._lock:
            if not self._initialized:
                return
            for device in self._devices:
                if device.gpm_previous is not None:
                    self._free_gpm_sample(device, device.gpm_previous)
                    device.gpm_previous = None
            if self._event_set is not None:
                try:
                    self._nvml.nvmlEventSetFree(self._event_set)
                except self._nvml.NVMLError as error:
                    logger.debug("nvmlEventSetFree failed: %s", error)
                self._event_set = None
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as error:
            logger.warning("nvmlShutdown failed: %s", error)
        self._initialized = False
        self._devices = []
        self._by_handle = {}

    # ---------------------------------------------------------------- one cycle

    def collect(self) -> Collected:
        """Sample every GPU once and drain the XID events queued since the last call."""
        with self._lock:
            if not self._initialized:
                raise NvmlError("NVML is not initialized")
            if self._driver_version is None and not self._driver_version_absent:
                self._read_driver_version()
            gpus: list[GpuSample] = []
            events: list[Event] = []
            for device in self._devices:
                sample, event = self._sample_device(device)
                gpus.append(sample)
                if event is not None:
                    events.append(event)
            events.extend(self._drain_xid_events())
            return Collected(gpus=tuple(gpus), events=tuple(events))

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
                if _error_code(error) in _UNREACHABLE:
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
                except _DeviceFault as fault:
                    code = _error_code(fault.error)
                    error = GpuUnreachable if code in _UNREACHABLE else NvmlError
                    raise error(f"GPU {device.index}: {fault}") from fault
        return tuple(gpus)

    def _gpu_links(self, device: _Device) -> GpuLinks:
        self._acquire(device)
        if device.handle is None or device.lost:
            raise NvmlError(f"GPU {device.index} is not reachable now")
        if device.nvlink_count is None:
            device.nvlink_count = self._probe_nvlinks(device)
            if device.nvlink_count is None:
                raise NvmlError(f"GPU {device.index}: its NVLinks could not be counted now")
        enabled = int(self._nvml.NVML_FEATURE_ENABLED)
        links: list[NvLinkRemote] = []
        for link in range(device.nvlink_count):
            state = self._call(device, "nvlink_state", "nvmlDeviceGetNvLinkState", link,
                               strict=True)
            if state is None or int(state) != enabled:
                links.append(NvLinkRemote(link, up=None if state is None else False))
                continue
            kind = self._call(device, "nvlink_remote_type",
                              "nvmlDeviceGetNvLinkRemoteDeviceType", link, strict=True)
            pci = self._call(device, "nvlink_remote_pci", "nvmlDeviceGetNvLinkRemotePciInfo",
                             link, strict=True)
            links.append(NvLinkRemote(
                link,
                up=True,
                remote_kind=None if kind is None else _NVLINK_REMOTE_KINDS.get(int(kind),
                                                                               "unknown"),
                remote_pci_bus_id=None if pci is None else canonical_bus_id(str(pci.busId)),
            ))
        return GpuLinks(device.index, device.uuid, device.pci_bus_id, tuple(links))

    # ---------------------------------------------------------------- devices

    def _acquire(self, device: _Device) -> None:
        """Get the handle and the identity; a GPU lost at start stays unidentified until back."""
        nvml_error = self._nvml.NVMLError
        if device.handle is None:
            try:
                device.handle = self._nvml.nvmlDeviceGetHandleByIndex(device.index)
            except nvml_error as error:
                self._log_once(
                    ("handle", device.index, _error_code(error)),
                    "GPU %d: no NVML handle: %s",
                    device.index,
                    error,
                    gpu=device.index,
                )
                return
            self._by_handle[_handle_key(device.handle)] = device
        if device.identified:
            return
        # Each part is asked until it is read or known absent: a transient error on one
        # must not leave the GPU without a UUID for the life of the process.
        if not device.uuid:
            uuid = self._call(device, "uuid", "nvmlDeviceGetUUID")
            device.uuid = str(uuid) if uuid is not None else ""
        if not device.name:
            name = self._call(device, "name", "nvmlDeviceGetName")
            device.name = str(name) if name is not None else ""
        if not device.pci_bus_id:
            pci = self._call(device, "pci", "nvmlDeviceGetPciInfo")
            if pci is not None:
                raw = str(pci.busId)
                device.pci_bus_id = canonical_bus_id(raw) or raw
        if device.serial is None:
            device.serial = _text(self._call(device, "serial", "nvmlDeviceGetSerial"))
        if device.vbios_version is None:
            device.vbios_version = _text(
                self._call(device, "vbios", "nvmlDeviceGetVbiosVersion")
            )
        parts = (
            ("uuid", "nvmlDeviceGetUUID", device.uuid),
            ("name", "nvmlDeviceGetName", device.name),
            ("pci", "nvmlDeviceGetPciInfo", device.pci_bus_id),
            ("serial", "nvmlDeviceGetSerial", device.serial),
            ("vbios", "nvmlDeviceGetVbiosVersion", device.vbios_version),
        )
        device.identified = all(
            value or key in device.absent or function in self._missing_functions
            for key, function, value in parts
        )

    def _sample_device(self, device: _Device) -> tuple[GpuSample, Event | None]:
        try:
            self._acquire(device)
            if device.handle is None:
                raise _DeviceFault("nvmlDeviceGetHandleByIndex", NvmlError("no handle"))
            sample = self._read(device)
        except _DeviceFault as fault:
            return self._lost_sample(device, fault)
        device.lost = False
        device.last_sample = sample
        self._register_events(device)
        return sample, None

    def _lost_sample(self, device: _Device, fault: _DeviceFault) -> tuple[GpuSample, Event | None]:
        """The GPU keeps its last known identity; the loss is an event once, not every cycle."""
        sample = GpuSample(
            index=device.index,
            uuid=device.uuid,
            name=device.name,
            pci_bus_id=device.pci_bus_id,
            serial=device.serial,
            vbios_version=device.vbios_version,
            driver_version=self._driver_version,
            lost=True,
        )
        if device.gpm_previous is not None:
            self._free_gpm_sample(device, device.gpm_previous)
            device.gpm_previous = None
        device.pcie_read_at = None
        device.pcie_throughput = (None, None)
        self._forget_nvlinks(device)
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

    def _read(self, device: _Device) -> GpuSample:
        """One full read; raises :class:`_DeviceFault` on the first fault."""
        nvml = self._nvml
        if device.nvlink_count is None:
            device.nvlink_count = self._probe_nvlinks(device)  # None: probe again next cycle
        fields = self._field_values(device)
        util = self._call(device, "utilization", "nvmlDeviceGetUtilizationRates")
        memory = self._call(device, "memory", "nvmlDeviceGetMemoryInfo")
        memory_ratio = _percent(util.memory) if util is not None else None
        gpm = self._gpm_read(device)
        bandwidth = gpm.dram_bandwidth
        if bandwidth is None and device.gpm_supported is False:
            bandwidth = memory_ratio
        if self._pcie_from_gpm(device):
            pcie_receive, pcie_transmit = gpm.pcie_receive, gpm.pcie_transmit
        else:
            pcie_receive, pcie_transmit = self._pcie_throughput(device)
        constraints = self._static(
            device, "power_constraints", "nvmlDeviceGetPowerManagementLimitConstraints"
        )
        reasons = self._throttle_reasons(device)
        remapped = self._call(device, "remapped_rows", "nvmlDeviceGetRemappedRows")
        fabric = self._fabric(device)
        return GpuSample(
            index=device.index,
            uuid=device.uuid,
            name=device.name,
            pci_bus_id=device.pci_bus_id,
            serial=device.serial,
            vbios_version=device.vbios_version,
            driver_version=self._driver_version,
            utilization_ratio=_percent(util.gpu) if util is not None else None,
            memory_utilization_ratio=memory_ratio,
            memory_bandwidth_utilization_ratio=bandwidth,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            temperature_celsius=_float(
                self._call(
                    device, "temperature", "nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU
                )
            ),
            memory_temperature_celsius=_float(fields.get("memory_temperature")),
            slowdown_temperature_celsius=self._threshold(
                device, "slowdown", nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            shutdown_temperature_celsius=self._threshold(
                device, "shutdown", nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
            ),
            gpu_max_temperature_celsius=self._threshold(
                device, "gpu_max", nvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX
            ),
            memory_max_temperature_celsius=self._threshold(
                device, "mem_max", nvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX
            ),
            power_watts=_milli(self._call(device, "power", "nvmlDeviceGetPowerUsage")),
            power_limit_watts=_milli(
                self._call(device, "power_limit", "nvmlDeviceGetEnforcedPowerLimit")
            ),
            power_default_limit_watts=_milli(
                self._static(device, "power_default", "nvmlDeviceGetPowerManagementDefaultLimit")
            ),
            power_min_limit_watts=_milli(constraints[0]) if constraints is not None else None,
            power_max_limit_watts=_milli(constraints[1]) if constraints is not None else None,
            energy_joules_total=_milli(
                self._call(device, "energy", "nvmlDeviceGetTotalEnergyConsumption")
            ),
            sm_clock_hertz=_mhz(
                self._call(device, "sm_clock", "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM)
            ),
            memory_clock_hertz=_mhz(
                self._call(device, "mem_clock", "nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM)
            ),
            sm_max_clock_hertz=_mhz(
                self._static(
                    device, "sm_max_clock", "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM
                )
            ),
            memory_max_clock_hertz=_mhz(
                self._static(
                    device, "mem_max_clock", "nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_MEM
                )
            ),
            throttle_reasons=reasons,
            ecc_corrected_errors_total=_int(
                self._call(
                    device,
                    "ecc_corrected",
                    "nvmlDeviceGetTotalEccErrors",
                    nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                    nvml.NVML_VOLATILE_ECC,
                )
            ),
            ecc_uncorrected_errors_total=_int(
                self._call(
                    device,
                    "ecc_uncorrected",
                    "nvmlDeviceGetTotalEccErrors",
                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nvml.NVML_VOLATILE_ECC,
                )
            ),
            remapped_rows_correctable=int(remapped[0]) if remapped is not None else None,
            remapped_rows_uncorrectable=int(remapped[1]) if remapped is not None else None,
            row_remap_pending=bool(remapped[2]) if remapped is not None else None,
            row_remap_failed=bool(remapped[3]) if remapped is not None else None,
            pcie_receive_bytes_per_second=pcie_receive,
            pcie_transmit_bytes_per_second=pcie_transmit,
            pcie_replays_total=_int(
                self._call(device, "pcie_replays", "nvmlDeviceGetPcieReplayCounter")
            ),
            pcie_link_generation=_int(
                self._call(device, "pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration")
            ),
            pcie_link_generation_max=self._pcie_max_generation(device),
            pcie_link_width=_int(
                self._call(device, "pcie_width", "nvmlDeviceGetCurrPcieLinkWidth")
            ),
            pcie_link_width_max=_int(
                self._static(device, "pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")
            ),
            nvlinks=self._nvlinks(device, _nvlink_totals(fields)),
            fabric_state=fabric.state if fabric is not None else None,
            fabric_status=fabric.status if fabric is not None else None,
            fabric_clique_id=fabric.clique_id if fabric is not None else None,
            fabric_cluster_uuid=fabric.cluster_uuid if fabric is not None else None,
            processes=self._processes(device),
            nvlink_transmitted_bytes_total=_kib_total(fields.get("nvlink_transmitted_kib")),
            nvlink_received_bytes_total=_kib_total(fields.get("nvlink_received_kib")),
        )

    # ---------------------------------------------------------------- the call wrapper

    def _call(self, device: _Device, key: str, function: str, *args: Any,
              strict: bool = False) -> Any:
        """Call ``function(handle, *args)``; None when absent, :class:`_DeviceFault` on faults.

        ``key`` names the field for the per-device "not supported" memory. ``strict``: an
        error that is neither absence nor a fault (a transient one) raises
        :class:`NvmlError` instead of leaving the value out (a topology is never built
        from a half-read).
        """
        if key in device.absent or function in self._missing_functions:
            return None
        fn = getattr(self._nvml, function, None)
        if fn is None:
            self._function_missing(function)
            return None
        try:
            return fn(device.handle, *args)
        except self._nvml.NVMLError as error:
            code = _error_code(error)
            if strict and code not in _ABSENT and code not in _FAULTS:
                raise NvmlError(f"GPU {device.index}: {function} failed: {error}") from error
            self._classify(device, key, function, error)  # a fault raises here
            return None

    def _classify(self, device: _Device, key: str, function: str, error: BaseException) -> None:
        """Remember an absent capability, raise a fault, log anything else once."""
        code = _error_code(error)
        if code == _FUNCTION_NOT_FOUND:
            self._function_missing(function)
        elif code == _NO_PERMISSION:
            device.absent.add(key)
            self._log_once(
                ("permission", function),
                "%s: no permission (%s); left out",
                function,
                error,
                level=logging.WARNING,
                gpu=device.index,
            )
        elif code in _ABSENT and code != _NOT_SUPPORTED:
            device.absent.add(key)
            self._log_once(
                ("absent", function, code),
                "%s: %s; left out",
                function,
                error,
                gpu=device.index,
            )
        elif code in _ABSENT:
            device.absent.add(key)
            logger.debug(
                "GPU %d: %s not supported; %s left out",
                device.index,
                function,
                key,
                extra={"gpu": device.index},
            )
        elif code in _FAULTS:
            raise _DeviceFault(function, error) from error
        else:
            self._log_once(
                ("error", device.index, key, code),
                "GPU %d: %s failed: %s; %s left out this cycle",
                device.index,
                function,
                error,
                key,
                level=logging.WARNING,
                gpu=device.index,
            )

    def _static(self, device: _Device, key: str, function: str, *args: Any) -> Any:
        """A value that does not change while the driver is loaded: read until it succeeds."""
        if key in device.static:
            return device.static[key]
        value = self._call(device, key, function, *args)
        if value is not None:
            device.static[key] = value
        return value

    def _function_missing(self, function: str) -> None:
        if function not in self._missing_functions:
            self._missing_functions.add(function)
            logger.info("NVML function %s is not available with this driver; left out", function)

    def _log_once(
        self,
        key: tuple[object, ...],
        message: str,
        *args: object,
        level: int = logging.INFO,
        gpu: int | None = None,
    ) -> None:
        """Log ``message`` the first time ``key`` is seen; ``gpu`` goes into the line's context."""
        if key not in self._logged:
            self._logged.add(key)
            extra = {"gpu": gpu} if gpu is not None else None
            logger.log(level, message, *args, extra=extra)

    # ---------------------------------------------------------------- fields

    def _threshold(self, device: _Device, name: str, threshold: int) -> float | None:
        return _float(
            self._static(
                device, f"threshold_{name}", "nvmlDeviceGetTemperatureThreshold", threshold
            )
        )

    def _field_values(self, device: _Device) -> dict[str, float]:
        """The cycle's field values, from one ``nvmlDeviceGetFieldValues`` for the GPU.

        The HBM temperature (``NVML_FI_DEV_MEMORY_TEMP``) and, on a GPU with NVLinks, the
        four GPU-wide NVLink error totals and the data sent and received over all links
        (KiB), keyed ``memory_temperature``, ``nvlink_total_<counter>`` and
        ``nvlink_{transmitted,received}_kib``. Each value has its own ``nvmlReturn``: one
        that is not supported is left out and never asked again, the others stay. Missing
        from the result: not available this cycle.
        """
        nvml = self._nvml
        wanted: list[tuple[str, int | tuple[int, int]]] = [
            ("memory_temperature", int(nvml.NVML_FI_DEV_MEMORY_TEMP))
        ]
        if device.nvlink_count:
            wanted.extend(
                (f"nvlink_total_{counter}", int(getattr(nvml, name, field_id)))
                for counter, name, field_id in _NVLINK_TOTAL_FIELDS
            )
            wanted.extend(
                (key, (int(getattr(nvml, name, field_id)), _ALL_LINKS))
                for key, name, field_id in _NVLINK_DATA_FIELDS
            )
        wanted = [(key, field_id) for key, field_id in wanted if key not in device.absent]
        if not wanted:
            return {}
        entries = self._call(
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
            if code != _SUCCESS:
                self._classify(device, key, "nvmlDeviceGetFieldValues", nvml.NVMLError(code))
                continue
            value = _field_value(nvml, entry)
            if value is not None:
                values[key] = value
        return values

    def _throttle_reasons(self, device: _Device) -> tuple[tuple[str, bool], ...] | None:
        """Clock event reasons; drivers before r535 only have the "throttle" name."""
        function = self._reasons_function
        if function is None:
            return None
        mask = self._call(device, "throttle_reasons", function)
        if mask is None and function in self._missing_functions:
            fallback = "nvmlDeviceGetCurrentClocksThrottleReasons"
            self._reasons_function = fallback if function != fallback else None
            if self._reasons_function is None:
                return None
            mask = self._call(device, "throttle_reasons", fallback)
        if mask is None:
            return None
        return tuple((name, bool(int(mask) & bit)) for name, bit in THROTTLE_REASONS)

    def _pcie_max_generation(self, device: _Device) -> int | None:
        """The GPU's own max generation; the older call also caps it by the slot's."""
        generation = self._static(device, "pcie_gen_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration")
        if generation is None:
            generation = self._static(
                device, "pcie_gen_max_slot", "nvmlDeviceGetMaxPcieLinkGeneration"
            )
        return _int(generation)

    def _fabric(self, device: _Device) -> _Fabric | None:
        """The GPU's NVLink fabric registration; None where the GPU or driver has none.

        ``status`` (an NVML return code) and the clique and cluster are only meaningful
        once the state is COMPLETED (nvml.h), so they are None before. A state of
        NOT_SUPPORTED is an absent capability, remembered like a NotSupported error.
        """
        nvml = self._nvml
        for function, struct in _FABRIC_CALLS:
            if function in self._missing_functions:
                continue
            make = getattr(nvml, struct, None)
            if make is None:
                self._function_missing(function)
                continue
            info = make()
            if self._call(device, "fabric", function, ctypes.byref(info)) is not None:
                return _fabric_of(device, info)
            if function not in self._missing_functions:
                return None  # absent, or failed this cycle
        return None

    def _processes(self, device: _Device) -> tuple[GpuProcess, ...] | None:
        """The compute processes on the GPU: pid and memory (container ids come later).

        :class:`~sn_monitor.agent.collectors.gpu.NvmlCollector` adds the container of
        each from /proc; NVML knows pids only.
        """
        for function in _PROCESS_FUNCTIONS:
            if function in self._missing_functions:
                continue
            found = self._call(device, "processes", function)
            if found is not None:
                return tuple(
                    GpuProcess(
                        pid=int(p.pid),
                        used_memory_bytes=(
                            None if p.usedGpuMemory is None else int(p.usedGpuMemory)
                        ),
                    )
                    for p in found
                )
            if function not in self._missing_functions:
                return None
        return None

    def _nvlinks(self, device: _Device, totals: tuple[int, ...] | None) -> tuple[NvLinkSample, ...]:
        """Per link: state and counters, read per link only when something may have changed.

        Reading every link is 5 driver calls (state and 4 error counters) per link each an
        RM ioctl: 720 a cycle on an 8 x 18-link H100 node. So the per-link values are
        read again only when

        * ``totals`` (this cycle's GPU-wide CRC flit, CRC data, replay and recovery totals,
          from the one batched field-values call) differ from those seen at the last
          per-link read: an error happened, and this cycle shows on which link;
        * the totals are not available (not supported, or failed this cycle): every
          cycle, as before;
        * the last per-link read was incomplete (a transient error on some value);
        * XID 74 (NVLink error) arrived for the GPU, the GPU came back after a loss, or
          ``nvlink_link_interval`` seconds passed since the last per-link read.

        Otherwise the cached links are served, and only a link that was down has its
        state asked again (one call each), so a link coming back shows within a cycle.

        The trade-off: a link *going down* with no error counted on any link (the totals
        do not move) and no XID 74 shows only at the next per-link read, at most
        ``nvlink_link_interval`` seconds late. A link drop normally comes with recovery
        attempts (the recovery total moves) and XID 74, either of which forces the read,
        so it shows within one cycle. A quiet GPU costs no extra call: the totals ride in
        the field-values call made for the HBM temperature anyway.
        """
        count = device.nvlink_count or 0
        if count == 0:
            return ()
        now = self._clock.monotonic()
        if (
            device.nvlink_settled
            and device.nvlink_read_at is not None
            and now - device.nvlink_read_at < self._nvlink_interval
            and totals is not None
            and totals == device.nvlink_totals
            and len(device.nvlink_links) == count
            and self._down_links_still_down(device)
        ):
            return device.nvlink_links
        device.nvlink_links, device.nvlink_settled = self._read_nvlinks(device, count)
        device.nvlink_read_at = now
        device.nvlink_totals = totals
        return device.nvlink_links

    def _down_links_still_down(self, device: _Device) -> bool:
        """Ask the state of each link that was down; False as soon as one is not."""
        disabled = int(self._nvml.NVML_FEATURE_DISABLED)
        for link in device.nvlink_links:
            if link.up is False:
                state = self._call(device, "nvlink_state", "nvmlDeviceGetNvLinkState", link.link)
                if state is None or int(state) != disabled:
                    return False
        return True

    def _read_nvlinks(self, device: _Device, count: int) -> tuple[tuple[NvLinkSample, ...], bool]:
        """Every link's state and counters, and whether every value was read.

        ``crc_errors_total`` is CRC_FLIT + CRC_DATA. A value left out for good (absent)
        still counts as read; one that failed this cycle does not.
        """
        nvml = self._nvml
        settled = True

        def get(key: str, function: str, *args: Any) -> Any:
            nonlocal settled
            value = self._call(device, key, function, *args)
            if (
                value is None
                and key not in device.absent
                and function not in self._missing_functions
            ):
                settled = False
            return value

        def counter(name: str, link: int, counter_type: int) -> int | None:
            return _int(
                get(f"nvlink_{name}", "nvmlDeviceGetNvLinkErrorCounter", link, counter_type)
            )

        enabled = int(nvml.NVML_FEATURE_ENABLED)
        links: list[NvLinkSample] = []
        for link in range(count):
            state = get("nvlink_state", "nvmlDeviceGetNvLinkState", link)
            flit = counter("crc_flit", link, nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
            data = counter("crc_data", link, nvml.NVML_NVLINK_ERROR_DL_CRC_DATA)
            links.append(
                NvLinkSample(
                    link=link,
                    up=None if state is None else int(state) == enabled,
                    crc_errors_total=(
                        None if flit is None and data is None else (flit or 0) + (data or 0)
                    ),
                    replay_errors_total=counter("replay", link, nvml.NVML_NVLINK_ERROR_DL_REPLAY),
                    recovery_errors_total=counter(
                        "recovery", link, nvml.NVML_NVLINK_ERROR_DL_RECOVERY
                    ),
                )
            )
        return tuple(links), settled

    @staticmethod
    def _forget_nvlinks(device: _Device) -> None:
        """The next cycle reads every link again (after a loss, or on XID 74)."""
        device.nvlink_links = ()
        device.nvlink_read_at = None
        device.nvlink_totals = None
        device.nvlink_settled = False

    def _probe_nvlinks(self, device: _Device) -> int | None:
        """Count links: ask link 0, 1, ... until the driver says InvalidArgument/NotSupported.

        None when a transient error cut the probe short: the count is kept for good, so it
        is not taken from a partial probe; the next cycle probes again.
        """
        fn = getattr(self._nvml, "nvmlDeviceGetNvLinkState", None)
        if fn is None:
            self._function_missing("nvmlDeviceGetNvLinkState")
            return 0
        limit = int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", _NVLINK_MAX_LINKS_FALLBACK))
        for link in range(limit):
            try:
                fn(device.handle, link)
            except self._nvml.NVMLError as error:
                code = _error_code(error)
                if code in (_INVALID_ARGUMENT, _NOT_SUPPORTED):
                    return link
                if code in _FAULTS:
                    raise _DeviceFault("nvmlDeviceGetNvLinkState", error) from error
                self._classify(device, "nvlink_state", "nvmlDeviceGetNvLinkState", error)
                if code in _ABSENT:
                    return link
                return None
        return limit

    # ---------------------------------------------------------------- GPM

    def _gpm_read(self, device: _Device) -> _GpmReading:
        """DRAM bandwidth utilization and PCIe throughput, from one ``nvmlGpmMetricsGet``.

        The metrics are averages over the span between the previous and this cycle's GPM
        sample, and taking a sample does not block. The first cycle after start (or after
        a loss) has no previous sample: nothing.
        """
        reading = _GpmReading()
        if device.gpm_supported is None:
            support = self._call(device, "gpm", "nvmlGpmQueryDeviceSupport")
            if (
                support is None
                and "gpm" not in device.absent
                and "nvmlGpmQueryDeviceSupport" not in self._missing_functions
            ):
                return reading  # a transient error: ask again next cycle
            device.gpm_supported = bool(support is not None and support.isSupportedDevice)
            if not device.gpm_supported:
                device.absent.add("gpm")
        if not device.gpm_supported:
            return reading
        nvml = self._nvml
        try:
            current = nvml.nvmlGpmSampleAlloc()
        except nvml.NVMLError as error:
            self._classify(device, "gpm", "nvmlGpmSampleAlloc", error)
            return reading
        try:
            nvml.nvmlGpmSampleGet(device.handle, current)
        except nvml.NVMLError as error:
            self._free_gpm_sample(device, current)
            self._classify(device, "gpm", "nvmlGpmSampleGet", error)
            if "gpm" in device.absent:
                device.gpm_supported = False
            return reading
        previous, device.gpm_previous = device.gpm_previous, current
        if previous is None:
            return reading
        try:
            self._gpm_metrics(device, previous, current, reading)
        finally:
            self._free_gpm_sample(device, previous)
        return reading

    def _gpm_metrics(self, device: _Device, first: Any, second: Any, reading: _GpmReading) -> None:
        """Fill ``reading``; a driver that refuses the PCIe metrics loses them, not DRAM."""
        nvml = self._nvml
        dram = int(nvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
        rx = int(getattr(nvml, "NVML_GPM_METRIC_PCIE_RX_PER_SEC", _GPM_PCIE_RX_PER_SEC))
        tx = int(getattr(nvml, "NVML_GPM_METRIC_PCIE_TX_PER_SEC", _GPM_PCIE_TX_PER_SEC))
        with_pcie = self._pcie_from_gpm(device)
        try:
            results = self._gpm_metrics_get(first, second, (dram, rx, tx) if with_pcie else (dram,))
        except nvml.NVMLError as error:
            if not with_pcie or _error_code(error) in _FAULTS:
                self._classify(device, "gpm_metrics", "nvmlGpmMetricsGet", error)
                return
            # A driver older than the PCIe metric ids may refuse the whole request.
            try:
                results = self._gpm_metrics_get(first, second, (dram,))
            except nvml.NVMLError:
                self._classify(device, "gpm_metrics", "nvmlGpmMetricsGet", error)
                return
            self._gpm_pcie_absent(device, error)
        code, value = results[0]
        if code == _SUCCESS:
            reading.dram_bandwidth = _clamp_ratio(value / 100.0)
        if len(results) < 3:
            return
        (rx_code, rx_value), (tx_code, tx_value) = results[1], results[2]
        if rx_code in _ABSENT or tx_code in _ABSENT:
            absent_code = rx_code if rx_code in _ABSENT else tx_code
            self._gpm_pcie_absent(device, nvml.NVMLError(absent_code))
            return
        if rx_code == _SUCCESS:
            reading.pcie_receive = max(0.0, rx_value) * _GPM_PCIE_MIB
        if tx_code == _SUCCESS:
            reading.pcie_transmit = max(0.0, tx_value) * _GPM_PCIE_MIB

    def _gpm_metrics_get(
        self, first: Any, second: Any, metric_ids: tuple[int, ...]
    ) -> list[tuple[int, float]]:
        """One ``nvmlGpmMetricsGet``: per requested metric, its return code and value."""
        nvml = self._nvml
        request = self._gpm_request
        if request is None:  # one request, filled again each call: its metrics array is big
            request = self._gpm_request = nvml.c_nvmlGpmMetricsGet_t()
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

    def _gpm_pcie_absent(self, device: _Device, error: BaseException) -> None:
        """GPM without the PCIe metrics: the throttled throughput read takes over for good."""
        device.absent.add("gpm_pcie")
        self._log_once(
            ("gpm_pcie", device.index),
            "GPU %d: GPM has no PCIe metrics (%s); reading nvmlDeviceGetPcieThroughput "
            "every %g s instead",
            device.index,
            error,
            self._pcie_interval,
            gpu=device.index,
        )

    @staticmethod
    def _pcie_from_gpm(device: _Device) -> bool:
        """Whether PCIe throughput comes from GPM (decided once GPM support is known)."""
        return bool(device.gpm_supported) and not ({"gpm_pcie", "gpm_metrics"} & device.absent)

    def _pcie_throughput(self, device: _Device) -> tuple[float | None, float | None]:
        """PCIe receive and transmit bytes/s for a GPU without GPM, read seldom.

        ``nvmlDeviceGetPcieThroughput`` samples the link over a 20 ms window and blocks
        the caller for it: two calls per GPU on an 8-GPU node are ~320 ms of a 1 s cycle,
        late samples for every other field and a busy NVML lock. So each GPU is read at
        most once per ``pcie_throughput_interval`` seconds of the clock's monotonic time
        and the last values are served in between; the value stays a 20 ms snapshot.
        """
        now = self._clock.monotonic()
        if device.pcie_read_at is not None and now - device.pcie_read_at < self._pcie_interval:
            return device.pcie_throughput
        nvml = self._nvml
        device.pcie_read_at = now
        device.pcie_throughput = (
            _kilobytes(
                self._call(
                    device, "pcie_rx", "nvmlDeviceGetPcieThroughput", nvml.NVML_PCIE_UTIL_RX_BYTES
                )
            ),
            _kilobytes(
                self._call(
                    device, "pcie_tx", "nvmlDeviceGetPcieThroughput", nvml.NVML_PCIE_UTIL_TX_BYTES
                )
            ),
        )
        return device.pcie_throughput

    def _free_gpm_sample(self, device: _Device, sample: Any) -> None:
        try:
            self._nvml.nvmlGpmSampleFree(sample)
        except self._nvml.NVMLError as error:
            logger.debug("nvmlGpmSampleFree failed: %s", error, extra={"gpu": device.index})

    # ---------------------------------------------------------------- XID events

    def _register_events(self, device: _Device) -> None:
        """Register for XID events on a device that has them; retried after a loss."""
        if device.events_registered or "xid_events" in device.absent or self._event_set_failed:
            return
        nvml = self._nvml
        if self._event_set is None:
            try:
                self._event_set = nvml.nvmlEventSetCreate()
            except nvml.NVMLError as error:
                if _error_code(error) in _ABSENT:
                    self._event_set_failed = True
                    logger.warning(
                        "no NVML event set, XID events only from the kernel log: %s", error
                    )
                else:  # transient (or a fault the device reads will show): try again
                    self._log_once(
                        ("event_set", _error_code(error)),
                        "nvmlEventSetCreate failed: %s; trying again next cycle",
                        error,
                        level=logging.WARNING,
                    )
                return
        xid = int(nvml.nvmlEventTypeXidCriticalError)
        supported = self._call(device, "xid_events", "nvmlDeviceGetSupportedEventTypes")
        if supported is None:
            return
        if not int(supported) & xid:
            device.absent.add("xid_events")
            return
        try:
            nvml.nvmlDeviceRegisterEvents(device.handle, xid, self._event_set)
        except nvml.NVMLError as error:
            self._classify(device, "xid_events", "nvmlDeviceRegisterEvents", error)
            return
        device.events_registered = True

    def _drain_xid_events(self) -> list[Event]:
        """Every queued XID becomes one event (repeats too), without blocking."""
        if self._event_set is None:
            return []
        nvml = self._nvml
        events: list[Event] = []
        for _ in range(_MAX_EVENTS_PER_COLLECT):
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, 0)
            except nvml.NVMLError as error:
                if _error_code(error) != _TIMEOUT:
                    self._log_once(
                        ("event_wait", _error_code(error)),
                        "nvmlEventSetWait failed: %s",
                        error,
                        level=logging.WARNING,
                    )
                break
            if not int(data.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
                continue
            device = self._by_handle.get(_handle_key(data.device))
            code = int(data.eventData)
            if code == _XID_NVLINK and device is not None:
                self._forget_nvlinks(device)
            gpu = device.index if device is not None else None
            events.append(
                Event(
                    kind="xid",
                    source="nvml",
                    time_seconds=self._clock.time(),
                    message=f"XID {code} on GPU {gpu if gpu is not None else '?'}",
                    gpu=gpu,
                    pci_bus_id=(device.pci_bus_id or None) if device is not None else None,
                    code=code,
                )
            )
        else:
            logger.warning(
                "more than %d NVML events in one cycle; the rest wait for the next",
                _MAX_EVENTS_PER_COLLECT,
            )
        return events


# -------------------------------------------------------------------- conversions


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _milli(value: Any) -> float | None:
    """Milli-units to units: mW -> W, mJ -> J."""
    return None if value is None else float(value) / 1000.0


def _mhz(value: Any) -> float | None:
    return None if value is None else float(value) * 1e6


def _kilobytes(value: Any) -> float | None:
    """NVML's KB/s -> bytes/s (1 KB = 1024 B)."""
    return None if value is None else float(value) * _PCIE_KB


def _kib_total(value: float | None) -> int | None:
    """A KiB counter (NVLink data) -> bytes."""
    return None if value is None else int(value) * _KIB


def _nvlink_totals(fields: dict[str, float]) -> tuple[int, ...] | None:
    """The four NVLink error totals from this cycle's field values; None unless all four."""
    keys = [f"nvlink_total_{counter}" for counter, _, _ in _NVLINK_TOTAL_FIELDS]
    if not all(key in fields for key in keys):
        return None
    return tuple(int(fields[key]) for key in keys)


def _clamp_ratio(value: float) -> float:
    return min(1.0, max(0.0, value))


def _percent(value: Any) -> float | None:
    return None if value is None else _clamp_ratio(float(value) / 100.0)


def _field_value(nvml: Any, entry: Any) -> float | None:
    """Read a ``c_nvmlFieldValue_t`` union by its ``valueType``; integer types stay ``int``."""
    readers: dict[int, Callable[[Any], float]] = {
        int(nvml.NVML_VALUE_TYPE_DOUBLE): lambda v: float(v.dVal),
        int(nvml.NVML_VALUE_TYPE_UNSIGNED_INT): lambda v: int(v.uiVal),
        int(nvml.NVML_VALUE_TYPE_UNSIGNED_LONG): lambda v: int(v.ulVal),
        int(nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG): lambda v: int(v.ullVal),
        int(nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG): lambda v: int(v.sllVal),
        int(nvml.NVML_VALUE_TYPE_SIGNED_INT): lambda v: int(v.siVal),
    }
    reader = readers.get(int(entry.valueType))
    return None if reader is None else reader(entry.value)


__all__ = [
    "FABRIC_STATE_COMPLETED",
    "FABRIC_STATE_IN_PROGRESS",
    "FABRIC_STATE_NOT_STARTED",
    "FABRIC_STATE_NOT_SUPPORTED",
    "NVLINK_LINK_INTERVAL_SECONDS",
    "PCIE_THROUGHPUT_INTERVAL_SECONDS",
    "THROTTLE_REASONS",
    "NvmlError",
    "NvmlLibrary",
    "NvmlUnavailable",
    "load_pynvml",
]
