"""One term as the active controller: the Controller, its API on uvicorn, the workers.

The server runs on this thread; the workers (sweep, checkpoints, actions, reload, the
store's writer, the job watch, the lease) are supervised by the runtime
(:mod:`sn_monitor.controller.supervision.runtime`). The term ends on a signal, on a
worker's failure or when the lease is lost, and everything stops by one deadline.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

from sn_monitor.clock import Clock
from sn_monitor.controller.actions.routing import Drivers
from sn_monitor.controller.api.app import build_app
from sn_monitor.controller.ha.elector import Elector
from sn_monitor.controller.process.reload import Reload
from sn_monitor.controller.process.server import active_server
from sn_monitor.controller.process.startup import build_job_watch, tune_garbage_collector
from sn_monitor.controller.security.auth import TokenBook
from sn_monitor.controller.service import Controller
from sn_monitor.controller.settings import ControllerSettings
from sn_monitor.controller.storage.store import Store
from sn_monitor.controller.supervision.runtime import STOP_DEADLINE_SECONDS, Runtime, Worker, every
from sn_monitor.notify import SystemdNotifier
from sn_monitor.rules.spec import RuleSet

log = logging.getLogger(__name__)

#: How often the action runner dispatches retries whose time has come.
ACTION_TICK_SECONDS = 1.0
#: How often the checkpoint directories that are due are looked through.
CHECKPOINT_SCAN_SECONDS = 1.0


def serve_active(settings: ControllerSettings, clock: Clock, rules: RuleSet,
                 tokens: TokenBook | None, store: Store, drivers: Drivers,
                 elector: Elector | None, notifier: SystemdNotifier,
                 listener: socket.socket) -> int:
    """Serve as the active controller until the term ends; the exit code."""
    controller = Controller(settings, rules.rules, clock, store, drivers, watch_stalls=True,
                            rule_sources=rules.sources)
    controller.start()
    tune_garbage_collector()
    term = ActiveTerm(settings, clock, controller, tokens, notifier)
    term.supervise(elector)
    log.info("controller serving %s on %s with %d rules, store %s",
             "HTTPS" if settings.tls is not None else "HTTP", settings.listen,
             len(rules.rules), store.path)
    return term.run(listener)


class ActiveTerm:
    """The server and the supervised workers of one active term, and how it ends."""

    def __init__(self, settings: ControllerSettings, clock: Clock, controller: Controller,
                 tokens: TokenBook | None, notifier: SystemdNotifier) -> None:
        self._settings = settings
        self._clock = clock
        self._controller = controller
        self._notifier = notifier
        self.runtime = Runtime(clock)
        controller.workers = self.runtime.up
        controller.runs_actions_elsewhere = True
        controller.jobs.scans_elsewhere = True
        #: Set when the lease is lost: the term ends with exit 1 (restart as a standby).
        self.lost = threading.Event()
        tls = settings.tls
        app = build_app(controller, tokens, settings.max_body_bytes,
                        certificates=tls is not None and tls.verifies_clients,
                        agent_auth=tls.agent_auth if tls is not None else "either")
        self.server, certificate = active_server(app, settings, notifier, controller.stalls,
                                                 clock)
        self.reload = Reload(settings, controller, certificate, self.server)

    def supervise(self, elector: Elector | None) -> None:
        """Add the workers to the runtime, and take SIGHUP (a reload)."""
        settings, controller, runtime = self._settings, self._controller, self.runtime
        # Stopped in this order: nothing new is decided, then what was decided is written,
        # then the lease goes (the writer still writes as the leader).
        runtime.add(Worker("sweep", every(float(settings.sweep_interval), self._sweep)))
        runtime.add(Worker("checkpoints", every(CHECKPOINT_SCAN_SECONDS,
                                                controller.jobs.scan_checkpoints)))
        runtime.add(Worker("actions", every(ACTION_TICK_SECONDS, controller.runner.tick)))
        runtime.add(Worker("reload", self.reload.run))
        runtime.add(Worker("writer", controller.writer.run))
        if settings.kubernetes.watch_jobs:
            job_watch = build_job_watch(settings, controller, self._clock)
            runtime.add(Worker("job-watch", job_watch.run))
            runtime.add(Worker("job-status", every(float(settings.kubernetes.status_interval),
                                                   job_watch.write_statuses)))
        if elector is not None:
            keep = elector.keep_leading
            runtime.add(Worker("lease", lambda stop: keep(stop, self._on_lost),
                               on_crash="stop"))
        runtime.on_failure = self._stop_serving
        signal.signal(signal.SIGHUP, self.reload.on_hup)

    def run(self, listener: socket.socket) -> int:
        """Start the workers, serve on ``listener`` until the term ends; the exit code."""
        self.runtime.start()
        try:
            self.server.run(sockets=[listener])
        finally:
            self._stop()
        if self.lost.is_set():
            log.error("controller stopped acting: it lost the lease (exit 1: restart as a "
                      "standby)")
            return 1
        if self.runtime.failure is not None:
            log.error("controller stopped: %s", self.runtime.failure)
            return 1
        return 0

    def _stop(self) -> None:
        """Stop the workers, then the controller, by the deadline; past it, exit at once."""
        deadline = self.server.stop_deadline()
        stuck = self.runtime.stop(deadline)
        idle = self._controller.close(max(0.0, deadline - self._clock.monotonic()))
        if not idle:
            log.error("actions still running at the stop deadline: their records say "
                      "so, and the next start resumes them")
        if stuck or not idle:
            _exit_now(1 if self.runtime.failure or self.lost.is_set() else 0)

    def _sweep(self) -> None:
        self._controller.sweep()
        self._notifier.watchdog()

    def _on_lost(self, reason: str) -> None:
        del reason  # logged by the elector
        self.lost.set()
        self.server.should_exit = True

    def _stop_serving(self, why: str) -> None:
        del why  # logged by the runtime
        self.server.should_exit = True


def _exit_now(code: int) -> None:
    """The stop deadline passed with work still running: exit without waiting for it.

    Python waits for the thread pools' threads at exit; a driver call or a store write
    stuck on a dead mount would hold the process past systemd's TimeoutStopSec (and be
    killed with SIGKILL, logs lost). What was not finished is resumed by the next start.
    """
    log.error("controller stopped at the deadline (%gs), leaving work unfinished",
              STOP_DEADLINE_SECONDS)
    logging.shutdown()  # the store is left open: a thread may be inside it
    os._exit(code)
