from __future__ import annotations

import pytest

from sn_monitor.agent.commands import CommandExecutor
from sn_monitor.agent.guard import STATE_FILE, ThermalGuard
from sn_monitor.agent.nvml import NvmlError
from sn_monitor.agent.settings import GuardSettings
from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot
from sn_monitor.clock import ManualClock
from sn_monitor.model import Command


class Gpus:
    """Power limits as NVML would hold them; the guard's setter."""

    def __init__(self, count: int = 4, limit: float = 700.0) -> None:
        self.limits = {i: limit for i in range(count)}
        self.calls: list[tuple[int, float]] = []
        self.refuse: set[int] = set()

    def set(self, gpu: int, watts: float) -> None:
        self.calls.append((gpu, watts))
        if gpu in self.refuse:
            raise NvmlError(f"GPU {gpu}: No permission")
        self.limits[gpu] = watts

    def snapshot(self, clock: ManualClock) -> NodeSnapshot:
        return NodeSnapshot("n", clock.time(), gpus=tuple(
            GpuSample(index=i, uuid=f"GPU-{i}", name="H100", pci_bus_id="0000:18:00.0",
                      temperature_celsius=60.0, slowdown_temperature_celsius=89.0,
                      power_limit_watts=limit, power_default_limit_watts=700.0,
                      power_min_limit_watts=200.0, power_max_limit_watts=700.0)
            for i, limit in self.limits.items()))


@pytest.fixture
def setup(tmp_path, request):
    mode = getattr(request, "param", "enforce")
    clock, gpus = ManualClock(), Gpus()
    guard = ThermalGuard(GuardSettings(mode=mode), gpus.set, tmp_path, clock)
    guard.observe(gpus.snapshot(clock))
    return clock, gpus, guard


def throttle(command_id: str, **fields) -> Command:
    return Command(id=command_id, kind="throttle", **fields)


def test_throttle_by_fraction_of_the_default_limit(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock)
    [result] = executor.execute([throttle("c1", gpu=2, power_fraction=0.6, reason="hot")])
    assert result.ok
    assert result.id == "c1"
    assert result.time_seconds == clock.time()
    assert not result.dry_run
    assert gpus.limits[2] == pytest.approx(420.0)
    assert guard.throttled() == {2}
    assert guard.caps()[2].owner == "controller"


def test_throttle_by_watts_and_release_restores_the_original(setup, tmp_path):
    clock, gpus, guard = setup
    gpus.limits[1] = 650.0  # the operator's own limit
    guard.observe(gpus.snapshot(clock))
    executor = CommandExecutor(guard, clock)
    [capped] = executor.execute([throttle("c1", gpu=1, power_watts=450.0)])
    assert capped.ok
    assert gpus.limits[1] == 450.0
    assert (tmp_path / STATE_FILE).exists()
    events = guard.observe(gpus.snapshot(clock))
    [released] = executor.execute([Command(id="c2", kind="release", gpu=1)])
    assert released.ok
    assert gpus.limits[1] == 650.0
    assert guard.throttled() == set()
    assert not (tmp_path / STATE_FILE).exists()
    events += guard.observe(gpus.snapshot(clock))
    assert [e.kind for e in events] == ["guard", "guard"]  # both actions reach the spool
    assert [e.gpu for e in events] == [1, 1]


def test_throttle_and_release_every_gpu(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock)
    [result] = executor.execute([throttle("all", power_fraction=0.5)])
    assert result.ok
    assert set(gpus.limits.values()) == {350.0}
    assert guard.throttled() == {0, 1, 2, 3}
    [result] = executor.execute([Command(id="rel", kind="release")])
    assert result.ok
    assert set(gpus.limits.values()) == {700.0}


def test_a_duplicate_command_id_is_not_executed_twice(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock)
    first = executor.execute([throttle("c1", gpu=0, power_watts=500.0)])
    clock.advance(5)
    again = executor.execute([throttle("c1", gpu=0, power_watts=300.0)])
    assert again == first
    assert gpus.calls == [(0, 500.0)]


@pytest.mark.parametrize("setup", ["enforce"], indirect=True)
def test_dry_run_changes_nothing(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock, dry_run=True)
    results = executor.execute([
        throttle("c1", gpu=0, power_watts=500.0), Command(id="c2", kind="release", gpu=0)])
    assert all(r.ok and r.dry_run for r in results)
    assert results[0].message == "would cap GPU 0 to 500 W"
    assert gpus.calls == []
    assert guard.caps() == {}


@pytest.mark.parametrize("setup", ["dry-run"], indirect=True)
def test_guard_in_dry_run_mode_turns_commands_into_dry_runs(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock)
    [result] = executor.execute([throttle("c1", gpu=0, power_watts=500.0)])
    assert result.ok
    assert result.dry_run
    assert gpus.calls == []


def test_checkpoint_is_not_the_agents(setup):
    clock, _, guard = setup
    [result] = CommandExecutor(guard, clock).execute([Command(id="k", kind="checkpoint")])
    assert not result.ok
    assert "not handled by the agent" in result.message


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (throttle("a", gpu=0), "exactly one of"),
        (throttle("b", gpu=0, power_watts=400.0, power_fraction=0.5), "exactly one of"),
        (throttle("c", gpu=0, power_watts=-1.0), "greater than 0"),
        (throttle("d", gpu=9, power_watts=400.0), "GPU 9 is not present"),
        (Command(id="e", kind="release", gpu=9), "GPU 9 is not present"),
    ],
)
def test_bad_commands_fail_with_a_reason(setup, command, message):
    clock, gpus, guard = setup
    [result] = CommandExecutor(guard, clock).execute([command])
    assert not result.ok
    assert message in result.message
    assert gpus.calls == []


def test_a_refused_throttle_is_a_failed_result(setup):
    clock, gpus, guard = setup
    gpus.refuse.add(3)
    [result] = CommandExecutor(guard, clock).execute([throttle("c", power_watts=400.0)])
    assert not result.ok
    assert "GPU 3" in result.message
    assert "No permission" in result.message
    assert guard.throttled() == {0, 1, 2}


def test_release_of_an_uncapped_gpu_is_fine(setup):
    clock, gpus, guard = setup
    [result] = CommandExecutor(guard, clock).execute([Command(id="r", kind="release", gpu=0)])
    assert result.ok
    assert "was not capped" in result.message
    assert gpus.calls == []


def test_only_recent_ids_are_remembered(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock, remember=2)
    for n in range(3):
        executor.execute([Command(id=f"r{n}", kind="release", gpu=0)])
    executor.execute([throttle("r0", gpu=0, power_watts=400.0)])  # forgotten: runs again
    assert gpus.calls == [(0, 400.0)]
