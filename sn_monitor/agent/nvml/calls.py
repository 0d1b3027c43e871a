"""The call wrapper every device read goes through, and the one place errors are classified.

:class:`DriverCalls` holds the NVML module and what the adapter has learnt about it: the
functions these bindings or this driver lack, and the lines already logged once. An error
is absent (remembered per (device, field) in :attr:`Device.absent
<sn_monitor.agent.nvml.device.Device.absent>`), a fault (:class:`DeviceFault`, which ends
the device's read) or transient (left out this cycle, logged once): :meth:`DriverCalls.classify`.
Imports :mod:`.errors` and :mod:`.device`.
"""

from __future__ import annotations

import logging
from typing import Any

from sn_monitor.agent.nvml.device import Device
from sn_monitor.agent.nvml.errors import (
    ABSENT,
    FAULTS,
    FUNCTION_NOT_FOUND,
    NO_PERMISSION,
    NOT_SUPPORTED,
    DeviceFault,
    NvmlError,
    error_code,
)

# One logger for the whole adapter, under the name it had as one module.
logger = logging.getLogger(__package__)


class DriverCalls:
    """Device calls on ``module`` (``pynvml`` or the fake) with the adapter's error model."""

    def __init__(self, module: Any) -> None:
        self.nvml = module
        self._missing_functions: set[str] = set()
        self._logged: set[tuple[object, ...]] = set()

    def call(self, device: Device, key: str, function: str, *args: Any,
             strict: bool = False) -> Any:
        """Call ``function(handle, *args)``; None when absent, :class:`DeviceFault` on faults.

        ``key`` names the field for the per-device "not supported" memory. ``strict``: an
        error that is neither absence nor a fault (a transient one) raises
        :class:`NvmlError` instead of leaving the value out (a topology is never built
        from a half-read).
        """
        if key in device.absent or function in self._missing_functions:
            return None
        fn = getattr(self.nvml, function, None)
        if fn is None:
            self.function_missing(function)
            return None
        try:
            return fn(device.handle, *args)
        except self.nvml.NVMLError as error:
            code = error_code(error)
            if strict and code not in ABSENT and code not in FAULTS:
                raise NvmlError(f"GPU {device.index}: {function} failed: {error}") from error
            self.classify(device, key, function, error)  # a fault raises here
            return None

    def classify(self, device: Device, key: str, function: str, error: BaseException) -> None:
        """Remember an absent capability, raise a fault, log anything else once."""
        code = error_code(error)
        if code == FUNCTION_NOT_FOUND:
            self.function_missing(function)
        elif code == NO_PERMISSION:
            device.absent.add(key)
            self.log_once(
                ("permission", function),
                "%s: no permission (%s); left out",
                function,
                error,
                level=logging.WARNING,
                gpu=device.index,
            )
        elif code in ABSENT and code != NOT_SUPPORTED:
            device.absent.add(key)
            self.log_once(
                ("absent", function, code),
                "%s: %s; left out",
                function,
                error,
                gpu=device.index,
            )
        elif code in ABSENT:
            device.absent.add(key)
            logger.debug(
                "GPU %d: %s not supported; %s left out",
                device.index,
                function,
                key,
                extra={"gpu": device.index},
            )
        elif code in FAULTS:
            raise DeviceFault(function, error) from error
        else:
            self.log_once(
                ("error", device.index, key, code),
                "GPU %d: %s failed: %s; %s left out this cycle",
                device.index,
                function,
                error,
                key,
                level=logging.WARNING,
                gpu=device.index,
            )

    def static(self, device: Device, key: str, function: str, *args: Any) -> Any:
        """A value that does not change while the driver is loaded: read until it succeeds."""
        if key in device.static:
            return device.static[key]
        value = self.call(device, key, function, *args)
        if value is not None:
            device.static[key] = value
        return value

    def known_absent(self, device: Device, key: str, function: str) -> bool:
        """Whether a value that came back None is known for good: absent or never callable."""
        return key in device.absent or function in self._missing_functions

    def is_missing(self, function: str) -> bool:
        """Whether ``function`` is known to be missing from these bindings or this driver."""
        return function in self._missing_functions

    def function_missing(self, function: str) -> None:
        """Remember that ``function`` is not there (logged the first time)."""
        if function not in self._missing_functions:
            self._missing_functions.add(function)
            logger.info("NVML function %s is not available with this driver; left out", function)

    def log_once(
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
