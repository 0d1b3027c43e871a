"""How an attempt ended, written to the action's record: succeeded, failed, or a retry.

A :class:`~.base.TemporaryError` (or a timeout) sends the action back to ``pending``
with ``next_attempt_at``: the driver's ``retry_after``, else ``backoff * 2**(attempt-1)``
capped at ``max_backoff``, until ``retries`` retries are spent; then it has ``failed``.
A failure counts toward the failure throttle (:mod:`.throttle`); a ``cordon``, ``evict``
or ``failover`` that succeeded marks its node as cordoned by us, an ``uncordon`` clears
the mark. Every state an action ends in is counted, for
``sn_actions_total{action,outcome}``.

Imports the store, the audit records, the drivers' vocabulary and the throttle.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Final

from sn_monitor.clock import Clock
from sn_monitor.controller.actions.base import Outcome, TemporaryError
from sn_monitor.controller.actions.throttle import FailureThrottle
from sn_monitor.controller.audit import ActionRecord, ActionState
from sn_monitor.controller.storage.store import Store

log = logging.getLogger(__name__)

#: The outcome key that says the failed attempt was a call that timed out (it may
#: still have been done: a restart reconciles it).
TIMED_OUT: Final = "timed_out"


class AttemptOutcomes:
    """Writes each attempt's end to the store, with its retry time; counts the outcomes."""

    def __init__(self, store: Store, clock: Clock, throttle: FailureThrottle, *,
                 retries: int, backoff: float, max_backoff: float) -> None:
        self.store = store
        self.clock = clock
        self.throttle = throttle
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds before the attempt after ``attempt``: the driver's say, else the backoff."""
        if retry_after is not None:
            return max(0.0, retry_after)
        base = self.backoff * 2 ** max(0, attempt - 1)
        return float(min(base, self.max_backoff))

    def retry(self, record: ActionRecord, err: TemporaryError, *,
              timed_out: bool = False) -> None:
        """The attempt failed for now: pending again after its delay (failed once spent)."""
        retries_done = record.attempts - 1
        if retries_done >= self.retries:
            self.fail(record, f"{err} (gave up after {record.attempts} attempts)",
                      timed_out=timed_out)
            return
        now = self.clock.time()
        delay = self.delay(record.attempts, err.retry_after)
        self.store.update_action(
            record.id, at=now, state="pending", next_attempt_at=now + delay,
            outcome_message=f"attempt {record.attempts} failed: {err}; retry in {delay:g}s",
            outcome={"error": str(err), TIMED_OUT: timed_out})
        log.warning("action %s %s on %s: attempt %d failed: %s", record.id, record.action,
                    record.node, record.attempts, err)

    def fail(self, record: ActionRecord, message: str, *, permanent: bool = False,
             timed_out: bool = False) -> None:
        """The action failed for good; the failure counts toward the throttle."""
        self.store.update_action(
            record.id, at=self.clock.time(), state="failed", next_attempt_at=None,
            outcome_message=message,
            outcome={"error": message, "permanent": permanent, TIMED_OUT: timed_out})
        self.count(record.action, "failed")
        self.throttle.note_failure(record.node, record.action)
        log.error("action %s %s on %s failed: %s", record.id, record.action, record.node,
                  message)

    def finish(self, record: ActionRecord, state: ActionState, outcome: Outcome, *,
               late: bool = False) -> None:
        """The driver returned ``outcome``; ``late``: from a call that had timed out."""
        message = outcome.message + (" (a timed-out attempt finished late)" if late else "")
        self.store.update_action(record.id, at=self.clock.time(), state=state,
                                 next_attempt_at=None, outcome_message=message,
                                 outcome=dict(outcome.details))
        self.count(record.action, state)
        if record.node is not None:
            now = self.clock.time()
            if record.action in {"cordon", "evict", "failover"}:
                self.store.set_cordoned_by_us(record.node, True, now)
            elif record.action == "uncordon":
                self.store.set_cordoned_by_us(record.node, False, now)

    def count(self, action: str, outcome: str) -> None:
        with self._lock:
            self._counts[(action, outcome)] += 1

    def counts(self) -> dict[tuple[str, str], int]:
        """(action, outcome) -> count since start."""
        with self._lock:
            return dict(self._counts)
