"""The audit records of API calls that change jobs, the breaker, or a repaired node.

Such a call is not an action for a driver, but it is recorded like one: written before
the change, in a final state (so that the runner never picks it up), and corrected to
``refused`` when the change is then refused. A store that takes no writes refuses the
call (503), as for any action.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from sn_monitor.clock import Clock
from sn_monitor.controller.audit import ActionRecord, ActionRequest
from sn_monitor.controller.errors import Conflict, NotFound, Unavailable
from sn_monitor.controller.jobs.settings import JobError, UnknownJob, UnknownRecovery
from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Store, StoreError, StoreUnavailable
from sn_monitor.model import ActionName

log = logging.getLogger(__name__)

#: What a client is told to wait before asking again while the store takes no writes.
STORE_RETRY_AFTER_SECONDS = 5.0


class AuditTrail:
    """Records API calls, and corrects the record of one refused (module docstring)."""

    def __init__(self, store: Store, store_health: StoreHealth, clock: Clock) -> None:
        self._store = store
        self._store_health = store_health
        self._clock = clock

    def record(self, what: str, who: str, reason: str, *, node: str | None = None,
               params: dict[str, Any] | None = None) -> ActionRecord:
        """The audit record of an API call, written before the change (module docstring)."""
        now = self._clock.time()
        request = ActionRequest(
            id=uuid.uuid4().hex, key=f"api:{uuid.uuid4().hex}", action=cast(ActionName, what),
            node=node, reason=f"{reason} (by {who})", requested_by=who,
            params={**(params or {}), "status": "api"}, created_seconds=now,
        )
        recorded = self._store_health.attempt(self._store.record_action, request, "succeeded",
                                              f"API call by {who}", at=now)
        if recorded is None:
            raise self.unavailable()
        return recorded[0]

    @contextmanager
    def audited(self, what: str, who: str, reason: str, *, node: str | None = None,
                params: dict[str, Any] | None = None,
                unknown: tuple[str, str] | None = None) -> Iterator[ActionRecord]:
        """The audit record (:meth:`record`) around a job change; a refusal corrects it.

        The refusal becomes the API's answer: an unknown job or recovery 404 when
        ``unknown`` = (what the record says, the API's message) is given, any other
        :class:`JobError` 409, a store that takes no writes 503.
        """
        record = self.record(what, who, reason, node=node, params=params)
        try:
            yield record
        except JobError as err:
            if unknown is not None and isinstance(err, UnknownJob | UnknownRecovery):
                self.refused(record, unknown[0])
                raise NotFound(unknown[1]) from None
            self.refused(record, str(err))
            raise Conflict(str(err)) from None
        except StoreUnavailable as err:
            self.refused(record, str(err))
            raise Unavailable(f"store unavailable: {err}",
                              STORE_RETRY_AFTER_SECONDS) from None

    def refused(self, record: ActionRecord, why: str) -> None:
        """The change ``record`` stands for was refused: the record says so."""
        try:
            self._store.update_action(record.id, at=self._clock.time(), state="refused",
                                      outcome_message=why)
        except StoreError as err:
            log.error("audit record %s not corrected (%s): %s", record.id, why, err)

    def repair(self, what: str, who: str, reason: str, node: str,
               params: dict[str, Any]) -> None:
        """The remediation ladder's record of a node's return to service."""
        self._store_health.attempt(self.record, what, who, reason, node=node, params=params)

    def unavailable(self) -> Unavailable:
        """The refusal of a call while the store takes no writes."""
        return Unavailable(f"store unavailable, refusing to act: {self._store_health.error}",
                           STORE_RETRY_AFTER_SECONDS)
