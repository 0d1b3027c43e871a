"""The ``sn-monitor controller`` process: start, stand by or lead, serve, stop in order.

What it opens from its settings is :mod:`~.startup`'s; standing by and the lease are
:mod:`~.leadership`'s; a term as the active controller is :mod:`~.active`'s, served by
:mod:`~.server` and reloaded on SIGHUP by :mod:`~.reload`.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import TYPE_CHECKING

from sn_monitor.clock import Clock
from sn_monitor.config import ConfigError, parse_listen
from sn_monitor.controller.actions.routing import build_drivers
from sn_monitor.controller.ha.elector import Elector
from sn_monitor.controller.process.active import serve_active
from sn_monitor.controller.process.leadership import (
    build_lease,
    build_role_label,
    fence_store,
    stand_by,
)
from sn_monitor.controller.process.startup import open_store, read_rules
from sn_monitor.controller.security.auth import TokenBook
from sn_monitor.controller.security.tls import TlsSettings
from sn_monitor.controller.settings import ControllerSettings
from sn_monitor.notify import SystemdNotifier
from sn_monitor.serving import listening_socket

if TYPE_CHECKING:
    from sn_monitor.controller.ha.k8s_role import PodRoleLabel

log = logging.getLogger(__name__)


def _already_stopping(signum: int, frame: FrameType | None) -> None:
    del signum, frame


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
            outcome = stand_by(settings, elector, notifier, listener)
            if outcome != "won":
                drivers.close()  # stopped as a standby: no controller took them over
                return 0 if outcome == "stopped" else 1
            fence_store(store, elector.lease, settings.ha, clock)
            if role is not None:
                role.mark("active")  # after the fence, before serving: the Service's pick
        return serve_active(settings, clock, rules, tokens, store, drivers, elector,
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
