"""The lease kept in the shared PostgreSQL store (bare metal: no Kubernetes)."""

from __future__ import annotations

from sn_monitor.clock import Clock
from sn_monitor.controller.ha.lease import HaSettings, LeaseError
from sn_monitor.controller.storage.database.base import StoreError
from sn_monitor.controller.storage.store import LeaseRecord, Store


class StoreLease:
    """The ``controller_lease`` row: taken when expired, renewed by its holder.

    The row is also the fence (see :mod:`sn_monitor.controller.storage.store`): the epoch this
    candidate was granted is the one its writes are checked against.
    """

    def __init__(self, store: Store, settings: HaSettings, clock: Clock) -> None:
        self.identity = settings.identity
        self._store = store
        self._duration = float(settings.lease_duration)
        self._clock = clock
        self.granted: LeaseRecord | None = None

    def try_acquire_or_renew(self) -> bool:
        try:
            self.granted = self._store.acquire_lease(self.identity, self._clock.time(),
                                                     self._duration)
        except StoreError as err:
            raise LeaseError(str(err)) from err
        return self.granted is not None

    def release(self) -> None:
        try:
            self._store.release_lease(self.identity, self._clock.time())
        except StoreError as err:
            raise LeaseError(str(err)) from err

    def holder(self) -> str | None:
        """Who holds the lease now (None when nobody or the store cannot be read)."""
        try:
            record = self._store.lease()
        except StoreError:
            return None
        if record is None or record.expires_at <= self._clock.time():
            return None
        return record.holder
