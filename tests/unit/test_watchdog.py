"""The collector watchdog: a hung NVML call stalls neither the cycle nor the guard.

Through the real agent (collectors from the registry, sampler, guard, exporter) on a
simulated node whose fake NVML is made to hang. The hung collector's deadline is short
(50 ms); the cycle that finds it stuck waits that long (on the runner's condition), and
no test waits on anything else but what the code under test signals. Every hang is released
in the fixture's teardown, before the agent stops, so no collector thread outlives a test.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from sn_monitor.agent.daemon import Agent, build_agent
from sn_monitor.agent.exposition import TextRenderer
from sn_monitor.agent.sampler import Sampler
from sn_monitor.agent.settings import AgentSettings, CollectorSettings, CollectorSwitch
from sn_monitor.agent.snapshot import Collected, CollectorStatus, GpuSample, NodeSnapshot
from sn_monitor.clock import ManualClock
from sn_monitor.config import Duration
from sn_monitor.model import Event
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.node import SimulatedNode
from tests.support.ports import free_port

DEADLINE = 0.05
#: Bound on every wait for something the code under test signals (never reached when
#: it works; a generous bound so that a loaded machine cannot fail the test).
WAIT = 30.0


@dataclass
class Node:
    sim: SimulatedNode
    agent: Agent
    clock: ManualClock

    def status(self, snapshot: NodeSnapshot, name: str) -> CollectorStatus:
        return next(c for c in snapshot.collectors if c.name == name)

    def metrics(self) -> dict[str, float]:
        text = TextRenderer().render(self.agent.exporter.families()).decode()
        return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
                for line in text.splitlines() if line and not line.startswith("#")}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    sim = SimulatedNode(tmp_path / "node", gpus=2)
    collectors = CollectorSettings(nvml=CollectorSwitch(deadline=Duration(DEADLINE)))
    settings = sim.agent_settings(AgentSettings(
        node="n1", listen=f"127.0.0.1:{free_port()}", collectors=collectors))
    clock = ManualClock()
    agent = build_agent(settings, sim.nvml, clock, before_sample=sim.step)
    agent.http.start()  # so that stop() has a server to stop
    try:
        yield Node(sim, agent, clock)
    finally:
        fake_nvml.release_hangs()
        agent.sampler.settle(WAIT)
        agent.stop()
        fake_nvml.reset()


def stuck_events(snapshot: NodeSnapshot) -> list[Event]:
    return [e for e in snapshot.events if e.kind == "collector_stuck"]


def test_a_hung_nvml_call_makes_the_collector_stuck_and_the_cycle_goes_on(node: Node):
    healthy = node.agent.tick()
    assert len(healthy.gpus) == 2
    assert node.status(healthy, "nvml") == CollectorStatus("nvml", True, 0.0, stuck=False)
    assert node.metrics()['sn_agent_collector_stuck{collector="nvml"}'] == 0.0

    hang = fake_nvml.inject_hang()  # the driver wedges: every NVML call blocks
    node.clock.advance(1.0)
    first = node.agent.tick()  # returns once the nvml call has run past its deadline
    assert hang.entered.is_set()
    assert hang.waiting == 1
    nvml = node.status(first, "nvml")
    assert (nvml.success, nvml.stuck) == (False, True)
    assert first.gpus == ()  # its last good values are not served as fresh
    # The other collectors report as usual.
    assert node.status(first, "net").success
    assert node.status(first, "host").success
    assert first.net
    assert first.host is not None
    (event,) = stuck_events(first)
    assert (event.kind, event.source, event.gpu) == ("collector_stuck", "agent", None)
    assert event.message.startswith("collector nvml has not returned for 0.05 s (deadline 0.05 s)")
    assert node.agent.sampler.stuck() == {"nvml"}
    metrics = node.metrics()
    assert metrics['sn_agent_collector_stuck{collector="nvml"}'] == 1.0
    assert metrics['sn_agent_collector_success{collector="nvml"}'] == 0.0
    assert metrics['sn_agent_collector_stuck{collector="host"}'] == 0.0
    assert metrics['sn_agent_collector_success{collector="host"}'] == 1.0
    assert not any(key.startswith("sn_gpu_temperature_celsius") for key in metrics)

    # Later cycles: no second call into the hung collector, no second event, the hang's
    # age in the duration; the loop keeps going.
    calls = fake_nvml.call_counts()
    for _ in range(3):
        node.clock.advance(1.0)
        later = node.agent.tick()
        assert stuck_events(later) == []
        assert node.status(later, "nvml").stuck
        assert node.status(later, "host").success
    assert node.status(later, "nvml").duration_seconds == 3.0
    assert metrics != node.metrics()
    assert node.metrics()['sn_agent_collector_duration_seconds{collector="nvml"}'] == 3.0
    assert fake_nvml.call_counts() == calls
    assert hang.waiting == 1
    assert dict(later.event_counts)["collector_stuck"] == 1

    # The driver comes back: the hung call returns, the collector is un-stuck.
    hang.release()
    assert node.agent.sampler.settle(WAIT)
    node.clock.advance(1.0)
    back = node.agent.tick()
    assert node.status(back, "nvml") == CollectorStatus("nvml", True, 0.0, stuck=False)
    assert len(back.gpus) == 2
    assert stuck_events(back) == []
    assert node.agent.sampler.stuck() == frozenset()
    assert node.metrics()['sn_agent_collector_stuck{collector="nvml"}'] == 0.0


def test_a_hang_on_one_gpu_stalls_the_whole_sweep_and_is_one_event(node: Node):
    node.agent.tick()
    fake_nvml.inject_hang(gpu=1)
    first = node.agent.tick()
    assert node.status(first, "nvml").stuck
    assert first.gpus == ()
    assert len(stuck_events(first)) == 1
    assert stuck_events(node.agent.tick()) == []


def test_the_guard_never_calls_into_a_hung_nvml(node: Node):
    guard = node.agent.protection.guard if node.agent.protection else None
    assert guard is not None
    node.agent.tick()
    assert guard.apply_cap(0, 500.0, "controller: test").ok
    assert node.sim.gpus[0].power_limit_watts == pytest.approx(500.0)

    hang = fake_nvml.inject_hang(function="nvmlDeviceSetPowerManagementLimit")
    stuck_sweep = fake_nvml.inject_hang(function="nvmlDeviceGetTemperature")
    node.agent.tick()
    node.clock.advance(2.0)
    node.agent.tick()
    assert node.agent.sampler.stuck() == {"nvml"}
    # A controller's release, and the restore at stop, would hang this thread: refused.
    outcome = guard.release(0, "controller: test")
    assert not outcome.ok
    (event,) = guard.restore_all()
    assert event.message == ("guard cannot restore 700 W on GPU 0: NVML is not answering "
                             "(the nvml collector has been stuck for 2 s): not calling it")
    assert hang.waiting == 0
    assert guard.throttled() == {0}
    assert guard.original_limits() == {0: 700.0}  # kept on disk for the next start
    assert guard.state_file.exists()

    # NVML answers again: the pending restore takes on the next cycle.
    hang.release()
    stuck_sweep.release()
    assert node.agent.sampler.settle(WAIT)
    node.agent.tick()
    assert node.sim.gpus[0].power_limit_watts == 700.0
    assert guard.throttled() == set()


class BlockingCollector:
    """Returns ``result`` once ``go`` is set (a call that hangs until told otherwise),
    then ``after`` at once."""

    def __init__(self, name: str, result: Collected, after: Collected | None = None) -> None:
        self.name = name
        self.result = result
        self.after = after
        self.go = threading.Event()
        self.entered = threading.Event()
        self.calls = 0
        self.closed = False

    def collect(self) -> Collected:
        self.calls += 1
        if self.calls > 1 and self.after is not None:
            return self.after
        self.entered.set()
        if not self.go.wait(WAIT):
            raise TimeoutError("never released")
        return self.result

    def close(self) -> None:
        self.closed = True


GPU0 = GpuSample(index=0, uuid="GPU-a", name="H100", pci_bus_id="00000000:18:00.0")


def test_a_late_return_drops_the_stale_values_but_keeps_the_events():
    xid = Event(kind="xid", source="nvml", time_seconds=1.0, message="m", gpu=0, code=13)
    stale = replace(GPU0, temperature_celsius=60.0)
    slow = BlockingCollector("nvml", Collected(gpus=(stale,), events=(xid,)),
                             after=Collected(gpus=(GPU0,)))
    clock = ManualClock()
    sampler = Sampler("n1", [slow], clock, deadlines={"nvml": DEADLINE})
    try:
        first = sampler.sample()
        assert first.collectors[0].stuck
        slow.go.set()
        assert sampler.settle(WAIT)
        late = sampler.sample()  # takes the late events, calls it afresh (it answers now)
        assert [e.kind for e in late.events] == ["xid"]
        assert late.gpus == (GPU0,)  # from the fresh call, not the late one
        assert slow.calls == 2
        assert late.collectors[0] == CollectorStatus("nvml", True, 0.0, stuck=False)
        assert dict(late.event_counts) == {"collector_stuck": 1, "xid": 1}
    finally:
        slow.go.set()
        sampler.close()
    assert slow.closed


def test_close_leaves_a_stuck_collector_to_close_itself_when_it_returns():
    slow = BlockingCollector("kmsg", Collected())
    sampler = Sampler("n1", [slow], ManualClock(), deadlines={"kmsg": DEADLINE})
    try:
        assert sampler.sample().collectors[0].stuck
        sampler.close(timeout=WAIT)  # does not wait for the hung call
        assert not slow.closed
    finally:
        slow.go.set()
    assert sampler.settle(WAIT)  # the call returned and its runner thread ended
    assert slow.closed


class RecordingCollector:
    """Answers at once, and records the thread each call was made on."""

    def __init__(self, name: str, order: list[str] | None = None) -> None:
        self.name = name
        self.order = order if order is not None else []
        self.threads: list[str] = []
        self.closed = False

    def collect(self) -> Collected:
        self.order.append(self.name)
        self.threads.append(threading.current_thread().name)
        return Collected()

    def close(self) -> None:
        self.closed = True


def runner_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("agent-collect")}


def test_a_cycle_makes_every_call_in_order_on_one_runner_thread():
    order: list[str] = []
    collectors = [RecordingCollector(name, order) for name in ("nvml", "net", "host")]
    sampler = Sampler("n1", collectors, ManualClock())
    try:
        for _ in range(3):
            assert all(status.success for status in sampler.sample().collectors)
        assert runner_threads() == {"agent-collect"}
    finally:
        sampler.close()
    assert order == ["nvml", "net", "host"] * 3
    # One handoff a cycle: the same runner thread, never the sampling one, for every call.
    assert {t for c in collectors for t in c.threads} == {"agent-collect"}
    assert all(c.closed for c in collectors)
    assert runner_threads() == set()  # stopped at close


def test_the_calls_after_a_stuck_one_go_to_a_fresh_runner_in_the_same_cycle():
    before, after = RecordingCollector("net"), RecordingCollector("host")
    slow = BlockingCollector("nvml", Collected(gpus=(GPU0,)), after=Collected(gpus=(GPU0,)))
    sampler = Sampler("n1", [before, slow, after], ManualClock(), deadlines={"nvml": DEADLINE})
    try:
        first = sampler.sample()
        assert [(c.name, c.success, c.stuck) for c in first.collectors] == [
            ("net", True, False), ("nvml", False, True), ("host", True, False)]
        assert len(stuck_events(first)) == 1
        # The runner stays with the hung call; the next one took the rest of the line.
        assert runner_threads() == {"agent-collect", "agent-collect-stuck-nvml"}
        second = sampler.sample()
        assert [c.stuck for c in second.collectors] == [False, True, False]
        assert slow.calls == 1  # no second call while the first hangs
        assert stuck_events(second) == []
        assert before.threads == after.threads == ["agent-collect"] * 2

        slow.go.set()
        assert sampler.settle(WAIT)
        assert runner_threads() == {"agent-collect"}  # the abandoned runner has ended
        third = sampler.sample()
        assert all(c.success for c in third.collectors)
        assert third.gpus == (GPU0,)
        assert slow.calls == 2
        assert sampler.stuck() == frozenset()
    finally:
        slow.go.set()
        sampler.close()
    assert [before.closed, slow.closed, after.closed] == [True, True, True]


def test_two_collectors_stuck_in_one_cycle_are_two_events_and_each_comes_back():
    first_slow = BlockingCollector("nvml", Collected())
    second_slow = BlockingCollector("kmsg", Collected())
    quick = RecordingCollector("host")
    sampler = Sampler("n1", [first_slow, second_slow, quick], ManualClock(),
                      deadlines={"nvml": DEADLINE, "kmsg": DEADLINE})
    try:
        snapshot = sampler.sample()
        assert [c.stuck for c in snapshot.collectors] == [True, True, False]
        assert [e.message.split(" has ")[0] for e in stuck_events(snapshot)] == [
            "collector nvml", "collector kmsg"]
        assert sampler.stuck() == {"nvml", "kmsg"}
        assert quick.threads == ["agent-collect"]
        first_slow.go.set()
        assert not sampler.settle(DEADLINE)  # kmsg still hangs
        second_slow.go.set()
        assert sampler.settle(WAIT)
        assert all(c.success for c in sampler.sample().collectors)
        assert (first_slow.calls, second_slow.calls) == (2, 2)
    finally:
        first_slow.go.set()
        second_slow.go.set()
        sampler.close()


def test_deadlines_come_from_the_settings_and_must_be_positive():
    settings = replace(AgentSettings(), collectors=CollectorSettings(
        nvml=CollectorSwitch(deadline=Duration(2.0))))
    assert settings.collectors.deadlines() == {
        "nvml": 2.0, "net": 5.0, "infiniband": 5.0, "host": 5.0, "kmsg": 5.0, "processes": 5.0}
    with pytest.raises(ValueError, match="deadline must be positive"):
        Sampler("n1", [BlockingCollector("a", Collected())], ManualClock(),
                deadlines={"a": 0.0})
