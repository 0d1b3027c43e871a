"""MIG on the fake NVML, through the adapter, the nvml collector and the exposition.

One H100 cut into seven 1g.10gb MIG devices, two workloads on two of them (the pids of
the h100-node fixture, one in a Kubernetes pod, one in a docker container): each MIG
device's memory and processes in the snapshot and on /metrics; the parent's utilization
absent and not an error; an empty slot skipped; a MIG mode change probing again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest

from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.exporter import SnapshotCollector
from sn_monitor.agent.exposition import TextRenderer
from sn_monitor.agent.nvml.mig import MODE_INTERVAL_SECONDS, mig_profile
from sn_monitor.agent.snapshot import Collected, GpuSample, NodeSnapshot
from sn_monitor.clock import ManualClock
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import A100_SXM, H100_SXM, SimulatedGpu
from sn_monitor.sim.mig import MAX_MIG_DEVICES, MigError
from tests.conftest import FIXTURES, assert_promtool_clean

GIB = 1024**3
MIB = 1024**2
PROCFS = FIXTURES / "h100-node" / "proc"
POD_UID = "8e1a2c4b-5d6f-4a7b-9c8d-0e1f2a3b4c5d"  # pid 4242's kubepods cgroup


@pytest.fixture(autouse=True)
def _clean_fake() -> Iterator[None]:
    yield
    fake_nvml.reset()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def mig_gpu(index: int = 0, instances: int = 7, *, gpm: bool = True) -> SimulatedGpu:
    """An H100 in MIG mode with ``instances`` 1g.10gb MIG devices, slots 0 up."""
    gpu = SimulatedGpu(index, replace(H100_SXM, gpm_supported=gpm), seed=3)
    gpu.mig.enable()
    gpu.mig.create(["1g.10gb"] * instances)
    return gpu


def collector(gpus: list[SimulatedGpu], clock: ManualClock) -> NvmlCollector:
    fake_nvml.configure(gpus)
    return NvmlCollector(fake_nvml, clock, procfs=PROCFS)


def cycle(nvml: NvmlCollector, gpus: list[SimulatedGpu], clock: ManualClock) -> Collected:
    for gpu in gpus:
        gpu.step(1.0)
    clock.advance(1.0)
    return nvml.collect()


def metrics(gpus: tuple[GpuSample, ...]) -> str:
    snapshot = NodeSnapshot(node="n", timestamp_seconds=1.0, gpus=gpus)
    return TextRenderer().render(SnapshotCollector(lambda: snapshot).families()).decode()


def series(text: str, family: str) -> dict[str, float]:
    """``family``'s series by their gpu_instance label (or gpu label), to their values."""
    out = {}
    for line in text.splitlines():
        if line.startswith(family + "{"):
            labels, value = line.rsplit(" ", 1)
            key = "gpu_instance" if 'gpu_instance="' in labels else "gpu"
            out[labels.split(f'{key}="')[1].split('"')[0]] = float(value)
    return out


def test_seven_instances_two_workloads_in_the_snapshot_and_on_metrics(clock):
    gpu, whole = mig_gpu(0), SimulatedGpu(1, H100_SXM, seed=3)
    first, *_, fourth, _, _, _ = gpu.mig.instances
    first.set_processes([(4242, 6 * GIB)])  # a pod's training job
    fourth.set_processes([(4243, 3 * GIB)])  # a docker container's notebook
    nvml = collector([gpu, whole], clock)
    cycle(nvml, [gpu, whole], clock)
    sample, plain = cycle(nvml, [gpu, whole], clock).gpus

    assert (sample.mig_mode, sample.mig_mode_pending) == (True, True)
    assert [m.gpu_instance_id for m in sample.mig_instances] == [7, 8, 9, 10, 11, 12, 13]
    assert {m.compute_instance_id for m in sample.mig_instances} == {0}
    assert {m.profile for m in sample.mig_instances} == {"1g.10gb"}
    assert {m.memory_total_bytes for m in sample.mig_instances} == {9984 * MIB}
    assert len({m.uuid for m in sample.mig_instances}) == 7
    assert all(m.uuid.startswith("MIG-") for m in sample.mig_instances)
    by_gi = {m.gpu_instance_id: m for m in sample.mig_instances}
    assert by_gi[7].uuid == first.uuid
    assert by_gi[7].memory_used_bytes == 6 * GIB
    (training,) = by_gi[7].processes or ()
    assert (training.pid, training.used_memory_bytes, training.pod_uid) == (4242, 6 * GIB, POD_UID)
    (notebook,) = by_gi[10].processes or ()
    assert (notebook.pid, notebook.pod_uid) == (4243, None)
    assert notebook.container_id is not None
    assert notebook.container_id.startswith("5a6b7c8d")
    assert all(by_gi[gi].processes == () for gi in (8, 9, 11, 12, 13))
    # the parent: every instance's processes and memory, no utilization
    assert sorted(p.pid for p in sample.processes or ()) == [4242, 4243]
    assert sample.memory_used_bytes == 9 * GIB
    assert sample.utilization_ratio is None
    assert sample.memory_utilization_ratio is None
    assert not sample.lost
    assert plain.mig_mode is False
    assert plain.mig_instances == ()
    assert plain.utilization_ratio is not None

    text = metrics((sample, plain))
    assert series(text, "sn_gpu_mig_mode") == {"0": 1.0, "1": 0.0}
    assert len(series(text, "sn_mig_info")) == 7
    assert series(text, "sn_mig_processes") == {
        "7": 1.0, "8": 0.0, "9": 0.0, "10": 1.0, "11": 0.0, "12": 0.0, "13": 0.0}
    used = series(text, "sn_mig_memory_used_bytes")
    assert (used["7"], used["10"], used["8"]) == (6 * GIB, 3 * GIB, 0.0)
    assert set(series(text, "sn_mig_memory_total_bytes").values()) == {9984 * MIB}
    assert series(text, "sn_gpu_utilization_ratio").keys() == {"1"}
    assert (f'sn_mig_info{{compute_instance="0",gpu="0",gpu_instance="7",mig_uuid="{first.uuid}",'
            f'profile="1g.10gb",uuid="{gpu.uuid}"}} 1.0') in text
    assert_promtool_clean(text)


def test_utilization_on_a_mig_parent_is_absent_not_an_error(clock, caplog):
    gpu = mig_gpu(0)
    nvml = collector([gpu], clock)
    with caplog.at_level(logging.INFO):
        samples = [cycle(nvml, [gpu], clock).gpus[0] for _ in range(3)]
    assert all(s.utilization_ratio is None and not s.lost for s in samples)
    assert not [r for r in caplog.records if r.levelno >= logging.INFO], caplog.text
    assert fake_nvml.call_count("nvmlDeviceGetUtilizationRates") == 1  # absent: asked once


def test_an_empty_slot_is_skipped_without_a_word(clock, caplog):
    gpu = mig_gpu(0, instances=7)
    gpu.mig.destroy(9)  # the third slot is empty from now on
    nvml = collector([gpu], clock)
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            sample = cycle(nvml, [gpu], clock).gpus[0]
    assert [m.gpu_instance_id for m in sample.mig_instances] == [7, 8, 10, 11, 12, 13]
    assert fake_nvml.call_count("nvmlDeviceGetMigDeviceHandleByIndex") == 2 * MAX_MIG_DEVICES
    assert not caplog.records, caplog.text


def test_a_destroyed_instance_leaves_the_next_cycle(clock):
    gpu = mig_gpu(0, instances=3)
    nvml = collector([gpu], clock)
    assert len(cycle(nvml, [gpu], clock).gpus[0].mig_instances) == 3
    gpu.mig.destroy(8)
    gpu.mig.create(["2g.20gb"])  # into the freed slot, GPU instance 3
    sample = cycle(nvml, [gpu], clock).gpus[0]
    assert [(m.gpu_instance_id, m.profile) for m in sample.mig_instances] == [
        (7, "1g.10gb"), (3, "2g.20gb"), (9, "1g.10gb")]


def test_a_mig_mode_change_probes_the_gpu_again(clock, caplog):
    gpu = SimulatedGpu(0, H100_SXM, seed=3)
    nvml = collector([gpu], clock)
    before = cycle(nvml, [gpu], clock).gpus[0]
    assert before.mig_mode is False
    assert before.utilization_ratio is not None

    gpu.mig.enable()
    gpu.mig.create(["3g.40gb", "3g.40gb"])
    modes = fake_nvml.call_count("nvmlDeviceGetMigMode")
    assert cycle(nvml, [gpu], clock).gpus[0].mig_mode is False  # read every 10 s, not now
    assert fake_nvml.call_count("nvmlDeviceGetMigMode") == modes
    clock.advance(MODE_INTERVAL_SECONDS)
    with caplog.at_level(logging.INFO):
        enabled = [cycle(nvml, [gpu], clock).gpus[0] for _ in range(2)]
    assert [s.utilization_ratio for s in enabled] == [None, None]
    assert [m.gpu_instance_id for m in enabled[-1].mig_instances] == [1, 2]
    assert "MIG mode enabled" in caplog.text

    gpu.mig.disable()
    clock.advance(MODE_INTERVAL_SECONDS)
    asked = fake_nvml.call_count("nvmlDeviceGetUtilizationRates")
    after = cycle(nvml, [gpu], clock).gpus[0]
    assert fake_nvml.call_count("nvmlDeviceGetUtilizationRates") == asked + 1  # re-probed
    assert after.mig_mode is False
    assert after.mig_instances == ()
    assert after.utilization_ratio is not None


def test_gpm_gives_each_gpu_instance_its_activity(clock):
    gpu = mig_gpu(0, instances=2)
    busy, idle = gpu.mig.instances
    busy.set_load(0.8)
    nvml = collector([gpu], clock)
    first = cycle(nvml, [gpu], clock).gpus[0]
    assert {m.sm_utilization_ratio for m in first.mig_instances} == {None}  # no span yet
    second = cycle(nvml, [gpu], clock).gpus[0]
    by_gi = {m.gpu_instance_id: m for m in second.mig_instances}
    assert by_gi[busy.gpu_instance_id].sm_utilization_ratio == pytest.approx(0.8)
    assert by_gi[busy.gpu_instance_id].memory_bandwidth_utilization_ratio == pytest.approx(0.6)
    assert by_gi[idle.gpu_instance_id].sm_utilization_ratio == 0.0
    text = metrics((second,))
    assert series(text, "sn_mig_sm_utilization_ratio")[str(busy.gpu_instance_id)] == (
        pytest.approx(0.8))


def test_without_gpm_the_activity_is_left_out(clock):
    gpu = mig_gpu(0, instances=2, gpm=False)
    nvml = collector([gpu], clock)
    for _ in range(2):
        sample = cycle(nvml, [gpu], clock).gpus[0]
    assert {m.sm_utilization_ratio for m in sample.mig_instances} == {None}
    assert fake_nvml.call_count("nvmlGpmMigSampleGet") == 0
    assert "sn_mig_sm_utilization_ratio" not in metrics((sample,))


def test_a_gpu_without_mig_is_asked_once(clock):
    gpu = SimulatedGpu(0, A100_SXM, seed=3)  # the simulated A100 has no MIG profiles
    nvml = collector([gpu], clock)
    for _ in range(3):
        sample = cycle(nvml, [gpu], clock).gpus[0]
    assert (sample.mig_mode, sample.mig_instances) == (None, ())
    assert fake_nvml.call_count("nvmlDeviceGetMigMode") == 1
    assert "sn_gpu_mig_mode" not in metrics((sample,))


def test_a_lost_mig_gpu_keeps_its_identity_and_no_instances(clock):
    gpu = mig_gpu(0, instances=2)
    nvml = collector([gpu], clock)
    cycle(nvml, [gpu], clock)
    gpu.fall_off_bus()
    collected = cycle(nvml, [gpu], clock)
    assert collected.gpus[0].lost
    assert collected.gpus[0].mig_instances == ()
    assert [e.kind for e in collected.events].count("gpu_lost") == 1


@pytest.mark.parametrize(("name", "profile"), [
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "1g.10gb"),
    ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "3g.20gb"),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
    ("NVIDIA H100 80GB HBM3", None),
    ("", None),
    (None, None),
])
def test_the_profile_is_read_from_the_mig_device_name(name, profile):
    assert mig_profile(name) == profile


# ------------------------------------------------------------------ the fake's semantics


def test_fake_mig_calls_follow_nvml(clock):
    gpu, plain = mig_gpu(0, instances=1), SimulatedGpu(1, A100_SXM, seed=3)
    fake_nvml.configure([gpu, plain])
    fake_nvml.nvmlInit()
    parent = fake_nvml.nvmlDeviceGetHandleByIndex(0)
    assert fake_nvml.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert fake_nvml.nvmlDeviceGetMaxMigDeviceCount(parent) == MAX_MIG_DEVICES
    handle = fake_nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert fake_nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0) is handle
    assert fake_nvml.nvmlDeviceIsMigDeviceHandle(handle) == 1
    assert fake_nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle) is parent
    assert fake_nvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert fake_nvml.nvmlDeviceGetGpuInstanceId(handle) == 7
    assert fake_nvml.nvmlDeviceGetComputeInstanceId(handle) == 0
    with pytest.raises(fake_nvml.NVMLError_NotFound):
        fake_nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    with pytest.raises(fake_nvml.NVMLError_InvalidArgument):
        fake_nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, MAX_MIG_DEVICES)
    with pytest.raises(fake_nvml.NVMLError_NotSupported):
        fake_nvml.nvmlDeviceGetUtilizationRates(parent)
    with pytest.raises(fake_nvml.NVMLError_NotSupported):
        fake_nvml.nvmlDeviceGetGpuInstanceId(parent)
    gpu.mig.destroy(7)
    with pytest.raises(fake_nvml.NVMLError_InvalidArgument):  # ask for the handle again
        fake_nvml.nvmlDeviceGetUUID(handle)
    other = fake_nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(fake_nvml.NVMLError_NotSupported):
        fake_nvml.nvmlDeviceGetMigMode(other)
    assert fake_nvml.nvmlDeviceGetMaxMigDeviceCount(other) == 0
    fake_nvml.nvmlShutdown()


def test_fake_mig_placements_are_bounded_like_an_h100():
    gpu = SimulatedGpu(0, H100_SXM, seed=3)
    with pytest.raises(MigError):
        gpu.mig.create(["1g.10gb"])  # mode off
    gpu.mig.enable()
    gpu.mig.create(["1g.10gb"] * 7)
    with pytest.raises(MigError):
        gpu.mig.create(["1g.10gb"])  # seven compute slices used
    gpu.mig.disable()
    gpu.mig.enable()
    assert [i.gpu_instance_id for i in gpu.mig.create(["3g.40gb", "3g.40gb"])] == [1, 2]
    with pytest.raises(MigError):
        gpu.mig.create(["1g.10gb"])  # eight memory slices used
    with pytest.raises(MigError):
        SimulatedGpu(1, A100_SXM).mig.enable()
