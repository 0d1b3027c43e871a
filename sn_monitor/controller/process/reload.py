"""SIGHUP: read the rules again (a bad file keeps the old ones) and the TLS certificate.

The signal only asks; the ``reload`` worker (supervised with the others) does the work,
off the signal handler and off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from types import FrameType

from sn_monitor.config import ConfigError
from sn_monitor.controller.process.server import NotifyingServer
from sn_monitor.controller.process.startup import read_rules
from sn_monitor.controller.security.tls import CertificateReloader
from sn_monitor.controller.service import Controller
from sn_monitor.controller.settings import ControllerSettings

log = logging.getLogger(__name__)


class Reload:
    """What a SIGHUP asks for, done by the ``reload`` worker."""

    def __init__(self, settings: ControllerSettings, controller: Controller,
                 certificate: CertificateReloader | None, server: NotifyingServer) -> None:
        self._settings = settings
        self._controller = controller
        self._certificate = certificate
        self._server = server
        self._wanted = threading.Event()

    def on_hup(self, signum: int, frame: FrameType | None) -> None:
        """The SIGHUP handler: ask the worker to reload."""
        del signum, frame
        self._wanted.set()

    def run(self, stop: threading.Event) -> None:
        """The ``reload`` worker: reload whenever asked, until ``stop``."""
        while not stop.is_set():
            if not self._wanted.wait(0.5):
                continue
            self._wanted.clear()
            try:
                reloaded = read_rules(self._settings)
                self._controller.reload_rules(reloaded.rules, reloaded.sources)
            except ConfigError as err:
                log.error("rules not reloaded, the old ones stay: %s", err)
            if self._certificate is not None:
                reload_certificate(self._certificate, self._server.loop)


def reload_certificate(reloader: CertificateReloader,
                       loop: asyncio.AbstractEventLoop | None) -> None:
    """Reload on the event loop's thread (before the server runs: on this one)."""
    if loop is None:
        reloader.reload()
        return
    try:
        loop.call_soon_threadsafe(reloader.reload)
    except RuntimeError:  # the loop has closed: the server is stopping
        log.warning("TLS certificate not reloaded: the server is stopping")
