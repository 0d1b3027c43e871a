"""The controller's accounting of workloads: held and idle GPUs, activity, energy.

On a manual clock: a report every 10 s from two nodes, a Kubernetes pod on one and a
Slurm job on the other, one of the job's GPUs left idle.
"""

from __future__ import annotations

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.workloads.accounting import (
    WorkloadAccounting,
    WorkloadKey,
    WorkloadSettings,
    WorkloadUsage,
    workload_key,
)
from sn_monitor.model import GpuReport, GpuWorkloadReport

POD = GpuWorkloadReport(pod="train-0", namespace="ml", container="main")
JOB = GpuWorkloadReport(slurm_job="4242", user="ada", partition="gpu", workload_job="sweep")
POD_KEY = WorkloadKey(namespace="ml", pod="train-0")
JOB_KEY = WorkloadKey(slurm_job="4242")


def gpu(index: int, held: GpuWorkloadReport | None, utilization: float | None,
        energy: float | None = None, memory: int | None = None) -> GpuReport:
    return GpuReport(index=index, utilization_ratio=utilization, energy_joules_total=energy,
                     memory_used_bytes=memory, workloads=[held] if held else [])


def by_key(accounting: WorkloadAccounting) -> dict[WorkloadKey, WorkloadUsage]:
    return {u.key: u for u in accounting.usage()}


@pytest.mark.parametrize(("attribution", "key"), [
    (POD, POD_KEY),
    (GpuWorkloadReport(pod="p", namespace="ml", slurm_job="1", user="u"),
     WorkloadKey(namespace="ml", pod="p")),
    (JOB, JOB_KEY),
    (GpuWorkloadReport(user="bob", container="c0"), WorkloadKey(user="bob")),
    (GpuWorkloadReport(container="c0"), None),
    (GpuWorkloadReport(mig_instance="MIG-1"), None),
])
def test_a_workload_is_keyed_by_its_pod_else_its_job_else_its_user(
        attribution: GpuWorkloadReport, key: WorkloadKey | None) -> None:
    assert workload_key(attribution) == key


def test_the_workload_leaving_a_gpu_idle_counts_it_after_n_minutes_the_other_none() -> None:
    clock = ManualClock()
    accounting = WorkloadAccounting(clock, WorkloadSettings(idle_after=600.0))
    for second in range(0, 660, 10):
        if second:
            clock.advance(10)
        accounting.take("n1", [gpu(0, POD, 0.9), gpu(1, POD, 0.7, memory=2**30)])
        accounting.take("n2", [gpu(0, JOB, 0.8), gpu(1, JOB, 0.01), gpu(2, None, 0.0)])
        if second == 590:  # not yet ten minutes below 5 %
            assert by_key(accounting)[JOB_KEY].idle_gpus == 0
    usage = by_key(accounting)
    assert set(usage) == {POD_KEY, JOB_KEY}  # the unheld GPU is nobody's
    pod, job = usage[POD_KEY], usage[JOB_KEY]
    assert (pod.idle_gpus, len(pod.gpus)) == (0, 2)
    assert (job.idle_gpus, len(job.gpus)) == (1, 2)
    assert [(g.node, g.gpu) for g in job.gpus if g.idle_seconds is not None] == [("n2", 1)]
    assert job.gpus[1].idle_seconds == pytest.approx(650.0)
    assert pod.sm_utilization_ratio == pytest.approx(0.8)
    assert pod.memory_used_bytes == 2**30
    assert (job.job, job.partition) == ("sweep", "gpu")


def test_one_busy_moment_restarts_the_idle_clock_and_so_does_a_new_holder() -> None:
    clock = ManualClock()
    accounting = WorkloadAccounting(clock, WorkloadSettings(idle_after=600.0))
    accounting.take("n1", [gpu(0, JOB, 0.0)])
    clock.advance(590)
    accounting.take("n1", [gpu(0, JOB, 0.5)])  # busy once
    clock.advance(590)
    accounting.take("n1", [gpu(0, JOB, 0.0)])
    assert by_key(accounting)[JOB_KEY].idle_gpus == 0
    clock.advance(20)
    accounting.take("n1", [gpu(0, POD, 0.0)])  # another workload takes the GPU
    clock.advance(599)
    accounting.take("n1", [gpu(0, POD, 0.0)])
    assert by_key(accounting)[POD_KEY].idle_gpus == 0
    clock.advance(1)
    accounting.take("n1", [gpu(0, POD, 0.0)])
    assert by_key(accounting)[POD_KEY].idle_gpus == 1


def test_a_gpu_of_unknown_utilization_is_never_idle() -> None:
    clock = ManualClock()
    accounting = WorkloadAccounting(clock)
    for _ in range(100):
        accounting.take("n1", [gpu(0, POD, None)])
        clock.advance(60)
    usage = by_key(accounting)[POD_KEY]
    assert (usage.idle_gpus, usage.sm_utilization_ratio) == (0, None)


def test_energy_is_the_counters_deltas_while_held_and_a_reset_counts_from_zero() -> None:
    clock = ManualClock()
    accounting = WorkloadAccounting(clock)
    readings = [  # (GPU 0's holder, its counter)
        (None, 1_000.0),    # nobody's: not counted
        (JOB, 1_500.0),     # the job takes it: 1,500 - 1,000 was nobody's
        (JOB, 2_000.0),     # +500 for the job
        (JOB, 300.0),       # the driver reloaded: +300, not -1,700
        (POD, 800.0),       # +500 for the job (it held it until this report)
        (POD, 1_000.0),     # +200 for the pod
    ]
    for holder, counter in readings:
        accounting.take("n1", [gpu(0, holder, 0.5, energy=counter)])
        clock.advance(10)
    usage = by_key(accounting)
    assert usage[JOB_KEY].energy_joules_total == pytest.approx(1_300.0)
    assert usage[POD_KEY].energy_joules_total == pytest.approx(200.0)
    assert usage[JOB_KEY].gpus == ()  # listed, holding nothing now


def test_a_shared_gpu_counts_for_each_holder_and_splits_its_energy() -> None:
    clock = ManualClock()
    accounting = WorkloadAccounting(clock)
    shared = GpuReport(index=0, utilization_ratio=0.5, energy_joules_total=100.0,
                       workloads=[GpuWorkloadReport(mig_instance="MIG-a", user="ann"),
                                  GpuWorkloadReport(mig_instance="MIG-b", user="bob")])
    accounting.take("n1", [shared])
    clock.advance(10)
    accounting.take("n1", [GpuReport(index=0, utilization_ratio=0.5, energy_joules_total=300.0,
                                     workloads=shared.workloads)])
    usage = by_key(accounting)
    for user in ("ann", "bob"):
        assert len(usage[WorkloadKey(user=user)].gpus) == 1
        assert usage[WorkloadKey(user=user)].energy_joules_total == pytest.approx(100.0)


def test_a_silent_node_stops_counting_and_a_gone_workload_is_forgotten() -> None:
    clock = ManualClock()
    settings = WorkloadSettings(stale_after=300.0, forget_after=900.0)
    accounting = WorkloadAccounting(clock, settings)
    accounting.take("n1", [gpu(0, JOB, 0.9, energy=10.0)])
    clock.advance(300)
    assert by_key(accounting)[JOB_KEY].gpus == ()  # its node silent: it holds nothing known
    clock.advance(600)
    assert accounting.usage() == []
