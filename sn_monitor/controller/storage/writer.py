"""The controller's one writer: the store writes that reports cause, in order, off the loop.

The event loop decodes a report, judges it and answers; what the report means for the
store (its events, a new node, an incident opened or closed and the actions it starts, an
agent's command result) is queued here and written by one thread in the order it was
queued. The sweep's findings take the same queue, so an incident is always opened before
it is closed. Consecutive reports' events are written in one durable transaction.

Events are acknowledged only once they are durable, and by the answer to the report that
carries them: :meth:`StoreWriter.events` hands back a future that is done once they are
written (or their write failed), and the report's answer (:class:`PendingReply`) waits for
it, saying how far the node's events are stored (:meth:`StoreWriter.stored_through`). A
report without events waits on nothing. The agent keeps unacknowledged events spooled and
sends them again (only after a write failed, or an answer was lost); the store and the
event rules take each event once.

Not started as a worker (tests, the goodput replay on a virtual clock), each write runs at
once on the caller's thread: the same code in the same order, deterministic.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Final

from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Store
from sn_monitor.model import EventRecord, ReportReply

log = logging.getLogger(__name__)

#: Reports' events written in one transaction at most.
MAX_EVENT_BATCH: Final = 256

Write = Callable[[], object]


@dataclass(frozen=True)
class _Events:
    node: str
    instance: str
    events: Sequence[EventRecord]
    at: float
    #: Done once the events are written, or their write failed.
    written: Future[None] = field(default_factory=Future)


class PendingReply:
    """A report's reply that waits for the report's events to be written.

    ``written`` is done (on the writer's thread) once they are stored or their write
    failed; :meth:`reply` is then the answer, acknowledging what is stored. The API
    answers the report only then, so that the answer that carries events acknowledges
    them (the agent sends them once) and never acknowledges what a crash could lose.
    """

    __slots__ = ("_finish", "written")

    def __init__(self, written: Future[None], finish: Callable[[], ReportReply]) -> None:
        self.written = written
        self._finish = finish

    def reply(self) -> ReportReply:
        """The reply, once :attr:`written` is done."""
        return self._finish()


class StoreWriter:
    """The queue of store writes and the thread that drains it (see the module)."""

    def __init__(self, store: Store, health: StoreHealth,
                 on_stored: Callable[[list[EventRecord]], None] | None = None) -> None:
        self._store = store
        self._health = health
        self._on_stored = on_stored
        self._cond = threading.Condition()
        self._queue: deque[_Events | Write] = deque()
        self._threaded = False
        self._busy = False
        #: node -> (agent instance, the highest event id of it stored)
        self._through: dict[str, tuple[str, int]] = {}

    # -- what the controller queues ------------------------------------------------------

    def events(self, node: str, instance: str, events: Sequence[EventRecord],
               at: float) -> Future[None]:
        """Store a report's events (received at ``at``); done once written or failed.

        Without a writer thread the future is done when this returns.
        """
        item = _Events(node, instance, events, at)
        self._put(item)
        return item.written

    def call(self, write: Write) -> None:
        """Run ``write`` (a store write, or a decision that writes) after what is queued."""
        self._put(write)

    def stored_through(self, node: str, instance: str) -> int:
        """The highest event id of this agent instance known to be stored (-1: none)."""
        known = self._through.get(node)
        return known[1] if known is not None and known[0] == instance else -1

    @property
    def depth(self) -> int:
        """Writes queued and not yet done."""
        return len(self._queue) + (1 if self._busy else 0)

    def _put(self, item: _Events | Write) -> None:
        with self._cond:
            if self._threaded:
                self._queue.append(item)
                self._cond.notify()
                return
        self._write([item])  # no writer thread: at once, on the caller's thread

    # -- the worker ----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Write what is queued until ``stop`` is set and the queue is empty (a worker).

        An unexpected error escapes (the runtime logs it and starts the worker again);
        the write that raised it is lost, the rest of the queue is kept.
        """
        with self._cond:
            self._threaded = True
        try:
            while True:
                with self._cond:
                    while not self._queue and not stop.is_set():
                        self._cond.wait(timeout=0.5)
                    if not self._queue:
                        # stopped, and everything written: what comes now is written
                        # at once (no write, and no answer waiting on one, is left behind)
                        self._threaded = False
                        return
                    batch = self._take()
                    self._busy = True
                try:
                    self._write(batch)
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
        finally:
            if stop.is_set():
                with self._cond:
                    self._threaded = False

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued is written; False if not within ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy,
                                       timeout=timeout)

    def _take(self) -> list[_Events | Write]:
        """The next writes: one call, or a run of reports' events (the lock is held)."""
        first = self._queue.popleft()
        batch = [first]
        if isinstance(first, _Events):
            while (self._queue and isinstance(self._queue[0], _Events)
                   and len(batch) < MAX_EVENT_BATCH):
                batch.append(self._queue.popleft())
        return batch

    def _write(self, batch: list[_Events | Write]) -> None:
        events = [item for item in batch if isinstance(item, _Events)]
        if events:
            try:
                self._store_events(events)
            finally:  # stored or not, their answers go out (unacknowledged if not)
                for queued in events:
                    queued.written.set_result(None)
        for item in batch:
            if not isinstance(item, _Events):
                item()

    def _store_events(self, batch: list[_Events]) -> None:
        stored = self._health.attempt(self._store.record_event_batches,
                                      [(b.node, b.events, b.at) for b in batch])
        if stored is None:
            return  # not acknowledged: the agents send them again
        for b in batch:
            highest = max(e.id for e in b.events)
            known = self._through.get(b.node)
            if known is None or known[0] != b.instance or known[1] < highest:
                self._through[b.node] = (b.instance, highest)
        if self._on_stored is not None and stored:
            self._on_stored(stored)
