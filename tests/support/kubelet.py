"""A throwaway kubelet: the real pod-resources v1 ``List`` served on a unix socket.

:class:`FakeKubelet` answers with the pods a test gives it (:func:`pod` builds one), or
stalls until it is stopped (a kubelet that does not answer in time), or answers with
bytes that are no ``ListPodResourcesResponse``. Its server runs in the test's process on
a thread pool that :meth:`FakeKubelet.stop` shuts down.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc

from sn_monitor.agent.workloads.kubelet.v1 import api_pb2, api_pb2_grpc

#: How long a stalled List waits for the test to stop the server, at most.
STALL_BOUND_SECONDS = 30.0
#: Not a protobuf message: a field tag of 0 is invalid.
UNREADABLE_ANSWER = b"\x00\x00\x00"


def pod(name: str, namespace: str,
        containers: Mapping[str, Mapping[str, Sequence[str]]]) -> api_pb2.PodResources:
    """A pod whose containers hold devices: ``{container: {resource: [device ids]}}``."""
    return api_pb2.PodResources(name=name, namespace=namespace, containers=[
        api_pb2.ContainerResources(name=container, devices=[
            api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
            for resource, ids in devices.items()])
        for container, devices in containers.items()])


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    """``v1.PodResourcesLister`` on ``socket``: ``pods`` is what ``List`` answers."""

    def __init__(self, socket: Path, pods: Sequence[api_pb2.PodResources] = ()) -> None:
        self.socket = socket
        self.pods = list(pods)
        self.stalled = False
        self.unreadable = False
        #: A status ``List`` fails with instead of answering (None: it answers).
        self.refusing: grpc.StatusCode | None = None
        self._released = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._server: grpc.Server | None = None

    def List(self, request: api_pb2.ListPodResourcesRequest,  # the proto's name
             context: grpc.ServicerContext) -> api_pb2.ListPodResourcesResponse:
        if self.stalled:
            self._released.wait(STALL_BOUND_SECONDS)
        if self.refusing is not None:
            context.abort(self.refusing, "pod resources are not for you")
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)

    def start(self) -> FakeKubelet:
        self._released.clear()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fake-kubelet")
        self._server = grpc.server(self._pool)
        if self.unreadable:
            self._server.add_generic_rpc_handlers([_unreadable_handler()])
        else:
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop serving (a stalled List is let go first); gRPC removes the socket."""
        self._released.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(STALL_BOUND_SECONDS)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._server = self._pool = None


def _unreadable_handler() -> grpc.GenericRpcHandler:
    """``List`` answering bytes that do not decode as its response."""
    def answer(request: bytes, context: grpc.ServicerContext) -> bytes:
        return UNREADABLE_ANSWER
    return grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(answer)})


@contextmanager
def serving(kubelet: FakeKubelet) -> Iterator[FakeKubelet]:
    """``kubelet`` started, and stopped on the way out."""
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()
