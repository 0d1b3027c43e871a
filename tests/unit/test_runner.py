"""The action runner: record first, retries, timeouts, approval, restart, failure throttle.

Drivers here are hand-written fakes at our own boundary (they record what they were
asked and what the store said at that moment); the store is a real SQLite file.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.config import Duration
from sn_monitor.controller.actions.base import Outcome, PermanentError, TemporaryError
from sn_monitor.controller.actions.policy import (
    ClusterSummary,
    PolicySettings,
    RateLimitSettings,
    SafetyPolicy,
)
from sn_monitor.controller.actions.runner import ActionRunner, ActionStateError, RunnerSettings
from sn_monitor.controller.audit import ActionRequest, Refusal
from sn_monitor.controller.storage.store import Store, StoreUnavailable

CLUSTER = ClusterSummary(total_nodes=100)
_ids = count()


class Gate:
    """A driver step that blocks until the test opens it."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.finished = threading.Event()


Step = Outcome | Exception | Gate


class FakeDriver:
    """Plays a script of outcomes and errors; records every call and the record's state."""

    def __init__(self, name: str, store: Store, *script: Step, idempotent: bool = False):
        self.name = name
        self.store = store
        self.script = list(script)
        self.calls: list[ActionRequest] = []
        self.seen_states: list[str] = []
        self.idempotent = idempotent

    def run(self, request: ActionRequest) -> Outcome:
        self.calls.append(request)
        record = self.store.get_action(request.id)
        self.seen_states.append(record.state if record else "missing")
        step = self.script.pop(0) if self.script else Outcome(f"{self.name} done")
        if isinstance(step, Gate):
            try:
                step.opened.wait(10)
                return Outcome(f"{self.name} done late")
            finally:
                step.finished.set()
        if isinstance(step, Exception):
            raise step
        return step


class ReconcilingDriver(FakeDriver):
    """A driver that can look at the outside system after a restart: ``answers`` by node."""

    def __init__(self, name: str, store: Store, answers: dict[str, bool | None],
                 **kw) -> None:
        super().__init__(name, store, **kw)
        self.answers = answers
        self.reconciled: list[str] = []

    def reconcile(self, request: ActionRequest) -> bool | None:
        self.reconciled.append(request.node or "")
        return self.answers.get(request.node or "")


def req(action: str = "cordon", node: str | None = "node-1", key: str | None = None,
        **kw) -> ActionRequest:
    n = next(_ids)
    return ActionRequest(id=f"act-{n}", key=key or f"key-{n}", action=action,  # type: ignore[arg-type]
                         node=node, reason="test", **kw)


class World:
    """A store, a clock and a way to build runners on them (a restart is a second runner)."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "controller.db"
        self.clock = ManualClock()
        self.store = Store(self.path)
        self.runners: list[ActionRunner] = []

    def runner(self, *drivers: FakeDriver, policy: PolicySettings | None = None,
               **settings) -> ActionRunner:
        defaults = {"retries": 3, "backoff": Duration(2), "max_backoff": Duration(60),
                    "timeout": Duration(5)}
        policy = policy or PolicySettings(max_unavailable="50%", node_cooldown=Duration(0),
                                          rate_limit=RateLimitSettings(actions=1000))
        runner = ActionRunner(self.store, SafetyPolicy(policy, self.clock),
                              {d.name: d for d in drivers}, self.clock,
                              RunnerSettings(**(defaults | settings)))
        self.runners.append(runner)
        return runner

    def driver(self, name: str = "cordon", *script: Step, **kw) -> FakeDriver:
        return FakeDriver(name, self.store, *script, **kw)

    def close(self) -> None:
        for runner in self.runners:
            runner.close()
        self.store.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


def settle(runner: ActionRunner) -> None:
    assert runner.wait_idle(10), "the runner did not finish its work"


def test_record_is_written_before_the_driver_runs(world: World) -> None:
    driver = world.driver()
    runner = world.runner(driver)
    submitted = runner.submit(req(), CLUSTER)
    settle(runner)
    assert driver.seen_states == ["running"]  # the driver saw its own record, running
    record = world.store.get_action(submitted.id)
    assert record is not None
    assert (record.state, record.attempts, record.outcome_message) == (
        "succeeded", 1, "cordon done")
    assert record.verdict_reason == "within policy limits"
    node = world.store.get_node("node-1")
    assert node is not None
    assert node.cordoned_by_us
    assert runner.outcomes() == {("cordon", "succeeded"): 1}


def test_temporary_errors_retry_with_backoff_then_succeed(world: World) -> None:
    driver = world.driver("cordon", TemporaryError("503"), TemporaryError("503"),
                          Outcome("cordoned", {"api": "ok"}))
    runner = world.runner(driver)
    action_id = runner.submit(req(), CLUSTER).id
    settle(runner)
    start = world.clock.time()
    record = world.store.get_action(action_id)
    assert record is not None
    assert (record.state, record.attempts, record.next_attempt_at) == ("pending", 1, start + 2)
    assert record.outcome_message == "attempt 1 failed: 503; retry in 2s"
    runner.tick()  # not due yet
    settle(runner)
    assert len(driver.calls) == 1
    world.clock.advance(2)
    runner.tick()
    settle(runner)
    record = world.store.get_action(action_id)
    assert record is not None
    assert len(driver.calls) == 2
    assert record.next_attempt_at == world.clock.time() + 4  # 2 s doubled
    world.clock.advance(3)
    runner.tick()
    settle(runner)
    assert len(driver.calls) == 2
    world.clock.advance(1)
    runner.tick()
    settle(runner)
    record = world.store.get_action(action_id)
    assert record is not None
    assert (record.state, record.attempts, record.outcome) == ("succeeded", 3, {"api": "ok"})
    assert driver.seen_states == ["running"] * 3


def test_retry_after_from_the_driver_and_giving_up(world: World) -> None:
    driver = world.driver("cordon", TemporaryError("busy", retry_after=30),
                          TemporaryError("busy"))
    runner = world.runner(driver, retries=1)
    action_id = runner.submit(req(), CLUSTER).id
    settle(runner)
    record = world.store.get_action(action_id)
    assert record is not None
    assert record.next_attempt_at == world.clock.time() + 30
    world.clock.advance(30)
    runner.tick()
    settle(runner)
    record = world.store.get_action(action_id)
    assert record is not None
    assert (record.state, record.attempts) == ("failed", 2)
    assert record.outcome_message == "busy (gave up after 2 attempts)"
    assert runner.outcomes() == {("cordon", "failed"): 1}


def test_permanent_error_fails_at_once(world: World) -> None:
    driver = world.driver("cordon", PermanentError("no such node"))
    runner = world.runner(driver)
    action_id = runner.submit(req(), CLUSTER).id
    settle(runner)
    world.clock.advance(3600)
    runner.tick()
    settle(runner)
    record = world.store.get_action(action_id)
    assert record is not None
    assert (record.state, record.attempts, record.next_attempt_at) == ("failed", 1, None)
    assert record.outcome == {"error": "no such node", "permanent": True, "timed_out": False}
    assert len(driver.calls) == 1


def test_driver_bug_fails_without_retry(world: World) -> None:
    driver = world.driver("cordon", KeyError("oops"))
    runner = world.runner(driver)
    action_id = runner.submit(req(), CLUSTER).id
    settle(runner)
    record = world.store.get_action(action_id)
    assert record is not None
    assert record.state == "failed"
    assert record.outcome_message == "driver error: KeyError: 'oops'"


def test_missing_driver_fails(world: World) -> None:
    runner = world.runner()
    record = runner.submit(req("evict"), CLUSTER)
    settle(runner)
    stored = world.store.get_action(record.id)
    assert stored is not None
    assert stored.state == "failed"
    assert stored.outcome_message == "no driver for action evict"


def test_timeout_is_temporary_and_never_runs_twice_at_once(world: World) -> None:
    gate = Gate()
    driver = world.driver("cordon", gate)
    runner = world.runner(driver, timeout=Duration(0.05))
    action_id = runner.submit(req(), CLUSTER).id
    settle(runner)
    record = world.store.get_action(action_id)
    assert record is not None
    assert record.state == "pending"
    assert record.outcome_message == "attempt 1 failed: cordon timed out after 0.05s; retry in 2s"
    assert record.outcome["timed_out"] is True
    world.clock.advance(2)
    runner.tick()
    settle(runner)  # the timed-out call is still running: no second call
    assert len(driver.calls) == 1
    record = world.store.get_action(action_id)
    assert record is not None
    assert record.outcome_message == "previous attempt still running; waiting for it"
    gate.opened.set()
    assert gate.finished.wait(10)
    world.clock.advance(60)
    runner.tick()
    settle(runner)
    record = world.store.get_action(action_id)
    assert record is not None
    assert record.state == "succeeded"
    assert record.outcome_message == "cordon done late (a timed-out attempt finished late)"
    assert len(driver.calls) == 1


def test_submit_is_idempotent_on_key(world: World) -> None:
    driver = world.driver()
    runner = world.runner(driver)
    first = runner.submit(req(key="fatal-xid/node-1/1"), CLUSTER)
    settle(runner)
    second = runner.submit(req(key="fatal-xid/node-1/1"), CLUSTER)
    settle(runner)
    assert second.id == first.id
    assert second.state == "succeeded"
    assert len(driver.calls) == 1
    assert len(world.store.list_actions()) == 1


def test_dry_run_and_refusals_are_recorded_not_run(world: World) -> None:
    driver = world.driver()
    runner = world.runner(driver, policy=PolicySettings(dry_run=True))
    record = runner.submit(req(rule="fatal-xid"), CLUSTER)
    assert (record.state, record.verdict_reason) == ("dry_run", "global dry run: would have run")
    tight = world.runner(driver, policy=PolicySettings(max_unavailable=1))
    record = tight.submit(req(node="node-2"), ClusterSummary(10, frozenset({"node-9"})))
    assert record.state == "refused"
    assert record.verdict_reason.startswith("max_unavailable")
    settle(runner)
    settle(tight)
    assert driver.calls == []
    assert runner.outcomes() == {("cordon", "dry_run"): 1}
    assert tight.outcomes() == {("cordon", "refused"): 1}


def test_in_flight_actions_count_against_max_unavailable(world: World) -> None:
    gate = Gate()
    driver = world.driver("cordon", gate)
    runner = world.runner(driver, policy=PolicySettings(max_unavailable=1))
    runner.submit(req(node="node-1"), ClusterSummary(10))
    second = runner.submit(req(node="node-2"), ClusterSummary(10))
    assert second.state == "refused"
    gate.opened.set()
    settle(runner)


def test_approval_path(world: World) -> None:
    driver = world.driver("evict")
    # two may be out: node-1's eviction (below) is one, in the store whatever the summary says
    runner = world.runner(driver, policy=PolicySettings(approval=["evict"],
                                                        max_unavailable=2))
    waiting = runner.submit(req("evict"), ClusterSummary(10))
    assert waiting.state == "awaiting_approval"
    settle(runner)
    assert driver.calls == []
    approved = runner.approve(waiting.id, "alice", ClusterSummary(10))
    settle(runner)
    record = world.store.get_action(approved.id)
    assert record is not None
    assert record.state == "succeeded"
    assert record.verdict_reason == "approved by alice; within policy limits"
    with pytest.raises(ActionStateError, match="not awaiting approval"):
        runner.approve(waiting.id, "bob", ClusterSummary(10))
    # limits are checked again at approval time
    later = runner.submit(req("evict", node="node-2"), ClusterSummary(10))
    refused = runner.approve(later.id, "alice", ClusterSummary(10, frozenset({"node-7"})))
    assert refused.state == "refused"
    assert refused.verdict_reason.startswith("approved by alice; max_unavailable")
    assert len(driver.calls) == 1
    assert runner.outcomes() == {("evict", "awaiting_approval"): 2,
                                 ("evict", "succeeded"): 1, ("evict", "refused"): 1}


def crashed(world: World, request: ActionRequest, state: str, **columns) -> str:
    """Leave an action as a killed controller would have: recorded, maybe half done."""
    world.store.record_action(request, "pending", "", at=world.clock.time())
    world.store.update_action(request.id, at=world.clock.time(), state=state, **columns)
    return request.id


def test_resume_after_a_crash(world: World) -> None:
    now = world.clock.time()
    done = crashed(world, req(node="n1"), "succeeded", attempts=1)
    unknown = crashed(world, req(node="n2"), "running", attempts=1,
                      verdict_reason="within policy limits")
    retry = crashed(world, req(node="n3"), "pending", attempts=1, next_attempt_at=now + 5)
    admitted = crashed(world, req(node="n4"), "pending", next_attempt_at=now)
    undecided = crashed(world, req(node="n5"), "pending")
    idem_running = crashed(world, req("throttle", node="n6"), "running", attempts=1)
    not_done = crashed(world, req("evict", node="n7"), "running", attempts=1)
    already = crashed(world, req("evict", node="n8"), "running", attempts=2)
    cannot_tell = crashed(world, req("evict", node="n9"), "running", attempts=1)

    cordon = world.driver("cordon")
    throttle = world.driver("throttle", idempotent=True)
    # n7's evict had not happened, n8's had, n9's cannot be told (and evict is not idempotent)
    evict = ReconcilingDriver("evict", world.store, {"n7": False, "n8": True, "n9": None})
    runner = world.runner(cordon, throttle, evict)
    runner.resume(CLUSTER)
    settle(runner)

    def state(action_id: str) -> str:
        record = world.store.get_action(action_id)
        assert record is not None
        return record.state

    assert state(done) == "succeeded"
    assert state(unknown) == "failed"  # cordon driver: no reconcile, not idempotent
    record = world.store.get_action(unknown)
    assert record is not None
    assert record.outcome_message == \
        "interrupted by a controller restart, unknown outcome, check by hand"
    assert state(retry) == "pending"  # its retry is not due yet
    assert state(admitted) == "succeeded"
    assert state(undecided) == "succeeded"
    assert state(idem_running) == "succeeded"  # idempotent: run again
    assert state(not_done) == "succeeded"  # reconcile said not done: run again
    assert state(already) == "succeeded"  # reconcile said done: not run again
    assert state(cannot_tell) == "failed"
    assert sorted(evict.reconciled) == ["n7", "n8", "n9"]
    assert sorted(r.node or "" for r in cordon.calls) == ["n4", "n5"]
    assert [r.node for r in throttle.calls] == ["n6"]
    assert [r.node for r in evict.calls] == ["n7"]

    world.clock.advance(5)
    runner.tick()
    settle(runner)
    assert state(retry) == "succeeded"
    # a second restart does nothing twice
    again = world.runner(cordon, throttle, evict)
    again.resume(CLUSTER)
    settle(again)
    again.submit(req(node="n1", key=world.store.get_action(done).key), CLUSTER)  # type: ignore[union-attr]
    settle(again)
    assert sorted(r.node or "" for r in cordon.calls) == ["n3", "n4", "n5"]
    assert len(throttle.calls) == 1
    assert len(evict.calls) == 1


def test_restart_keeps_the_policy_budget(world: World) -> None:
    driver = world.driver()
    policy = PolicySettings(node_cooldown=Duration(1800), max_unavailable="50%")
    first = world.runner(driver, policy=policy)
    first.submit(req(node="n1"), CLUSTER)
    settle(first)
    first.close()
    world.clock.advance(60)
    second = world.runner(driver, policy=policy)
    second.resume(CLUSTER)
    record = second.submit(req(node="n1"), CLUSTER)
    assert record.state == "refused"
    assert record.verdict_reason.startswith("cooldown")


def test_repeated_failures_are_throttled(world: World) -> None:
    driver = world.driver("cordon", *[PermanentError("node unreachable")] * 10)
    alerts = world.driver("alert", *[PermanentError("alertmanager down")] * 10)
    runner = world.runner(driver, alerts, retries=0, throttle_failures=2,
                          throttle_window=Duration(600))
    for _ in range(2):
        runner.submit(req(node="n1"), CLUSTER)
        settle(runner)
    held = runner.submit(req(node="n1"), CLUSTER)
    assert held.state == "refused"
    assert held.verdict_reason.startswith("throttled: cordon on n1 failed 2 times within 600s")
    assert len(driver.calls) == 2
    assert runner.submit(req(node="n2"), CLUSTER).state != "refused"  # other nodes go on
    settle(runner)
    for _ in range(3):  # alerts are never held back
        assert runner.submit(req("alert", node="n1"), CLUSTER).state != "refused"
        settle(runner)
    world.clock.advance(600)
    assert runner.submit(req(node="n1"), CLUSTER).state != "refused"
    settle(runner)
    assert len(driver.calls) == 4


def test_throttle_holds_pending_retries(world: World) -> None:
    driver = world.driver("cordon", PermanentError("x"), TemporaryError("busy"),
                          PermanentError("y"))
    runner = world.runner(driver, throttle_failures=2, throttle_window=Duration(600))
    runner.submit(req(node="n1"), CLUSTER)
    settle(runner)
    retrying = runner.submit(req(node="n1"), CLUSTER)  # fails temporarily: retry in 2 s
    settle(runner)
    runner.submit(req(node="n1", key="k-third"), CLUSTER)  # gets the "y" permanent error
    settle(runner)
    # two failures now: the pending retry is held until the window passes
    world.clock.advance(2)
    runner.tick()
    settle(runner)
    record = world.store.get_action(retrying.id)
    assert record is not None
    assert record.state == "pending"
    assert record.next_attempt_at == pytest.approx(world.clock.time() + 598)
    assert len(driver.calls) == 3
    world.clock.advance(598)
    runner.tick()
    settle(runner)
    record = world.store.get_action(retrying.id)
    assert record is not None
    assert record.state == "succeeded"


def test_uncordon_only_what_we_cordoned(world: World) -> None:
    cordon, uncordon = world.driver("cordon"), world.driver("uncordon")
    runner = world.runner(cordon, uncordon)
    refused = runner.submit(req("uncordon", node="n1"), CLUSTER)
    assert refused.state == "refused"
    assert "did not cordon n1" in refused.verdict_reason
    runner.submit(req("cordon", node="n1"), CLUSTER)
    settle(runner)
    runner.submit(req("uncordon", node="n1"), CLUSTER)
    settle(runner)
    assert len(uncordon.calls) == 1
    node = world.store.get_node("n1")
    assert node is not None
    assert not node.cordoned_by_us


def test_no_record_no_action(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    Store(path).close()
    store = Store(f"file:{path}?mode=ro")
    driver = FakeDriver("cordon", store)
    clock = ManualClock()
    runner = ActionRunner(store, SafetyPolicy(PolicySettings(), clock), {"cordon": driver},
                          clock)
    try:
        with pytest.raises(StoreUnavailable):
            runner.submit(req(), CLUSTER)
        assert runner.wait_idle(1)
        assert driver.calls == []
    finally:
        runner.close()
        store.close()


# --------------------------------------------------------------------------- owned actions


def _trip(runner: ActionRunner) -> None:
    for i in range(4):
        runner.policy.note_fault(f"lost-{i}", 10)
    assert runner.policy.breaker_state().open


def test_an_owned_action_refused_by_the_breaker_is_held_in_one_record(world: World) -> None:
    evict = world.driver("evict")
    runner = world.runner(evict, policy=PolicySettings(
        max_unavailable="100%", node_cooldown=Duration(0)))
    _trip(runner)
    plain = runner.submit(req("evict", node="n1"), CLUSTER)
    assert (plain.state, plain.refusal) == ("refused", Refusal.BREAKER)
    held = runner.submit(req("evict", node="n2", owner="recovery-1"), CLUSTER)
    assert (held.state, held.refusal) == ("held", Refusal.BREAKER)
    assert held.verdict_reason.startswith("held since ")
    for _ in range(5):  # asked again while the breaker is open: the same record, untouched
        world.clock.advance(15)
        again = runner.release(held.id, CLUSTER)
        assert again == world.store.get_action(held.id)
        assert again.updated_at == held.updated_at
    runner.policy.reset_breaker()
    released = runner.release(held.id, CLUSTER)
    settle(runner)
    assert released.refusal is None
    assert world.store.get_action(held.id).state == "succeeded"
    assert [c.id for c in evict.calls] == [held.id]
    assert runner.outcomes()[("evict", "held")] == 1


def test_a_held_or_pending_action_can_be_cancelled_a_finished_one_not(world: World) -> None:
    evict = world.driver("evict")
    runner = world.runner(evict)
    _trip(runner)
    held = runner.submit(req("evict", node="n2", owner="recovery-1"), CLUSTER)
    cancelled = runner.cancel(held.id, "n2 is back and healthy")
    assert cancelled.state == "cancelled"
    assert cancelled.outcome_message == "cancelled: n2 is back and healthy"
    assert runner.release(held.id, CLUSTER).state == "cancelled"
    runner.policy.reset_breaker()
    done = runner.submit(req("evict", node="n3"), CLUSTER)
    settle(runner)
    assert runner.cancel(done.id, "too late").state == "succeeded"
    assert [c.node for c in evict.calls] == ["n3"]


def test_a_recovery_s_own_evictions_do_not_count_against_its_next(world: World) -> None:
    evict = world.driver("evict")
    runner = world.runner(evict, policy=PolicySettings(
        max_unavailable=1, node_cooldown=Duration(0),
        rate_limit=RateLimitSettings(actions=1000)))
    first = runner.submit(req("evict", node="n1", owner="recovery-1"), CLUSTER)
    settle(runner)
    out = ClusterSummary(total_nodes=100, unavailable=frozenset({"n1"}))
    other = runner.submit(req("evict", node="n2"), out)
    assert (other.state, other.refusal) == ("refused", Refusal.MAX_UNAVAILABLE)
    second = runner.submit(req("evict", node="n3", owner="recovery-1"), out)
    settle(runner)
    assert world.store.get_action(first.id).state == "succeeded"
    assert world.store.get_action(second.id).state == "succeeded"


def test_an_interrupted_idempotent_action_runs_again_under_the_same_id(world: World) -> None:
    command = world.driver("evict", idempotent=True)
    first = world.runner(command)
    record = world.store.record_action(req("evict", node="n4"), "pending", at=0.0)[0]
    world.store.update_action(record.id, at=1.0, state="running", attempts=1)
    first.close()
    second = world.runner(command)
    [resumed] = second.resume(CLUSTER)
    settle(second)
    assert world.store.get_action(record.id).state == "succeeded"
    assert [c.id for c in command.calls] == [record.id]
    assert len(world.store.list_actions(action="evict")) == 1
    assert resumed.id == record.id


def test_a_take_out_that_finished_after_the_summary_was_read_still_counts(
        world: World) -> None:
    """The caller's summary is read before submit; the cordon it missed finished since."""
    driver = world.driver("cordon")
    runner = world.runner(driver, policy=PolicySettings(max_unavailable=1,
                                                        node_cooldown=Duration(0)))
    stale = ClusterSummary(10)  # read while nothing was out
    first = runner.submit(req("cordon", node="node-1"), stale)
    settle(runner)  # done: off the in-flight list, in the store
    assert world.store.get_action(first.id).state == "succeeded"
    second = runner.submit(req("cordon", node="node-2"), stale)
    assert second.state == "refused"
    assert second.verdict_reason.startswith("max_unavailable: 1 of 10 nodes already out")
