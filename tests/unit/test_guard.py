from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.guard import STATE_FILE, ThermalGuard, effective_thresholds
from sn_monitor.agent.nvml import NvmlError
from sn_monitor.agent.settings import GuardSettings
from sn_monitor.agent.snapshot import CollectorStatus, GpuSample, NodeSnapshot
from sn_monitor.clock import ManualClock
from sn_monitor.config import Duration
from sn_monitor.model import Event
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import SimulatedGpu, make_gpus


@pytest.fixture(autouse=True)
def _clean_fake() -> Iterator[None]:
    yield
    fake_nvml.reset()


def settings(**overrides) -> GuardSettings:
    fields = {"mode": "enforce", "throttle_at": 85.0, "release_at": 80.0,
              "hold": Duration(5.0), "power_cap": 0.7}
    fields.update(overrides)
    return GuardSettings(**fields)


class RecordingSetter:
    """The real NVML setter, recording each call and the guard file at that moment."""

    def __init__(self, collector: NvmlCollector, state_dir: Path) -> None:
        self._collector = collector
        self._file = state_dir / STATE_FILE
        self.calls: list[tuple[int, float]] = []
        self.file_at_call: list[dict | None] = []
        self.fail_next = 0

    def __call__(self, gpu: int, watts: float) -> None:
        self.calls.append((gpu, watts))
        self.file_at_call.append(
            json.loads(self._file.read_text()) if self._file.exists() else None)
        if self.fail_next:
            self.fail_next -= 1
            raise NvmlError(f"GPU {gpu}: cannot set power limit to {watts} W: No permission")
        self._collector.library.set_power_limit_watts(gpu, watts)


class SimNode:
    """Simulated GPUs behind fake NVML, sampled by the real collector, on a manual clock."""

    def __init__(self, tmp_path: Path, count: int = 2, **guard_settings) -> None:
        self.clock = ManualClock()
        self.gpus = make_gpus(count)
        for gpu in self.gpus:
            gpu.set_load(0.9)
            gpu.step(300.0)  # settled at its working temperature
        fake_nvml.configure(self.gpus)
        self.collector = NvmlCollector(fake_nvml, self.clock)
        self.state_dir = tmp_path / "state"
        self.setter = RecordingSetter(self.collector, self.state_dir)
        self.guard = ThermalGuard(settings(**guard_settings), self.setter, self.state_dir,
                                  self.clock)
        self.events: list[Event] = []

    def cycle(self) -> NodeSnapshot:
        for gpu in self.gpus:
            gpu.step(1.0)
        self.clock.advance(1.0)
        collected = self.collector.collect()
        snapshot = NodeSnapshot("node-1", self.clock.time(), gpus=collected.gpus)
        self.events.extend(self.guard.observe(snapshot))
        return snapshot

    def run_until(self, predicate, limit: int = 600) -> int:
        for n in range(1, limit + 1):
            if predicate(self.cycle()):
                return n
        raise AssertionError("condition never met")

    @property
    def hot(self) -> SimulatedGpu:
        return self.gpus[1]


def temperature(snapshot: NodeSnapshot, index: int) -> float:
    value = snapshot.gpus[index].temperature_celsius
    assert value is not None
    return value


def test_overheating_gpu_is_capped_after_hold_then_released(tmp_path):
    node = SimNode(tmp_path)
    node.cycle()
    node.hot.inject_cooling_failure(1.7)
    node.run_until(lambda s: temperature(s, 1) >= 85.0)
    hot_since = node.clock.monotonic()
    assert node.guard.throttled() == set()
    capped_after = node.run_until(lambda s: node.guard.throttled() == {1})
    assert node.clock.monotonic() - hot_since == pytest.approx(5.0)
    assert capped_after == 5
    assert node.setter.calls == [(1, pytest.approx(490.0))]
    assert node.hot.power_limit_watts == pytest.approx(490.0)
    # The original limit was on disk before the first change.
    assert node.setter.file_at_call[0] == {
        "version": 1, "original_power_limits_watts": {"1": 700.0}}
    assert [e.kind for e in node.events] == ["guard"]
    assert node.events[0].gpu == 1
    assert "700 W -> 490 W" in node.events[0].message
    assert node.gpus[0].power_limit_watts == 700.0  # the healthy GPU is left alone

    # The fan is fixed: capped, the GPU cools below release_at; after hold the cap goes.
    node.hot.clear_cooling_failure()
    node.run_until(lambda s: temperature(s, 1) < 80.0)
    cool_since = node.clock.monotonic()
    node.run_until(lambda s: node.guard.throttled() == set())
    assert node.clock.monotonic() - cool_since == pytest.approx(5.0)
    assert node.hot.power_limit_watts == 700.0
    assert node.setter.calls[-1] == (1, 700.0)
    assert "restored GPU 1 power limit to 700 W" in node.events[-1].message
    assert not (node.state_dir / STATE_FILE).exists()


def test_cap_keeps_a_failed_fan_from_reaching_shutdown(tmp_path):
    node = SimNode(tmp_path)
    node.hot.inject_cooling_failure(1.7)
    peak = 0.0
    for _ in range(400):
        peak = max(peak, temperature(node.cycle(), 1))
    assert not node.hot.lost
    assert peak < node.hot.profile.shutdown_celsius
    assert node.guard.throttled() == {1}


def test_restart_after_a_crash_restores_the_original_limit(tmp_path):
    node = SimNode(tmp_path)
    node.hot.inject_cooling_failure(1.7)
    node.run_until(lambda s: node.guard.throttled() == {1})
    assert node.hot.power_limit_watts == pytest.approx(490.0)
    # The agent dies without restore_all; a new one starts on the same state_dir.
    restarted = ThermalGuard(settings(), node.setter, node.state_dir, node.clock)
    events = restarted.recover()
    assert node.hot.power_limit_watts == 700.0
    assert not (node.state_dir / STATE_FILE).exists()
    assert [e.gpu for e in events] == [1]
    assert "previous agent run" in events[0].message
    assert restarted.recover() == []  # nothing left


def test_restore_all_at_stop_puts_back_every_limit(tmp_path):
    node = SimNode(tmp_path, count=3)
    for gpu in node.gpus[1:]:
        gpu.inject_cooling_failure(1.7)
    node.run_until(lambda s: node.guard.throttled() == {1, 2})
    events = node.guard.restore_all()
    assert sorted(e.gpu for e in events) == [1, 2]
    assert [g.power_limit_watts for g in node.gpus] == [700.0, 700.0, 700.0]
    assert node.guard.throttled() == set()
    assert not (node.state_dir / STATE_FILE).exists()


def test_dry_run_decides_but_never_sets(tmp_path):
    node = SimNode(tmp_path, mode="dry-run")
    node.hot.inject_cooling_failure(1.7)
    node.run_until(lambda s: any("would cap" in e.message for e in node.events))
    assert node.setter.calls == []
    assert node.hot.power_limit_watts == 700.0
    assert node.guard.throttled() == set()
    assert node.guard.caps()[1].dry_run
    assert "would cap GPU 1 power limit to 490 W" in node.events[0].message
    assert not (node.state_dir / STATE_FILE).exists()
    node.guard.restore_all()
    assert node.setter.calls == []


def test_off_does_nothing(tmp_path):
    node = SimNode(tmp_path, mode="off")
    node.hot.inject_cooling_failure(1.7)
    for _ in range(60):
        node.cycle()
    assert node.setter.calls == []
    assert node.events == []


def test_setter_failure_is_logged_and_retried_every_cycle(tmp_path, caplog):
    node = SimNode(tmp_path)
    node.hot.inject_cooling_failure(1.7)
    node.setter.fail_next = 2
    node.run_until(lambda s: len(node.setter.calls) == 1)
    assert node.guard.throttled() == set()
    assert "cannot cap to 490 W on GPU 1" in caplog.text
    assert any("guard cannot" in e.message for e in node.events)
    node.cycle()
    assert node.guard.throttled() == set()
    node.cycle()
    assert node.guard.throttled() == {1}
    assert len(node.setter.calls) == 3
    assert node.hot.power_limit_watts == pytest.approx(490.0)
    assert sum("guard cannot" in e.message for e in node.events) == 1  # one event a streak


# ---------------------------------------------------------------- synthetic snapshots


def sample(index: int, celsius: float, *, slowdown: float | None = 89.0,
           limit: float = 700.0) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index}", name="H100", pci_bus_id="0000:18:00.0",
                     temperature_celsius=celsius, slowdown_temperature_celsius=slowdown,
                     power_limit_watts=limit, power_default_limit_watts=700.0,
                     power_min_limit_watts=200.0, power_max_limit_watts=700.0)


class FakeGpus:
    def __init__(self) -> None:
        self.limits: dict[int, float] = {}
        self.calls: list[tuple[int, float]] = []

    def set(self, gpu: int, watts: float) -> None:
        self.calls.append((gpu, watts))
        self.limits[gpu] = watts


def run(guard: ThermalGuard, clock: ManualClock, gpus: FakeGpus, celsius: float,
        seconds: int, *, slowdown: float | None = 89.0) -> list[Event]:
    events: list[Event] = []
    for _ in range(seconds):
        clock.advance(1.0)
        limit = gpus.limits.get(0, 700.0)
        snapshot = NodeSnapshot("n", clock.time(), gpus=(sample(0, celsius, slowdown=slowdown,
                                                                 limit=limit),))
        events.extend(guard.observe(snapshot))
    return events


@pytest.mark.parametrize(
    ("slowdown", "expected"),
    [(None, (85.0, 80.0)), (89.0, (85.0, 80.0)), (88.0, (85.0, 80.0)), (86.0, (83.0, 78.0))],
)
def test_effective_thresholds_keep_a_margin_below_slowdown(slowdown, expected):
    assert effective_thresholds(settings(), slowdown) == expected


def test_slowdown_margin_lowers_the_throttle_point(tmp_path):
    clock, gpus = ManualClock(), FakeGpus()
    guard = ThermalGuard(settings(), gpus.set, tmp_path, clock)
    run(guard, clock, gpus, 84.0, 10, slowdown=89.0)
    assert gpus.calls == []  # 84 < 85
    run(guard, clock, gpus, 84.0, 10, slowdown=86.0)  # 86 - 3 = 83 <= 84
    assert gpus.calls == [(0, 490.0)]
    run(guard, clock, gpus, 79.0, 10, slowdown=86.0)  # release moved to 78: still held
    assert guard.throttled() == {0}
    run(guard, clock, gpus, 77.0, 6, slowdown=86.0)
    assert guard.throttled() == set()


def test_a_break_in_the_heat_restarts_the_hold(tmp_path):
    clock, gpus = ManualClock(), FakeGpus()
    guard = ThermalGuard(settings(), gpus.set, tmp_path, clock)
    run(guard, clock, gpus, 86.0, 4)
    run(guard, clock, gpus, 84.0, 1)
    run(guard, clock, gpus, 86.0, 5)
    assert gpus.calls == []
    run(guard, clock, gpus, 86.0, 1)
    assert gpus.calls == [(0, 490.0)]


def test_guard_does_not_release_a_controller_cap_but_controller_releases_a_guard_cap(tmp_path):
    clock, gpus = ManualClock(), FakeGpus()
    guard = ThermalGuard(settings(), gpus.set, tmp_path, clock)
    run(guard, clock, gpus, 70.0, 1)
    outcome = guard.apply_cap(0, 400.0, "controller rule gpu-overheat")
    assert outcome.ok
    assert gpus.limits[0] == 400.0
    run(guard, clock, gpus, 60.0, 30)
    assert guard.throttled() == {0}  # cool, but the controller still wants it
    assert guard.release(0, "controller release").ok
    assert gpus.limits[0] == 700.0
    # A guard cap, released by the controller.
    run(guard, clock, gpus, 90.0, 6)
    assert gpus.limits[0] == 490.0
    assert guard.release(0, "controller release").ok
    assert gpus.limits[0] == 700.0
    assert guard.throttled() == set()
    assert not (tmp_path / STATE_FILE).exists()


def test_hot_gpu_under_a_milder_controller_cap_is_lowered_by_the_guard(tmp_path):
    clock, gpus = ManualClock(), FakeGpus()
    guard = ThermalGuard(settings(), gpus.set, tmp_path, clock)
    run(guard, clock, gpus, 70.0, 1)
    guard.apply_cap(0, 600.0, "controller")
    run(guard, clock, gpus, 90.0, 6)
    assert gpus.limits[0] == 490.0
    assert guard.caps()[0].owner == "guard"
    run(guard, clock, gpus, 60.0, 6)
    assert gpus.limits[0] == 700.0  # the original, not the controller's 600


def test_controller_cap_is_clamped_and_saved_before_it_is_set(tmp_path):
    clock = ManualClock()
    seen: list[dict] = []

    def setter(gpu: int, watts: float) -> None:
        seen.append(json.loads((tmp_path / STATE_FILE).read_text()))

    guard = ThermalGuard(settings(), setter, tmp_path, clock)
    guard.observe(NodeSnapshot("n", 0.0, gpus=(sample(0, 60.0, limit=650.0),)))
    outcome = guard.apply_cap(0, 50.0, "test")
    assert outcome.ok
    assert outcome.message == "capped GPU 0 to 200 W"
    assert seen == [{"version": 1, "original_power_limits_watts": {"0": 650.0}}]


def test_refused_controller_cap_is_reported_and_not_retried(tmp_path):
    clock = ManualClock()
    calls = []

    def setter(gpu: int, watts: float) -> None:
        calls.append(watts)
        raise NvmlError("No permission")

    guard = ThermalGuard(settings(), setter, tmp_path, clock)
    guard.observe(NodeSnapshot("n", 0.0, gpus=(sample(0, 60.0),)))
    outcome = guard.apply_cap(0, 400.0, "test")
    assert not outcome.ok
    assert "No permission" in outcome.message
    guard.observe(NodeSnapshot("n", 0.0, gpus=(sample(0, 60.0),)))
    assert calls == [400.0]
    assert not (tmp_path / STATE_FILE).exists()


def test_unknown_gpu_is_refused(tmp_path):
    guard = ThermalGuard(settings(), FakeGpus().set, tmp_path, ManualClock())
    assert not guard.apply_cap(5, 300.0, "x").ok
    assert not guard.release(5, "x").ok


def test_corrupt_state_file_is_set_aside(tmp_path):
    (tmp_path / STATE_FILE).write_text("{garbage")
    gpus = FakeGpus()
    guard = ThermalGuard(settings(), gpus.set, tmp_path, ManualClock())
    assert guard.recover() == []
    assert gpus.calls == []
    assert (tmp_path / (STATE_FILE + ".bad")).exists()


def test_failed_restore_at_recover_is_retried_in_the_cycle(tmp_path):
    (tmp_path / STATE_FILE).write_text(json.dumps(
        {"version": 1, "original_power_limits_watts": {"0": 650.0}}))
    failures = [NvmlError("GPU is lost")]
    calls = []

    def setter(gpu: int, watts: float) -> None:
        calls.append((gpu, watts))
        if failures:
            raise failures.pop()

    clock = ManualClock()
    guard = ThermalGuard(settings(), setter, tmp_path, clock)
    guard.recover()
    assert (tmp_path / STATE_FILE).exists()
    events = guard.observe(NodeSnapshot("n", 0.0, gpus=(sample(0, 60.0, limit=490.0),)))
    assert calls == [(0, 650.0), (0, 650.0)]
    assert "restored GPU 0 power limit to 650 W" in events[-1].message
    assert not (tmp_path / STATE_FILE).exists()


def test_a_gap_in_readings_restarts_the_hold(tmp_path):
    """Readings missing for a cycle (NVML stuck) are no evidence: the hold starts again."""
    node = SimNode(tmp_path)
    node.hot.inject_cooling_failure(1.7)
    node.run_until(lambda s: temperature(s, 1) >= 85.0)
    for _ in range(3):
        node.cycle()
    stuck = CollectorStatus("nvml", False, 1.0, stuck=True)
    node.clock.advance(1.0)
    node.guard.observe(NodeSnapshot("node-1", node.clock.time(), collectors=(stuck,)))
    assert node.guard.throttled() == set()
    back_at = node.clock.monotonic()
    node.run_until(lambda s: node.guard.throttled() == {1})
    # 3 s hot before the gap did not count: a full hold from the first fresh reading.
    assert node.clock.monotonic() - back_at == pytest.approx(6.0)
