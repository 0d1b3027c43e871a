"""Whose workload is on each GPU: sources joined to the fake NVML's GPUs, failing soft."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest

from sn_monitor.agent.collectors.attribution import WorkloadAttribution
from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.snapshot import (
    GpuProcess,
    GpuSample,
    GpuWorkload,
    MigInstanceSample,
    SourceStatus,
)
from sn_monitor.agent.workloads.join import (
    AllocationIndex,
    claimed_workloads,
    device_names,
    gpu_workloads,
    workload_of,
)
from sn_monitor.agent.workloads.model import DeviceAllocation, SourceUnavailable, Workload
from sn_monitor.clock import ManualClock
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import make_gpus
from tests.conftest import FIXTURES

PROC = FIXTURES / "h100-node" / "proc"
POD = "8e1a2c4b-5d6f-4a7b-9c8d-0e1f2a3b4c5d"
TRAINER = Workload(pod="trainer-0", namespace="ml", container="pytorch", job="llama")
SLURM = Workload(slurm_job="4711", user="alice", partition="gpu", job="pretrain")


class ListedSource:
    """An allocation source that answers what the test lists, or fails while ``down``."""

    def __init__(self, name: str, allocations: tuple[DeviceAllocation, ...] = ()) -> None:
        self.name = name
        self.listed = allocations
        self.down = False
        self.calls = 0

    def allocations(self) -> tuple[DeviceAllocation, ...]:
        self.calls += 1
        if self.down:
            raise SourceUnavailable(self.name, "socket missing")
        return self.listed


@pytest.fixture(autouse=True)
def _clean_fake() -> Iterator[None]:
    yield
    fake_nvml.reset()


def gpu(index: int, *, minor: int | None = None,
        processes: tuple[GpuProcess, ...] | None = ()) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index}", name="H100", pci_bus_id="0000:18:00.0",
                     minor_number=minor, processes=processes)


def join(gpus: tuple[GpuSample, ...] | list[GpuSample], allocations: list[DeviceAllocation]
         ) -> tuple[list[tuple[GpuWorkload, ...]], tuple[str, ...]]:
    """Each GPU's workloads, and the device names no GPU answers to."""
    claims, unmatched = claimed_workloads(gpus, allocations)
    return [gpu_workloads(claimed, g.processes or ())
            for g, claimed in zip(gpus, claims, strict=True)], unmatched


def allocation(device: str, workload: Workload, source: str = "kubelet",
               replica: int | None = None) -> DeviceAllocation:
    return DeviceAllocation(device=device, resource="nvidia.com/gpu", workload=workload,
                            source=source, replica=replica)


def test_allocations_join_gpus_by_uuid_and_minor_number() -> None:
    gpus = (gpu(0, minor=3), gpu(1, minor=0))
    joined, unmatched = join(gpus, [
        allocation("GPU-0", TRAINER),
        allocation("minor:0", SLURM, source="slurm"),
        allocation("GPU-9", TRAINER),  # another node's GPU
        allocation("minor:1", SLURM, source="slurm"),  # minor 1 is no GPU here
    ])
    assert joined[0] == (GpuWorkload(pod="trainer-0", namespace="ml",
                                               container="pytorch", workload_job="llama"),)
    # minor:0 is GPU 1 (NVML's order need not be the device files')
    assert joined[1] == (GpuWorkload(slurm_job="4711", user="alice", partition="gpu",
                                               workload_job="pretrain"),)
    assert unmatched == ("GPU-9", "minor:1")


def test_one_workload_per_gpu_however_many_replicas_and_sources_name_it() -> None:
    other = Workload(pod="infer-1", namespace="serving", container="vllm")
    joined, _ = join([gpu(0)], [
        allocation("GPU-0", TRAINER, replica=0),
        allocation("GPU-0", TRAINER, replica=1),
        allocation("GPU-0", other, replica=2),
    ])
    assert [w.pod for w in joined[0]] == ["trainer-0", "infer-1"]  # by namespace


def test_an_allocated_gpu_without_processes_still_has_its_workload() -> None:
    joined, _ = join([gpu(0, processes=())], [allocation("GPU-0", SLURM, "slurm")])
    assert joined[0][0].slurm_job == "4711"


def test_a_gpu_no_source_claims_gets_its_processes_users() -> None:
    processes = (GpuProcess(1, user="alice"), GpuProcess(2, user="alice"),
                 GpuProcess(3, user="bob"), GpuProcess(4))  # 4: gone before it was read
    joined, _ = join([gpu(0, processes=processes), gpu(1, processes=None)], [])
    assert joined[0] == (GpuWorkload(user="alice"), GpuWorkload(user="bob"))
    assert joined[1] == ()


def test_where_a_source_claims_the_gpu_its_answer_stands_over_the_processes() -> None:
    processes = (GpuProcess(1, user="root", pod_uid=POD),)
    joined, _ = join([gpu(0, processes=processes)], [allocation("GPU-0", TRAINER)])
    assert [w.pod for w in joined[0]] == ["trainer-0"]


def test_a_mig_uuid_without_enumerated_instances_matches_no_gpu() -> None:
    mig = "MIG-4f5b1a2c-0000-0000-0000-000000000000"
    index = AllocationIndex([allocation("GPU-0", TRAINER), allocation("minor:0", SLURM, "slurm"),
                             allocation(mig, TRAINER)])
    plain = gpu(0, minor=0)
    assert index.claims(device_names(plain.uuid, plain.minor_number, ())) == {
        workload_of(TRAINER), workload_of(SLURM)}
    assert index.unmatched() == (mig,)


def test_a_mig_allocation_lands_on_its_instance_and_mig_users_are_per_instance() -> None:
    instances = (
        MigInstanceSample(uuid="MIG-a", gpu_instance_id=7, compute_instance_id=0,
                          processes=(GpuProcess(10, user="bob"),)),
        MigInstanceSample(uuid="MIG-b", gpu_instance_id=8, compute_instance_id=0,
                          processes=(GpuProcess(11, user="carol", slurm_job="42"),)))
    parent = replace(gpu(0), mig_instances=instances,
                     processes=(GpuProcess(10, user="bob"), GpuProcess(11, user="carol")))
    assert AllocationIndex([allocation("MIG-b", TRAINER)]).claims(
        device_names(parent.uuid, parent.minor_number, instances)) == {
        workload_of(TRAINER, "MIG-b")}
    (claimed,), unmatched = join([parent], [allocation("MIG-a", TRAINER)])
    assert unmatched == ()
    assert claimed == (workload_of(TRAINER, "MIG-a"),)
    # no source: each MIG device's processes on it, a Slurm job as the process's own
    claims, _ = claimed_workloads([parent], [])
    assert gpu_workloads(claims[0], parent.processes or (), instances) == (
        GpuWorkload(mig_instance="MIG-a", user="bob"),
        GpuWorkload(mig_instance="MIG-b", user="carol", slurm_job="42"))


def test_the_nvml_collector_identifies_processes_and_joins_the_sources() -> None:
    gpus = make_gpus(2)
    gpus[0].set_processes([(4242, 60 * 2**30), (999999, 2**20)])
    gpus[1].minor_number = 7
    fake_nvml.configure(gpus)
    kubelet = ListedSource("kubelet", (allocation(gpus[0].uuid, TRAINER),))
    slurm = ListedSource("slurm", (allocation("minor:7", SLURM, "slurm"),))
    collector = NvmlCollector(fake_nvml, ManualClock(), procfs=PROC, sources=[kubelet, slurm])
    collected = collector.collect()
    first, second = collected.gpus
    assert (first.minor_number, second.minor_number) == (0, 7)
    trainer = first.processes[0] if first.processes else None
    assert trainer is not None
    assert (trainer.pid, trainer.command, trainer.user, trainer.pod_uid) == (
        4242, "python3", "root", POD)
    # gone before /proc was read: its pid, and what NVML said of it
    assert first.processes[1] == GpuProcess(999999, 2**20, sm_utilization_ratio=0.0)
    assert [w.pod for w in first.workloads] == ["trainer-0"]
    assert [w.slurm_job for w in second.workloads] == ["4711"]
    assert collected.sources == (SourceStatus("kubelet", True), SourceStatus("slurm", True))
    # Without a procfs root: NVML's pid and memory only, and the sources still joined.
    bare = NvmlCollector(fake_nvml, ManualClock(), sources=[kubelet]).collect().gpus[0]
    assert bare.processes is not None
    assert [(p.pid, p.command, p.user) for p in bare.processes] == [
        (4242, None, None), (999999, None, None)]
    assert [w.pod for w in bare.workloads] == ["trainer-0"]


def test_a_source_down_is_left_out_logged_once_per_outage_and_reported(caplog) -> None:
    gpus = make_gpus(1)
    fake_nvml.configure(gpus)
    kubelet = ListedSource("kubelet", (allocation(gpus[0].uuid, TRAINER),))
    slurm = ListedSource("slurm", (allocation(gpus[0].uuid, SLURM, "slurm"),))
    collector = NvmlCollector(fake_nvml, ManualClock(), sources=[kubelet, slurm])
    caplog.set_level(logging.DEBUG, logger="sn_monitor.agent.collectors.attribution")

    def cycle() -> tuple[tuple[str | None, ...], tuple[bool, ...]]:
        collected = collector.collect()
        return (tuple(w.pod or w.slurm_job for w in collected.gpus[0].workloads),
                tuple(s.up for s in collected.sources))

    kubelet.down = True
    assert cycle() == (("4711",), (False, True))  # the sample goes on without it
    assert cycle() == (("4711",), (False, True))
    kubelet.down = False
    assert cycle() == (("4711", "trainer-0"), (True, True))  # namespace "" sorts first
    kubelet.down = True
    assert cycle() == (("4711",), (False, True))
    assert cycle() == (("4711",), (False, True))
    outages = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(outages) == 2
    assert all("kubelet" in r.getMessage() and "socket missing" in r.getMessage()
               for r in outages)
    assert kubelet.calls == 5  # asked every cycle, down or not


def test_sources_need_distinct_names() -> None:
    with pytest.raises(ValueError, match="distinct"):
        WorkloadAttribution(None, [ListedSource("kubelet"), ListedSource("kubelet")])
