"""The NVML event waiter: a thread blocked in NVML's event wait, handing each XID on at once.

It waits on the adapter's event set (the one the sampling cycle registers the GPUs on
and drains as a fallback) for at most :data:`WAIT_SECONDS` at a time, so that stopping
takes at most that long; idle, it costs one return from the driver per timeout. Before
the cycle has registered a GPU the adapter makes it wait on an event, not spin. A wait
that fails (logged once by the adapter) is followed by a pause of one timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from sn_monitor.agent.nvml import NvmlError
from sn_monitor.model import Event

log = logging.getLogger(__name__)

#: The longest one wait in the driver takes: the most a stop waits for the thread.
WAIT_SECONDS = 0.5

Deliver = Callable[[Sequence[Event]], None]


class XidSource(Protocol):
    """What the waiter needs of the NVML adapter (:class:`~sn_monitor.agent.nvml.NvmlLibrary`)."""

    def wait_xid_events(self, timeout: float) -> tuple[Event, ...]: ...


class NvmlEventWaiter:
    """Waits for XIDs from ``source`` on a thread of its own and hands them to ``deliver``."""

    def __init__(self, source: XidSource, deliver: Deliver, *, node: str = "",
                 wait_seconds: float = WAIT_SECONDS) -> None:
        if wait_seconds <= 0:
            raise ValueError("wait_seconds must be positive")
        self._source = source
        self._deliver = deliver
        self._node = node
        self._wait_seconds = wait_seconds
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-nvml-events",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether its thread is alive (started and not yet ended)."""
        return self._thread.is_alive()

    def stop(self, timeout: float) -> None:
        """Stop after the wait in progress (at most ``wait_seconds``; waits up to ``timeout``)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
        if self._thread.is_alive():
            log.error("the NVML event waiter did not stop within %.1f s", timeout,
                      extra={"node": self._node})

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    events = self._source.wait_xid_events(self._wait_seconds)
                except NvmlError:  # logged once by the adapter; the cycle drains meanwhile
                    self._stopping.wait(self._wait_seconds)
                    continue
                if events:
                    self._deliver(events)
        except Exception:  # the cycle still drains the event set; the thread's end is logged
            log.exception("the NVML event waiter failed: XIDs wait for the sampling cycle",
                          extra={"node": self._node})
