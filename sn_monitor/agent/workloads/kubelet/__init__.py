"""The kubelet's pod-resources API as an attribution source: :class:`KubeletSource`.

The kubelet serves ``v1.PodResourcesLister`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``); ``List`` says which devices each pod's
containers hold. ``source`` owns the calls and their failures, ``answer`` reads the answer
(pure), ``channel`` makes the one gRPC call over HTTP/2 (``h2``), ``message`` decodes its
answer from protobuf's wire format, ``v1`` is the kubelet's own ``api.proto`` and the
Python generated from it (the tests' throwaway kubelet serves it with ``grpcio``, and the
tests check ``message`` against it; the agent imports neither).

Regenerating ``v1`` (after replacing ``v1/api.proto`` with a newer upstream text):
``make kubelet-proto``, which runs grpcio-tools' protoc at the version pinned in the
Makefile with ``--python_out``, ``--grpc_python_out`` and ``--pyi_out``; commit the result.
The generated files' versions set the ``kubelet`` extra's lower bounds in pyproject.toml.

May import: the standard library and ``sn_monitor.agent.workloads.model``; ``h2`` (the
``kubelet`` extra) only in ``channel``, which ``source`` imports at its first call;
``grpc`` and ``google.protobuf`` only in ``v1``, which only the tests import.
"""

from sn_monitor.agent.workloads.kubelet.source import (
    DEFAULT_SOCKET,
    DEFAULT_TIMEOUT_SECONDS,
    KubeletSource,
)

__all__ = ["DEFAULT_SOCKET", "DEFAULT_TIMEOUT_SECONDS", "KubeletSource"]
