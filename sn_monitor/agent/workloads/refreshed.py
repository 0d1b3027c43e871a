"""An allocation source asked on its own thread; the sample reads its last answer.

Some sources cost more than a sample may spend: Slurm's answer is 1 + (jobs on the node)
commands, 40-150 ms and up to their timeout when slurmctld is slow, while a sample's
budget is 3 ms. :class:`RefreshedSource` asks such a source every ``interval`` seconds on
a thread of its own (``agent-source-<name>``) and hands the sampling thread the last
answer, or the last failure (a :class:`SourceUnavailable`, so the source shows down until
an answer comes back). The first call waits up to ``first_wait`` seconds for the first
answer, so that an agent's first samples are attributed when the source answers quickly;
a source that has not answered by then is unavailable until it does.
"""

from __future__ import annotations

import logging
import threading

from sn_monitor.agent.workloads.model import AllocationSource, DeviceAllocation, SourceUnavailable

logger = logging.getLogger(__name__)

#: Seconds the first call waits for the first answer.
DEFAULT_FIRST_WAIT_SECONDS = 1.0
#: Seconds :meth:`RefreshedSource.close` waits for the thread (a command has its own timeout).
CLOSE_WAIT_SECONDS = 5.0


class RefreshedSource:
    """``source`` asked every ``interval`` seconds off the sampling thread.

    The thread starts at the first :meth:`allocations` call (building an agent starts
    nothing) and stops at :meth:`close`. :meth:`refresh` is one ask; with
    ``threaded=False`` nothing else asks (a test drives the refreshes).
    """

    def __init__(self, source: AllocationSource, interval: float, *,
                 first_wait: float = DEFAULT_FIRST_WAIT_SECONDS, threaded: bool = True) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        if first_wait < 0:
            raise ValueError("first_wait must be >= 0")
        self.name = source.name
        self._source = source
        self._interval = float(interval)
        self._first_wait = float(first_wait)
        self._lock = threading.Lock()
        self._answered = threading.Event()
        self._stop = threading.Event()
        self._threaded = threaded
        self._thread: threading.Thread | None = None
        self._last: tuple[DeviceAllocation, ...] = ()
        self._failure: SourceUnavailable | None = None

    def allocations(self) -> tuple[DeviceAllocation, ...]:
        """The last answer; :class:`SourceUnavailable` while the last ask failed or none came."""
        self._start()
        if not self._answered.wait(self._first_wait):
            raise SourceUnavailable(self.name, f"no answer yet (asked every "
                                               f"{self._interval:g}s on its own thread)")
        with self._lock:
            if self._failure is not None:
                raise self._failure
            return self._last

    def refresh(self) -> None:
        """Ask the source once and keep its answer, or its failure."""
        try:
            answer = self._source.allocations()
        except SourceUnavailable as failure:
            with self._lock:
                self._failure = failure
        else:
            with self._lock:
                self._last, self._failure = answer, None
        self._answered.set()

    def close(self) -> None:
        """Stop the thread (waiting for an ask in flight up to a bound) and the source."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(CLOSE_WAIT_SECONDS)
            if thread.is_alive():
                logger.warning("workload source %s still answering after %gs; left to end "
                               "on its own", self.name, CLOSE_WAIT_SECONDS,
                               extra={"source": self.name})
        self._source.close()

    def _start(self) -> None:
        if not self._threaded or self._thread is not None or self._stop.is_set():
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"agent-source-{self.name}")
                self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self._interval)
