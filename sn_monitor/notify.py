"""systemd's notify protocol (``Type=notify``), written to ``NOTIFY_SOCKET`` directly.

READY=1 once serving, WATCHDOG=1 from the loop that does the work (so a hung loop gets
the service restarted), STOPPING=1 on the way out. Without NOTIFY_SOCKET (not under
systemd) every call does nothing. No extra package: it is one datagram.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from sn_monitor.clock import Clock

log = logging.getLogger(__name__)


class SystemdNotifier:
    """Sends notify datagrams; ``watchdog()`` rate-limits itself to half of WatchdogSec."""

    def __init__(self, clock: Clock, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._clock = clock
        self._address = _address(env.get("NOTIFY_SOCKET", ""))
        usec = env.get("WATCHDOG_USEC", "")
        self.watchdog_interval: float | None = (
            int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 else None)
        self._last_watchdog = -1e18
        self._lock = threading.Lock()
        self._warned = False

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, message: str) -> None:
        """One datagram; a failure is logged once and never stops the daemon."""
        if self._address is None:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self._address)
                sock.sendall(message.encode())
        except OSError as err:
            if not self._warned:
                log.warning("cannot notify systemd at %s: %s", self._address, err)
                self._warned = True

    def ready(self, status: str = "") -> None:
        self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def watchdog(self) -> None:
        """Pet the watchdog, at most twice per WatchdogSec."""
        if self._address is None or self.watchdog_interval is None:
            return
        now = self._clock.monotonic()
        with self._lock:
            if now - self._last_watchdog < self.watchdog_interval:
                return
            self._last_watchdog = now
        self.send("WATCHDOG=1")


def _address(value: str) -> str | None:
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]  # an abstract socket
    return value
