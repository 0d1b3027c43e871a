"""Every few seconds: the nodes' states into the store, and whether it takes writes again.

The sweep copies the nodes the controller cordoned from the store into memory, and
records the states that changed (one transaction: a fleet's first sweep changes
thousands). While the store refuses writes, a probe tells when it takes one again:
acting resumes, and the faults seen meanwhile are acted on if they still hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sn_monitor.clock import Clock
from sn_monitor.controller.incidents.fleet_state import FleetState
from sn_monitor.controller.ingest.decode import NodeRegistry
from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Store, StoreError

log = logging.getLogger(__name__)

NODE_REFRESH_SECONDS = 5.0


class NodeStateRefresh:
    """The nodes' states recorded, and the store's return noticed (module docstring)."""

    def __init__(self, *, fleet: FleetState, registry: NodeRegistry, store: Store,
                 store_health: StoreHealth, clock: Clock,
                 store_back: Callable[[], None]) -> None:
        """``store_back``: called when a store that refused writes takes them again."""
        self._fleet = fleet
        self._registry = registry
        self._store = store
        self._store_health = store_health
        self._clock = clock
        self._store_back = store_back
        self._last_refresh = -1e18

    def tick(self, now: float) -> None:
        """Refresh if NODE_REFRESH_SECONDS passed since the last time (``now``: monotonic)."""
        if now - self._last_refresh >= NODE_REFRESH_SECONDS:
            self._last_refresh = now
            self._refresh()

    def _refresh(self) -> None:
        cordoned = self._store_health.attempt(self._store.cordoned_by_us)
        if cordoned is None:
            return
        if not self._store_health.ok and self._store_takes_writes():
            log.warning("store writable again: acting resumes")
            self._store_health.recovered()
            self._store_back()
        changed = self._fleet.changed_states(cordoned, self._registry.views())
        if changed:  # one transaction: a fleet's first sweep changes thousands
            self._store_health.attempt(self._store.set_node_states, changed, self._clock.time())
            self._fleet.recorded(changed)

    def _store_takes_writes(self) -> bool:
        """A probe while the store refuses writes: whether it takes one again."""
        try:
            self._store.set_meta("alive", str(self._clock.time()))
        except StoreError as err:
            self._store_health.error = str(err)
            return False
        return True
