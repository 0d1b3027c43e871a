"""The controller process: the ASGI app on uvicorn, the supervised workers, SIGHUP reload."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import uvicorn

from sn_monitor.clock import Clock
from sn_monitor.config import ConfigError, parse_listen
from sn_monitor.controller.actions.routing import Drivers, build_drivers
from sn_monitor.controller.api.app import build_app
from sn_monitor.controller.api.report_lane import report_lane
from sn_monitor.controller.ha.elector import Elector
from sn_monitor.controller.ha.lease import HaSettings, Lease
from sn_monitor.controller.ha.standby import StandbyApp, StandbyStatus
from sn_monitor.controller.ha.store_lease import StoreLease
from sn_monitor.controller.jobs.crd_watch import JobWatch
from sn_monitor.controller.security.auth import TokenBook
from sn_monitor.controller.security.tls import (
    CertificateReloader,
    TlsSettings,
    harden,
    uvicorn_options,
)
from sn_monitor.controller.service import Controller
from sn_monitor.controller.settings import STORE_DSN_ENV, ControllerSettings
from sn_monitor.controller.storage.database.postgres import PostgresDatabase
from sn_monitor.controller.storage.store import Store
from sn_monitor.controller.supervision.runtime import STOP_DEADLINE_SECONDS, Runtime, Worker, every
from sn_monitor.controller.supervision.stall import LOOP_TICK_SECONDS, StallWatch
from sn_monitor.notify import SystemdNotifier
from sn_monitor.rules.spec import (
    CONFIG_SOURCE,
    NO_RULES,
    RuleSet,
    default_rule_paths,
    load_rule_set,
)
from sn_monitor.serving import listening_socket

if TYPE_CHECKING:
    from sn_monitor.controller.ha.k8s_role import PodRoleLabel

log = logging.getLogger(__name__)

#: uvicorn's share of the stop deadline: open connections finish their requests.
SERVER_GRACE_SECONDS = int(STOP_DEADLINE_SECONDS // 2)
#: How often the action runner dispatches retries whose time has come.
ACTION_TICK_SECONDS = 1.0
#: How often the checkpoint directories that are due are looked through.
CHECKPOINT_SCAN_SECONDS = 1.0


def rule_paths(settings: ControllerSettings) -> tuple[list[Path], str]:
    """The rule files or directories to load, and where they come from (for the log)."""
    if settings.rules is None:
        return default_rule_paths()
    paths = [Path(p) for p in settings.rules]
    return paths, ", ".join(map(str, paths))


def read_rules(settings: ControllerSettings) -> RuleSet:
    """The controller's rules (ConfigError naming file, key and line); logs their source.

    No rules at all is a ConfigError (a controller that watches nothing looks exactly
    like a healthy one), unless the config asks for none with ``rules: []``.
    """
    paths, source = rule_paths(settings)
    if not paths:
        log.warning("no rules: the config says rules: [] (no node fault is acted on)")
        return RuleSet([], {CONFIG_SOURCE: 0})
    loaded = load_rule_set(paths)
    if not loaded.rules:
        raise ConfigError(source, "", None, NO_RULES)
    log.info("%d rules from %s", len(loaded.rules), source)
    return loaded


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    del signum, frame


class NotifyingServer(uvicorn.Server):
    """uvicorn that tells systemd READY=1 once it accepts connections.

    With ``stalls``, the event loop ticks it (:mod:`sn_monitor.controller.supervision.stall`):
    how the controller tells its own stalls from its nodes' silence.
    """

    def __init__(self, config: uvicorn.Config, notifier: SystemdNotifier,
                 stalls: StallWatch | None = None, clock: Clock | None = None) -> None:
        super().__init__(config)
        self._notifier = notifier
        self._stalls = stalls
        self._clock = clock
        self._asked_at: float | None = None
        #: The event loop serving, once started (for work that must run on its thread).
        self.loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGTERM/SIGINT: the stop deadline runs from the first one."""
        if self._asked_at is None and self._clock is not None:
            self._asked_at = self._clock.monotonic()
        super().handle_exit(sig, frame)

    def stop_deadline(self) -> float:
        """When everything must have stopped (monotonic): the deadline from the signal."""
        assert self._clock is not None
        start = self._asked_at if self._asked_at is not None else self._clock.monotonic()
        return start + STOP_DEADLINE_SECONDS

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        if self._stalls is not None:
            self._tick(self._stalls)
        await super().startup(sockets)
        if not self.should_exit:
            self._notifier.ready("serving")

    def _tick(self, stalls: StallWatch) -> None:
        stalls.loop_ticked()
        if self.loop is not None and not self.should_exit:
            self.loop.call_later(LOOP_TICK_SECONDS, self._tick, stalls)


def tune_garbage_collector() -> None:
    """Fewer, cheaper collections for a long-lived process holding many small objects.

    Everything allocated at start-up (modules, rules, the store) is frozen out of the
    collector, and the first generation collects every 50,000 allocations instead of 700:
    the ingest path allocates a lot and frees almost all of it by reference counting.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def open_store(settings: ControllerSettings) -> Store:
    """The store the settings name: SQLite in the state directory, or PostgreSQL."""
    if settings.store.backend == "sqlite":
        state_dir = Path(settings.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        return Store(state_dir / "controller.db")
    return Store(PostgresDatabase(_store_dsn(settings)))


def _store_dsn(settings: ControllerSettings) -> str:
    path = settings.store.dsn_file
    if path is None:
        dsn = os.environ.get(STORE_DSN_ENV, "").strip()
        if not dsn:
            raise ConfigError("controller config", "store.dsn_file", None,
                              f"backend postgresql needs dsn_file or ${STORE_DSN_ENV}")
        return dsn
    try:
        dsn = Path(path).read_text(encoding="utf-8").strip()
    except OSError as err:
        raise ConfigError("controller config", "store.dsn_file", None,
                          f"cannot read {path}: {err.strerror}") from None
    if not dsn:
        raise ConfigError("controller config", "store.dsn_file", None, f"{path} is empty")
    return dsn


def build_job_watch(settings: ControllerSettings, controller: Controller,
                    clock: Clock) -> JobWatch:
    """For ``kubernetes.watch_jobs``: the DistributedJob watch (imports the client)."""
    from sn_monitor.controller.k8s.job_api import DistributedJobApi

    watch = settings.kubernetes
    try:
        api = DistributedJobApi(watch.api_settings(), watch.namespace)
    except ValueError as err:
        raise ConfigError("controller config", "kubernetes", None, str(err)) from None
    return JobWatch(api, controller.jobs, clock,
                    status_interval=float(watch.status_interval))


def build_lease(ha: HaSettings, store: Store, clock: Clock) -> Lease:
    """The lease ``ha.lease`` names (the Kubernetes client is imported only for it)."""
    if ha.lease == "postgresql":
        return StoreLease(store, ha, clock)
    from sn_monitor.controller.ha.k8s_lease import KubernetesLease

    try:
        lease: Lease = KubernetesLease(ha)
    except ValueError as err:
        raise ConfigError("controller config", "ha.kubernetes", None, str(err)) from None
    return lease


def build_role_label(ha: HaSettings) -> PodRoleLabel | None:
    """For ``ha.lease: kubernetes``: the label on our pod that the active's Service selects."""
    if ha.lease != "kubernetes":
        return None
    from sn_monitor.controller.ha.k8s_role import PodRoleLabel

    try:
        return PodRoleLabel(ha.kubernetes)
    except ValueError as err:
        raise ConfigError("controller config", "ha.kubernetes", None, str(err)) from None


def fence_store(store: Store, lease: Lease, ha: HaSettings, clock: Clock) -> int:
    """Make the store refuse writes once another controller takes over; the epoch.

    The PostgreSQL lease is its own fence. A Kubernetes Lease is not in the store, so
    the new active claims the store's lease row (a new epoch) as it takes over.
    """
    record = lease.granted if isinstance(lease, StoreLease) else None
    if record is None:
        record = store.acquire_lease(lease.identity, clock.time(),
                                     float(ha.lease_duration), force=True)
    assert record is not None  # a forced acquisition always takes the row
    store.fence(lease.identity, record.epoch)
    log.info("controller %s is active (lease epoch %d)", lease.identity, record.epoch)
    return record.epoch


def run_controller(settings: ControllerSettings, clock: Clock) -> int:
    """Serve until SIGTERM/SIGINT. Config problems raise ConfigError before anything runs.

    With ``ha`` set, first stand by until this controller holds the lease. Exits 1 if
    the lease is lost while active (the supervisor starts it again, as a standby).
    """
    rules = read_rules(settings)
    tokens = TokenBook.load(settings.token_file) if settings.token_file else None
    if tokens is None:
        log.warning("no token file: the API is open to anyone who can reach it "
                    "(set token_file / --token-file outside a test setup)")
    if settings.tls is not None:
        _check_tls(settings.tls, tokens)
    # Bound before anything starts: a port in use is a ListenError naming it, and
    # "serving" is logged only once the address is ours.
    listener = listening_socket(*parse_listen(settings.listen))
    try:
        drivers = build_drivers(settings.drivers, settings.routes, clock)
    except ValueError as err:
        listener.close()
        raise ConfigError("controller config", "routes", None, str(err)) from None
    try:
        store = open_store(settings)
    except BaseException:
        drivers.close()
        listener.close()
        raise
    previous = signal.getsignal(signal.SIGHUP)
    # uvicorn stops gracefully on SIGTERM/SIGINT and then re-raises the signal to the
    # handler that was there before it: make that a no-op, so that an orderly stop exits 0.
    stop_handlers = {sig: signal.signal(sig, _already_stopping)
                     for sig in (signal.SIGTERM, signal.SIGINT)}
    notifier = SystemdNotifier(clock)
    elector: Elector | None = None
    role: PodRoleLabel | None = None
    try:
        if settings.ha is not None:
            elector = Elector(build_lease(settings.ha, store, clock), settings.ha, clock)
            role = build_role_label(settings.ha)
            if role is not None:
                role.mark("standby")  # before serving: a stale "active" draws agents here
            outcome = _stand_by(settings, elector, notifier, listener)
            if outcome != "won":
                drivers.close()  # stopped as a standby: no controller took them over
                return 0 if outcome == "stopped" else 1
            fence_store(store, elector.lease, settings.ha, clock)
            if role is not None:
                role.mark("active")  # after the fence, before serving: the Service's pick
        return _serve_active(settings, clock, rules, tokens, store, drivers, elector,
                             notifier, listener)
    finally:
        listener.close()
        notifier.stopping()
        if elector is not None:
            elector.release()
        if role is not None:
            role.close()
        store.close()
        signal.signal(signal.SIGHUP, previous)
        for sig, handler in stop_handlers.items():
            signal.signal(sig, handler)
        log.info("controller stopped")


def _stand_by(settings: ControllerSettings, elector: Elector, notifier: SystemdNotifier,
              listener: socket.socket) -> Literal["won", "stopped", "failed"]:
    """Serve the standby's answers until the lease is ours, a signal, or the campaign fails.

    The campaign is this phase's one worker: an unexpected error in it is logged and
    stops the process (exit 1; the supervisor starts it again), never a standby that
    silently stopped campaigning. The standby serves on a copy of ``listener`` (uvicorn
    closes the sockets it served on): the address stays bound for the active.
    """
    status = StandbyStatus(elector.lease.identity)
    server = NotifyingServer(_uvicorn_config(StandbyApp(status), settings,
                                             graceful_seconds=2), notifier)
    stop = threading.Event()
    won = threading.Event()
    failed = threading.Event()

    def campaign() -> None:
        try:
            leads = elector.wait_to_lead(stop, observe=status.saw)
        except Exception:  # the campaign's supervisor: log it and stop the process
            log.exception("worker lease-standby failed: the controller stops",
                          extra={"worker": "lease-standby"})
            failed.set()
            leads = False
        if leads:
            won.set()
        server.should_exit = True

    thread = threading.Thread(target=campaign, name="lease-standby", daemon=True)
    thread.start()
    log.info("controller %s standing by on %s", elector.lease.identity, settings.listen)
    try:
        server.run(sockets=[listener.dup()])
    finally:
        stop.set()
        thread.join(timeout=float(elector.settings.retry_period) + 15)
    return "won" if won.is_set() else "failed" if failed.is_set() else "stopped"


def _serve_active(settings: ControllerSettings, clock: Clock, rules: RuleSet,
                  tokens: TokenBook | None, store: Store, drivers: Drivers,
                  elector: Elector | None, notifier: SystemdNotifier,
                  listener: socket.socket) -> int:
    """Serve as the active controller: the server here, the workers supervised (runtime.py)."""
    controller = Controller(settings, rules.rules, clock, store, drivers, watch_stalls=True,
                            rule_sources=rules.sources)
    controller.start()
    tune_garbage_collector()
    runtime = Runtime(clock)
    controller.workers = runtime.up
    controller.runs_actions_elsewhere = True
    controller.jobs.scans_elsewhere = True
    reload_wanted = threading.Event()
    lost = threading.Event()
    tls = settings.tls
    app = build_app(controller, tokens, settings.max_body_bytes,
                    certificates=tls is not None and tls.verifies_clients,
                    agent_auth=tls.agent_auth if tls is not None else "either")
    config = _uvicorn_config(app, settings, graceful_seconds=SERVER_GRACE_SECONDS,
                             http=report_lane(app.gate))
    reloader = CertificateReloader(config.ssl, tls) if tls is not None and config.ssl else None
    server = NotifyingServer(config, notifier, controller.stalls, clock)

    def sweep() -> None:
        controller.sweep()
        notifier.watchdog()

    def reload(stop: threading.Event) -> None:
        while not stop.is_set():
            if not reload_wanted.wait(0.5):
                continue
            reload_wanted.clear()
            try:
                reloaded = read_rules(settings)
                controller.reload_rules(reloaded.rules, reloaded.sources)
            except ConfigError as err:
                log.error("rules not reloaded, the old ones stay: %s", err)
            if reloader is not None:
                _reload_certificate(reloader, server.loop)

    def on_lost(reason: str) -> None:
        del reason  # logged by the elector
        lost.set()
        server.should_exit = True

    def on_hup(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        reload_wanted.set()

    def stop_serving(why: str) -> None:
        del why  # logged by the runtime
        server.should_exit = True

    # Stopped in this order: nothing new is decided, then what was decided is written,
    # then the lease goes (the writer still writes as the leader).
    runtime.add(Worker("sweep", every(float(settings.sweep_interval), sweep)))
    runtime.add(Worker("checkpoints", every(CHECKPOINT_SCAN_SECONDS,
                                            controller.jobs.scan_checkpoints)))
    runtime.add(Worker("actions", every(ACTION_TICK_SECONDS, controller.runner.tick)))
    runtime.add(Worker("reload", reload))
    runtime.add(Worker("writer", controller.writer.run))
    if settings.kubernetes.watch_jobs:
        job_watch = build_job_watch(settings, controller, clock)
        runtime.add(Worker("job-watch", job_watch.run))
        runtime.add(Worker("job-status", every(float(settings.kubernetes.status_interval),
                                               job_watch.write_statuses)))
    if elector is not None:
        keep = elector.keep_leading
        runtime.add(Worker("lease", lambda stop: keep(stop, on_lost), on_crash="stop"))
    runtime.on_failure = stop_serving
    signal.signal(signal.SIGHUP, on_hup)
    log.info("controller serving %s on %s with %d rules, store %s",
             "HTTPS" if tls is not None else "HTTP", settings.listen, len(rules.rules),
             store.path)
    runtime.start()
    try:
        server.run(sockets=[listener])
    finally:
        deadline = server.stop_deadline()
        stuck = runtime.stop(deadline)
        idle = controller.close(max(0.0, deadline - clock.monotonic()))
        if not idle:
            log.error("actions still running at the stop deadline: their records say "
                      "so, and the next start resumes them")
        if stuck or not idle:
            _exit_now(1 if runtime.failure or lost.is_set() else 0)
    if lost.is_set():
        log.error("controller stopped acting: it lost the lease (exit 1: restart as a "
                  "standby)")
        return 1
    if runtime.failure is not None:
        log.error("controller stopped: %s", runtime.failure)
        return 1
    return 0


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


def _uvicorn_config(app: Any, settings: ControllerSettings, *, graceful_seconds: int,
                    **extra: Any) -> uvicorn.Config:
    """Uvicorn's settings for the active's app or the standby's (TLS hardened)."""
    host, _, port = settings.listen.rpartition(":")
    # Agents connect directly: the peer address is theirs (it names their /metrics in
    # service discovery), so no X-Forwarded-For rewriting.
    config = uvicorn.Config(
        app, host=host.strip("[]"), port=int(port), log_level="warning", access_log=False,
        lifespan="off", timeout_graceful_shutdown=graceful_seconds, loop="uvloop",
        proxy_headers=False, **extra, **uvicorn_options(settings.tls),
    )
    if settings.tls is not None:
        config.load()  # builds config.ssl, the context every connection is made from
        assert config.ssl is not None
        harden(config.ssl)
    return config


def _reload_certificate(reloader: CertificateReloader,
                        loop: asyncio.AbstractEventLoop | None) -> None:
    """Reload on the event loop's thread (before the server runs: on this one)."""
    if loop is None:
        reloader.reload()
        return
    try:
        loop.call_soon_threadsafe(reloader.reload)
    except RuntimeError:  # the loop has closed: the server is stopping
        log.warning("TLS certificate not reloaded: the server is stopping")


def _check_tls(tls: TlsSettings, tokens: TokenBook | None) -> None:
    """ConfigError for an ``agent_auth`` that needs tokens where there are none."""
    if tokens is None and tls.agent_auth in ("token", "both"):
        raise ConfigError("controller config", "tls.agent_auth", None,
                          f"{tls.agent_auth} needs a token file (token_file / --token-file)")
    if tls.verifies_clients:
        log.info("client certificates %s (CA %s): a certificate names its node, reports "
                 "need %s", tls.client_cert_mode, tls.client_ca_file,
                 {"either": "a token or a certificate", "token": "a token",
                  "cert": "a certificate", "both": "a token and a certificate"}
                 [tls.agent_auth])
