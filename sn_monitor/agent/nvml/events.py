"""XID events from an NVML event set: registered per device, waited on, drained.

Every queued XID becomes one :class:`~sn_monitor.model.Event`, on the collect that drains
it or on the event waiter's thread (:meth:`XidEvents.wait`, the agent's fast path),
whichever takes it first; XID 74 (an NVLink error) also makes the GPU's next cycle read
every link. A node whose driver has no event set gets its XIDs from the kernel log only.

The set's lifetime: the waiter blocks in ``nvmlEventSetWait_v2`` holding the set's own
lock (never the adapter's), so :meth:`XidEvents.close` frees the set only between two
waits (it waits at most one timeout); a collect's drain does not wait for it (the waiter
takes what is queued). A waiter with no set yet waits on an event the first registration
sets. Imports :mod:`.calls`, :mod:`.device` and :mod:`.errors`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sn_monitor.agent.nvml.calls import DriverCalls
from sn_monitor.agent.nvml.device import Device, handle_key
from sn_monitor.agent.nvml.errors import ABSENT, TIMEOUT, NvmlError, error_code
from sn_monitor.clock import Clock
from sn_monitor.model import Event

logger = logging.getLogger(__package__)  # the adapter's one logger (see .calls)

# XID 74: an NVLink error (a link went down, or errors past the threshold).
_XID_NVLINK = 74
_MAX_EVENTS_PER_COLLECT = 1000


class XidEvents:
    """The event set, the devices registered on it, the wait and the drain.

    ``clock`` stamps events. :meth:`register`, :meth:`drain`, :meth:`close` and
    :meth:`forget_devices` run under the adapter's lock; :meth:`wait` on the waiter's
    thread, without it.
    """

    def __init__(self, calls: DriverCalls, clock: Clock) -> None:
        self._calls = calls
        self._clock = clock
        self._event_set: Any = None
        self._event_set_failed = False
        self._by_handle: dict[object, Device] = {}
        #: Held while the set is waited on or drained, and to create or free it.
        self._set_lock = threading.Lock()
        #: Set while there is an event set to wait on.
        self._has_set = threading.Event()
        #: Devices whose links the next drain forgets (XID 74 taken by the waiter).
        self._links_stale: list[Device] = []
        self._stale_lock = threading.Lock()

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
                with self._set_lock:
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
        self._has_set.set()

    def drain(self) -> list[Event]:
        """Every queued XID becomes one event (repeats too), without blocking.

        While the waiter is in its wait, it takes what is queued: the drain leaves it.
        """
        if self._event_set is None or not self._set_lock.acquire(blocking=False):
            return []
        try:
            data = self._take(0)
        except NvmlError:
            return []  # logged once
        finally:
            self._set_lock.release()
        return [self._xid_event(each, forget_links=True) for each in data]

    def forget_stale_links(self) -> None:
        """Make the GPUs the waiter took an XID 74 for read every link (before a collect)."""
        with self._stale_lock:
            stale, self._links_stale = self._links_stale, []
        for device in stale:
            device.forget_nvlinks()

    def wait(self, timeout: float) -> list[Event]:
        """Block up to ``timeout`` seconds for XIDs; every one queued by then, as events.

        For the waiter's thread, never under the adapter's lock. Before the first device
        registers it waits on that (no busy loop); after :meth:`close` too. Raises
        :class:`NvmlError` for a failure that is not a timeout (logged once); the caller
        waits before asking again.
        """
        if not self._has_set.wait(timeout):
            return []
        timeout_ms = max(0, round(timeout * 1000))
        with self._set_lock:
            if self._event_set is None:
                return []
            data = self._take(timeout_ms)
        return [self._xid_event(each, forget_links=False) for each in data]

    def _take(self, first_wait_ms: int) -> list[Any]:
        """The queued XIDs' data, the set's lock held: the first wait ``first_wait_ms``.

        Every later wait is 0. Raises :class:`NvmlError`, logged once, for an error that
        is not a timeout before anything was taken.
        """
        nvml = self._calls.nvml
        taken: list[Any] = []
        for count in range(_MAX_EVENTS_PER_COLLECT):
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, 0 if count else first_wait_ms)
            except nvml.NVMLError as error:
                if error_code(error) == TIMEOUT:
                    return taken
                self._calls.log_once(
                    ("event_wait", error_code(error)),
                    "nvmlEventSetWait failed: %s",
                    error,
                    level=logging.WARNING,
                )
                if taken:
                    return taken
                raise NvmlError(f"nvmlEventSetWait failed: {error}") from error
            if int(data.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
                taken.append(data)
        logger.warning(
            "more than %d NVML events at once; the rest wait for the next look",
            _MAX_EVENTS_PER_COLLECT,
        )
        return taken

    def close(self) -> None:
        """Free the event set (before ``nvmlShutdown``), after the waiter's wait ends."""
        self._has_set.clear()
        with self._set_lock:
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
        with self._stale_lock:
            self._links_stale = []

    def _xid_event(self, data: Any, *, forget_links: bool) -> Event:
        """The event for one XID; ``forget_links``: under the adapter's lock (a drain).

        The waiter, without that lock, leaves XID 74's "read every link" to the next
        collect (:meth:`forget_stale_links`).
        """
        device = self._by_handle.get(handle_key(data.device))
        code = int(data.eventData)
        if code == _XID_NVLINK and device is not None:
            if forget_links:
                device.forget_nvlinks()
            else:
                with self._stale_lock:
                    self._links_stale.append(device)
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
