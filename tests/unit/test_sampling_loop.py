"""The agent's sampling loop: fixed-rate slots, missed slots skipped, an orderly stop."""

from __future__ import annotations

import threading

import pytest

from sn_monitor.agent.daemon import SamplingLoop, next_slot


@pytest.mark.parametrize(("due", "now", "expected"), [
    (10.0, 10.2, 11.0),    # on time: the next slot
    (10.0, 10.99, 11.0),
    (10.0, 11.0, 12.0),    # ran a whole period: that slot is gone, not run at once
    (10.0, 13.5, 14.0),    # a long stall (a GC pause, a stopped process): three skipped
    (10.0, 9.0, 11.0),     # woke early: still the slot after ``due``
])
def test_the_next_slot_skips_the_missed_ones(due: float, now: float, expected: float) -> None:
    assert next_slot(due, now, 1.0) == pytest.approx(expected)


def test_the_loop_runs_cycles_until_stopped() -> None:
    calls: list[int] = []
    enough = threading.Event()

    def cycle() -> None:
        calls.append(1)
        if len(calls) >= 3:
            enough.set()

    loop = SamplingLoop(cycle, 0.01)
    loop.start()
    try:
        assert enough.wait(timeout=30)
    finally:
        loop.stop(timeout=30)
    count = len(calls)
    assert count >= 3
    assert not any(t.name == "agent-sample" for t in threading.enumerate())
    assert len(calls) == count  # stopped: no cycle after stop()


def test_a_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        SamplingLoop(lambda: None, 0.0)
