"""The controller process: the ASGI app on uvicorn, the sweep on APScheduler, SIGHUP reload."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import threading
from pathlib import Path
from types import FrameType

import uvicorn
from apscheduler.schedulers.background import BackgroundScheduler

from sn_monitor.clock import Clock
from sn_monitor.config import ConfigError
from sn_monitor.controller.app import build_app
from sn_monitor.controller.auth import TokenBook
from sn_monitor.controller.report_lane import report_lane
from sn_monitor.controller.routing import build_drivers
from sn_monitor.controller.rules.spec import load_rules
from sn_monitor.controller.service import Controller
from sn_monitor.controller.settings import ControllerSettings
from sn_monitor.controller.store import Store
from sn_monitor.controller.tls import (
    CertificateReloader,
    TlsSettings,
    harden,
    uvicorn_options,
)
from sn_monitor.notify import SystemdNotifier

log = logging.getLogger(__name__)

STOP_DEADLINE_SECONDS = 20


def rule_paths(settings: ControllerSettings) -> list[Path]:
    return [Path(p) for p in settings.rules]


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    del signum, frame


class NotifyingServer(uvicorn.Server):
    """uvicorn that tells systemd READY=1 once it accepts connections."""

    def __init__(self, config: uvicorn.Config, notifier: SystemdNotifier) -> None:
        super().__init__(config)
        self._notifier = notifier
        #: The event loop serving, once started (for work that must run on its thread).
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if not self.should_exit:
            self._notifier.ready("serving")


def tune_garbage_collector() -> None:
    """Fewer, cheaper collections for a long-lived process holding many small objects.

    Everything allocated at start-up (modules, rules, the store) is frozen out of the
    collector, and the first generation collects every 50,000 allocations instead of 700:
    the ingest path allocates a lot and frees almost all of it by reference counting.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


def run_controller(settings: ControllerSettings, clock: Clock) -> int:
    """Serve until SIGTERM/SIGINT. Config problems raise ConfigError before anything runs."""
    rules = load_rules(rule_paths(settings))
    tokens = TokenBook.load(settings.token_file) if settings.token_file else None
    if tokens is None:
        log.warning("no token file: the API is open to anyone who can reach it "
                    "(set token_file / --token-file outside a test setup)")
    if settings.tls is not None:
        _check_tls(settings.tls, tokens)
    state_dir = Path(settings.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    store = Store(state_dir / "controller.db")
    try:
        drivers = build_drivers(settings.drivers, settings.routes, clock)
    except ValueError as err:
        store.close()
        raise ConfigError("controller config", "routes", None, str(err)) from None
    controller = Controller(settings, rules, clock, store, drivers)
    controller.start()
    tune_garbage_collector()
    reload_wanted = threading.Event()
    notifier = SystemdNotifier(clock)

    server: NotifyingServer | None = None
    reloader: CertificateReloader | None = None

    def sweep() -> None:
        if reload_wanted.is_set():
            reload_wanted.clear()
            try:
                controller.reload_rules(load_rules(rule_paths(settings)))
            except ConfigError as err:
                log.error("rules not reloaded, the old ones stay: %s", err)
            if reloader is not None:
                _reload_certificate(reloader, server.loop if server is not None else None)
        try:
            controller.sweep()
        except Exception:  # the sweep must keep running; the failure is logged
            log.exception("sweep failed")
            return
        notifier.watchdog()

    def on_hup(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        reload_wanted.set()

    previous = signal.signal(signal.SIGHUP, on_hup)
    # uvicorn stops gracefully on SIGTERM/SIGINT and then re-raises the signal to the
    # handler that was there before it: make that a no-op, so that an orderly stop exits 0.
    stop_handlers = {sig: signal.signal(sig, _already_stopping)
                     for sig in (signal.SIGTERM, signal.SIGINT)}
    scheduler = BackgroundScheduler(daemon=True)
    scheduler.add_job(sweep, "interval", seconds=settings.sweep_interval, id="sweep",
                      max_instances=1, coalesce=True, misfire_grace_time=None)
    scheduler.start()
    host, _, port = settings.listen.rpartition(":")
    tls = settings.tls
    app = build_app(controller, tokens, settings.max_body_bytes,
                    certificates=tls is not None and tls.verifies_clients,
                    agent_auth=tls.agent_auth if tls is not None else "either")
    # Agents connect directly: the peer address is theirs (it names their /metrics in
    # service discovery), so no X-Forwarded-For rewriting.
    config = uvicorn.Config(
        app, host=host.strip("[]"), port=int(port), log_level="warning", access_log=False,
        lifespan="off", timeout_graceful_shutdown=STOP_DEADLINE_SECONDS // 2,
        http=report_lane(app.gate), loop="uvloop", proxy_headers=False,
        **uvicorn_options(tls),
    )
    log.info("controller serving %s on %s with %d rules, state in %s",
             "HTTPS" if tls is not None else "HTTP", settings.listen, len(rules), state_dir)
    try:
        if tls is not None:
            config.load()  # builds config.ssl, the context every connection is made from
            assert config.ssl is not None
            harden(config.ssl)
            reloader = CertificateReloader(config.ssl, tls)
        server = NotifyingServer(config, notifier)
        server.run()
    finally:
        notifier.stopping()
        scheduler.shutdown(wait=True)
        controller.close()
        store.close()
        signal.signal(signal.SIGHUP, previous)
        for sig, handler in stop_handlers.items():
            signal.signal(sig, handler)
        log.info("controller stopped")
    return 0


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
