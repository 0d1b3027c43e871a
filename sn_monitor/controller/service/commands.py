"""The API's changes to nodes and actions: cordon or uncordon by hand, approve, the breaker.

Each is recorded: a manual action and an approval on the action itself (the runner's
record), the breaker's change by the audit trail.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any, cast

from sn_monitor.clock import Clock
from sn_monitor.controller.actions.policy import ClusterSummary
from sn_monitor.controller.actions.runner import ActionRunner, ActionStateError
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.errors import Conflict, Invalid, NotFound, Unavailable
from sn_monitor.controller.incidents.breaker import BreakerKeeper, breaker_doc
from sn_monitor.controller.ingest.decode import NodeRegistry
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.remediation.ladder import RemediationLadder
from sn_monitor.controller.service.audit_trail import STORE_RETRY_AFTER_SECONDS, AuditTrail
from sn_monitor.controller.service.queries import action_doc
from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Store, StoreError, StoreUnavailable
from sn_monitor.model import ActionName

log = logging.getLogger(__name__)


class AuditedCommands:
    """Manual actions, approvals and the breaker by hand (module docstring)."""

    def __init__(self, *, runner: ActionRunner, breaker: BreakerKeeper, audit: AuditTrail,
                 registry: NodeRegistry, jobs: JobOrchestrator,
                 remediation: RemediationLadder, store: Store, store_health: StoreHealth,
                 clock: Clock, cluster: Callable[[], ClusterSummary]) -> None:
        self._runner = runner
        self._breaker = breaker
        self._audit = audit
        self._registry = registry
        self._jobs = jobs
        self._remediation = remediation
        self._store = store
        self._store_health = store_health
        self._clock = clock
        self._cluster = cluster

    def manual_action(self, action: str, node: str, who: str, reason: str) -> dict[str, Any]:
        if action not in ("cordon", "uncordon"):
            raise Invalid(f"cannot {action} by hand")
        view = self._registry.get(node)
        request = ActionRequest(
            id=uuid.uuid4().hex, key=f"manual:{uuid.uuid4().hex}", action=cast(ActionName, action),
            node=node, reason=f"{reason} (by {who})", requested_by=who,
            labels=dict(view.labels) if view else {}, params={"status": "manual"},
            created_seconds=self._clock.time(),
        )
        record = self._store_health.attempt(self._runner.submit, request, self._cluster(), False)
        if record is None:
            raise self._audit.unavailable()
        if action == "uncordon" and self._jobs.excluding(node):
            # a person says it is repaired: a job takes it back as a spare after its check
            self._store_health.attempt(self._remediation.check, node, f"uncordoned by {who}")
        return action_doc(record)

    def approve(self, action_id: str, who: str) -> dict[str, Any]:
        if self._store.get_action(action_id) is None:
            raise NotFound(f"no action {action_id!r}")
        # The approval is recorded on the action itself ("approved by <who>; ...").
        try:
            return action_doc(self._runner.approve(action_id, who, self._cluster()))
        except ActionStateError as err:
            raise Conflict(str(err)) from None
        except StoreUnavailable as err:
            raise Unavailable(f"store unavailable, refusing to act: {err}",
                              STORE_RETRY_AFTER_SECONDS) from None
        except StoreError as err:  # approved or cancelled by someone else meanwhile
            raise Conflict(str(err)) from None

    def set_breaker(self, open_it: bool, who: str, reason: str) -> dict[str, Any]:
        """A person closes the breaker (evictions go on) or opens it (they freeze); audited."""
        what = "open-breaker" if open_it else "close-breaker"
        with self._audit.audited(what, who, f"circuit breaker {'opened' if open_it else 'closed'}: "
                                            f"{reason}", params={"reason": reason}):
            state = (self._breaker.open_by_hand(who, reason) if open_it
                     else self._breaker.close_by_hand(who, reason))
        log.warning("circuit breaker %s by %s: %s", "opened" if open_it else "closed", who,
                    reason)
        return breaker_doc(state)
