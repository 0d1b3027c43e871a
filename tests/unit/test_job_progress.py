"""Per-job progress: ranks, median step time, who stopped first, and ETTR."""

from __future__ import annotations

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.jobs.progress import JobProgress
from sn_monitor.controller.storage.store import Store
from tests.support.jobs import (
    RecordingSubmit,
    checkpoint,
    make_job,
    node,
    orchestrator,
    train,
)

T0 = 1000.0


def _steps(p, first, last, start, step_time=1.0, rank=0):
    for i, step in enumerate(range(first, last + 1)):
        when = start + i * step_time
        p.update(rank, "n0", 1, [(step, when)], step_time, when)


def test_steady_progress_is_productive():
    p = JobProgress(max_ranks=8)
    _steps(p, 1, 100, T0 + 1)  # steps 1..100 at T0+1 .. T0+100
    assert p.ledger.productive == pytest.approx(99.0)  # the first step's start is unknown
    assert p.frontier == 100


def test_stalls_and_recomputed_steps_are_not_productive():
    p = JobProgress(max_ranks=8)
    _steps(p, 1, 100, T0 + 1)
    # hung for 100 s, then restored from step 50: 51..100 again, then new steps 101..110
    _steps(p, 51, 100, T0 + 201)
    # 52..100 are redone: their first run no longer counts, their second does (51's
    # first run stands for its second, whose start is not known)
    assert p.ledger.productive == pytest.approx(50.0 + 49.0)
    _steps(p, 101, 110, T0 + 251)
    assert p.ledger.productive == pytest.approx(99.0 + 10.0)


def test_jitter_counts_whole():
    p = JobProgress(max_ranks=8)
    p.update(0, "n0", 1, [(1, T0)], 1.0, T0)
    p.update(0, "n0", 1, [(2, T0 + 1.8)], 1.0, T0 + 1.8)  # slow step, under 2x median
    assert p.ledger.productive == pytest.approx(1.8)


def test_unknown_step_time_counts_gaps_up_to_a_limit():
    p = JobProgress(max_ranks=8, unknown_gap=60)
    p.update(0, "n0", 1, [(1, T0)], None, T0)
    p.update(0, "n0", 1, [(2, T0 + 30)], None, T0 + 30)
    assert p.ledger.productive == pytest.approx(30.0)
    assert p.median_step_time() == pytest.approx(30.0)  # derived from the rank's own steps


def test_median_and_first_stopped():
    p = JobProgress(max_ranks=8)
    for rank, step_time in enumerate([1.0, 2.0, 3.0, 10.0]):
        p.update(rank, f"n{rank}", 4, [(5, T0 + rank)], step_time, T0 + 10)
    assert p.median_step_time() == pytest.approx(2.5)
    assert p.all_reported()
    assert [rank for rank, _ in p.first_stopped()] == [0, 1]  # within half a step time
    assert p.last_step() == 5


def test_bounded_world():
    p = JobProgress(max_ranks=4)
    with pytest.raises(ValueError, match="world_size"):
        p.update(0, "n0", 5, [(1, T0)], None, T0)
    p.update(3, "n3", 4, [(1, T0)], None, T0)
    p.update(0, "n0", 2, [(1, T0)], None, T0)  # the world shrank: rank 3 is forgotten
    assert set(p.ranks) == {0}


def test_ettr_of_a_job_through_a_recovery(tmp_path):
    clock = ManualClock(start=T0)
    store = Store(tmp_path / "db")
    submit = RecordingSubmit(store, clock)
    orch = orchestrator(store, clock, submit)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    nodes = [node(i) for i in range(4)]
    orch.add_job(make_job(ckpt, nodes=4, spares=1, hang=3600), "api")
    train(orch, clock, "train", nodes, 1, 100)  # T0+1 .. T0+100
    checkpoint(ckpt, 50, clock)
    metrics = orch.metrics().jobs["train"]
    # from its first step (T0+1): neither that step's time nor its credit is known
    assert metrics.effective_training_ratio == pytest.approx(99 / 99)
    clock.advance(100)  # broken for 100 s
    [status] = orch.on_node_fault(node(2), "lost", None, alive=False)
    assert status.checkpoint == {"step": 50, "path": str(ckpt / "step_000000050")}
    new_nodes = [node(0), node(1), node(4), node(3)]
    train(orch, clock, "train", new_nodes, 51, 110)  # 50 recomputed, 10 new
    assert orch.recovery(status.id).state == "done"
    metrics = orch.metrics().jobs["train"]
    assert metrics.productive_seconds == pytest.approx(109.0)
    assert metrics.effective_training_ratio == pytest.approx(109 / 259)
    assert metrics.state == "running"
    assert metrics.generation == 1
    assert metrics.failures_total == 1
    assert metrics.nodes == 4
    assert metrics.spares == 0
    assert metrics.checkpoint_age_seconds == pytest.approx(160.0)
    # the counters survive a restart
    orch.save_all()
    store.close()
    store = Store(tmp_path / "db")
    again = orchestrator(store, clock, RecordingSubmit(store, clock))
    assert again.metrics().jobs["train"].productive_seconds == pytest.approx(109.0)
    assert again.metrics().jobs["train"].effective_training_ratio == pytest.approx(109 / 259)
    store.close()


def test_recent_step_time_is_the_frontiers_pace_over_its_last_seconds():
    p = JobProgress(max_ranks=8)
    assert p.recent_step_time() is None
    for step in range(1, 41):  # 1 s a step, then 1.5 s: the ranks' medians lag, this does not
        p.update(0, "n0", 1, [(step, 1000.0 + step)], 1.0, 1000.0 + step)
    for step in range(41, 61):
        p.update(0, "n0", 1, [(step, 1040.0 + (step - 40) * 1.5)], 1.0, 1070.0)
    assert p.recent_step_time(window=30.0) == pytest.approx(1.5)
    assert p.recent_step_time(window=60.0) == pytest.approx((1070 - 1010) / 50)
    p.reset_ranks()  # a new generation measures its own pace
    assert p.recent_step_time() is None
