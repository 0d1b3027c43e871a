"""The agent's decoder of the kubelet's List answer against protobuf's own encoder.

Messages are built with the kubelet's generated API (``v1``, the real protobuf runtime),
with every field the agent skips filled in too (CPU ids, memory, topology, dynamic
resources), serialized, and decoded by :mod:`sn_monitor.agent.workloads.kubelet.message`:
what it reads must be what protobuf wrote.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sn_monitor.agent.workloads.kubelet.message import (
    ContainerDevices,
    ContainerResources,
    ListPodResourcesResponse,
    PodResources,
    WireError,
    decode_list_answer,
)
from sn_monitor.agent.workloads.kubelet.v1 import api_pb2

text = st.text(max_size=12)
ints = st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=3)


@st.composite
def devices(draw: st.DrawFn) -> api_pb2.ContainerDevices:
    return api_pb2.ContainerDevices(
        resource_name=draw(text), device_ids=draw(st.lists(text, max_size=3)),
        topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in draw(ints)]))


@st.composite
def containers(draw: st.DrawFn) -> api_pb2.ContainerResources:
    return api_pb2.ContainerResources(
        name=draw(text), devices=draw(st.lists(devices(), max_size=3)), cpu_ids=draw(ints),
        memory=[api_pb2.ContainerMemory(memory_type=draw(text),
                                        size=draw(st.integers(0, 2**64 - 1)))],
        dynamic_resources=[api_pb2.DynamicResource(claim_name=draw(text))])


@st.composite
def answers(draw: st.DrawFn) -> api_pb2.ListPodResourcesResponse:
    return api_pb2.ListPodResourcesResponse(pod_resources=[
        api_pb2.PodResources(name=draw(text), namespace=draw(text),
                             containers=draw(st.lists(containers(), max_size=3)))
        for _ in range(draw(st.integers(0, 3)))])


def expected(answer: api_pb2.ListPodResourcesResponse) -> ListPodResourcesResponse:
    return ListPodResourcesResponse(tuple(
        PodResources(pod.name, pod.namespace, tuple(
            ContainerResources(container.name, tuple(
                ContainerDevices(d.resource_name, tuple(d.device_ids))
                for d in container.devices))
            for container in pod.containers))
        for pod in answer.pod_resources))


@settings(max_examples=300, deadline=None)
@given(answers())
def test_what_protobuf_writes_the_agent_reads(answer: api_pb2.ListPodResourcesResponse) -> None:
    assert decode_list_answer(answer.SerializeToString()) == expected(answer)


def test_a_kubelet_s_answer_with_every_kind_of_device() -> None:
    answer = api_pb2.ListPodResourcesResponse(pod_resources=[api_pb2.PodResources(
        name="llama-0", namespace="ml", containers=[api_pb2.ContainerResources(
            name="trainer", cpu_ids=[0, 1], devices=[
                api_pb2.ContainerDevices(resource_name="nvidia.com/gpu",
                                         device_ids=["GPU-a", "GPU-b::2"]),
                api_pb2.ContainerDevices(resource_name="nvidia.com/mig-1g.10gb",
                                         device_ids=["MIG-c"])])])])
    assert decode_list_answer(answer.SerializeToString()) == ListPodResourcesResponse((
        PodResources("llama-0", "ml", (ContainerResources("trainer", (
            ContainerDevices("nvidia.com/gpu", ("GPU-a", "GPU-b::2")),
            ContainerDevices("nvidia.com/mig-1g.10gb", ("MIG-c",)))),)),))


@pytest.mark.parametrize(("data", "why"), [
    (b"\x0a\x05abc", "runs 2 bytes past the end"),          # pod_resources, 5 bytes of 3
    (b"\x0a", "varint runs past the end"),                    # a length that is not there
    (b"\x0a\x03\x0a\x01\xff", "not UTF-8"),                   # a pod name of byte 0xff
    (b"\x0b", "wire type 3"),                                 # a group (field 1, type 3)
    (b"\x00\x00\x00", "field number 0"),
    (b"\x08" + b"\xff" * 11, "longer than 10 bytes"),
])
def test_bytes_that_are_no_answer_say_why(data: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        decode_list_answer(data)


def test_an_empty_answer_is_no_pods() -> None:
    assert decode_list_answer(b"") == ListPodResourcesResponse(())
