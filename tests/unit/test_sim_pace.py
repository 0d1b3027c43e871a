"""The demo job's pace under fail-slow faults: the ranks' step time follows the slowest
GPU or link of the job's nodes, as sim/failslow.py's model says."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sn_monitor.sim.failslow import (
    COMPUTE_SECONDS,
    INTER_NODE_SECONDS,
    INTRA_NODE_SECONDS,
    FailSlowFault,
    fault_slowdown,
)
from sn_monitor.sim.node_tree import congestion_share
from sn_monitor.sim.pace import Pace, PaceBook, read_faults, standing_fault
from sn_monitor.sim.train import job_pace, step_seconds

JOB_NODES = ("sim-0000", "sim-0001", "sim-0002")
BASE = COMPUTE_SECONDS + INTER_NODE_SECONDS + INTRA_NODE_SECONDS


def _book(tmp_path: Path) -> tuple[PaceBook, Pace]:
    book = PaceBook(tmp_path / "pace.json")
    return book, Pace(book.path, JOB_NODES)


def test_a_healthy_job_keeps_its_pace(tmp_path: Path):
    book, pace = _book(tmp_path)
    assert pace.factor() == 1.0
    book.play("sim-0001", "overheat", 3, {"factor": 1.8})  # not a fail-slow fault
    assert pace.factor() == 1.0
    assert Pace(tmp_path / "missing.json", JOB_NODES).factor() == 1.0


def test_a_nic_at_half_rate_slows_every_rank_by_the_model_s_inter_node_phase(tmp_path: Path):
    book, pace = _book(tmp_path)
    book.play("sim-0002", "nic-degraded", None, {"device": "mlx5_3", "rate_gbps": 200.0})
    # the all-reduce over the rails at half the rate: that phase takes twice as long
    expected = (COMPUTE_SECONDS + 2 * INTER_NODE_SECONDS + INTRA_NODE_SECONDS) / BASE
    assert pace.factor() == pytest.approx(expected)
    assert step_seconds(0.1, pace) == pytest.approx(0.1 * expected)
    assert step_seconds(0.1, None) == 0.1
    (fault,) = read_faults(book.path)
    assert (fault.node, fault.kind, fault.link, fault.rail) == ("sim-0002", "nic-degraded",
                                                                "mlx5_3", 3)
    book.play("sim-0002", "nic-degraded-cleared", None, {"device": "mlx5_3"})
    assert pace.factor() == 1.0


def test_the_slowest_gpu_sets_the_pace_and_a_spare_slows_nothing(tmp_path: Path):
    book, pace = _book(tmp_path)
    book.play("sim-0009", "gpu-throttled", 2, {"ratio": 0.3})  # a spare: not the job's
    assert pace.factor() == 1.0
    book.play("sim-0000", "gpu-throttled", 1, {"ratio": 0.8})
    book.play("sim-0001", "gpu-throttled", 5, {"ratio": 0.6})
    slowest = (COMPUTE_SECONDS / 0.6 + INTER_NODE_SECONDS + INTRA_NODE_SECONDS) / BASE
    assert pace.factor() == pytest.approx(slowest)
    book.play("sim-0001", "gpu-throttled-cleared", 5, {})
    assert pace.factor() == pytest.approx(
        (COMPUTE_SECONDS / 0.8 + INTER_NODE_SECONDS + INTRA_NODE_SECONDS) / BASE)
    book.play("sim-0000", "fail-slow-clear", None, {})
    assert pace.factor() == 1.0


@pytest.mark.parametrize(("fault", "gpu", "params", "kind", "link", "severity"), [
    ("congested-link", None, {"device": "mlx5_1", "factor": 60.0}, "congested-link", "mlx5_1",
     1 / congestion_share(60.0)),
    ("nic-degraded", None, {"device": "mlx5_4"}, "nic-degraded", "mlx5_4", 200.0),
    ("nvlink-slow", 6, {"bandwidth_ratio": 0.5}, "nvlink-slow", "gpu6/nvlink", 0.5),
    ("gpu-throttled", 3, {}, "gpu-throttled", "gpu3", 0.7),
    ("noisy-neighbour", 0, {"share": 0.4}, "noisy-neighbour", "gpu0", 0.4),
])
def test_each_kind_becomes_the_model_s_fault_with_the_simulated_node_s_defaults(
        fault, gpu, params, kind, link, severity):
    made = standing_fault(fault, "sim-0001", gpu, params)
    assert made is not None
    assert (made.kind, made.link, made.gpu) == (kind, link, gpu)
    assert made.severity == pytest.approx(severity)
    # every kind of the five slows the job in the model (by its own amount)
    assert fault_slowdown([made]) > 0
    assert made.standing(1e12)
    assert made.end == math.inf


def test_a_rank_reads_the_job_s_nodes_from_the_launcher(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    book = PaceBook(tmp_path / "pace.json")
    book.play("sim-0007", "gpu-throttled", 0, {"ratio": 0.5})
    monkeypatch.setenv("SN_JOB_NODES", "sim-0000,sim-0001")
    pace = job_pace(book.path)
    assert pace is not None
    assert pace.factor() == 1.0
    monkeypatch.setenv("SN_JOB_NODES", "sim-0000,sim-0007")
    pace = job_pace(book.path)
    assert pace is not None
    assert pace.factor() > 1.3
    assert job_pace(None) is None


def test_a_file_that_is_not_a_pace_file_is_refused(tmp_path: Path):
    bad = tmp_path / "pace.json"
    bad.write_text('{"faults": [{"node": "n"}]}')
    with pytest.raises(ValueError, match="not a pace file"):
        read_faults(bad)
    assert isinstance(standing_fault("gpu-throttled", "n", 1, {}), FailSlowFault)
