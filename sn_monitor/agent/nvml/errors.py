"""NVML's return codes as the adapter reads them, and the errors the adapter raises.

Three classes of driver error (see :meth:`~sn_monitor.agent.nvml.calls.DriverCalls.classify`,
the one place an error is classified): :data:`ABSENT` (the capability is not there),
:data:`FAULTS` (the GPU or the driver under it is broken) and anything else (transient).
Imports nothing of the package.
"""

from __future__ import annotations

from sn_monitor.errors import SnMonitorError

# NVML return codes (nvml.h); stable ABI values, so they need no lookup in the module.
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INVALID_ARGUMENT = 2
NOT_FOUND = 6  # e.g. no MIG device in that slot: an answer, not an error
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
SUCCESS = 0

# Errors that say the capability is not there: leave the field out, for good.
ABSENT = frozenset(
    {
        NOT_SUPPORTED,
        NO_PERMISSION,
        FUNCTION_NOT_FOUND,
        22,  # VgpuEccNotSupported
        25,  # ArgumentVersionMismatch: the bindings' struct version is not this driver's
        26,  # Deprecated
    }
)
# Errors that say the GPU (or the driver under it) is broken: an event, never "N/A".
FAULTS = frozenset(
    {
        1,  # Uninitialized: NVML was torn down under us after init
        8,  # InsufficientPower: external power cables not properly attached
        DRIVER_NOT_LOADED,
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
# GpuIsLost, ResetRequired, GpuNotFound: the GPU is out of every process's reach until
# it is reset; other faults (DriverNotLoaded, Unknown) say nothing about who uses it.
UNREACHABLE = frozenset({15, 16, 28})


class NvmlError(SnMonitorError):
    """NVML could not do what was asked."""


class NvmlUnavailable(NvmlError):
    """No NVML on this node: the library is absent or the kernel driver is not loaded."""


class GpuUnreachable(NvmlError):
    """NVML cannot reach the GPU: lost, gone from the bus, or waiting for a reset."""


class DeviceFault(Exception):
    """A fault error from a device call; ends this cycle's read of that device."""

    def __init__(self, function: str, error: BaseException) -> None:
        super().__init__(f"{function}: {error}")
        self.function = function
        self.error = error


def error_code(error: BaseException) -> int | None:
    """The NVML return code an ``NVMLError`` carries; None for any other exception."""
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None
