"""The ``kubelet`` allocation source: which pod's container holds which GPU, from the kubelet.

Each call asks the kubelet's pod-resources ``List`` over its unix socket and keeps the
GPU resources (:data:`~sn_monitor.agent.workloads.kubelet.answer.GPU_RESOURCES` and those
configured). Invariants: nothing here raises but
:class:`~sn_monitor.agent.workloads.model.SourceUnavailable`; the channel is made at the
first call (so the ``kubelet`` extra, ``h2``, is imported only then), and
each call connects anew to whatever socket is at the path now (a kubelet that restarted
between two calls is simply reached again).
"""

from __future__ import annotations

import stat
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from sn_monitor.agent.workloads.kubelet.answer import (
    GPU_RESOURCES,
    SOURCE,
    MalformedAnswer,
    ResourceNames,
    allocations_from,
)
from sn_monitor.agent.workloads.model import DeviceAllocation, SourceUnavailable

if TYPE_CHECKING:
    from sn_monitor.agent.workloads.kubelet.channel import PodResourcesChannel
    from sn_monitor.agent.workloads.kubelet.message import ListPodResourcesResponse

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_TIMEOUT_SECONDS = 2.0
EXTRA_HINT = "pip install 'sn-monitor[kubelet]'"


class KubeletSource:
    """The kubelet's record of devices given to containers (an ``AllocationSource``).

    ``socket``: the pod-resources socket; ``resources``: resource names read as GPUs
    besides :data:`GPU_RESOURCES` (a trailing ``*`` makes a prefix:
    ``example.com/vgpu-*``); ``timeout_seconds``: how long one ``List`` may take.
    Safe to call from several threads (one call at a time).
    """

    name = SOURCE

    def __init__(self, socket: Path = DEFAULT_SOCKET, *, resources: tuple[str, ...] = (),
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be positive, not {timeout_seconds}")
        self.socket = socket
        self.resources = ResourceNames.of(GPU_RESOURCES + resources)
        self.timeout_seconds = timeout_seconds
        self._lock = threading.Lock()
        self._channel: PodResourcesChannel | None = None

    def allocations(self) -> tuple[DeviceAllocation, ...]:
        """Every GPU the kubelet has given a container. Raises SourceUnavailable."""
        with self._lock:
            try:
                answer = self._list()
            except SourceUnavailable:
                self._drop_channel()
                raise
        try:
            return allocations_from(answer, self.resources)
        except MalformedAnswer as err:
            raise SourceUnavailable(SOURCE, f"malformed answer from {self.socket}: {err}") \
                from err

    def close(self) -> None:
        """Close the channel, if one is open; a later call opens a new one."""
        with self._lock:
            self._drop_channel()

    def _list(self) -> ListPodResourcesResponse:
        self._check_socket()
        if self._channel is None:
            self._channel = self._open()
        return self._channel.list(self.timeout_seconds)

    def _check_socket(self) -> None:
        """A clear reason when there is no socket to talk to (gRPC's would be vaguer)."""
        try:
            found = self.socket.stat()
        except FileNotFoundError as err:
            raise SourceUnavailable(SOURCE, f"no socket at {self.socket} (no kubelet on "
                                            "this node, or not mounted)") from err
        except OSError as err:
            raise SourceUnavailable(SOURCE, f"cannot stat {self.socket}: {err.strerror}") \
                from err
        if not stat.S_ISSOCK(found.st_mode):
            raise SourceUnavailable(SOURCE, f"{self.socket} is not a socket")

    def _open(self) -> PodResourcesChannel:
        try:
            from sn_monitor.agent.workloads.kubelet.channel import PodResourcesChannel
        except ImportError as err:
            package = (err.name or "a package").partition(".")[0]
            raise SourceUnavailable(SOURCE, f"the kubelet extra is not installed ({package} "
                                            f"is missing): {EXTRA_HINT}") from err
        return PodResourcesChannel(self.socket)

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
