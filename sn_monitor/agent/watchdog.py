"""Each collector on a thread of its own, so that a call that never returns stalls nothing.

A driver can wedge: an NVML call then blocks in the kernel and never returns, and an
agent that made it on its sampling thread would stop sampling, guarding and reporting
while its last values still look healthy. Python cannot interrupt a thread blocked in a
C call, so the call is made where its hanging does no harm: :class:`CollectorWorker`
runs one collector's ``collect()`` on that collector's own thread, one call at a time.
The sampler asks each idle worker for a run in turn, waits for it up to its deadline (on
a :class:`threading.Event`) and goes on without it if it is still running: it is stuck.
A stuck worker gets no second call while the first hangs; when that call returns at
last, the worker is idle again and its late :class:`CallOutcome` says so.

The worker closes its collector on its own thread when told to stop, after the call in
flight (if any) has returned: a collector is never closed under a running call.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from sn_monitor.agent.collectors.base import Collector
from sn_monitor.agent.snapshot import Collected
from sn_monitor.clock import Clock

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """How one ``collect()`` call ended: what it returned, or what it raised.

    ``started`` and ``duration_seconds`` are on the injected clock's monotonic time.
    """

    collected: Collected | None
    error: Exception | None
    started: float
    duration_seconds: float


class CollectorWorker:
    """Runs one collector's calls on its own thread (``agent-collect-<name>``).

    The thread is started by the first :meth:`start_call` and ends at :meth:`close`
    (once the call in flight, if any, has returned).
    """

    def __init__(self, collector: Collector, clock: Clock) -> None:
        self.collector = collector
        self.name = collector.name
        self._clock = clock
        self._cond = threading.Condition()
        self._asked = False
        self._busy = False
        self._closing = False
        self._started: float | None = None
        self._outcome: CallOutcome | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """A call was asked for and has not returned yet."""
        with self._cond:
            return self._busy

    @property
    def started(self) -> float | None:
        """When the call in flight (or the last one) was asked for, on the clock."""
        with self._cond:
            return self._started

    def start_call(self) -> None:
        """Ask for one ``collect()``; the worker must be idle (not :attr:`busy`)."""
        with self._cond:
            if self._busy:
                raise RuntimeError(f"collector {self.name} is still running its last call")
            if self._closing:
                raise RuntimeError(f"collector {self.name} is closed")
            self._busy = True
            self._asked = True
            self._outcome = None
            self._started = self._clock.monotonic()
            self._done.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"agent-collect-{self.name}",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` real seconds for the call in flight; True once it returned."""
        return self._done.wait(max(0.0, timeout))

    def take(self) -> CallOutcome | None:
        """The outcome of the call that returned, once (None: none returned since)."""
        with self._cond:
            outcome, self._outcome = self._outcome, None
            return outcome

    def close(self, timeout: float) -> bool:
        """Stop the thread and close the collector; True when that is done.

        An idle worker closes its collector within ``timeout``. A stuck one cannot: it
        is left to close the collector itself if its call ever returns (the thread is a
        daemon, so it holds no process open), and False says so.
        """
        with self._cond:
            self._closing = True
            thread = self._thread
            self._cond.notify()
        if thread is None:
            self._close_collector()
            return True
        thread.join(max(0.0, timeout))
        return not thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._asked and not self._closing:
                    self._cond.wait()
                if self._closing and not self._asked:
                    break
                self._asked = False
                started = self._started if self._started is not None else self._clock.monotonic()
            collected: Collected | None = None
            error: Exception | None = None
            try:
                collected = self.collector.collect()
            except Exception as err:  # noqa: BLE001 - handed to the sampler, which logs it
                error = err
            took = max(0.0, self._clock.monotonic() - started)
            with self._cond:
                self._outcome = CallOutcome(collected, error, started, took)
                self._busy = False
                self._done.set()
        self._close_collector()

    def _close_collector(self) -> None:
        try:
            self.collector.close()
        except OSError as err:
            log.warning("close failed: %s", err, extra={"collector": self.name})
