"""The controller's workers, each supervised, and an orderly stop with a hard deadline.

In the shape of kopf's reactor (``kopf/_core/reactor/running.py``): the process is a few
named root workers, and none of them may die unnoticed. The HTTP server runs on the main
thread (uvicorn wants the signals); every other worker is a thread running
``run(stop)``, a loop that returns once its ``stop`` event is set:

- ``sweep``: heartbeats, peers, node states, recovery steps (the controller's sweep);
- ``writer``: the store writes reports and findings cause (:mod:`.writer`);
- ``actions``: the action runner's retries and dispatch (``ActionRunner.tick``);
- ``reload``: SIGHUP's rule and certificate reload;
- ``lease``: the lease renewal, with high availability.

A worker that raises (or returns without being asked) is logged with its traceback and,
as its :class:`Worker` says, either started again after a backoff that doubles with each
failure in a row (1 s to 30 s; a run of a minute resets it) or stops the whole process in
order (the lease renewer: a controller that cannot tell whether it still leads must not
act). ``sn_controller_worker_up{worker}`` is 0 while a worker is down,
``sn_controller_worker_restarts_total{worker}`` counts the restarts.

Stopping: the workers are stopped one at a time, in the order they were added (the
sweep before the writer that drains what it queued, the lease last), within one deadline
shared by all. :data:`STOP_DEADLINE_SECONDS` from SIGTERM to exit is below systemd's
``TimeoutStopSec=30s``; the action runner's driver timeout is below it too, so that no
driver call outlives the stop by design. A worker still running at the deadline is named
in the log with its stack, and the process exits without waiting for it.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from sn_monitor.clock import Clock

log = logging.getLogger(__name__)

#: From SIGTERM to exit, at most (systemd's TimeoutStopSec is 30 s).
STOP_DEADLINE_SECONDS: Final = 20.0
#: The first restart's delay, doubled per failure in a row up to MAX_BACKOFF_SECONDS.
BACKOFF_SECONDS: Final = 1.0
MAX_BACKOFF_SECONDS: Final = 30.0
#: A worker that ran this long before failing starts again from the first delay.
HEALTHY_RUN_SECONDS: Final = 60.0

OnCrash = Literal["restart", "stop"]


@dataclass(frozen=True)
class Worker:
    """A named root worker: ``run(stop)`` loops until ``stop`` is set, then returns."""

    name: str
    run: Callable[[threading.Event], None]
    on_crash: OnCrash = "restart"


class _Slot:
    """One worker's thread, stop event and health."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.up = False
        self.restarts = 0


class Runtime:
    """Starts the workers, supervises them, and stops them in order (see the module)."""

    def __init__(self, clock: Clock, *, backoff: float = BACKOFF_SECONDS,
                 max_backoff: float = MAX_BACKOFF_SECONDS) -> None:
        self._clock = clock
        self._backoff = backoff
        self._max_backoff = max_backoff
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        #: Set once the process must stop: a signal, or a worker whose failure stops it.
        self.stopping = threading.Event()
        #: Why the process stops because of a worker (None: it was asked to).
        self.failure: str | None = None
        #: Called (once) when a worker's failure stops the process: tell the server.
        self.on_failure: Callable[[str], None] | None = None

    def add(self, worker: Worker) -> None:
        if worker.name in self._slots:
            raise ValueError(f"worker {worker.name} added twice")
        self._slots[worker.name] = _Slot(worker)

    def start(self) -> None:
        """Start every worker added (each in its own thread, named ``sn-<worker>``)."""
        for slot in self._slots.values():
            slot.thread = threading.Thread(target=self._supervise, args=(slot,),
                                           name=f"sn-{slot.worker.name}", daemon=True)
            slot.up = True
            slot.thread.start()

    def up(self) -> dict[str, bool]:
        """Each worker: whether it runs now (``sn_controller_worker_up``)."""
        with self._lock:
            return {name: slot.up for name, slot in self._slots.items()}

    def restarts(self) -> dict[str, int]:
        """Each worker: how often it was started again after a failure."""
        with self._lock:
            return {name: slot.restarts for name, slot in self._slots.items()}

    def stop(self, deadline: float) -> list[str]:
        """Stop the workers in order by ``deadline`` (monotonic); those still running.

        Each one's stack is logged: what it waits on is why the stop was not clean.
        """
        self.stopping.set()
        stuck: list[str] = []
        for name, slot in self._slots.items():
            slot.stop.set()
            thread = slot.thread
            if thread is None:
                continue
            thread.join(timeout=max(0.0, deadline - self._clock.monotonic()))
            if thread.is_alive():
                stuck.append(name)
                log.error("worker %s did not stop within the deadline:\n%s", name,
                          _stack_of(thread), extra={"worker": name})
        return stuck

    # -- supervision ---------------------------------------------------------------------

    def _supervise(self, slot: _Slot) -> None:
        worker = slot.worker
        failures = 0
        while not slot.stop.is_set():
            started = self._clock.monotonic()
            self._set_up(slot, True)
            try:
                worker.run(slot.stop)
            except Exception:  # the supervisor's whole job: log it, then restart or stop
                why = f"worker {worker.name} failed"
                log.exception("%s", why, extra={"worker": worker.name})
            else:
                if slot.stop.is_set():
                    break
                why = f"worker {worker.name} returned without being asked to stop"
                log.error("%s", why, extra={"worker": worker.name})
            self._set_up(slot, False)
            if worker.on_crash == "stop":
                self._fail(why)
                return
            ran = self._clock.monotonic() - started
            failures = 1 if ran >= HEALTHY_RUN_SECONDS else failures + 1
            delay = min(self._max_backoff, self._backoff * 2 ** (failures - 1))
            log.warning("worker %s starts again in %.0f s (failure %d in a row)",
                        worker.name, delay, failures, extra={"worker": worker.name})
            if slot.stop.wait(delay):
                break
            with self._lock:
                slot.restarts += 1
        self._set_up(slot, False)

    def _set_up(self, slot: _Slot, up: bool) -> None:
        with self._lock:
            slot.up = up

    def _fail(self, why: str) -> None:
        with self._lock:
            first = self.failure is None
            if first:
                self.failure = why
        if not first:
            return
        log.error("%s: the controller stops", why)
        self.stopping.set()
        if self.on_failure is not None:
            self.on_failure(why)


def every(seconds: float, tick: Callable[[], None]) -> Callable[[threading.Event], None]:
    """A worker's ``run`` that calls ``tick`` every ``seconds`` until stopped.

    The first call is right away, each next one ``seconds`` after the previous one
    ended (never two at once; a late one is not made up for).
    """
    def run(stop: threading.Event) -> None:
        while not stop.is_set():
            tick()
            stop.wait(seconds)
    return run


def _stack_of(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or -1)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"
