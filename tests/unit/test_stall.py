"""The stall watch: the controller's own stalls leave its nodes' silence alone."""

from __future__ import annotations

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.stall import LOOP_LAG_SECONDS, LOOP_TICK_SECONDS, StallWatch


def _sweep(watch: StallWatch) -> float:
    stall = watch.sweep_started()
    watch.sweep_finished()
    return stall


def test_on_time_sweeps_are_no_stall_and_its_clock_runs_on() -> None:
    clock = ManualClock()
    seen: list[tuple[str, float]] = []
    watch = StallWatch(clock, 0.5, on_stall=lambda where, s: seen.append((where, s)))
    start = watch.monotonic()
    for _ in range(20):
        assert _sweep(watch) == 0.0
        clock.advance(0.5)
    assert watch.monotonic() - start == pytest.approx(10.0)
    assert watch.time() == clock.time()
    assert seen == []


def test_a_late_sweep_is_a_stall_left_out_of_its_monotonic_time() -> None:
    clock = ManualClock()
    seen: list[tuple[str, float]] = []
    watch = StallWatch(clock, 0.5, on_stall=lambda where, s: seen.append((where, s)))
    _sweep(watch)
    before = watch.monotonic()
    clock.advance(30.5)  # paused for 30 s
    assert _sweep(watch) == pytest.approx(30.0)
    assert watch.monotonic() - before == pytest.approx(0.5)
    assert seen == [("sweep", pytest.approx(30.0))]
    clock.advance(0.9)  # a little late: counted, not reported
    assert _sweep(watch) == pytest.approx(0.4)
    assert len(seen) == 1
    assert watch.stalls_total == pytest.approx(30.4)


def test_a_long_sweep_is_not_a_stall() -> None:
    clock = ManualClock()
    watch = StallWatch(clock, 0.5)
    watch.sweep_started()
    clock.advance(3.0)  # the sweep itself took 3 s (the next starts at once)
    watch.sweep_finished()
    clock.advance(0.5)
    assert watch.sweep_started() == 0.0


def test_an_event_loop_that_has_not_ticked_is_behind_on_its_reports() -> None:
    clock = ManualClock()
    seen: list[tuple[str, float]] = []
    watch = StallWatch(clock, 0.5, on_stall=lambda where, s: seen.append((where, s)))
    assert not watch.reports_behind()  # no loop: nothing to wait for (tests, tools)
    watch.loop_ticked()
    clock.advance(LOOP_TICK_SECONDS)
    watch.loop_ticked()
    assert not watch.reports_behind()
    clock.advance(LOOP_LAG_SECONDS + 0.1)
    assert watch.reports_behind()
    clock.advance(5)
    watch.loop_ticked()  # it ran again, late: reported, caught up
    assert not watch.reports_behind()
    assert seen == [("event_loop", pytest.approx(LOOP_LAG_SECONDS + 0.1 + 5
                                                 - LOOP_TICK_SECONDS))]


def test_the_ingest_lag_is_the_most_the_loop_ran_late_since_the_last_read() -> None:
    clock = ManualClock()
    watch = StallWatch(clock, 0.5)
    watch.loop_ticked()
    assert watch.ingest_lag() == 0.0
    clock.advance(LOOP_TICK_SECONDS + 0.3)  # 0.3 s late: behind, not yet a stall
    watch.loop_ticked()
    clock.advance(LOOP_TICK_SECONDS + 0.1)
    watch.loop_ticked()
    assert watch.ingest_lag() == pytest.approx(0.3)  # the peak between two scrapes
    assert watch.ingest_lag() == pytest.approx(0.1)  # then the latest
    clock.advance(LOOP_TICK_SECONDS)
    watch.loop_ticked()  # caught up
    assert watch.ingest_lag() == pytest.approx(0.1)
    assert watch.ingest_lag() == 0.0


class Cpu:
    """The process's CPU time, moved by the test."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def _sweeps(watch: StallWatch, clock: ManualClock, cpu: Cpu, seconds: float,
            busy: float, interval: float = 0.5) -> None:
    """Sweeps every ``interval`` for ``seconds``, the process using ``busy`` of a core."""
    for _ in range(round(seconds / interval)):
        clock.advance(interval)
        cpu.seconds += busy * interval
        watch.sweep_started()
        watch.sweep_finished()


def test_a_saturated_controller_does_not_take_its_backlog_for_silence() -> None:
    clock, cpu = ManualClock(), Cpu()
    seen: list[tuple[str, float]] = []
    watch = StallWatch(clock, 0.5, on_stall=lambda where, s: seen.append((where, s)),
                       cpu_seconds=cpu)
    _sweeps(watch, clock, cpu, 5.0, busy=0.4)  # working, with room to spare
    assert not watch.reports_behind()
    received = watch.monotonic()  # a node's last report, as the registry dates it
    _sweeps(watch, clock, cpu, 20.0, busy=1.0)  # a whole core: reports wait unread
    assert watch.reports_behind()  # saturated: heartbeats are not judged meanwhile
    silence = watch.monotonic() - received
    assert silence < 2.5  # 20 s of saturation: a few seconds at most, not 20
    before = watch.monotonic()
    _sweeps(watch, clock, cpu, 5.0, busy=0.3)  # caught up
    assert not watch.reports_behind()
    assert watch.monotonic() - before == pytest.approx(5.0, abs=2.0)  # time runs again
    assert [where for where, _ in seen] == ["saturated"]
    assert seen[0][1] >= 15.0


def test_the_progress_clock_never_goes_back() -> None:
    clock, cpu = ManualClock(), Cpu()
    watch = StallWatch(clock, 0.5, cpu_seconds=cpu)
    _sweeps(watch, clock, cpu, 4.0, busy=1.0)
    assert watch.reports_behind()  # saturated (the loop never ticked here)
    readings = []
    for _ in range(10):
        clock.advance(0.3)
        cpu.seconds += 0.3
        readings.append(watch.monotonic())  # a report between two sweeps
        watch.sweep_started()
        watch.sweep_finished()
        readings.append(watch.monotonic())
    assert readings == sorted(readings)
