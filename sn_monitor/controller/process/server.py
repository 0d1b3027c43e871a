"""Serving HTTP: uvicorn that tells systemd when it is ready, and its settings.

The active's app and the standby's are served the same way (TLS hardened, no proxy
headers); only the active's has the reports' lane and the longer grace.
"""

from __future__ import annotations

import asyncio
import socket
from types import FrameType
from typing import Any

import uvicorn

from sn_monitor.clock import Clock
from sn_monitor.controller.api.app import ControllerApp
from sn_monitor.controller.api.report_lane import report_lane
from sn_monitor.controller.security.tls import CertificateReloader, harden, uvicorn_options
from sn_monitor.controller.settings import ControllerSettings
from sn_monitor.controller.supervision.runtime import STOP_DEADLINE_SECONDS
from sn_monitor.controller.supervision.stall import LOOP_TICK_SECONDS, StallWatch
from sn_monitor.notify import SystemdNotifier

#: uvicorn's share of the stop deadline: open connections finish their requests.
SERVER_GRACE_SECONDS = int(STOP_DEADLINE_SECONDS // 2)


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


def uvicorn_config(app: Any, settings: ControllerSettings, *, graceful_seconds: int,
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


def active_server(app: ControllerApp, settings: ControllerSettings, notifier: SystemdNotifier,
                  stalls: StallWatch | None, clock: Clock
                  ) -> tuple[NotifyingServer, CertificateReloader | None]:
    """The active's server (the reports' lane, the loop ticked) and its certificate's reloader."""
    config = uvicorn_config(app, settings, graceful_seconds=SERVER_GRACE_SECONDS,
                            http=report_lane(app.gate))
    tls = settings.tls
    reloader = CertificateReloader(config.ssl, tls) if tls is not None and config.ssl else None
    return NotifyingServer(config, notifier, stalls, clock), reloader
