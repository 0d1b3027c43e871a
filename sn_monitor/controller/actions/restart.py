"""What an action a stopped controller left in flight becomes at the next start.

An action a crashed controller left ``running`` (or ``pending`` after a timed-out call)
may or may not have been done. If the driver has ``reconcile(request) -> bool | None``
(:class:`Reconciling`), it is asked: True (done) -> succeeded; False (not done) -> run
again; None (cannot tell) -> as for a driver without reconcile: run again, under the
same id, if the driver declares it idempotent (a program or a webhook gets the same
action id on every run and must take a repeat as done), else ``failed`` with
"interrupted, unknown outcome, check by hand". Never under a new key: that would
defeat the receiver's de-duplication.

Imports the store, the audit records, the drivers' vocabulary and the outcomes.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from sn_monitor.controller.actions.base import Driver, PermanentError, TemporaryError
from sn_monitor.controller.actions.outcomes import AttemptOutcomes
from sn_monitor.controller.audit import ActionRecord, ActionRequest
from sn_monitor.controller.storage.store import Store

log = logging.getLogger(__name__)


@runtime_checkable
class Reconciling(Protocol):
    """A driver that can tell whether an interrupted action was done."""

    def reconcile(self, request: ActionRequest) -> bool | None:
        """True: done; False: not done; None: cannot tell."""
        ...


def _idempotent(driver: Driver, request: ActionRequest) -> bool:
    """Whether running ``request`` again, under its id, is safe with ``driver``.

    A driver may answer per request (``idempotent_for``: a router whose targets differ)
    or once for all (``idempotent``).
    """
    per_request = getattr(driver, "idempotent_for", None)
    if callable(per_request):
        return bool(per_request(request))
    return getattr(driver, "idempotent", False) is True


def reconcile_interrupted(record: ActionRecord, driver: Driver | None, now: float,
                          store: Store, outcomes: AttemptOutcomes) -> ActionRecord:
    """The interrupted ``record`` settled (see the module docstring), as it now stands."""
    request = record.to_request()
    done: bool | None = None
    if isinstance(driver, Reconciling):
        try:
            done = driver.reconcile(request)
        except (TemporaryError, PermanentError) as err:
            log.warning("action %s: reconcile failed: %s", record.id, err)
            done = None
    if done is True:
        record = store.update_action(
            record.id, at=now, state="succeeded", next_attempt_at=None,
            outcome_message="interrupted by a controller restart; reconciled: already done")
        outcomes.count(record.action, "succeeded")
        return record
    if done is False or (driver is not None and _idempotent(driver, request)):
        why = "not done" if done is False else "outcome unknown, driver is idempotent"
        record = store.update_action(
            record.id, at=now, state="pending", next_attempt_at=now,
            outcome_message=f"interrupted by a controller restart; {why}: running again",
            outcome={})
        return record
    outcomes.fail(record, "interrupted by a controller restart, unknown outcome, "
                          "check by hand")
    return store.get_action(record.id) or record

