"""The ``kubelet`` source against a throwaway kubelet serving the real pod-resources v1 proto.

Each test serves ``List`` on a unix socket in ``tmp_path`` (tests/support/kubelet.py):
whole GPUs, MIG devices and time-sliced replicas come back as allocations; everything
that goes wrong (no socket, nobody listening, no answer in time, an unreadable answer,
the extra not installed) is a ``SourceUnavailable`` saying why; a kubelet that restarts
on the same path is read again at the next call.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sn_monitor.agent.workloads.kubelet import KubeletSource
from sn_monitor.agent.workloads.model import DeviceAllocation, SourceUnavailable, Workload
from tests.support.kubelet import FakeKubelet, pod, serving

pytestmark = pytest.mark.integration

GPU_A = "GPU-5a9ee4b6-7d0c-4e8a-93a1-0c1f7c8f2a01"
GPU_B = "GPU-9b0c1d2e-3f40-4a5b-8c6d-7e8f9a0b1c02"
MIG_1 = "MIG-6f2d8c1e-0a3b-5c4d-9e8f-1a2b3c4d5e60"
#: Short enough that the stalled tests end soon, long enough for a busy machine's answer.
SHORT_TIMEOUT_SECONDS = 0.5


def trainer(container: str = "trainer") -> Workload:
    return Workload(pod="llama-0", namespace="ml", container=container)


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "kubelet.sock"


@pytest.fixture
def source(sock: Path) -> Iterator[KubeletSource]:
    kubelet = KubeletSource(sock, resources=("example.com/vgpu-*",),
                            timeout_seconds=SHORT_TIMEOUT_SECONDS)
    yield kubelet
    kubelet.close()


def unavailable(source: KubeletSource) -> str:
    with pytest.raises(SourceUnavailable) as caught:
        source.allocations()
    assert caught.value.source == "kubelet"
    return caught.value.why


def test_a_whole_gpu_is_the_pods_container(sock: Path, source: KubeletSource) -> None:
    pods = [pod("llama-0", "ml", {"trainer": {"nvidia.com/gpu": [GPU_A, GPU_B]},
                                  "sidecar": {}})]
    with serving(FakeKubelet(sock, pods)):
        found = source.allocations()
    assert found == tuple(DeviceAllocation(device=gpu, resource="nvidia.com/gpu",
                                           workload=trainer(), source="kubelet")
                          for gpu in (GPU_A, GPU_B))


def test_a_mig_slice_is_its_mig_device(sock: Path, source: KubeletSource) -> None:
    pods = [pod("llama-0", "ml", {"trainer": {"nvidia.com/mig-1g.10gb": [MIG_1]}})]
    with serving(FakeKubelet(sock, pods)):
        (found,) = source.allocations()
    assert (found.device, found.resource, found.replica) == (
        MIG_1, "nvidia.com/mig-1g.10gb", None)
    assert found.workload == trainer()


def test_time_sliced_replicas_name_the_gpu_and_the_replica(sock: Path,
                                                          source: KubeletSource) -> None:
    pods = [pod("llama-0", "ml", {"trainer": {"nvidia.com/gpu": [f"{GPU_A}::0"]}}),
            pod("notebook", "lab", {"jupyter": {"nvidia.com/gpu.shared": [f"{GPU_A}::3"]}})]
    with serving(FakeKubelet(sock, pods)):
        found = source.allocations()
    assert [(a.device, a.replica, a.workload.pod, a.workload.container) for a in found] == [
        (GPU_A, 0, "llama-0", "trainer"), (GPU_A, 3, "notebook", "jupyter")]


def test_a_configured_resource_counts_and_other_resources_do_not(sock: Path,
                                                                 source: KubeletSource) -> None:
    pods = [pod("web", "default", {"nginx": {"example.com/nic": ["0000:3b:00.1"]}}),
            pod("llama-0", "ml", {"trainer": {"example.com/vgpu-8g": [GPU_B],
                                              "hugepages-2Mi": ["0"]}})]
    with serving(FakeKubelet(sock, pods)):
        found = source.allocations()
    assert [(a.device, a.resource) for a in found] == [(GPU_B, "example.com/vgpu-8g")]


def test_a_node_without_gpu_pods_has_no_allocations(sock: Path, source: KubeletSource) -> None:
    pods = [pod("web", "default", {"nginx": {"example.com/nic": ["0000:3b:00.1"]}})]
    with serving(FakeKubelet(sock, pods)):
        assert source.allocations() == ()


def test_no_socket_says_so(sock: Path, source: KubeletSource) -> None:
    assert f"no socket at {sock}" in unavailable(source)


def test_a_socket_nobody_listens_on_is_refused(sock: Path, source: KubeletSource) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(sock))  # the file stays, with nobody behind it
    why = unavailable(source)
    assert why.startswith(f"cannot reach the kubelet on {sock}"), why


def test_a_file_that_is_not_a_socket_says_so(sock: Path, source: KubeletSource) -> None:
    sock.write_text("")
    assert unavailable(source) == f"{sock} is not a socket"


def test_a_restarted_kubelet_is_read_at_the_next_call(sock: Path,
                                                     source: KubeletSource) -> None:
    before = [pod("llama-0", "ml", {"trainer": {"nvidia.com/gpu": [GPU_A]}})]
    after = [pod("llama-1", "ml", {"trainer": {"nvidia.com/gpu": [GPU_B]}})]
    with serving(FakeKubelet(sock, before)):
        assert [a.device for a in source.allocations()] == [GPU_A]
    assert not sock.exists()  # gRPC removes its socket on stop, as the kubelet does
    with serving(FakeKubelet(sock, after)):
        assert [(a.device, a.workload.pod) for a in source.allocations()] == [
            (GPU_B, "llama-1")]


def test_a_kubelet_down_then_back_is_unavailable_then_read(sock: Path,
                                                          source: KubeletSource) -> None:
    pods = [pod("llama-0", "ml", {"trainer": {"nvidia.com/gpu": [GPU_A]}})]
    kubelet = FakeKubelet(sock, pods)
    with serving(kubelet):
        assert len(source.allocations()) == 1
    unavailable(source)
    with serving(kubelet):
        assert [a.device for a in source.allocations()] == [GPU_A]


def test_a_slow_answer_times_out(sock: Path, source: KubeletSource) -> None:
    kubelet = FakeKubelet(sock, [pod("llama-0", "ml", {"trainer": {"nvidia.com/gpu": [GPU_A]}})])
    kubelet.stalled = True
    with serving(kubelet):
        why = unavailable(source)
        kubelet.stalled = False
        assert [a.device for a in source.allocations()] == [GPU_A]
    assert why == f"List on {sock} timed out: no answer within {SHORT_TIMEOUT_SECONDS:g} s"


def test_an_unreadable_answer_is_malformed(sock: Path, source: KubeletSource) -> None:
    kubelet = FakeKubelet(sock)
    kubelet.unreadable = True
    with serving(kubelet):
        why = unavailable(source)
    assert why.startswith(f"malformed answer from {sock}"), why


def test_a_device_id_no_device_plugin_writes_is_malformed(sock: Path,
                                                         source: KubeletSource) -> None:
    pods = [pod("llama-0", "ml", {"trainer": {"nvidia.com/gpu": [f"{GPU_A}::x"]}})]
    with serving(FakeKubelet(sock, pods)):
        why = unavailable(source)
    assert why == (f"malformed answer from {sock}: device id '{GPU_A}::x': replica 'x' is "
                   "not a number")


def test_a_refused_call_names_grpc_s_status(sock: Path, source: KubeletSource) -> None:
    kubelet = FakeKubelet(sock)
    kubelet.refusing = grpc.StatusCode.PERMISSION_DENIED
    with serving(kubelet):
        assert unavailable(source) == (f"List on {sock} failed: gRPC status 7 "
                                       "PERMISSION_DENIED: pod resources are not for you")


def test_an_answer_larger_than_http2_s_first_window_is_read_whole(sock: Path,
                                                                   source: KubeletSource) -> None:
    """HTTP/2 lets a peer send 65,535 bytes before the reader opens its window: a node
    with many pods answers more (here ~300 KB), which must come through whole."""
    pods = [pod(f"job-{n:04d}-" + "x" * 100, "batch", {"c": {"example.com/other": ["d"]}})
            for n in range(2000)]
    pods.append(pod("llama-0", "ml", {"trainer": {"nvidia.com/gpu": [GPU_A]}}))
    with serving(FakeKubelet(sock, pods)):
        assert [a.workload.pod for a in source.allocations()] == ["llama-0"]


def test_a_socket_that_speaks_no_http2_is_not_a_kubelet(sock: Path,
                                                        source: KubeletSource) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
        listening.bind(str(sock))
        listening.listen()

        def answer_garbage() -> None:
            conn, _ = listening.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        server = threading.Thread(target=answer_garbage, daemon=True)
        server.start()
        why = unavailable(source)
        server.join(30)
    assert why == f"List on {sock} failed: the kubelet closed the connection before answering"


def test_without_the_extra_the_source_names_it(sock: Path) -> None:
    """In an interpreter where ``h2`` cannot be imported (as without the extra)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listening:
        listening.bind(str(sock))
        listening.listen()
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import sys
            sys.modules["h2"] = sys.modules["google"] = None  # as without the extra
            from pathlib import Path
            from sn_monitor.agent.workloads.kubelet import KubeletSource
            from sn_monitor.agent.workloads.model import SourceUnavailable
            try:
                KubeletSource(Path({str(sock)!r})).allocations()
            except SourceUnavailable as err:
                print(err.why)
        """)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "the kubelet extra is not installed (h2 is missing): pip install 'sn-monitor[kubelet]'")
