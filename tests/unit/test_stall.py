"""The stall watch: the controller's own stalls leave its nodes' silence alone, and
never take back a loss found before them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.config import Duration
from sn_monitor.controller.actions.policy import PolicySettings
from sn_monitor.controller.security.auth import OPEN_ACCESS
from sn_monitor.controller.service import Controller
from sn_monitor.controller.supervision.stall import (
    LOOP_LAG_SECONDS,
    LOOP_TICK_SECONDS,
    StallWatch,
)
from tests.drivers.servers import wait_until
from tests.support.harness import (
    HEARTBEAT_RULE,
    Harness,
    make_harness,
    report_body,
    rules_from,
)


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


# ------------------------------------------------------------------ a loss across a stall


class Watched:
    """A controller that watches its own stalls, on a manual clock, with fake outside
    systems; the test ticks its event loop, as the loop itself does in the daemon."""

    def __init__(self, h: Harness) -> None:
        h.controller.close()
        self.h = h
        self.clock = h.clock
        # The process's CPU time stands still: on a loaded machine the real one, against
        # a clock moved by hand, reads as a controller saturated by its own work (and a
        # saturated controller's time stands still: the failover never came, seen in CI).
        self.controller = Controller(h.controller.settings, h.controller.engine.rules,
                                     h.clock, h.store, h.drivers, watch_stalls=True,
                                     cpu_seconds=lambda: 0.0)
        self.controller.start()
        stalls = self.controller.stalls
        assert stalls is not None
        self.stalls = stalls
        self.sequence = 0

    def report(self, node: str) -> None:
        self.sequence += 1
        self.controller.ingest(report_body(node, temps=[50.0], sequence=self.sequence,
                                           sample_time=self.clock.time()), OPEN_ACCESS, None)

    def step(self, reporting: tuple[str, ...]) -> None:
        """Half a second: the loop ticks on time, ``reporting`` report, one sweep."""
        for _ in range(2):
            self.clock.advance(LOOP_TICK_SECONDS)
            self.stalls.loop_ticked()
        for node in reporting:
            self.report(node)
        self.controller.sweep()

    def lost_incidents(self, node: str) -> list[dict[str, object]]:
        return [i for i in self.controller.list_incidents("open", node, 100)
                if i["rule"] == "node-lost"]

    def state(self, node: str) -> object:
        found = self.controller.get_node(node)
        assert found is not None
        return found["state"]


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[Watched]:
    policy = PolicySettings(max_unavailable="100%", node_cooldown=Duration(0))
    # failover waits 20 s after the loss: a loss taken back meanwhile cancels it
    w = Watched(make_harness(tmp_path, rules_from(HEARTBEAT_RULE), settle=20.0,
                             policy=policy))
    yield w
    w.controller.close()
    w.h.store.close()


@pytest.mark.parametrize("where", ["event_loop", "sweep"])
def test_a_node_lost_before_a_stall_stays_lost_until_it_reports(watched: Watched,
                                                                  where: str) -> None:
    w = watched
    alive = ("n2", "n3")
    for node in ("n1", *alive):
        w.report(node)
    for _ in range(24):  # n1 falls silent: lost after the 10 s timeout
        w.step(alive)
    assert len(w.lost_incidents("n1")) == 1
    assert w.state("n1") == "lost"
    assert w.h.fakes["failover"].calls == []  # still settling

    if where == "event_loop":
        # one read of a large document held the loop 1.5 s: no tick meanwhile, while
        # the sweep thread went on (and did not judge heartbeats: reports were waiting)
        for _ in range(3):
            w.clock.advance(0.5)
            w.controller.sweep()
        w.stalls.loop_ticked()  # late: the stall is seen, silent nodes get their grace
    else:
        w.clock.advance(30.0)  # the whole process paused: no tick, no sweep, no report
    w.step(alive)
    seen = f'sn_controller_stall_seconds_count{{where="{where}"}} 1.0'
    assert seen in w.controller.metrics().decode()  # the stall was seen, and forgiven

    for _ in range(60):  # past the grace (12 s) and the failover's settle time
        w.step(alive)
        assert len(w.lost_incidents("n1")) == 1, "the loss was taken back without a report"
        assert w.state("n1") in ("lost", "evicted")
    w.h.settle()
    # the failover is dispatched once the eviction before it succeeded: on a loaded
    # machine it may still be on its way to the fake driver when the runner looks idle
    wait_until(lambda: w.h.fakes["failover"].calls, timeout=30)
    assert [r.node for r in w.h.fakes["failover"].calls] == ["n1"]  # not cancelled

    w.report("n1")  # back: only a report of its own resolves the loss
    assert w.lost_incidents("n1") == []
    assert w.state("n1") != "lost"
