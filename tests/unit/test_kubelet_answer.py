"""Reading the kubelet's ``List`` answer (sn_monitor/agent/workloads/kubelet/answer.py):
device ids, the resources read as GPUs, and the allocations of a decoded answer."""

from __future__ import annotations

import pytest

from sn_monitor.agent.workloads.kubelet.answer import (
    GPU_RESOURCES,
    MalformedAnswer,
    ResourceNames,
    allocations_from,
    device_of,
)
from sn_monitor.agent.workloads.kubelet.v1 import api_pb2
from sn_monitor.agent.workloads.model import DeviceAllocation, Workload
from tests.support.kubelet import pod

GPU = "GPU-5a9ee4b6-7d0c-4e8a-93a1-0c1f7c8f2a01"
MIG = "MIG-6f2d8c1e-0a3b-5c4d-9e8f-1a2b3c4d5e60"


@pytest.mark.parametrize(("device_id", "expected"), [
    (GPU, (GPU, None)),
    (MIG, (MIG, None)),
    (f"{GPU}::0", (GPU, 0)),
    (f"{MIG}::12", (MIG, 12)),
    ("MIG-GPU-5a9ee4b6/1/0", ("MIG-GPU-5a9ee4b6/1/0", None)),  # the older MIG id form
    ("3", ("3", None)),  # the device plugin's index strategy: as written
])
def test_device_ids(device_id: str, expected: tuple[str, int | None]) -> None:
    assert device_of(device_id) == expected


@pytest.mark.parametrize(("device_id", "why"), [
    ("", "names no device"),
    ("::2", "names no device"),
    (f"{GPU}::", "replica '' is not a number"),
    (f"{GPU}::-1", "replica '-1' is not a number"),
    (f"{GPU}::1::2", "replica '1::2' is not a number"),
])
def test_device_ids_no_device_plugin_writes(device_id: str, why: str) -> None:
    with pytest.raises(MalformedAnswer, match=why):
        device_of(device_id)


@pytest.mark.parametrize(("resource", "read"), [
    ("nvidia.com/gpu", True),
    ("nvidia.com/gpu.shared", True),
    ("nvidia.com/mig-1g.10gb", True),
    ("nvidia.com/mig-7g.80gb", True),
    ("example.com/vgpu", True),
    ("nvidia.com/gpus", False),
    ("nvidia.com/mig", False),
    ("example.com/vgpu-8g", False),
    ("hugepages-2Mi", False),
])
def test_the_resources_read_as_gpus(resource: str, read: bool) -> None:
    assert (resource in ResourceNames.of((*GPU_RESOURCES, "example.com/vgpu"))) is read


def test_an_answer_gives_each_device_once_in_its_order() -> None:
    answer = api_pb2.ListPodResourcesResponse(pod_resources=[
        pod("llama-0", "ml", {"trainer": {"nvidia.com/gpu": [GPU, GPU]}}),
        pod("notebook", "", {"": {"nvidia.com/mig-1g.10gb": [f"{MIG}::1"]}}),
    ])
    assert allocations_from(answer, ResourceNames.of(GPU_RESOURCES)) == (
        DeviceAllocation(device=GPU, resource="nvidia.com/gpu", source="kubelet",
                         workload=Workload(pod="llama-0", namespace="ml", container="trainer")),
        DeviceAllocation(device=MIG, resource="nvidia.com/mig-1g.10gb", source="kubelet",
                         replica=1, workload=Workload(pod="notebook")),
    )
