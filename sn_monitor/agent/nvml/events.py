"""XID events from an NVML event set: registered per device, drained without blocking.

Every queued XID becomes one :class:`~sn_monitor.model.Event` on each collect; XID 74 (an
NVLink error) also makes the GPU's next cycle read every link. A node whose driver has no
event set gets its XIDs from the kernel log only. Imports :mod:`.calls`, :mod:`.device`
and :mod:`.errors`.
"""

from __future__ import annotations

import logging
from typing import Any

from sn_monitor.agent.nvml.calls import DriverCalls
from sn_monitor.agent.nvml.device import Device, handle_key
from sn_monitor.agent.nvml.errors import ABSENT, TIMEOUT, error_code
from sn_monitor.clock import Clock
from sn_monitor.model import Event

logger = logging.getLogger(__package__)  # the adapter's one logger (see .calls)

# XID 74: an NVLink error (a link went down, or errors past the threshold).
_XID_NVLINK = 74
_MAX_EVENTS_PER_COLLECT = 1000


class XidEvents:
    """The event set, the devices registered on it and the drain; ``clock`` stamps events."""

    def __init__(self, calls: DriverCalls, clock: Clock) -> None:
        self._calls = calls
        self._clock = clock
        self._event_set: Any = None
        self._event_set_failed = False
        self._by_handle: dict[object, Device] = {}

    def track(self, device: Device) -> None:
        """Know ``device`` by its (new) handle, which the events name."""
        self._by_handle[handle_key(device.handle)] = device

    def register(self, device: Device) -> None:
        """Register for XID events on a device that has them; retried after a loss."""
        if device.events_registered or "xid_events" in device.absent or self._event_set_failed:
            return
        nvml = self._calls.nvml
        if self._event_set is None:
            try:
                self._event_set = nvml.nvmlEventSetCreate()
            except nvml.NVMLError as error:
                if error_code(error) in ABSENT:
                    self._event_set_failed = True
                    logger.warning(
                        "no NVML event set, XID events only from the kernel log: %s", error
                    )
                else:  # transient (or a fault the device reads will show): try again
                    self._calls.log_once(
                        ("event_set", error_code(error)),
                        "nvmlEventSetCreate failed: %s; trying again next cycle",
                        error,
                        level=logging.WARNING,
                    )
                return
        xid = int(nvml.nvmlEventTypeXidCriticalError)
        supported = self._calls.call(device, "xid_events", "nvmlDeviceGetSupportedEventTypes")
        if supported is None:
            return
        if not int(supported) & xid:
            device.absent.add("xid_events")
            return
        try:
            nvml.nvmlDeviceRegisterEvents(device.handle, xid, self._event_set)
        except nvml.NVMLError as error:
            self._calls.classify(device, "xid_events", "nvmlDeviceRegisterEvents", error)
            return
        device.events_registered = True

    def drain(self) -> list[Event]:
        """Every queued XID becomes one event (repeats too), without blocking."""
        if self._event_set is None:
            return []
        nvml = self._calls.nvml
        events: list[Event] = []
        for _ in range(_MAX_EVENTS_PER_COLLECT):
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, 0)
            except nvml.NVMLError as error:
                if error_code(error) != TIMEOUT:
                    self._calls.log_once(
                        ("event_wait", error_code(error)),
                        "nvmlEventSetWait failed: %s",
                        error,
                        level=logging.WARNING,
                    )
                break
            if int(data.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
                events.append(self._xid_event(data))
        else:
            logger.warning(
                "more than %d NVML events in one cycle; the rest wait for the next",
                _MAX_EVENTS_PER_COLLECT,
            )
        return events

    def close(self) -> None:
        """Free the event set (before ``nvmlShutdown``)."""
        if self._event_set is not None:
            nvml = self._calls.nvml
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError as error:
                logger.debug("nvmlEventSetFree failed: %s", error)
            self._event_set = None

    def forget_devices(self) -> None:
        """Drop every handle (after ``nvmlShutdown``: the handles are no longer valid)."""
        self._by_handle = {}

    def _xid_event(self, data: Any) -> Event:
        device = self._by_handle.get(handle_key(data.device))
        code = int(data.eventData)
        if code == _XID_NVLINK and device is not None:
            device.forget_nvlinks()
        gpu = device.index if device is not None else None
        return Event(
            kind="xid",
            source="nvml",
            time_seconds=self._clock.time(),
            message=f"XID {code} on GPU {gpu if gpu is not None else '?'}",
            gpu=gpu,
            pci_bus_id=(device.pci_bus_id or None) if device is not None else None,
            code=code,
        )
