"""The agent command queue and driver: take, complete, redelivery, expiry, results."""

from __future__ import annotations

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.actions.base import PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.agent import (
    AgentCommandDriver,
    AgentCommandQueue,
    AgentQueueSettings,
)
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.model import Command, CommandResult


def act(action: str = "throttle", id: str = "a-1", node: str | None = "n1",
        gpu: int | None = 3, **params: object) -> ActionRequest:
    return ActionRequest(id=id, key=id, action=action, node=node,  # type: ignore[arg-type]
                         reason="GPU 3 at 91 C", gpu=gpu, params=params)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def seen() -> list[tuple[str, CommandResult]]:
    return []


@pytest.fixture
def queue(clock: ManualClock, seen: list[tuple[str, CommandResult]]) -> AgentCommandQueue:
    settings = AgentQueueSettings(max_per_node=3, redeliver_after=10.0,  # type: ignore[arg-type]
                                  expire_after=100.0)  # type: ignore[arg-type]
    return AgentCommandQueue(settings, clock=clock,
                             on_result=lambda node, result: seen.append((node, result)))


def ok(command_id: str, ok: bool = True) -> CommandResult:
    return CommandResult(id=command_id, ok=ok, time_seconds=1.0, message="done")


def test_throttle_becomes_a_queued_command(queue: AgentCommandQueue) -> None:
    outcome = AgentCommandDriver(queue).run(act())
    assert outcome.message == "queued for agent on n1"
    assert queue.take("n1") == [Command(id="a-1", kind="throttle", gpu=3, power_fraction=0.7,
                                        reason="GPU 3 at 91 C")]
    assert queue.take("n2") == []


def test_throttle_params(clock: ManualClock) -> None:
    queue = AgentCommandQueue(clock=clock)
    driver = AgentCommandDriver(queue)
    driver.run(act(id="w", power_watts=400))
    driver.run(act(id="f", power_fraction=0.5, gpu=None))
    driver.run(act("release", id="r"))
    driver.run(act("checkpoint", id="c"))
    taken = {c.id: c for c in queue.take("n1")}
    assert taken["w"].power_watts == 400.0
    assert taken["w"].power_fraction is None
    assert taken["f"].power_fraction == 0.5
    assert taken["f"].gpu is None
    assert taken["r"].kind == "release"
    assert taken["r"].power_fraction is None
    assert [c.id for c in queue.take("n1")] == []


@pytest.mark.parametrize("params", [{"power_fraction": 1.5}, {"power_fraction": "x"},
                                    {"power_watts": -1}, {"power_fraction": True}])
def test_bad_throttle_params_are_permanent(queue: AgentCommandQueue,
                                           params: dict[str, object]) -> None:
    request = ActionRequest(id="a", key="a", action="throttle", node="n1", reason="r",
                            params=params)
    with pytest.raises(PermanentError):
        AgentCommandDriver(queue).run(request)


def test_actions_agents_cannot_do(queue: AgentCommandQueue) -> None:
    with pytest.raises(PermanentError):
        AgentCommandDriver(queue).run(act("cordon"))
    with pytest.raises(PermanentError):
        AgentCommandDriver(queue).run(act(node=None))


def test_in_flight_until_acknowledged_then_redelivered(queue: AgentCommandQueue,
                                                       clock: ManualClock) -> None:
    AgentCommandDriver(queue).run(act())
    assert len(queue.take("n1")) == 1
    clock.advance(5)
    assert queue.take("n1") == []  # in flight, not yet overdue
    clock.advance(5)
    assert [c.id for c in queue.take("n1")] == ["a-1"]  # reply lost? send again
    assert queue.pending("n1")[0].id == "a-1"


def test_complete_records_results_and_calls_back(
        queue: AgentCommandQueue, clock: ManualClock,
        seen: list[tuple[str, CommandResult]]) -> None:
    driver = AgentCommandDriver(queue)
    driver.run(act())
    driver.run(act("release", id="a-2"))
    queue.take("n1")
    assert driver.reconcile(act()) is True  # on its way
    assert queue.complete("n1", [ok("a-1"), ok("unknown")]) == ["a-1"]
    assert seen == [("n1", ok("a-1"))]
    assert driver.result("a-1") == ok("a-1")
    assert driver.result("a-2") is None
    clock.advance(60)
    assert [c.id for c in queue.take("n1")] == ["a-2"]  # only the unacknowledged one
    assert queue.complete("n1", [ok("a-1")]) == []  # a duplicate result: reported once
    assert len(seen) == 1


def test_reconcile(queue: AgentCommandQueue) -> None:
    driver = AgentCommandDriver(queue)
    assert driver.reconcile(act()) is False  # never queued (e.g. after a restart)
    driver.run(act())
    queue.complete("n1", [ok("a-1", ok=False)])
    assert driver.reconcile(act()) is False


def test_same_id_is_queued_once(queue: AgentCommandQueue) -> None:
    driver = AgentCommandDriver(queue)
    driver.run(act())
    assert driver.run(act()).details["queued"] is False
    assert len(queue.take("n1")) == 1


def test_queue_is_bounded_per_node(queue: AgentCommandQueue) -> None:
    driver = AgentCommandDriver(queue)
    for i in range(3):
        driver.run(act(id=f"a-{i}"))
    with pytest.raises(TemporaryError, match="full") as caught:
        driver.run(act(id="a-3"))
    assert caught.value.retry_after == 10.0
    driver.run(act(id="other", node="n2"))  # other nodes are not affected


def test_uncollected_commands_expire_as_failed(
        queue: AgentCommandQueue, clock: ManualClock,
        seen: list[tuple[str, CommandResult]]) -> None:
    AgentCommandDriver(queue).run(act())
    clock.advance(100)
    assert queue.take("n1") == []
    (node, result), = seen
    assert node == "n1"
    assert result.id == "a-1"
    assert not result.ok
    assert "expired" in result.message
    assert queue.result("a-1") == result


def test_results_kept_are_bounded(clock: ManualClock) -> None:
    queue = AgentCommandQueue(AgentQueueSettings(results_kept=2), clock=clock)
    driver = AgentCommandDriver(queue)
    for i in range(3):
        driver.run(act(id=f"a-{i}"))
    queue.complete("n1", [ok("a-0"), ok("a-1"), ok("a-2")])
    assert queue.result("a-0") is None
    assert queue.result("a-2") is not None
