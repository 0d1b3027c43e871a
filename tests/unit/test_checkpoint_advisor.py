"""The checkpoint-interval advisor: Young/Daly, the job's history and the fleet's rate, and
``checkpointInterval: auto`` applying it (status, metric, schedule)."""

from __future__ import annotations

import math

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.jobs.advisor import (
    MIN_INTERVAL,
    PRIOR_SECONDS,
    FleetFaults,
    advise,
    daly,
    expected_waste,
    young,
)
from sn_monitor.controller.storage.store import Store
from sn_monitor.controller.telemetry.metrics import ControllerMetrics, ControllerState
from tests.support.jobs import (
    RecordingSubmit,
    checkpoint,
    make_job,
    node,
    orchestrator,
    train,
)


def test_young_and_daly() -> None:
    assert young(2.0, 7200.0) == pytest.approx(math.sqrt(2 * 2 * 7200))
    # Daly's correction is small when saving is short next to the MTBF ...
    assert daly(2.0, 7200.0) == pytest.approx(young(2.0, 7200.0), rel=0.02)
    # ... and the optimum it gives is a minimum of the first-order waste
    best = daly(30.0, 3600.0)
    assert expected_waste(best, 30.0, 3600.0) <= expected_waste(best * 0.8, 30.0, 3600.0)
    assert expected_waste(best, 30.0, 3600.0) <= expected_waste(best * 1.25, 30.0, 3600.0)
    assert daly(10_000.0, 3600.0) == 3600.0  # saving takes longer than two MTBFs


def test_advice_needs_a_save_time_and_a_failure_rate() -> None:
    assert advise(None, 3, 86400.0, 16, None) is None
    assert advise(2.0, 0, 86400.0, 16, None) is None  # nothing ever failed, fleet unknown
    own = advise(2.0, 12, 86400.0, 16, None)
    assert own is not None
    assert own.mtbf_seconds == pytest.approx(7200.0)
    # a young job with no failure yet takes the fleet's rate: 1 fault per node-day
    fleet = advise(2.0, 0, 600.0, 16, 1 / 86400.0)
    assert fleet is not None
    assert fleet.mtbf_seconds == pytest.approx((600.0 + PRIOR_SECONDS) / (16 * PRIOR_SECONDS
                                                                        / 86400.0))
    tiny = advise(0.001, 1000, 1000.0, 16, None)
    assert tiny is not None
    assert tiny.interval_seconds == MIN_INTERVAL


def test_fleet_faults_are_per_node_second() -> None:
    fleet = FleetFaults()
    assert fleet.rate_per_node_second() is None
    fleet.observe(100, 0.0)
    fleet.observe(100, 3600.0)
    fleet.note_fault()
    assert fleet.rate_per_node_second() == pytest.approx(1 / 360_000.0)


def test_auto_applies_the_recommendation_in_status_metric_and_schedule(tmp_path) -> None:
    clock = ManualClock(1_700_000_000.0)
    store = Store(tmp_path / "c.db")
    submit = RecordingSubmit(store, clock)
    orch = orchestrator(store, clock, submit)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    job = make_job(ckpt, nodes=4, spares=1, max_failures=100)
    job = type(job)(api_version=job.api_version, kind=job.kind, metadata=job.metadata,
                    spec=type(job.spec)(**{**job.spec.__dict__, "checkpoint_interval": "auto"}))
    status = orch.add_job(job, "api")
    assert status.checkpoint_interval_seconds == 900.0  # no history yet: the default
    assert status.checkpoint_interval_recommended_seconds is None
    nodes = [node(i) for i in range(4)]
    train(orch, clock, "train", nodes, 1, 10)
    path = checkpoint(ckpt, 10, clock)
    orch.checkpoint_saved("train", 0, node(0), 10, str(path), save_seconds=5.0)
    # one failure in the job's first hour, no fleet rate: MTBF = the job's age
    clock.advance(3600)
    orch.on_node_fault(node(2), "lost", None, alive=False)
    status = orch.job("train")
    assert status is not None
    assert status.checkpoint_save_seconds == 5.0
    mtbf = clock.time() - status.created_at
    assert status.mtbf_seconds == pytest.approx(mtbf)
    assert status.checkpoint_interval_recommended_seconds == pytest.approx(daly(5.0, mtbf))
    assert status.checkpoint_interval_seconds == status.checkpoint_interval_recommended_seconds
    assert status.to_dict()["checkpoint_interval_recommended_seconds"] == pytest.approx(
        daly(5.0, mtbf))
    text = ControllerMetrics(lambda: ControllerState(jobs=orch.metrics())).render().decode()
    line = next(x for x in text.splitlines()
                if x.startswith("sn_job_checkpoint_interval_recommended_seconds{"))
    assert float(line.split()[-1]) == pytest.approx(daly(5.0, mtbf))
    store.close()
