"""The gRPC channel to the kubelet's pod-resources socket, and its one call, ``List``.

The only module (with the generated ``v1``) that imports ``grpc``: the ``kubelet`` extra,
loaded by the source at first use. A failed call raises
:class:`~sn_monitor.agent.workloads.model.SourceUnavailable` saying why in words: no
answer within the timeout, nobody listening, an answer that cannot be decoded.
"""

from __future__ import annotations

from pathlib import Path

import grpc

from sn_monitor.agent.workloads.kubelet.answer import SOURCE
from sn_monitor.agent.workloads.kubelet.v1 import api_pb2, api_pb2_grpc
from sn_monitor.agent.workloads.model import SourceUnavailable

#: The kubelet's own bound on a pod-resources answer (its DefaultPodResourcesMaxSize);
#: gRPC's default of 4 MiB is too small for a node with many pods.
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class PodResourcesChannel:
    """One channel to the socket at ``socket``; :meth:`close` when done."""

    def __init__(self, socket: Path) -> None:
        self._socket = socket
        self._channel = grpc.insecure_channel(
            f"unix://{socket.absolute()}",
            options=[("grpc.max_receive_message_length", MAX_ANSWER_BYTES)])
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def list(self, timeout_seconds: float) -> api_pb2.ListPodResourcesResponse:
        """The kubelet's answer to ``List``. Raises SourceUnavailable."""
        try:
            answer: api_pb2.ListPodResourcesResponse = self._stub.List(
                api_pb2.ListPodResourcesRequest(), timeout=timeout_seconds)
        except grpc.RpcError as err:
            raise SourceUnavailable(SOURCE, self._why(err, timeout_seconds)) from err
        return answer

    def close(self) -> None:
        self._channel.close()

    def _why(self, err: grpc.RpcError, timeout_seconds: float) -> str:
        if not isinstance(err, grpc.Call):
            return f"List on {self._socket} failed: {err}"
        code, details = err.code(), err.details() or "no details"
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return (f"List on {self._socket} timed out: no answer within "
                    f"{timeout_seconds:g} s (deadline exceeded)")
        if code is grpc.StatusCode.UNAVAILABLE:
            return f"cannot reach the kubelet on {self._socket}: {details}"
        if code is grpc.StatusCode.INTERNAL:
            return f"malformed answer from {self._socket}: {details}"
        return f"List on {self._socket} failed ({code.name}): {details}"
