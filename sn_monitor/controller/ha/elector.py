"""Standing by until the lease is ours, then keeping it or stopping.

The loop is kube-controller-manager's: a standby tries to take the lease every
``retry_period``; the active renews it every ``retry_period`` and, if it cannot renew for
``renew_deadline`` (the backend unreachable) or finds it taken, it has lost: it stops
acting at once (the caller exits; a supervisor restarts it as a standby). Because
``renew_deadline < lease_duration``, the old active has given up before a standby can
take an expired lease; the store's fence covers a process too paused to notice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sn_monitor.clock import Clock
from sn_monitor.controller.ha.lease import HaSettings, Lease, LeaseError
from sn_monitor.errors import SnMonitorError

log = logging.getLogger(__name__)


class LeadershipLost(SnMonitorError):
    """The lease is gone: taken by another controller, or not renewed in time."""


class Elector:
    """Runs a :class:`Lease` for one candidate. ``check`` is one step, for tests."""

    def __init__(self, lease: Lease, settings: HaSettings, clock: Clock) -> None:
        self.lease = lease
        self.settings = settings
        self.clock = clock
        self.leading = False
        self._last_renewal = 0.0

    def try_to_lead(self) -> bool:
        """One attempt to take the lease; True once this candidate leads."""
        try:
            won = self.lease.try_acquire_or_renew()
        except LeaseError as err:
            log.warning("standby %s: cannot ask the lease: %s", self.lease.identity, err)
            return False
        if won:
            self.leading = True
            self._last_renewal = self.clock.monotonic()
            log.info("controller %s took the lease: now active", self.lease.identity)
        return won

    def check(self) -> None:
        """One renewal; raises LeadershipLost when the lease is gone or past its deadline."""
        if not self.leading:
            raise LeadershipLost("not leading")
        try:
            held = self.lease.try_acquire_or_renew()
        except LeaseError as err:
            waited = self.clock.monotonic() - self._last_renewal
            if waited >= self.settings.renew_deadline:
                self.leading = False
                raise LeadershipLost(
                    f"lease not renewed for {waited:.1f}s (renew deadline "
                    f"{self.settings.renew_deadline:g}s): {err}") from err
            log.warning("controller %s: lease not renewed (%.1fs of %gs): %s",
                        self.lease.identity, waited, self.settings.renew_deadline, err)
            return
        if not held:
            self.leading = False
            raise LeadershipLost("another controller holds the lease")
        self._last_renewal = self.clock.monotonic()

    def wait_to_lead(self, stop: threading.Event,
                     observe: Callable[[str | None], None] | None = None) -> bool:
        """Block until this candidate leads (True) or ``stop`` is set (False).

        ``observe(holder)`` is told who holds the lease after each attempt that failed.
        """
        log.info("controller %s standing by for the lease (retry every %gs)",
                 self.lease.identity, self.settings.retry_period)
        while not stop.is_set():
            if self.try_to_lead():
                return True
            if observe is not None:
                observe(self._holder())
            stop.wait(self.settings.retry_period)
        return False

    def _holder(self) -> str | None:
        try:
            return self.lease.holder()
        except LeaseError:
            return None

    def keep_leading(self, stop: threading.Event, on_lost: Callable[[str], None]) -> None:
        """Renew every ``retry_period`` until ``stop``; ``on_lost(reason)`` once if lost."""
        while not stop.wait(self.settings.retry_period):
            try:
                self.check()
            except LeadershipLost as lost:
                log.error("controller %s lost the lease: %s; it stops acting",
                          self.lease.identity, lost)
                on_lost(str(lost))
                return

    def release(self) -> None:
        """Give the lease up (an orderly stop): the standby takes over at once."""
        if not self.leading:
            return
        self.leading = False
        try:
            self.lease.release()
            log.info("controller %s released the lease", self.lease.identity)
        except LeaseError as err:
            log.warning("controller %s: lease not released (%s): the standby takes over "
                        "when it expires", self.lease.identity, err)
