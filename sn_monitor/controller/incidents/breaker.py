"""The circuit breaker's life around the policy that holds it.

The safety policy (:mod:`.actions.policy`) decides with the breaker; this keeps it
across restarts (a crash must not reopen evictions), pages when it opens and says when
it closes (one ``alert`` action each, keyed by when it opened), closes it once the
nodes it counted are back and healthy, and lets a person close or open it
(``POST /api/v1/breaker``, ``sn-monitor breaker``; the controller audits the call).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from sn_monitor.clock import Clock
from sn_monitor.controller.actions.policy import BreakerState, SafetyPolicy
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.storage.store import Store, StoreError

log = logging.getLogger(__name__)

BREAKER_RULE = "circuit-breaker"
_STATE_KEY = "breaker"
_OPENED_KEY = "breaker_opened_at"


def breaker_doc(state: BreakerState) -> dict[str, Any]:
    """The breaker as the API shows it."""
    return {"open": state.open, "reason": state.reason, "since": state.since,
            "until": state.until, "nodes": list(state.nodes), "by_hand": state.by_hand}


class BreakerKeeper:
    """Saves, restores, announces and closes the policy's breaker (see the module)."""

    def __init__(self, policy: SafetyPolicy, store: Store, clock: Clock,
                 submit: Callable[[ActionRequest], object]) -> None:
        self._policy = policy
        self._store = store
        self._clock = clock
        self._submit = submit
        self._was_open = False
        self._saved: BreakerState | None = None

    def state(self) -> BreakerState:
        return self._policy.breaker_state()

    def restore(self) -> None:
        """At start: the breaker as the last run left it (until its hold runs out)."""
        raw = self._store.get_meta(_STATE_KEY)
        if not raw:
            return
        try:
            doc = json.loads(raw)
            state = BreakerState(open=bool(doc["open"]), reason=str(doc["reason"]),
                                 since=doc["since"], until=doc["until"],
                                 nodes=tuple(doc.get("nodes", ())),
                                 by_hand=bool(doc.get("by_hand", False)))
        except (ValueError, KeyError, TypeError) as err:
            log.warning("ignoring a saved breaker state that cannot be read: %s", err)
            return
        self._policy.restore_breaker(state)
        restored = self._policy.breaker_state()
        self._saved = restored
        if restored.open:
            self._was_open = True
            log.warning("circuit breaker still open after the restart: %s", restored.reason)

    def opened(self, state: BreakerState) -> None:
        """A fault opened it: page a person."""
        log.critical("circuit breaker open, evictions frozen: %s", state.reason)
        self._was_open = True
        self._store.set_meta(_OPENED_KEY, str(state.since))
        self._alert(f"breaker:{state.since}:alert", "firing",
                    f"circuit breaker open, evictions frozen: {state.reason}")
        self._save(self._policy.breaker_state())

    def sweep(self, node_healthy: Callable[[str, float], bool]) -> None:
        """Close it once the nodes it counted are back; say so when it closed; save it.

        A node is back when it reports and no fault from the breaker's window on is
        firing on it (``node_healthy(node, since)``): one broken before the burst that
        stays broken is back from the burst.
        """
        state = self._policy.breaker_state()
        since = (state.since or self._clock.time()) - float(self._policy.settings.breaker.window)
        for node in state.nodes:
            if node_healthy(node, since) and self._policy.note_healthy(node):
                log.warning("circuit breaker: every node it counted is back and healthy")
        state = self._policy.breaker_state()
        if self._was_open and not state.open:
            self._closed("circuit breaker closed: evictions allowed again")
        self._save(state)

    def close_by_hand(self, who: str, reason: str) -> BreakerState:
        self._policy.reset_breaker()
        if self._was_open:
            self._closed(f"circuit breaker closed by {who}: {reason}")
        state = self._policy.breaker_state()
        self._save(state)
        return state

    def open_by_hand(self, who: str, reason: str) -> BreakerState:
        was_open = self._policy.breaker_state().open
        state = self._policy.open_by_hand(f"{reason} (by {who})")
        if not was_open:
            self.opened(state)
        else:
            log.critical("circuit breaker held open by %s: %s", who, reason)
            self._save(state)
        return state

    def _closed(self, message: str) -> None:
        log.warning("%s", message)
        self._was_open = False
        try:
            opened = self._store.get_meta(_OPENED_KEY) or "0"
        except StoreError:
            opened = "0"
        self._alert(f"breaker:{opened}:alert:resolved", "resolved", message)

    def _alert(self, key: str, status: str, reason: str) -> None:
        self._submit(ActionRequest(
            id=uuid.uuid4().hex, key=key, action="alert", node=None, reason=reason,
            rule=BREAKER_RULE, severity="critical", params={"status": status},
            created_seconds=self._clock.time()))

    def _save(self, state: BreakerState) -> None:
        """Keep the breaker across restarts: a crash must not reopen evictions."""
        if state == self._saved:
            return
        self._store.set_meta(_STATE_KEY, json.dumps(breaker_doc(state)))
        self._saved = state
