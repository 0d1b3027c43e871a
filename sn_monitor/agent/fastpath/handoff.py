"""The hand-off: an event taken by a fast-path thread goes through the join to the reporter.

The join is the sampler's (:meth:`Sampler.admit <sn_monitor.agent.sampler.Sampler.admit>`):
the PCI address mapped to the GPU index with the GPUs of the last sample, and the XID
ledger, shared with the cycle, that counts one XID seen by NVML and by the kernel log
once, whichever thread sees it first. An event that is new is spooled at once (it is
then the spool's, not the next snapshot's: each event is spooled once) and the report
thread is woken to send it in an event-only report, or in the sampled report already
waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sn_monitor.model import Event

log = logging.getLogger(__name__)

#: The join: the new events among those given (thread-safe).
Admit = Callable[[Sequence[Event]], list[Event]]
#: Keeps events until the controller stored them (thread-safe).
Spool = Callable[[Sequence[Event]], None]
#: Wakes the report thread to send the spooled events now.
SendNow = Callable[[], None]


class EventHandoff:
    """Admit, spool, send now; called from the fast path's threads, both at once if need be."""

    def __init__(self, admit: Admit, spool: Spool, send_now: SendNow, *, node: str = "") -> None:
        self._admit = admit
        self._spool = spool
        self._send_now = send_now
        self._node = node

    def deliver(self, events: Sequence[Event]) -> None:
        """Hand ``events`` on; those the cycle or the other thread saw already are dropped."""
        new = self._admit(events)
        if not new:
            return
        self._spool(new)
        self._send_now()
        for event in new:
            log.info("%s %s on GPU %s from %s: handed to the reporter at once", event.kind,
                     event.code if event.code is not None else "",
                     "?" if event.gpu is None else event.gpu, event.source,
                     extra={"node": self._node, "gpu": event.gpu})
