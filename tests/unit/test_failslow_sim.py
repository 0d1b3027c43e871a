"""The simulated-time fail-slow job: healthy reports as agents send them, and each fault
slowing the job the way it would while its node's counters show where."""

from __future__ import annotations

import random
import statistics

import msgspec
import pytest

from sn_monitor.model import Report, topology_digest
from sn_monitor.sim.failslow import (
    FAIL_SLOW_KINDS,
    FailSlowFault,
    FailSlowJob,
    fault_slowdown,
)

HEALTHY_STEP = 4.0


def _run(job: FailSlowJob, ticks: int):
    return [job.tick() for _ in range(ticks)]


def _rate(ticks, node, read):
    """Per second between the first and the last tick, of ``read(report)``."""
    first = next(r for r in ticks[0].reports if r.node == node)
    last = next(r for r in ticks[-1].reports if r.node == node)
    return (read(last) - read(first)) / (ticks[-1].time - ticks[0].time)


def _port(report, device):
    return next(p for p in report.infiniband if p.device == device)


def test_healthy_reports_are_valid_wire_reports_with_the_topology_once():
    job = FailSlowJob(4, seed=3, spare_nodes=1)
    ticks = _run(job, 30)
    decoder = msgspec.json.Decoder(Report)
    for tick in ticks:
        assert len(tick.reports) == 5
        for report in tick.reports:
            assert decoder.decode(msgspec.json.encode(report)) == report
    first = ticks[0].reports[0]
    assert first.topology is not None
    assert first.topology_digest == topology_digest(first.topology)
    assert all(t.reports[0].topology is None for t in ticks[1:])
    assert [r.sequence for r in (t.reports[0] for t in ticks[:3])] == [1, 2, 3]
    steps = [t.step_time_seconds for t in ticks]
    assert HEALTHY_STEP * 0.9 < statistics.median(steps) < HEALTHY_STEP * 1.1


def test_the_topology_is_an_hgx_node_on_a_rail_optimised_fabric():
    topology = FailSlowJob(2, seed=1).topology("node-0001")
    assert topology.nvswitches == 4
    assert len(topology.gpus) == 8
    for gpu in topology.gpus:
        assert gpu.nvlinks == 18
        assert sorted(p.links for p in gpu.peers) == [4, 4, 5, 5]
        assert gpu.nics[f"mlx5_{gpu.index}"] == "PIX"
        assert gpu.numa_node == gpu.index // 4
    rails = [n for n in topology.nics if n.role == "rail"]
    assert [(n.device, n.rail) for n in rails] == [(f"mlx5_{i}", i) for i in range(8)]
    assert all(n.ports[0].rate_bytes_per_second == 50e9 for n in rails)
    assert [n.device for n in topology.nics if n.role == "storage"] == ["mlx5_8", "mlx5_9"]


@pytest.mark.parametrize("kind", FAIL_SLOW_KINDS)
def test_each_fault_slows_the_job_and_its_node_shows_why(kind):
    job = FailSlowJob(8, seed=11)
    fault = job.random_fault(kind, random.Random(5), job.now + 1, 600.0, node="node-0003")
    job.schedule(fault)
    ticks = _run(job, 24)[2:]
    slowdown = statistics.median(t.step_time_seconds for t in ticks) / HEALTHY_STEP - 1
    assert slowdown == pytest.approx(fault_slowdown([fault]), abs=0.04)
    assert slowdown > 0.05
    last = next(r for r in ticks[-1].reports if r.node == "node-0003")
    peer = next(r for r in ticks[-1].reports if r.node == "node-0004")
    if kind in ("congested-link", "nic-degraded"):
        device = fault.link

        def wait(r: Report) -> float:
            return _port(r, device).counters["transmit_wait"]

        assert _rate(ticks, "node-0003", wait) > 2.5 * _rate(ticks, "node-0005", wait)
        if kind == "nic-degraded":
            assert _port(last, device).rate_bytes_per_second == fault.severity * 1e9 / 8
            assert _port(peer, device).rate_bytes_per_second == 50e9
    else:
        assert fault.gpu is not None
        gpu, other = last.gpus[fault.gpu], peer.gpus[fault.gpu]
        if kind == "nvlink-slow":
            def errors(r: Report) -> float:
                return r.gpus[fault.gpu].nvlink_replay_errors_total or 0

            assert _rate(ticks, "node-0003", errors) > 10
            assert _rate(ticks, "node-0004", errors) == 0
            assert gpu.nvlinks_down == fault.nvlinks_down
        elif kind == "gpu-throttled":
            assert gpu.sm_clock_hertz < 0.87 * other.sm_clock_hertz
            assert gpu.throttle_reasons == list(fault.reasons)
        else:
            assert (gpu.processes, other.processes) == (2, 1)
            assert gpu.utilization_ratio > 0.9


def test_a_fault_ends_and_the_job_is_healthy_again():
    job = FailSlowJob(4, seed=2)
    job.schedule(FailSlowFault("gpu-throttled", "node-0001", "gpu2", job.now + 1,
                               job.now + 30, 0.6, gpu=2, reasons=("sw_power_cap",)))
    slow = _run(job, 5)
    assert min(t.step_time_seconds for t in slow) > 1.25 * HEALTHY_STEP
    _run(job, 1)
    assert job.standing_faults() == []
    healthy = _run(job, 10)
    assert statistics.median(t.step_time_seconds for t in healthy) < 1.1 * HEALTHY_STEP
    report = next(r for r in healthy[-1].reports if r.node == "node-0001")
    assert report.gpus[2].throttle_reasons == []


def test_a_degraded_link_sends_the_changed_topology_with_a_new_digest():
    job = FailSlowJob(2, seed=4)
    before = job.tick().reports[0]
    job.schedule(FailSlowFault("nic-degraded", "node-0000", "mlx5_5", job.now + 1,
                               job.now + 600, 200.0, rail=5))
    carried = [r for t in _run(job, 20) for r in t.reports
               if r.node == "node-0000" and r.topology is not None]
    assert len(carried) == 1
    assert carried[0].topology_digest != before.topology_digest
    nic = next(n for n in carried[0].topology.nics if n.device == "mlx5_5")
    assert nic.ports[0].rate_bytes_per_second == 25e9


def test_distractors_do_not_slow_the_job():
    job = FailSlowJob(4, seed=9, spare_nodes=2)
    rng = random.Random(1)
    for kind in ("storage-congestion", "spare-gpu-throttled"):
        job.schedule(job.random_distractor(kind, rng, job.now + 1, 600.0))
    ticks = _run(job, 20)
    assert statistics.median(t.step_time_seconds for t in ticks) < 1.1 * HEALTHY_STEP
    spare = [r for r in ticks[-1].reports if r.node.startswith("spare-")]
    assert any(g.throttle_reasons and "gpu_idle" not in g.throttle_reasons
               for r in spare for g in r.gpus)


def test_a_seed_repeats_the_run():
    def run(seed: int) -> list[float]:
        job = FailSlowJob(3, seed=seed)
        return [t.step_time_seconds for t in _run(job, 5)]

    assert run(1) == run(1)
    assert run(1) != run(2)
