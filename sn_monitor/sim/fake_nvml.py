"""A stand-in for ``pynvml`` backed by :class:`~sn_monitor.sim.gpu_model.SimulatedGpu`.

The agent takes its NVML module as a parameter; the simulator and the tests pass this
one. It has the functions the adapter (:mod:`sn_monitor.agent.nvml`) calls, with
pynvml's signatures, NVML's units (mW, mJ, MHz, KB/s, percent; MiB/s for GPM PCIe) and
result objects with the attribute names of pynvml's ctypes structs. The exceptions and
constants *are* pynvml's, re-exported, so ``except pynvml.NVMLError_GpuIsLost`` works the
same on both.

Module state (the installed GPUs, init refcount, call counts) sits behind one lock:
the sampler and the thermal guard may call from different threads. The fake never
moves time: the simulation driver calls ``gpu.step(dt)``. The one call that waits is
``nvmlEventSetWait_v2``, as the driver's does: up to its timeout in real time, outside the
lock, until an XID is queued on a GPU (the agent's event waiter thread blocks there).

MIG (:mod:`sn_monitor.sim.mig`): a GPU whose profile has MIG profiles answers the MIG
calls from its :attr:`SimulatedGpu.mig <sn_monitor.sim.gpu_model.SimulatedGpu.mig>`, with
NVML's documented semantics: ``nvmlDeviceGetMaxMigDeviceCount`` is 0 while the mode is
off, ``nvmlDeviceGetMigDeviceHandleByIndex`` NotFound on an empty slot, a MIG device
handle answers the identity, memory and process calls for its instance (and
InvalidArgument once the instance is destroyed), the parent's utilization is
NotSupported while the mode is on, and the parent's processes and memory are those of
all its instances. A GPU without MIG profiles answers NotSupported to
``nvmlDeviceGetMigMode``.

Test and simulator API: :func:`configure`, :func:`configure_missing_library`,
:func:`configure_driver_not_loaded`, :func:`reset`, :func:`simulated_gpus`,
:func:`call_counts`, :func:`call_count`, :func:`inject_error`, :func:`clear_errors`,
:func:`inject_hang`, :func:`release_hangs`, and what a simulated agent runs instead of
``nvidia-smi --gpu-reset`` and a reboot (NVML has no call for either): :func:`reset_gpu`,
:func:`reboot`.

A hang (:func:`inject_hang`) is what a wedged driver does: the call never returns. The
calling thread blocks on a :class:`threading.Event` (outside the module lock, so other
threads' calls go on) until the hang is released: :meth:`Hang.release`,
:func:`release_hangs`, :func:`configure` or :func:`reset`. A test that injects one
releases it in its teardown, or the blocked thread outlives the test.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import pynvml  # noqa: TID251 - the fake reuses pynvml's own exceptions and constants

from sn_monitor.sim.gpu_model import SimulatedGpu
from sn_monitor.sim.hgx import nvswitch_bus_id, nvswitch_of_link
from sn_monitor.sim.mig import MAX_MIG_DEVICES, MigInstance

# ------------------------------------------------------------------ pynvml re-exports

NVMLError: Any = pynvml.NVMLError
nvmlExceptionClass: Any = pynvml.nvmlExceptionClass
NVMLError_Uninitialized: Any = pynvml.NVMLError_Uninitialized
NVMLError_InvalidArgument: Any = pynvml.NVMLError_InvalidArgument
NVMLError_NotSupported: Any = pynvml.NVMLError_NotSupported
NVMLError_NoPermission: Any = pynvml.NVMLError_NoPermission
NVMLError_NotFound: Any = pynvml.NVMLError_NotFound
NVMLError_DriverNotLoaded: Any = pynvml.NVMLError_DriverNotLoaded
NVMLError_Timeout: Any = pynvml.NVMLError_Timeout
NVMLError_LibraryNotFound: Any = pynvml.NVMLError_LibraryNotFound
NVMLError_FunctionNotFound: Any = pynvml.NVMLError_FunctionNotFound
NVMLError_GpuIsLost: Any = pynvml.NVMLError_GpuIsLost
NVMLError_ResetRequired: Any = pynvml.NVMLError_ResetRequired
NVMLError_ArgumentVersionMismatch: Any = pynvml.NVMLError_ArgumentVersionMismatch
NVMLError_Unknown: Any = pynvml.NVMLError_Unknown

NVML_SUCCESS: int = pynvml.NVML_SUCCESS
NVML_ERROR_UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
NVML_ERROR_INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
NVML_ERROR_NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_NO_PERMISSION: int = pynvml.NVML_ERROR_NO_PERMISSION
NVML_ERROR_DRIVER_NOT_LOADED: int = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
NVML_ERROR_TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
NVML_ERROR_LIBRARY_NOT_FOUND: int = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
NVML_ERROR_FUNCTION_NOT_FOUND: int = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
NVML_ERROR_GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_IN_USE: int = pynvml.NVML_ERROR_IN_USE
NVML_ERROR_RESET_REQUIRED: int = pynvml.NVML_ERROR_RESET_REQUIRED
NVML_ERROR_LIB_RM_VERSION_MISMATCH: int = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
NVML_ERROR_NO_DATA: int = pynvml.NVML_ERROR_NO_DATA
NVML_ERROR_NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
NVML_ERROR_UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN

NVML_FEATURE_DISABLED: int = pynvml.NVML_FEATURE_DISABLED
NVML_FEATURE_ENABLED: int = pynvml.NVML_FEATURE_ENABLED
NVML_DEVICE_MIG_DISABLE: int = pynvml.NVML_DEVICE_MIG_DISABLE
NVML_DEVICE_MIG_ENABLE: int = pynvml.NVML_DEVICE_MIG_ENABLE
NVML_TEMPERATURE_GPU: int = pynvml.NVML_TEMPERATURE_GPU
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: int = pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: int = pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
NVML_TEMPERATURE_THRESHOLD_MEM_MAX: int = pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX
NVML_TEMPERATURE_THRESHOLD_GPU_MAX: int = pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX
NVML_FI_DEV_MEMORY_TEMP: int = pynvml.NVML_FI_DEV_MEMORY_TEMP
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: int = (
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
)
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: int = (
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
)
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: int = (
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
)
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: int = (
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
)
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: int = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: int = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
NVML_NVLINK_DEVICE_TYPE_GPU: int = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
NVML_NVLINK_DEVICE_TYPE_IBMNPU: int = pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU
NVML_NVLINK_DEVICE_TYPE_SWITCH: int = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
NVML_NVLINK_DEVICE_TYPE_UNKNOWN: int = pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN
NVML_VALUE_TYPE_DOUBLE: int = pynvml.NVML_VALUE_TYPE_DOUBLE
NVML_VALUE_TYPE_UNSIGNED_INT: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
NVML_VALUE_TYPE_UNSIGNED_LONG: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
NVML_VALUE_TYPE_SIGNED_LONG_LONG: int = pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG
NVML_VALUE_TYPE_SIGNED_INT: int = pynvml.NVML_VALUE_TYPE_SIGNED_INT
NVML_VALUE_TYPE_UNSIGNED_SHORT: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT
NVML_CLOCK_GRAPHICS: int = pynvml.NVML_CLOCK_GRAPHICS
NVML_CLOCK_SM: int = pynvml.NVML_CLOCK_SM
NVML_CLOCK_MEM: int = pynvml.NVML_CLOCK_MEM
NVML_CLOCK_VIDEO: int = pynvml.NVML_CLOCK_VIDEO
NVML_MEMORY_ERROR_TYPE_CORRECTED: int = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
NVML_VOLATILE_ECC: int = pynvml.NVML_VOLATILE_ECC
NVML_AGGREGATE_ECC: int = pynvml.NVML_AGGREGATE_ECC
NVML_PCIE_UTIL_TX_BYTES: int = pynvml.NVML_PCIE_UTIL_TX_BYTES
NVML_PCIE_UTIL_RX_BYTES: int = pynvml.NVML_PCIE_UTIL_RX_BYTES
NVML_NVLINK_MAX_LINKS: int = pynvml.NVML_NVLINK_MAX_LINKS
NVML_NVLINK_ERROR_DL_REPLAY: int = pynvml.NVML_NVLINK_ERROR_DL_REPLAY
NVML_NVLINK_ERROR_DL_RECOVERY: int = pynvml.NVML_NVLINK_ERROR_DL_RECOVERY
NVML_NVLINK_ERROR_DL_CRC_FLIT: int = pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
NVML_NVLINK_ERROR_DL_CRC_DATA: int = pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA
NVML_NVLINK_ERROR_DL_ECC_DATA: int = pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA
NVML_GPM_METRIC_SM_UTIL: int = pynvml.NVML_GPM_METRIC_SM_UTIL
NVML_GPM_METRIC_DRAM_BW_UTIL: int = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
NVML_GPM_METRIC_ANY_TENSOR_UTIL: int = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
NVML_GPM_METRIC_PCIE_TX_PER_SEC: int = pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
NVML_GPM_METRIC_PCIE_RX_PER_SEC: int = pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC
NVML_GPM_METRIC_MAX: int = pynvml.NVML_GPM_METRIC_MAX
NVML_GPM_METRICS_GET_VERSION: int = pynvml.NVML_GPM_METRICS_GET_VERSION
NVML_GPM_SUPPORT_VERSION: int = pynvml.NVML_GPM_SUPPORT_VERSION
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: int = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
NVML_GPU_FABRIC_STATE_NOT_STARTED: int = pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED
NVML_GPU_FABRIC_STATE_IN_PROGRESS: int = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
NVML_GPU_FABRIC_STATE_COMPLETED: int = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
nvmlGpuFabricInfo_v2: int = pynvml.nvmlGpuFabricInfo_v2
# The real ctypes structs: the adapter passes them by reference, as to the real library.
c_nvmlGpuFabricInfo_t: Any = pynvml.c_nvmlGpuFabricInfo_t
c_nvmlGpuFabricInfoV_t: Any = pynvml.c_nvmlGpuFabricInfoV_t

nvmlEventTypeSingleBitEccError: int = pynvml.nvmlEventTypeSingleBitEccError
nvmlEventTypeDoubleBitEccError: int = pynvml.nvmlEventTypeDoubleBitEccError
nvmlEventTypePState: int = pynvml.nvmlEventTypePState
nvmlEventTypeXidCriticalError: int = pynvml.nvmlEventTypeXidCriticalError
nvmlEventTypeClock: int = pynvml.nvmlEventTypeClock
nvmlEventTypeNone: int = pynvml.nvmlEventTypeNone

nvmlClocksEventReasonGpuIdle: int = pynvml.nvmlClocksEventReasonGpuIdle
nvmlClocksEventReasonApplicationsClocksSetting: int = (
    pynvml.nvmlClocksEventReasonApplicationsClocksSetting
)
nvmlClocksEventReasonSwPowerCap: int = pynvml.nvmlClocksEventReasonSwPowerCap
nvmlClocksEventReasonHwSlowdown: int = pynvml.nvmlClocksEventReasonHwSlowdown
nvmlClocksEventReasonSyncBoost: int = pynvml.nvmlClocksEventReasonSyncBoost
nvmlClocksEventReasonSwThermalSlowdown: int = pynvml.nvmlClocksEventReasonSwThermalSlowdown
nvmlClocksEventReasonHwThermalSlowdown: int = pynvml.nvmlClocksEventReasonHwThermalSlowdown
nvmlClocksEventReasonHwPowerBrakeSlowdown: int = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
nvmlClocksEventReasonDisplayClockSetting: int = pynvml.nvmlClocksEventReasonDisplayClockSetting
nvmlClocksEventReasonNone: int = pynvml.nvmlClocksEventReasonNone
nvmlClocksThrottleReasonGpuIdle: int = pynvml.nvmlClocksThrottleReasonGpuIdle
nvmlClocksThrottleReasonSwPowerCap: int = pynvml.nvmlClocksThrottleReasonSwPowerCap
nvmlClocksThrottleReasonSwThermalSlowdown: int = pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
nvmlClocksThrottleReasonHwThermalSlowdown: int = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown

# Event types a simulated data-centre GPU can deliver.
_SUPPORTED_EVENT_TYPES = (
    nvmlEventTypeSingleBitEccError
    | nvmlEventTypeDoubleBitEccError
    | nvmlEventTypePState
    | nvmlEventTypeXidCriticalError
    | nvmlEventTypeClock
)
# A field value's scopeId that asks for the sum over every NVLink (nvml.h).
_ALL_LINKS = 0xFFFFFFFF
_KIB = 1024
# What NVML puts in gpuInstanceId / computeInstanceId outside MIG.
_NO_INSTANCE = 0xFFFFFFFF
# GPM's PCIe metrics are in MiB/s (pynvml: "PCIe traffic ... in MiB/sec").
_MIB = 1024 * 1024


# ------------------------------------------------------------------ result objects


@dataclass(slots=True)
class _Memory:
    """Like ``c_nvmlMemory_t``: bytes."""

    total: int
    free: int
    used: int


@dataclass(slots=True)
class _Utilization:
    """Like ``c_nvmlUtilization_t``: percent."""

    gpu: int
    memory: int


@dataclass(slots=True)
class _PciInfo:
    """Like ``nvmlPciInfo_t``; pynvml decodes the char arrays to ``str``."""

    busIdLegacy: str
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int
    busId: str


@dataclass(slots=True)
class _Value:
    """Like the ``c_nvmlValue_t`` union: every view is filled from one number."""

    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0
    usVal: int = 0


@dataclass(slots=True)
class _FieldValue:
    """Like ``c_nvmlFieldValue_t``."""

    fieldId: int
    scopeId: int = 0
    timestamp: int = 0
    latencyUsec: int = 0
    valueType: int = 0
    nvmlReturn: int = 0
    value: _Value = field(default_factory=_Value)


@dataclass(slots=True)
class _EventData:
    """Like ``c_nvmlEventData_t``."""

    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = _NO_INSTANCE
    computeInstanceId: int = _NO_INSTANCE


@dataclass(slots=True)
class _ProcessInfo:
    """Like ``c_nvmlProcessInfo_t`` as pynvml hands it out (a friendly object)."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = _NO_INSTANCE
    computeInstanceId: int = _NO_INSTANCE


@dataclass(slots=True)
class _ProcessUtilizationSample:
    """Like ``c_nvmlProcessUtilizationSample_t``: percent over the sample's period."""

    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int
    encUtil: int = 0
    decUtil: int = 0


@dataclass(slots=True)
class _GpmSupport:
    """Like ``c_nvmlGpmSupport_t``."""

    version: int
    isSupportedDevice: int


class _GpmSample:
    """An opaque GPM sample buffer, filled by :func:`nvmlGpmSampleGet`."""

    __slots__ = ("device_index", "freed", "gpu_instance_id", "snapshot")

    def __init__(self) -> None:
        self.device_index: int | None = None
        #: The GPU instance of a MIG sample (nvmlGpmMigSampleGet); None: the whole GPU.
        self.gpu_instance_id: int | None = None
        self.snapshot: Any = None
        self.freed = False


class c_nvmlGpmMetric_t:
    """Like pynvml's ``c_nvmlGpmMetric_t``; ``value`` is a double: percent, or MiB/s for PCIe."""

    __slots__ = ("metricId", "metricInfo", "nvmlReturn", "value")

    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = NVML_SUCCESS
        self.value = 0.0
        self.metricInfo: Any = None


class c_nvmlGpmMetricsGet_t:
    """Like pynvml's ``c_nvmlGpmMetricsGet_t``: the caller fills it, the call answers in it."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [c_nvmlGpmMetric_t() for _ in range(NVML_GPM_METRIC_MAX)]


class _DeviceHandle:
    """An opaque device handle; one per GPU for the life of a configuration."""

    __slots__ = ("_gpu",)

    def __init__(self, gpu: SimulatedGpu) -> None:
        self._gpu = gpu

    def __repr__(self) -> str:
        return f"<fake nvmlDevice_t {self._gpu.index}>"


class _MigDeviceHandle:
    """A MIG device handle: the parent GPU and the MIG instance it stands for."""

    __slots__ = ("_gpu", "instance")

    def __init__(self, gpu: SimulatedGpu, instance: MigInstance) -> None:
        self._gpu = gpu
        self.instance = instance

    def __repr__(self) -> str:
        return f"<fake MIG nvmlDevice_t {self._gpu.index}/{self.instance.gpu_instance_id}>"


class _EventSet:
    """An event set: per registered device, its event mask and a cursor into its XID log."""

    def __init__(self) -> None:
        self.registrations: dict[int, tuple[int, int]] = {}
        self.freed = False


# ------------------------------------------------------------------ module state


@dataclass(slots=True)
class _InjectedError:
    code: int
    remaining: int | None  # calls left to fail; None: until cleared


class Hang:
    """An injected hang: matching calls block until :meth:`release` (see :func:`inject_hang`).

    ``entered`` is set once a call has blocked on it, so a test can wait for the hang to
    be reached without sleeping; :attr:`waiting` counts the calls blocked now.
    """

    def __init__(self, gpu: int | None, function: str | None) -> None:
        self.gpu = gpu
        self.function = function
        self.entered = threading.Event()
        self._released = threading.Event()
        self._count_lock = threading.Lock()
        self._waiting = 0

    def __repr__(self) -> str:
        where = "every GPU" if self.gpu is None else f"GPU {self.gpu}"
        return f"<fake NVML hang: {self.function or 'every function'} on {where}>"

    @property
    def released(self) -> bool:
        return self._released.is_set()

    @property
    def waiting(self) -> int:
        """Calls blocked on this hang now."""
        with self._count_lock:
            return self._waiting

    def matches(self, gpu: int, function: str) -> bool:
        """Whether a call of ``function`` about GPU ``gpu`` (-1: none) blocks here."""
        return ((self.gpu is None or self.gpu == gpu)
                and (self.function is None or self.function == function))

    def release(self) -> None:
        """Let every blocked call go on (and later ones through): the driver is back."""
        with _lock:
            if self in _state.hangs:
                _state.hangs.remove(self)
        self._released.set()

    def block(self) -> None:
        """Block the calling thread until the hang is released."""
        with self._count_lock:
            self._waiting += 1
        self.entered.set()
        try:
            self._released.wait()
        finally:
            with self._count_lock:
                self._waiting -= 1


@dataclass(slots=True)
class _State:
    gpus: list[SimulatedGpu] = field(default_factory=list)
    handles: list[_DeviceHandle] = field(default_factory=list)
    driver_version: str = "550.90.07"
    nvml_version: str = "12.550.90.07"
    init_error: int | None = None
    missing_functions: frozenset[str] = frozenset()
    refcount: int = 0
    calls: Counter[str] = field(default_factory=Counter)
    # (gpu or -1, function) -> the injected error; see inject_error.
    errors: dict[tuple[int, str], _InjectedError] = field(default_factory=dict)
    # Injected hangs, oldest first; see inject_hang.
    hangs: list[Hang] = field(default_factory=list)
    # One handle per MIG device, by (GPU index, MIG UUID): NVML hands out the same one.
    mig_handles: dict[tuple[int, str], _MigDeviceHandle] = field(default_factory=dict)


class _XidSignal:
    """Counts the XIDs queued on the installed GPUs; the event wait blocks on it.

    Its condition's lock is taken under a GPU's lock (the GPU notifies as it queues) and
    never held while another lock is taken.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._posted = 0

    @property
    def posted(self) -> int:
        """XIDs queued so far (read before looking, to wait past what was seen)."""
        with self._cond:
            return self._posted

    def post(self) -> None:
        with self._cond:
            self._posted += 1
            self._cond.notify_all()

    def wait_past(self, seen: int, timeout: float) -> None:
        """Block up to ``timeout`` real seconds until more than ``seen`` XIDs were queued."""
        with self._cond:
            self._cond.wait_for(lambda: self._posted != seen, timeout)


_lock = threading.RLock()
_state = _State()
_xids = _XidSignal()

_P = ParamSpec("_P")
_R = TypeVar("_R")

# Functions that work before nvmlInit.
_NO_INIT = frozenset({"nvmlInit", "nvmlInitWithFlags"})


def configure(
    gpus: Iterable[SimulatedGpu],
    driver_version: str = "550.90.07",
    *,
    nvml_version: str | None = None,
    missing_functions: Iterable[str] = (),
) -> None:
    """Install simulated GPUs (NVML index = list position) and start uninitialized.

    ``missing_functions`` raise NVMLError_FunctionNotFound, as on an older driver.
    Injected errors are dropped and injected hangs released.
    """
    with _lock:
        gpu_list = list(gpus)
        for gpu in gpu_list:
            gpu.listen_xids(_xids.post)
        _state.gpus = gpu_list
        _state.handles = [_DeviceHandle(gpu) for gpu in gpu_list]
        _state.driver_version = driver_version
        _state.nvml_version = nvml_version or f"12.{driver_version}"
        _state.init_error = None
        _state.missing_functions = frozenset(missing_functions)
        _state.refcount = 0
        _state.calls.clear()
        _state.errors.clear()
        _state.mig_handles.clear()
        hangs, _state.hangs = _state.hangs, []
    for hang in hangs:
        hang.release()


def configure_missing_library() -> None:
    """No libnvidia-ml.so here: nvmlInit raises NVMLError_LibraryNotFound."""
    configure([])
    with _lock:
        _state.init_error = NVML_ERROR_LIBRARY_NOT_FOUND


def configure_driver_not_loaded() -> None:
    """The library is there but the kernel driver is not: nvmlInit raises DriverNotLoaded."""
    configure([])
    with _lock:
        _state.init_error = NVML_ERROR_DRIVER_NOT_LOADED


def reset() -> None:
    """Back to an empty, uninitialized NVML with no GPUs, no injected errors or hangs."""
    configure([])


def inject_error(gpu: int, function: str, code: int, times: int | None = None) -> None:
    """Make the next ``times`` calls of ``function`` on GPU ``gpu`` raise ``NVMLError(code)``.

    ``pynvml.NVMLError(code)`` instantiates the code's own subclass (``NVMLError_Timeout``
    for NVML_ERROR_TIMEOUT, ...), as the real bindings raise it. ``gpu`` is the NVML index
    of the device the call is about (its handle, ``nvmlDeviceGetHandleByIndex``'s index, a
    GPM sample's device); ``-1`` for calls tied to no GPU (``nvmlInit``,
    ``nvmlSystemGetDriverVersion``, ``nvmlEventSetWait_v2``, ...). ``times=None`` fails
    every call until :func:`clear_errors` (or :func:`configure`, :func:`reset`). The failing
    call is counted in :func:`call_counts` like any other; a function made missing by
    ``configure(missing_functions=...)`` still answers FunctionNotFound first. Injecting
    again for the same GPU and function replaces the earlier injection.
    """
    if not callable(globals().get(function)) or not function.startswith("nvml"):
        raise ValueError(f"the fake has no NVML function {function!r}")
    if code == NVML_SUCCESS:
        raise ValueError("cannot inject NVML_SUCCESS")
    if times is not None and times < 1:
        raise ValueError("times must be >= 1 (or None: until cleared)")
    if gpu < -1:
        raise ValueError("gpu must be a device index, or -1 for calls tied to no GPU")
    with _lock:
        _state.errors[(gpu, function)] = _InjectedError(code, times)


def clear_errors(gpu: int | None = None, function: str | None = None) -> None:
    """Drop injected errors: all of them, or those matching ``gpu`` and/or ``function``."""
    with _lock:
        for key in list(_state.errors):
            if (gpu is None or key[0] == gpu) and (function is None or key[1] == function):
                del _state.errors[key]


def inject_hang(gpu: int | None = None, function: str | None = None) -> Hang:
    """Make calls hang, as NVML does while the driver is wedged, until released.

    ``gpu`` None hangs calls about any GPU and calls tied to none (the whole driver);
    a device index hangs only calls about that GPU (as :func:`inject_error` tells them).
    ``function`` None hangs every function, else only that one. A matching call is
    counted in :func:`call_counts`, then blocks before doing anything else; released, it
    goes on as if it had never stopped (against whatever state the fake has by then).
    Release with :meth:`Hang.release` or :func:`release_hangs` (``configure`` and
    ``reset`` release every hang too).
    """
    if function is not None and (
            not callable(globals().get(function)) or not function.startswith("nvml")):
        raise ValueError(f"the fake has no NVML function {function!r}")
    if gpu is not None and gpu < -1:
        raise ValueError("gpu must be a device index, -1 for calls tied to no GPU, "
                         "or None for every call")
    hang = Hang(gpu, function)
    with _lock:
        _state.hangs.append(hang)
    return hang


def release_hangs() -> None:
    """Release every injected hang: blocked calls go on."""
    with _lock:
        hangs = list(_state.hangs)
    for hang in hangs:
        hang.release()


def simulated_gpus() -> list[SimulatedGpu]:
    """The models behind the devices, to step them and inject faults."""
    with _lock:
        return list(_state.gpus)


def reset_gpu(index: int) -> None:
    """Reset GPU ``index`` as ``nvidia-smi --gpu-reset`` would (:meth:`SimulatedGpu.reset`).

    Refused with ``NVMLError(NVML_ERROR_IN_USE)`` while a process uses the GPU, as the
    driver refuses; an index with no GPU is InvalidArgument.
    """
    with _lock:
        if not 0 <= index < len(_state.gpus):
            raise NVMLError_InvalidArgument()
        gpu = _state.gpus[index]
    with gpu.lock:
        if gpu.processes or any(i.processes for i in gpu.mig.instances):
            raise NVMLError(NVML_ERROR_IN_USE)
        gpu.reset()


def reboot() -> None:
    """The node rebooted: every GPU power-cycled (:meth:`SimulatedGpu.power_cycle`)."""
    for gpu in simulated_gpus():
        gpu.power_cycle()


def call_counts() -> dict[str, int]:
    """How often each NVML function was called since the last configure."""
    with _lock:
        return dict(_state.calls)


def call_count(name: str) -> int:
    with _lock:
        return _state.calls[name]


def _target_gpu(name: str, args: tuple[Any, ...]) -> int:
    """The GPU index a call is about, for :func:`inject_error`; -1 when none."""
    if not args:
        return -1
    first = args[0]
    if isinstance(first, _DeviceHandle | _MigDeviceHandle):
        return first._gpu.index
    if name == "nvmlDeviceGetHandleByIndex" and isinstance(first, int):
        return first
    if name == "nvmlGpmMetricsGet":
        sample = getattr(first, "sample1", None)
        if isinstance(sample, _GpmSample) and sample.device_index is not None:
            return sample.device_index
    return -1


def _raise_injected(name: str, args: tuple[Any, ...]) -> None:
    """Raise the error injected for this call, if any, and count it down."""
    if not _state.errors:
        return
    key = (_target_gpu(name, args), name)
    injected = _state.errors.get(key)
    if injected is None:
        return
    if injected.remaining is not None:
        injected.remaining -= 1
        if injected.remaining == 0:
            del _state.errors[key]
    raise NVMLError(injected.code)


def _hang_for(name: str, args: tuple[Any, ...]) -> Hang | None:
    """The oldest hang this call blocks on, if any (the caller holds the lock)."""
    if not _state.hangs:
        return None
    gpu = _target_gpu(name, args)
    return next((h for h in _state.hangs if h.matches(gpu, name)), None)


def _nvml_function(fn: Callable[_P, _R], *, name: str | None = None) -> Callable[_P, _R]:
    """Count the call, then fail the way NVML would before reaching the device.

    ``name`` is the NVML function it stands for (default: ``fn``'s own name).

    In order: a hang injected for this call (see :func:`inject_hang`: it blocks outside
    the lock), function missing from this driver, an error injected for this call (see
    :func:`inject_error`), not initialized, and (when the first argument is a device
    handle) GPU lost, function not supported on this GPU.
    """
    name = name or fn.__name__

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _lock:
            _state.calls[name] += 1
            hang = _hang_for(name, args)
        if hang is not None:
            hang.block()
        with _lock:
            if name in _state.missing_functions:
                raise NVMLError_FunctionNotFound()
            _raise_injected(name, args)
            if name not in _NO_INIT and _state.refcount == 0:
                raise NVMLError_Uninitialized()
            if args and isinstance(args[0], _DeviceHandle | _MigDeviceHandle):
                gpu = args[0]._gpu
                with gpu.lock:
                    if gpu.lost:
                        raise NVMLError_GpuIsLost()
                    _check_mig_handle(args[0])
                    if name in gpu.profile.unsupported:
                        raise NVMLError_NotSupported()
                    return fn(*args, **kwargs)
            return fn(*args, **kwargs)

    return wrapper


def _gpu(handle: Any) -> SimulatedGpu:
    if not isinstance(handle, _DeviceHandle):
        raise NVMLError_InvalidArgument()
    return handle._gpu


def _check_mig_handle(handle: Any) -> None:
    """A MIG device handle whose instance was destroyed is invalid: ask for it again."""
    if isinstance(handle, _MigDeviceHandle) and handle.instance not in handle._gpu.mig.instances:
        raise NVMLError_InvalidArgument()


def _mig_instance(handle: Any) -> MigInstance | None:
    """The MIG instance behind a MIG device handle; None for a GPU's handle."""
    return handle.instance if isinstance(handle, _MigDeviceHandle) else None


# ------------------------------------------------------------------ init, system


@_nvml_function
def nvmlInitWithFlags(flags: int) -> None:
    if _state.init_error is not None:
        raise NVMLError(_state.init_error)
    _state.refcount += 1


@_nvml_function
def nvmlInit() -> None:
    if _state.init_error is not None:
        raise NVMLError(_state.init_error)
    _state.refcount += 1


@_nvml_function
def nvmlShutdown() -> None:
    _state.refcount -= 1


@_nvml_function
def nvmlSystemGetDriverVersion() -> str:
    return _state.driver_version


@_nvml_function
def nvmlSystemGetNVMLVersion() -> str:
    return _state.nvml_version


@_nvml_function
def nvmlDeviceGetCount() -> int:
    return len(_state.gpus)


@_nvml_function
def nvmlDeviceGetHandleByIndex(index: int) -> _DeviceHandle:
    if not 0 <= index < len(_state.handles):
        raise NVMLError_InvalidArgument()
    handle = _state.handles[index]
    if handle._gpu.lost:
        raise NVMLError_GpuIsLost()
    return handle


# ------------------------------------------------------------------ identity


@_nvml_function
def nvmlDeviceGetIndex(handle: Any) -> int:
    return _gpu(handle).index


@_nvml_function
def nvmlDeviceGetUUID(handle: Any) -> str:
    instance = _mig_instance(handle)
    return instance.uuid if instance is not None else _gpu(handle).uuid


@_nvml_function
def nvmlDeviceGetName(handle: Any) -> str:
    """A MIG device's name is its GPU's with the profile: ``NVIDIA H100 ... MIG 1g.10gb``."""
    instance = _mig_instance(handle)
    if instance is not None:
        return f"{handle._gpu.profile.name} MIG {instance.profile.name}"
    return _gpu(handle).profile.name


@_nvml_function
def nvmlDeviceGetPciInfo(handle: Any) -> _PciInfo:
    return _pci_info(_gpu(handle).pci_bus_id, 0x233010DE)


def _pci_info(bus_id: str, device_id: int) -> _PciInfo:
    """``nvmlPciInfo_t`` for NVML's bus id spelling (``00000000:18:00.0``)."""
    domain_text, bus_text, dev_fn = bus_id.split(":")
    dev_text = dev_fn.split(".")[0]
    domain, bus, dev = int(domain_text, 16), int(bus_text, 16), int(dev_text, 16)
    return _PciInfo(
        busIdLegacy=f"{domain:04X}:{bus:02X}:{dev:02X}.0",
        domain=domain,
        bus=bus,
        device=dev,
        pciDeviceId=device_id,
        pciSubSystemId=0x16C110DE,
        busId=f"{domain:08X}:{bus:02X}:{dev:02X}.0",
    )


@_nvml_function
def nvmlDeviceGetSerial(handle: Any) -> str:
    return _gpu(handle).serial


@_nvml_function
def nvmlDeviceGetMinorNumber(handle: Any) -> int:
    return _gpu(handle).minor_number


@_nvml_function
def nvmlDeviceGetVbiosVersion(handle: Any) -> str:
    return _gpu(handle).profile.vbios_version


# ------------------------------------------------------------------ utilization, memory


@_nvml_function
def nvmlDeviceGetUtilizationRates(handle: Any) -> _Utilization:
    """NotSupported on a MIG device and on a GPU in MIG mode, as NVML documents."""
    if _mig_instance(handle) is not None:
        raise NVMLError_NotSupported()
    gpu = _gpu(handle)
    if gpu.mig.enabled:
        raise NVMLError_NotSupported()
    return _Utilization(
        gpu=round(gpu.utilization * 100), memory=round(gpu.memory_utilization * 100)
    )


@_nvml_function
def nvmlDeviceGetMemoryInfo(handle: Any, version: int | None = None) -> _Memory:
    """A MIG device's own memory; a GPU in MIG mode: what all its instances use."""
    instance = _mig_instance(handle)
    if instance is not None:
        total = instance.profile.memory_bytes
        return _Memory(total=total, free=total - instance.memory_used_bytes,
                       used=instance.memory_used_bytes)
    gpu = _gpu(handle)
    total = gpu.profile.memory_total_bytes
    used = min(total, gpu.memory_used_bytes)
    if gpu.mig.enabled:
        used = min(total, sum(i.memory_used_bytes for i in gpu.mig.instances))
    return _Memory(total=total, free=total - used, used=used)


# ------------------------------------------------------------------ temperature


@_nvml_function
def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError_InvalidArgument()
    return round(_gpu(handle).temperature_celsius)


@_nvml_function
def nvmlDeviceGetTemperatureThreshold(handle: Any, threshold: int) -> int:
    profile = _gpu(handle).profile
    values = {
        NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: profile.shutdown_celsius,
        NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: profile.slowdown_celsius,
        NVML_TEMPERATURE_THRESHOLD_GPU_MAX: profile.gpu_max_celsius,
        NVML_TEMPERATURE_THRESHOLD_MEM_MAX: profile.memory_max_celsius,
    }
    if threshold not in values:
        raise NVMLError_NotSupported()
    return round(values[threshold])


def _nvlink_throughput(gpu: SimulatedGpu, field_id: int, scope: int) -> int | None:
    """KiB sent or received over link ``scope`` (``_ALL_LINKS``: every link); None if none."""
    if not gpu.nvlinks or field_id not in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                                           NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
        return None
    if scope == _ALL_LINKS:
        links = gpu.nvlinks
    elif 0 <= scope < len(gpu.nvlinks):
        links = [gpu.nvlinks[scope]]
    else:
        return None
    transmitted = field_id == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    total = sum(link.transmitted_bytes if transmitted else link.received_bytes for link in links)
    return int(total // _KIB)


def _nvlink_total(gpu: SimulatedGpu, field_id: int) -> int | None:
    """A GPU-wide NVLink error total (the sum over its links); None when not simulated."""
    if not gpu.nvlinks or not gpu.profile.nvlink_totals_supported:
        return None
    if field_id == NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL:
        return sum(link.crc_flit_errors for link in gpu.nvlinks)
    if field_id == NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL:
        return sum(link.crc_data_errors for link in gpu.nvlinks)
    if field_id == NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL:
        return sum(link.replay_errors for link in gpu.nvlinks)
    if field_id == NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL:
        return sum(link.recovery_errors for link in gpu.nvlinks)
    return None


def _integer_value(number: int) -> _Value:
    """Every view of the union filled from one non-negative integer."""
    return _Value(
        dVal=float(number),
        uiVal=number & 0xFFFFFFFF,
        ulVal=number,
        ullVal=number,
        sllVal=number,
        siVal=number & 0x7FFFFFFF,
        usVal=number & 0xFFFF,
    )


@_nvml_function
def nvmlDeviceGetFieldValues(handle: Any, fieldIds: list[Any]) -> list[_FieldValue]:
    """The HBM temperature, the GPU-wide NVLink error totals and NVLink data, per entry.

    NVML_FI_DEV_MEMORY_TEMP is an unsigned int in °C; the NVLink totals (CRC flit, CRC
    data, replay, recovery) are unsigned long longs, each summed over the GPU's links.
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / RX count KiB of one link, the entry's scope:
    as in pynvml, an entry is a field id (scope 0: link 0 alone) or a ``(fieldId,
    scopeId)`` pair, and scope 0xFFFFFFFF sums every link.

    Each entry answers for itself in ``nvmlReturn``: an id the GPU does not have (memory
    temperature on A100, the NVLink totals on a GPU without NVLink or whose profile says
    ``nvlink_totals_supported=False``, any other id) is NotSupported, the rest succeed.
    """
    gpu = _gpu(handle)
    timestamp_us = round(gpu.elapsed_seconds * 1e6)
    results = []
    for item in fieldIds:
        field_id, scope = item if isinstance(item, tuple) else (item, 0)
        entry = _FieldValue(fieldId=field_id, scopeId=scope, timestamp=timestamp_us)
        total = _nvlink_total(gpu, field_id)
        if total is None:
            total = _nvlink_throughput(gpu, field_id, scope)
        if field_id == NVML_FI_DEV_MEMORY_TEMP and gpu.profile.memory_temperature_supported:
            entry.valueType = NVML_VALUE_TYPE_UNSIGNED_INT
            entry.value = _integer_value(round(gpu.memory_temperature_celsius))
        elif total is not None:
            entry.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            entry.value = _integer_value(total)
        else:
            entry.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        results.append(entry)
    return results


# ------------------------------------------------------------------ power


@_nvml_function
def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    return round(_gpu(handle).power_watts * 1000)


@_nvml_function
def nvmlDeviceGetEnforcedPowerLimit(handle: Any) -> int:
    return round(_gpu(handle).power_limit_watts * 1000)


@_nvml_function
def nvmlDeviceGetPowerManagementLimit(handle: Any) -> int:
    return round(_gpu(handle).power_limit_watts * 1000)


@_nvml_function
def nvmlDeviceGetPowerManagementDefaultLimit(handle: Any) -> int:
    return round(_gpu(handle).profile.power_default_limit_watts * 1000)


@_nvml_function
def nvmlDeviceGetPowerManagementLimitConstraints(handle: Any) -> list[int]:
    profile = _gpu(handle).profile
    return [
        round(profile.power_min_limit_watts * 1000),
        round(profile.power_max_limit_watts * 1000),
    ]


@_nvml_function
def nvmlDeviceSetPowerManagementLimit(handle: Any, limit: int) -> None:
    """Milliwatts; out of the constraints is InvalidArgument, as in the real driver."""
    gpu = _gpu(handle)
    watts = limit / 1000.0
    if not gpu.profile.power_min_limit_watts <= watts <= gpu.profile.power_max_limit_watts:
        raise NVMLError_InvalidArgument()
    gpu.set_power_limit_watts(watts)


@_nvml_function
def nvmlDeviceGetTotalEnergyConsumption(handle: Any) -> int:
    return int(_gpu(handle).energy_millijoules)


# ------------------------------------------------------------------ clocks


def _clock_mhz(gpu: SimulatedGpu, clock_type: int, *, maximum: bool) -> int:
    if clock_type in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS):
        return gpu.profile.sm_max_clock_mhz if maximum else gpu.sm_clock_mhz
    if clock_type == NVML_CLOCK_MEM:
        return gpu.profile.memory_clock_mhz if maximum else gpu.memory_clock_mhz
    if clock_type == NVML_CLOCK_VIDEO:
        return 1755
    raise NVMLError_InvalidArgument()


@_nvml_function
def nvmlDeviceGetClockInfo(handle: Any, type: int) -> int:
    return _clock_mhz(_gpu(handle), type, maximum=False)


@_nvml_function
def nvmlDeviceGetMaxClockInfo(handle: Any, type: int) -> int:
    return _clock_mhz(_gpu(handle), type, maximum=True)


@_nvml_function
def nvmlDeviceGetCurrentClocksEventReasons(handle: Any) -> int:
    return _gpu(handle).clock_event_reasons


@_nvml_function
def nvmlDeviceGetCurrentClocksThrottleReasons(handle: Any) -> int:
    return _gpu(handle).clock_event_reasons


# ------------------------------------------------------------------ ECC, row remapping


@_nvml_function
def nvmlDeviceGetTotalEccErrors(handle: Any, errorType: int, counterType: int) -> int:
    gpu = _gpu(handle)
    if counterType not in (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC):
        raise NVMLError_InvalidArgument()
    if errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED:
        return gpu.ecc_corrected
    if errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
        return gpu.ecc_uncorrected
    raise NVMLError_InvalidArgument()


@_nvml_function
def nvmlDeviceGetRemappedRows(device: Any) -> tuple[int, int, int, int]:
    """(correctable, uncorrectable, pending, failure), as pynvml returns it."""
    gpu = _gpu(device)
    return (
        gpu.remapped_rows_correctable,
        gpu.remapped_rows_uncorrectable,
        int(gpu.row_remap_pending),
        int(gpu.row_remap_failed),
    )


# ------------------------------------------------------------------ PCIe


@_nvml_function
def nvmlDeviceGetPcieThroughput(device: Any, counter: int) -> int:
    """KB/s over NVML's 20 ms window, 1 KB = 1024 bytes."""
    gpu = _gpu(device)
    if counter == NVML_PCIE_UTIL_RX_BYTES:
        return int(gpu.pcie_rx_bytes_per_second / 1024)
    if counter == NVML_PCIE_UTIL_TX_BYTES:
        return int(gpu.pcie_tx_bytes_per_second / 1024)
    raise NVMLError_InvalidArgument()


@_nvml_function
def nvmlDeviceGetPcieReplayCounter(handle: Any) -> int:
    return _gpu(handle).pcie_replays


@_nvml_function
def nvmlDeviceGetCurrPcieLinkGeneration(handle: Any) -> int:
    return _gpu(handle).pcie_generation


@_nvml_function
def nvmlDeviceGetMaxPcieLinkGeneration(handle: Any) -> int:
    return _gpu(handle).profile.pcie_generation


@_nvml_function
def nvmlDeviceGetGpuMaxPcieLinkGeneration(handle: Any) -> int:
    return _gpu(handle).profile.pcie_generation


@_nvml_function
def nvmlDeviceGetCurrPcieLinkWidth(handle: Any) -> int:
    return _gpu(handle).pcie_width


@_nvml_function
def nvmlDeviceGetMaxPcieLinkWidth(handle: Any) -> int:
    return _gpu(handle).profile.pcie_width


# ------------------------------------------------------------------ NVLink


def _nvlink(gpu: SimulatedGpu, link: int) -> Any:
    """A GPU without NVLink is NotSupported; a link number past its count InvalidArgument."""
    if not gpu.nvlinks:
        raise NVMLError_NotSupported()
    if not 0 <= link < len(gpu.nvlinks):
        raise NVMLError_InvalidArgument()
    return gpu.nvlinks[link]


@_nvml_function
def nvmlDeviceGetNvLinkState(device: Any, link: int) -> int:
    state = _nvlink(_gpu(device), link)
    return NVML_FEATURE_ENABLED if state.up else NVML_FEATURE_DISABLED


@_nvml_function
def nvmlDeviceGetNvLinkRemoteDeviceType(handle: Any, link: int) -> int:
    """Every simulated NVLink goes to an NVSwitch, as on an HGX baseboard."""
    _nvlink(_gpu(handle), link)
    return NVML_NVLINK_DEVICE_TYPE_SWITCH


@_nvml_function
def nvmlDeviceGetNvLinkRemotePciInfo(device: Any, link: int) -> _PciInfo:
    """The NVSwitch at the far end (:func:`sn_monitor.sim.hgx.nvswitch_of_link`)."""
    gpu = _gpu(device)
    _nvlink(gpu, link)
    switch = nvswitch_of_link(link, len(gpu.nvlinks))
    return _pci_info(nvswitch_bus_id(switch), 0x22A310DE)


@_nvml_function
def nvmlDeviceGetNvLinkErrorCounter(device: Any, link: int, counter: int) -> int:
    state = _nvlink(_gpu(device), link)
    counters = {
        NVML_NVLINK_ERROR_DL_REPLAY: state.replay_errors,
        NVML_NVLINK_ERROR_DL_RECOVERY: state.recovery_errors,
        NVML_NVLINK_ERROR_DL_CRC_FLIT: state.crc_flit_errors,
        NVML_NVLINK_ERROR_DL_CRC_DATA: state.crc_data_errors,
        NVML_NVLINK_ERROR_DL_ECC_DATA: 0,
    }
    if counter not in counters:
        raise NVMLError_InvalidArgument()
    return int(counters[counter])


# ------------------------------------------------------------------ fabric, processes


def _fabric_info(gpu: SimulatedGpu, reference: Any) -> Any:
    """Fill the struct behind ``reference`` (``ctypes.byref(struct)``, or the struct)."""
    if not gpu.profile.fabric_supported:
        raise NVMLError_NotSupported()
    info = getattr(reference, "_obj", reference)
    info.state = gpu.fabric_state
    info.status = gpu.fabric_status
    info.cliqueId = gpu.fabric_clique_id
    for i, byte in enumerate(gpu.fabric_cluster_uuid[:16]):
        info.clusterUuid[i] = byte
    return info


@_nvml_function
def nvmlDeviceGetGpuFabricInfo(device: Any, gpuFabricInfo: Any) -> int:
    _fabric_info(_gpu(device), gpuFabricInfo)
    return NVML_SUCCESS


@_nvml_function
def nvmlDeviceGetGpuFabricInfoV(device: Any, gpuFabricInfo: Any) -> int:
    info = getattr(gpuFabricInfo, "_obj", gpuFabricInfo)
    if getattr(info, "version", None) != nvmlGpuFabricInfo_v2:
        raise NVMLError_ArgumentVersionMismatch()
    _fabric_info(_gpu(device), info)
    return NVML_SUCCESS


def _processes(handle: Any) -> list[_ProcessInfo]:
    """A MIG device's processes, each with its instance ids.

    On a GPU in MIG mode: those of every instance (NVML's aggregate, which needs the
    privileges the agent has).
    """
    instance = _mig_instance(handle)
    if instance is None and _gpu(handle).mig.enabled:
        instances = _gpu(handle).mig.instances
    elif instance is None:
        return [_ProcessInfo(pid, used) for pid, used in _gpu(handle).processes]
    else:
        instances = [instance]
    return [_ProcessInfo(pid, used, i.gpu_instance_id, i.compute_instance_id)
            for i in instances for pid, used in i.processes]


@_nvml_function
def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[_ProcessInfo]:
    return _processes(handle)


@_nvml_function
def nvmlDeviceGetComputeRunningProcesses_v2(handle: Any) -> list[_ProcessInfo]:
    return _processes(handle)


# ------------------------------------------------------------------ MIG


@_nvml_function
def nvmlDeviceGetMigMode(device: Any) -> list[int]:
    """[current, pending]; NotSupported on a GPU without MIG."""
    mig = _gpu(device).mig
    if not mig.supported:
        raise NVMLError_NotSupported()
    return [int(mig.enabled), int(mig.pending)]


@_nvml_function
def nvmlDeviceGetMaxMigDeviceCount(device: Any) -> int:
    """How many MIG devices can exist: 0 where MIG is not supported or not enabled."""
    return MAX_MIG_DEVICES if _gpu(device).mig.enabled else 0


@_nvml_function
def nvmlDeviceGetMigDeviceHandleByIndex(device: Any, index: int) -> _MigDeviceHandle:
    """The MIG device in slot ``index``.

    NotFound where the slot is empty, InvalidArgument past the count (0 with MIG off).
    """
    gpu = _gpu(device)
    if not 0 <= index < len(gpu.mig.slots):
        raise NVMLError_InvalidArgument()
    instance = gpu.mig.slots[index]
    if instance is None:
        raise NVMLError_NotFound()
    key = (gpu.index, instance.uuid)
    handle = _state.mig_handles.get(key)
    if handle is None or handle.instance is not instance:
        handle = _state.mig_handles[key] = _MigDeviceHandle(gpu, instance)
    return handle


@_nvml_function
def nvmlDeviceIsMigDeviceHandle(device: Any) -> int:
    return int(isinstance(device, _MigDeviceHandle))


@_nvml_function
def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice: Any) -> _DeviceHandle:
    if not isinstance(migDevice, _MigDeviceHandle):
        raise NVMLError_InvalidArgument()
    return _state.handles[migDevice._gpu.index]


@_nvml_function
def nvmlDeviceGetGpuInstanceId(device: Any) -> int:
    """A MIG device's GPU instance id; NotSupported on a GPU's own handle."""
    instance = _mig_instance(device)
    if instance is None:
        _gpu(device)
        raise NVMLError_NotSupported()
    return instance.gpu_instance_id


@_nvml_function
def nvmlDeviceGetComputeInstanceId(device: Any) -> int:
    """A MIG device's compute instance id; NotSupported on a GPU's own handle."""
    instance = _mig_instance(device)
    if instance is None:
        _gpu(device)
        raise NVMLError_NotSupported()
    return instance.compute_instance_id


#: Microseconds on the fake's sample clock at simulated time 0 (NVML's are wall-clock
#: microseconds; a caller's first ``timeStamp`` of 0 gets every sample).
_SAMPLE_EPOCH_US = 1_000_000


@_nvml_function
def nvmlDeviceGetProcessUtilization(
    handle: Any, timeStamp: int
) -> list[_ProcessUtilizationSample]:
    """One sample per process, at the GPU's simulated time; utilization shared evenly.

    The GPU's SM and memory utilization go to its processes in equal parts. As NVML:
    NotFound when no sample is newer than ``timeStamp`` (no process, or none since).
    """
    gpu = _gpu(handle)
    now = _SAMPLE_EPOCH_US + round(gpu.elapsed_seconds * 1e6)
    if not gpu.processes or timeStamp >= now:
        raise NVMLError_NotFound()
    n = len(gpu.processes)
    return [
        _ProcessUtilizationSample(
            pid=pid, timeStamp=now, smUtil=round(gpu.utilization * 100 / n),
            memUtil=round(gpu.memory_utilization * 100 / n),
        )
        for pid, _ in gpu.processes
    ]


# ------------------------------------------------------------------ GPM


@_nvml_function
def nvmlGpmQueryDeviceSupport(device: Any) -> _GpmSupport:
    gpu = _gpu(device)
    return _GpmSupport(
        version=NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(gpu.profile.gpm_supported)
    )


@_nvml_function
def nvmlGpmSampleAlloc() -> _GpmSample:
    return _GpmSample()


@_nvml_function
def nvmlGpmSampleFree(gpmSample: Any) -> None:
    if not isinstance(gpmSample, _GpmSample) or gpmSample.freed:
        raise NVMLError_InvalidArgument()
    gpmSample.freed = True


@_nvml_function
def nvmlGpmSampleGet(device: Any, gpmSample: Any) -> _GpmSample:
    gpu = _gpu(device)
    if not gpu.profile.gpm_supported:
        raise NVMLError_NotSupported()
    if not isinstance(gpmSample, _GpmSample) or gpmSample.freed:
        raise NVMLError_InvalidArgument()
    gpmSample.device_index = gpu.index
    gpmSample.gpu_instance_id = None
    gpmSample.snapshot = gpu.gpm_snapshot()
    return gpmSample


@_nvml_function
def nvmlGpmMigSampleGet(device: Any, gpuInstanceId: int, gpmSample: Any) -> _GpmSample:
    """A GPM sample of one GPU instance of a GPU in MIG mode (the GPU's own handle)."""
    gpu = _gpu(device)
    if not gpu.profile.gpm_supported or not gpu.mig.enabled:
        raise NVMLError_NotSupported()
    if not isinstance(gpmSample, _GpmSample) or gpmSample.freed:
        raise NVMLError_InvalidArgument()
    instance = next((i for i in gpu.mig.instances if i.gpu_instance_id == gpuInstanceId), None)
    if instance is None:
        raise NVMLError_InvalidArgument()
    gpmSample.device_index = gpu.index
    gpmSample.gpu_instance_id = gpuInstanceId
    gpmSample.snapshot = instance.gpm_snapshot()
    return gpmSample


@_nvml_function
def nvmlGpmMetricsGet(metricsGet: Any) -> Any:
    """Fill ``metrics[i]`` for the simulated metrics between two samples, averaged over them.

    SM_UTIL, ANY_TENSOR_UTIL and DRAM_BW_UTIL in percent, PCIE_RX_PER_SEC and
    PCIE_TX_PER_SEC in MiB/s; any other id answers NotSupported in its own ``nvmlReturn``.
    """
    if metricsGet.version != NVML_GPM_METRICS_GET_VERSION:
        raise NVMLError_ArgumentVersionMismatch()
    first, second = metricsGet.sample1, metricsGet.sample2
    for sample in (first, second):
        if not isinstance(sample, _GpmSample) or sample.freed or sample.snapshot is None:
            raise NVMLError_InvalidArgument()
    if (first.device_index, first.gpu_instance_id) != (
            second.device_index, second.gpu_instance_id):
        raise NVMLError_InvalidArgument()
    a, b = first.snapshot, second.snapshot
    span = b.elapsed_seconds - a.elapsed_seconds
    for metric in metricsGet.metrics[: metricsGet.numMetrics]:
        if metric.metricId == NVML_GPM_METRIC_DRAM_BW_UTIL:
            total, scale = b.dram_active_seconds - a.dram_active_seconds, 100.0
        elif metric.metricId == NVML_GPM_METRIC_SM_UTIL:
            total, scale = b.sm_active_seconds - a.sm_active_seconds, 100.0
        elif metric.metricId == NVML_GPM_METRIC_ANY_TENSOR_UTIL:
            total, scale = b.tensor_active_seconds - a.tensor_active_seconds, 100.0
        elif metric.metricId == NVML_GPM_METRIC_PCIE_RX_PER_SEC:
            total, scale = b.pcie_rx_bytes - a.pcie_rx_bytes, 1.0 / _MIB
        elif metric.metricId == NVML_GPM_METRIC_PCIE_TX_PER_SEC:
            total, scale = b.pcie_tx_bytes - a.pcie_tx_bytes, 1.0 / _MIB
        else:
            metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            continue
        if span <= 0:
            metric.nvmlReturn = NVML_ERROR_NO_DATA
            continue
        metric.nvmlReturn = NVML_SUCCESS
        metric.value = scale * total / span
    return metricsGet


# ------------------------------------------------------------------ events


@_nvml_function
def nvmlEventSetCreate() -> _EventSet:
    return _EventSet()


@_nvml_function
def nvmlDeviceGetSupportedEventTypes(handle: Any) -> int:
    _gpu(handle)
    return _SUPPORTED_EVENT_TYPES


@_nvml_function
def nvmlDeviceRegisterEvents(handle: Any, eventTypes: int, eventSet: Any) -> None:
    """Events queued before registration are not delivered, as with the real driver."""
    gpu = _gpu(handle)
    if not isinstance(eventSet, _EventSet) or eventSet.freed:
        raise NVMLError_InvalidArgument()
    if eventTypes & ~_SUPPORTED_EVENT_TYPES:
        raise NVMLError_NotSupported()
    mask, cursor = eventSet.registrations.get(gpu.index, (0, len(gpu.xid_log)))
    eventSet.registrations[gpu.index] = (mask | eventTypes, cursor)


def nvmlEventSetWait_v2(eventSet: Any, timeoutms: int) -> _EventData:
    """The oldest undelivered XID of the lowest-numbered device, waiting for one if none.

    It blocks up to ``timeoutms`` real milliseconds, outside the module lock, until an
    XID is queued on any GPU (:meth:`SimulatedGpu.inject_xid
    <sn_monitor.sim.gpu_model.SimulatedGpu.inject_xid>`, a fall off the bus), then raises
    Timeout; 0 raises Timeout at once when nothing is queued. Each look at the queues
    counts as one call (and meets injected errors and hangs as one). Lost GPUs still
    deliver (XID 79 arrives after the loss).
    """
    deadline = time.monotonic() + max(0, int(timeoutms)) / 1000.0
    while True:
        seen = _xids.posted
        try:
            return _next_xid(eventSet, 0)
        except NVMLError_Timeout:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
        _xids.wait_past(seen, left)


def _take_xid(eventSet: Any, timeoutms: int) -> _EventData:
    """The oldest undelivered XID of the lowest-numbered device, else Timeout at once."""
    del timeoutms  # the caller waits
    if not isinstance(eventSet, _EventSet) or eventSet.freed:
        raise NVMLError_InvalidArgument()
    for index in sorted(eventSet.registrations):
        mask, cursor = eventSet.registrations[index]
        if not mask & nvmlEventTypeXidCriticalError:
            continue
        gpu = _state.gpus[index]
        with gpu.lock:
            if cursor < len(gpu.xid_log):
                eventSet.registrations[index] = (mask, cursor + 1)
                return _EventData(
                    device=_state.handles[index],
                    eventType=nvmlEventTypeXidCriticalError,
                    eventData=gpu.xid_log[cursor],
                )
    raise NVMLError_Timeout()


_next_xid = _nvml_function(_take_xid, name="nvmlEventSetWait_v2")


@_nvml_function
def nvmlEventSetFree(eventSet: Any) -> None:
    if not isinstance(eventSet, _EventSet) or eventSet.freed:
        raise NVMLError_InvalidArgument()
    eventSet.freed = True
