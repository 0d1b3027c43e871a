"""Runs actions: record first, ask the policy, call the driver, retry, remember the outcome.

The life of an action (each step a durable write to the store before the next):

``submit`` records the request (``pending``; an existing idempotency key returns the
existing record and does nothing else), then asks the safety policy; ``dry_run``,
``refused`` and ``awaiting_approval`` are stored with the policy's reason (and a refusal's
typed :class:`~sn_monitor.controller.audit.Refusal`). An action with an ``owner`` (a step
of a job recovery) that the open circuit breaker refuses is ``held`` instead: one record
that says since when, which its owner later releases (to be decided again) or cancels.
``run`` sets ``next_attempt_at`` and hands the action to a worker thread, which marks it ``running``
(attempts + 1) *before* calling the driver. The driver's answer decides the rest:

- an :class:`Outcome` -> ``succeeded``;
- :class:`PermanentError` -> ``failed`` at once;
- :class:`TemporaryError` or a timeout -> back to ``pending`` with ``next_attempt_at``
  (the driver's ``retry_after``, else ``backoff * 2**(attempt-1)`` capped at
  ``max_backoff``), until ``retries`` retries are spent, then ``failed``.

Retries are not slept on: ``tick()`` (called every second by the controller, and by
tests with a manual clock) dispatches the actions whose retry time has come. So a retry
survives a restart like everything else.

Timeouts. A driver call runs in its own (daemon) thread and the worker waits ``timeout``
for it. Python cannot stop a thread, so a call that timed out may still be running (or
may still succeed): its retry waits until that call has returned, and if it returned an
outcome the action is marked succeeded instead of being run again. Drivers should set
their own network timeouts below the runner's; the runner's is the backstop.

Restart (``resume``). An action a crashed controller left ``running`` (or ``pending``
after a timed-out call) may or may not have been done. If the driver has
``reconcile(request) -> bool | None``, it is asked: True (done) -> succeeded; False
(not done) -> run again; None (cannot tell) -> as for a driver without reconcile: run
again, under the same id, if the driver declares ``idempotent = True`` (a program or a
webhook gets the same action id on every run and must take a repeat as done), else
``failed`` with "interrupted, unknown outcome, check by hand". Never under a new key:
that would defeat the receiver's de-duplication. ``pending`` actions admitted before the
crash are run; ones the policy never saw are decided now; ``awaiting_approval`` and
``held`` keep waiting. The policy's rate limit and cooldowns are seeded from the actions
that ran recently.

Failure throttle (kopf's throttlers, simplified). When a (node, action) pair has ended
``failed`` ``throttle_failures`` times within ``throttle_window``, new actions for that
pair are refused and its pending retries are held until fewer than that many failures
are left in the window: a flapping XID cannot start an eviction or reboot storm. Alerts
are not throttled (a lost "resolved" alert is worse than a retried one) and neither are
actions without a node.

The runner decides and dispatches; its parts keep the rest: :mod:`.throttle` the
failure throttle, :mod:`.calls` the driver calls and their timeout, :mod:`.outcomes`
what an attempt's end writes (with the backoff) and the outcome counts, :mod:`.restart`
what an interrupted action becomes at the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import partial
from typing import Final, Literal

from sn_monitor.clock import Clock
from sn_monitor.config import Duration, non_negative, positive, setting
from sn_monitor.controller.actions.base import Driver, Outcome, PermanentError, TemporaryError
from sn_monitor.controller.actions.calls import DriverCalls
from sn_monitor.controller.actions.outcomes import TIMED_OUT, AttemptOutcomes
from sn_monitor.controller.actions.policy import ClusterSummary, Decision, SafetyPolicy
from sn_monitor.controller.actions.restart import reconcile_interrupted
from sn_monitor.controller.actions.throttle import FailureThrottle
from sn_monitor.controller.audit import (
    DISRUPTIVE,
    TAKES_NODE_OUT,
    ActionRecord,
    ActionRequest,
    ActionState,
    Refusal,
)
from sn_monitor.controller.storage.store import Store, StoreError, StoreUnavailable
from sn_monitor.controller.supervision.runtime import STOP_DEADLINE_SECONDS
from sn_monitor.errors import SnMonitorError

log = logging.getLogger(__name__)

OutcomeName = Literal["succeeded", "failed", "dry_run", "refused", "awaiting_approval",
                      "held", "cancelled"]

def _clock_text(wall: float) -> str:
    """A wall time for a record a person reads: ``2026-12-01 19:54:03 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall))


_VERDICT_STATE: Final[dict[str, ActionState]] = {
    "dry_run": "dry_run", "refuse": "refused", "await_approval": "awaiting_approval",
}


def _below_stop_deadline(value: float) -> None:
    """A driver call must end before the controller's stop deadline does (runtime.py)."""
    positive(value)
    if value >= STOP_DEADLINE_SECONDS:
        raise ValueError(f"must be below the controller's stop deadline of "
                         f"{STOP_DEADLINE_SECONDS:g}s (systemd's TimeoutStopSec is 30s), "
                         f"got {value:g}s")


@dataclass(frozen=True)
class RunnerSettings:
    """Retries, timeouts and the failure throttle (the ``actions:`` config section)."""

    retries: int = setting(default=3, check=non_negative)
    backoff: Duration = setting(default=Duration(2.0), check=positive)
    max_backoff: Duration = setting(default=Duration(60.0), check=positive)
    #: The backstop on one driver call: below the controller's stop deadline.
    timeout: Duration = setting(default=Duration(15.0), check=_below_stop_deadline)
    workers: int = setting(default=4, check=positive)
    throttle_failures: int = setting(default=3, check=positive)
    throttle_window: Duration = setting(default=Duration(600.0), check=positive)


class ActionStateError(SnMonitorError):
    """The action is not in a state that allows this (e.g. approving a finished one)."""


class ActionRunner:
    """Carries out actions through drivers, under the safety policy, with an audit trail.

    ``drivers`` maps an action name (``cordon``) to the driver that does it.
    """

    def __init__(self, store: Store, policy: SafetyPolicy, drivers: Mapping[str, Driver],
                 clock: Clock, settings: RunnerSettings | None = None) -> None:
        self.store = store
        self.policy = policy
        self.drivers = dict(drivers)
        self.clock = clock
        self.settings = settings or RunnerSettings()
        self._pool = ThreadPoolExecutor(max_workers=self.settings.workers,
                                        thread_name_prefix="sn-action")
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._inflight: set[str] = set()  # ids queued or running in a worker
        self._taking_out: dict[str, str] = {}  # action id -> node, for in-flight cordon/evict
        self._calls = DriverCalls(self.settings.timeout)
        self._throttle = FailureThrottle(clock, self.settings.throttle_failures,
                                         self.settings.throttle_window)
        self._outcomes = AttemptOutcomes(
            store, clock, self._throttle, retries=self.settings.retries,
            backoff=self.settings.backoff, max_backoff=self.settings.max_backoff)
        self._closed = False
        #: Called (on the worker thread) after an action succeeds: lets a multi-step
        #: process (a job recovery) take its next step without waiting for the sweep.
        self.on_succeeded: Callable[[ActionRecord], None] | None = None

    # -- public -----------------------------------------------------------------------

    def submit(self, request: ActionRequest, cluster: ClusterSummary,
               rule_dry_run: bool = False) -> ActionRecord:
        """Record ``request``, ask the policy, and start it if allowed. Idempotent on key.

        Raises StoreUnavailable when the record cannot be written: then nothing is done.
        """
        now = self.clock.time()
        record, created = self.store.record_action(request, "pending", "", at=now)
        if not created:
            log.debug("action %s (key %s) already recorded as %s",
                      record.id, record.key, record.state)
            return record
        return self._decide(record, cluster, rule_dry_run, approved=False)

    def approve(self, action_id: str, who: str, cluster: ClusterSummary) -> ActionRecord:
        """A person approved an action that was awaiting approval: limits are checked again."""
        record = self.store.get_action(action_id)
        if record is None:
            raise ActionStateError(f"no action {action_id!r}")
        if record.state != "awaiting_approval":
            raise ActionStateError(
                f"action {action_id} is {record.state}, not awaiting approval")
        record = self.store.update_action(
            action_id, at=self.clock.time(), state="pending",
            expect_state="awaiting_approval", verdict_reason=f"approved by {who}")
        return self._decide(record, cluster, False, approved=True, approver=who)

    def tick(self) -> None:
        """Dispatch the retries whose time has come. Called every second."""
        now = self.clock.time()
        for record in self.store.actions_in_states(["pending"]):
            if record.next_attempt_at is None or record.next_attempt_at > now:
                continue
            with self._lock:
                if record.id in self._inflight:
                    continue
            until = self._throttle.held_until(record.node, record.action)
            if until is not None:
                wall_until = now + (until - self.clock.monotonic())
                self.store.update_action(record.id, at=now, next_attempt_at=wall_until)
                continue
            self._dispatch(record)

    def resume(self, cluster: ClusterSummary) -> list[ActionRecord]:
        """Reconcile what a previous controller left unfinished; call once at start-up.

        Returns the records it touched, in their new states.
        """
        now = self.clock.time()
        self._seed_history(now)
        touched: list[ActionRecord] = []
        for record in self.store.actions_in_states(["running", "pending"]):
            with self._lock:
                if record.id in self._inflight:
                    continue
            interrupted = record.state == "running" or record.outcome.get(TIMED_OUT) is True
            if interrupted:
                touched.append(reconcile_interrupted(
                    record, self.drivers.get(record.action), now, self.store, self._outcomes))
            elif record.next_attempt_at is None:
                # recorded, but the policy had not answered when the controller stopped
                touched.append(self._decide(record, cluster, False, approved=False))
            else:
                touched.append(record)  # admitted and waiting: tick() runs it when due
        self.tick()
        return [self.store.get_action(r.id) or r for r in touched]

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no action is queued or running in a worker; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._inflight, timeout=timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Stop taking work; wait up to ``timeout`` for the attempts under way.

        Not for abandoned driver calls (they run in daemon threads). False when some
        attempt was still running at the timeout: its record says ``running``, and the
        next start resumes it (``resume``), as after a crash.
        """
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._idle:
            idle = self._idle.wait_for(lambda: not self._inflight, timeout=timeout)
            self._inflight.clear()
            self._idle.notify_all()
        return idle

    def outcomes(self) -> dict[tuple[str, str], int]:
        """(action, outcome) -> count since start, for ``sn_actions_total{action,outcome}``."""
        return self._outcomes.counts()

    # -- deciding ---------------------------------------------------------------------

    def _decide(self, record: ActionRecord, cluster: ClusterSummary, rule_dry_run: bool,
                *, approved: bool, approver: str | None = None) -> ActionRecord:
        request = record.to_request()
        now = self.clock.time()
        until = self._throttle.held_until(record.node, record.action)
        if until is not None:
            failures = self.settings.throttle_failures
            decision = Decision(
                "refuse",
                f"throttled: {record.action} on {record.node} failed {failures} times within "
                f"{self.settings.throttle_window:g}s; held for another "
                f"{until - self.clock.monotonic():.0f}s", Refusal.THROTTLED)
        elif record.action == "uncordon" and record.node is not None:
            node = self.store.get_node(record.node)
            decision = self.policy.may_uncordon(
                record.node, node is not None and node.cordoned_by_us)
            if decision.runs:
                decision = self.policy.admit(request, cluster, rule_dry_run)
        else:
            with self._lock:
                out = cluster.unavailable | frozenset(self._taking_out.values())
            if record.action in TAKES_NODE_OUT:
                # ``cluster`` was read before this call: a cordon that finished since left
                # the in-flight set above and is in the store now (read second, so that one
                # finishing in between is in one or the other), never in neither.
                out |= self.store.cordoned_by_us()
            if record.owner is not None and record.action in TAKES_NODE_OUT:
                out -= self._taken_out_by(record.owner, record.id)
            summary = ClusterSummary(cluster.total_nodes, out)
            decision = self.policy.admit(request, summary, rule_dry_run, approved=approved)
        reason = decision.reason if approver is None else \
            f"approved by {approver}; {decision.reason}"
        if not decision.runs:
            state = _VERDICT_STATE[decision.verdict]
            if decision.refusal is Refusal.BREAKER and record.owner is not None:
                if record.state == "held":
                    return record  # still held: the record already says since when
                state = "held"
                reason = f"held since {_clock_text(now)}: {reason}"
            record = self.store.update_action(record.id, at=now, state=state,
                                              verdict_reason=reason, refusal=decision.refusal)
            self._outcomes.count(record.action, state)
            log.info("action %s %s on %s: %s", record.id, record.action, record.node, reason)
            return record
        record = self.store.update_action(record.id, at=now, state="pending",
                                          verdict_reason=reason, next_attempt_at=now,
                                          refusal=None)
        self._dispatch(record)
        return record

    def _taken_out_by(self, owner: str, action_id: str) -> frozenset[str]:
        """The nodes ``owner``'s other actions took (or are taking) out of service."""
        return frozenset(
            r.node for r in self.store.list_actions(owner=owner, limit=10_000)
            if r.node is not None and r.id != action_id and r.action in TAKES_NODE_OUT
            and r.state in ("succeeded", "running", "pending"))

    def release(self, action_id: str, cluster: ClusterSummary) -> ActionRecord:
        """Decide a ``held`` action again (its owner still wants it); it may stay held."""
        record = self.store.get_action(action_id)
        if record is None:
            raise ActionStateError(f"no action {action_id!r}")
        if record.state != "held":
            return record
        return self._decide(record, cluster, False, approved=False)

    def cancel(self, action_id: str, why: str) -> ActionRecord:
        """Cancel an action that has not run yet (held, pending, awaiting approval).

        One that is running or finished is left as it is (and returned): it may have
        been done already.
        """
        record = self.store.get_action(action_id)
        if record is None:
            raise ActionStateError(f"no action {action_id!r}")
        with self._lock:
            busy = action_id in self._inflight
        if busy or record.state not in ("held", "pending", "awaiting_approval"):
            return record
        try:
            record = self.store.update_action(
                action_id, at=self.clock.time(), state="cancelled", expect_state=record.state,
                next_attempt_at=None, outcome_message=f"cancelled: {why}")
        except StoreError as err:  # moved on meanwhile (a worker took it): it stands
            log.info("action %s not cancelled: %s", action_id, err)
            return self.store.get_action(action_id) or record
        self._outcomes.count(record.action, "cancelled")
        log.info("action %s %s on %s cancelled: %s", record.id, record.action, record.node,
                 why)
        return record

    # -- running ----------------------------------------------------------------------

    def _dispatch(self, record: ActionRecord) -> None:
        with self._lock:
            if self._closed or record.id in self._inflight:
                return
            self._inflight.add(record.id)
            if record.action in {"cordon", "evict", "failover"} and record.node is not None:
                self._taking_out[record.id] = record.node
        try:
            attempt = self._pool.submit(self._attempt, record.id)
        except RuntimeError:  # the pool is shutting down: the action stays pending
            self._done(record.id)
            return
        attempt.add_done_callback(partial(self._attempted, record.id))

    def _attempted(self, action_id: str, attempt: Future[None]) -> None:
        """An attempt ended: cancelled by close() (never ran), or broken by a bug (logged)."""
        if attempt.cancelled():
            self._done(action_id)
        elif attempt.exception() is not None:
            log.error("action %s: the attempt failed unexpectedly; it stays as last "
                      "recorded and is tried again", action_id, exc_info=attempt.exception())

    def _done(self, action_id: str) -> None:
        with self._idle:
            self._inflight.discard(action_id)
            self._taking_out.pop(action_id, None)
            self._idle.notify_all()

    def _attempt(self, action_id: str) -> None:
        """One attempt, in a worker thread. Every exit path leaves a durable record."""
        try:
            self._attempt_once(action_id)
        except StoreUnavailable as err:
            # Could not record: the action stays as last written and tick()/resume()
            # picks it up again once the store is back. Never act without a record.
            log.error("action %s: store unavailable, attempt abandoned: %s", action_id, err)
        except StoreError as err:
            # Someone else moved the action on (compare-and-set lost): theirs stands.
            log.warning("action %s: not attempted: %s", action_id, err)
        finally:
            self._done(action_id)

    def _attempt_once(self, action_id: str) -> None:
        record = self.store.get_action(action_id)
        if record is None or record.state != "pending":
            return
        request = record.to_request()
        if self._settled_by_abandoned_call(record):
            return
        driver = self.drivers.get(record.action)
        if driver is None:
            self._outcomes.fail(record, f"no driver for action {record.action}",
                                permanent=True)
            return
        attempt = record.attempts + 1
        record = self.store.update_action(
            action_id, at=self.clock.time(), state="running", expect_state="pending",
            attempts=attempt, next_attempt_at=None)
        try:
            outcome = self._calls.run(driver, request, action_id)
        except FutureTimeout:
            self._outcomes.retry(record, TemporaryError(
                f"{driver.name} timed out after {self.settings.timeout:g}s"), timed_out=True)
        except TemporaryError as err:
            self._outcomes.retry(record, err)
        except PermanentError as err:
            self._outcomes.fail(record, str(err), permanent=True)
        except Exception as err:
            # A driver bug (KeyError, ...): retrying the same code cannot help.
            log.exception("driver %s raised an unexpected error", driver.name)
            self._outcomes.fail(record, f"driver error: {type(err).__name__}: {err}",
                                permanent=True)
        else:
            self._succeeded(record, outcome)

    def _settled_by_abandoned_call(self, record: ActionRecord) -> bool:
        """Whether the action's earlier, timed-out call settles this attempt.

        Still running: the attempt waits for it (the driver is never called twice at
        once). Returned an outcome: the action succeeded. Raised: the attempt goes on.
        """
        earlier = self._calls.abandoned(record.id)
        if earlier is None:
            return False
        if not earlier.done():
            # the timed-out call may still do it: do not call the driver twice at once
            delay = self._outcomes.delay(record.attempts, None)
            self.store.update_action(
                record.id, at=self.clock.time(), next_attempt_at=self.clock.time() + delay,
                outcome_message="previous attempt still running; waiting for it")
            return True
        self._calls.forget(record.id)
        if earlier.exception() is None:
            self._succeeded(record, earlier.result(), late=True)
            return True
        return False

    def _succeeded(self, record: ActionRecord, outcome: Outcome, *, late: bool = False) -> None:
        """The driver did it; the after-action hook runs (its failure is logged)."""
        self._outcomes.finish(record, "succeeded", outcome, late=late)
        if self.on_succeeded is not None:
            try:
                self.on_succeeded(record)
            except Exception:  # the hook's failure must not undo a finished action; logged
                log.exception("after-action hook failed for %s", record.id)

    # -- throttle and restart -----------------------------------------------------------

    def _seed_history(self, now: float) -> None:
        """Rebuild the policy's budget and the failure throttle from the audit trail."""
        horizon = max(self.policy.settings.rate_limit.window,
                      self.policy.settings.node_cooldown, self.settings.throttle_window)
        recent = self.store.list_actions(since=now - horizon, limit=100_000)
        ran = [(record.to_request(), record.created_at) for record in recent
               if record.action in DISRUPTIVE and record.attempts > 0]
        self._throttle.seed(recent, now)
        self.policy.remember(ran)
