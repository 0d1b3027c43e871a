"""The workload families as /metrics serves them: labels, the per-GPU process bound, sources."""

from __future__ import annotations

from sn_monitor.agent.exporter import SnapshotCollector
from sn_monitor.agent.exposition import Family, TextRenderer
from sn_monitor.agent.snapshot import (
    GpuProcess,
    GpuSample,
    GpuWorkload,
    NodeSnapshot,
    SourceStatus,
)
from sn_monitor.agent.workload_series import (
    MAX_PROCESS_SERIES_PER_GPU,
    PROCESS_LABELS,
    WORKLOAD_LABELS,
    workload_families,
)
from tests.conftest import assert_promtool_clean

POD = "8e1a2c4b-5d6f-4a7b-9c8d-0e1f2a3b4c5d"
CID = "3f" * 32
TRAINER = GpuWorkload(pod="trainer-0", namespace="ml", container="pytorch",
                      workload_job="llama")


def snapshot(*gpus: GpuSample, sources: tuple[SourceStatus, ...] = ()) -> NodeSnapshot:
    return NodeSnapshot(node="n1", timestamp_seconds=1.0, gpus=gpus, sources=sources)


def gpu(index: int, processes: tuple[GpuProcess, ...] | None = (),
        workloads: tuple[GpuWorkload, ...] = ()) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index}", name="H100", pci_bus_id="0000:18:00.0",
                     processes=processes, workloads=workloads)


def series(families: list[Family], name: str) -> list[dict[str, str | float]]:
    family = next((f for f in families if f.name == name), None)
    if family is None:
        return []
    return [{**dict(zip(family.labelnames, values, strict=True)), "value": value}
            for values, value in family.samples]


def test_one_info_series_per_gpu_and_workload_with_empty_labels_for_the_unknown() -> None:
    families = list(workload_families(snapshot(
        gpu(0, workloads=(TRAINER, GpuWorkload(user="alice"))), gpu(1))))
    assert series(families, "sn_gpu_workload_info") == [
        {"gpu": "0", "uuid": "GPU-0", "mig_instance": "", "pod": "trainer-0", "namespace": "ml",
         "container": "pytorch", "slurm_job": "", "user": "", "partition": "",
         "workload_job": "llama", "value": 1.0},
        {"gpu": "0", "uuid": "GPU-0", "mig_instance": "", "pod": "", "namespace": "",
         "container": "", "slurm_job": "", "user": "alice", "partition": "",
         "workload_job": "", "value": 1.0},
    ]


def test_no_label_collides_with_the_targets_job_and_instance() -> None:
    for labels in (WORKLOAD_LABELS, PROCESS_LABELS):
        assert not {"job", "instance"} & set(labels)


def test_per_process_series_are_bounded_per_gpu_the_most_memory_first() -> None:
    many = tuple(GpuProcess(pid, used_memory_bytes=pid * 2**20, sm_utilization_ratio=0.01)
                 for pid in range(1, 41))
    families = list(workload_families(snapshot(gpu(0, many))))
    memory = series(families, "sn_gpu_process_memory_bytes")
    assert len(memory) == MAX_PROCESS_SERIES_PER_GPU
    assert [row["pid"] for row in memory][:2] == ["40", "39"]
    assert len(series(families, "sn_gpu_process_sm_utilization_ratio")) == \
        MAX_PROCESS_SERIES_PER_GPU


def test_process_series_carry_who_and_only_what_nvml_gave() -> None:
    processes = (GpuProcess(4242, 60 * 2**30, CID, POD, "python3", "root", 0.5),
                 GpuProcess(7, None, command="sleep"))
    families = list(workload_families(snapshot(gpu(0, processes), gpu(1, None))))
    assert series(families, "sn_gpu_process_memory_bytes") == [
        {"gpu": "0", "uuid": "GPU-0", "mig_instance": "", "pid": "4242", "command": "python3",
         "user": "root", "container_id": CID, "pod_uid": POD, "value": float(60 * 2**30)}]
    assert [row["value"] for row in series(families, "sn_gpu_process_sm_utilization_ratio")] \
        == [0.5]


def test_each_source_is_up_or_down_and_absent_without_sources() -> None:
    families = list(workload_families(snapshot(
        gpu(0), sources=(SourceStatus("kubelet", False), SourceStatus("slurm", True)))))
    assert series(families, "sn_agent_source_up") == [
        {"source": "kubelet", "value": 0.0}, {"source": "slurm", "value": 1.0}]
    assert not series(list(workload_families(snapshot(gpu(0)))), "sn_agent_source_up")


def test_the_agents_metrics_carry_the_families_promtool_clean() -> None:
    latest = snapshot(
        gpu(0, (GpuProcess(4242, 2**30, CID, POD, "python3", "root", 0.5),), (TRAINER,)),
        sources=(SourceStatus("kubelet", True),))
    text = TextRenderer().render(SnapshotCollector(lambda: latest).families()).decode()
    for name in ("sn_gpu_workload_info{", "sn_gpu_process_memory_bytes{",
                 "sn_gpu_process_sm_utilization_ratio{", 'sn_agent_source_up{source="kubelet"} 1'):
        assert name in text
    assert_promtool_clean(text)
