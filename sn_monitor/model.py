"""Wire types shared by the agent and the controller.

An :class:`Event` is something that happened (an XID, a GPU falling off the bus), as
opposed to a sampled value. Events are counted by the agent, reported to the controller
and never dropped, only retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EventKind = Literal["xid", "sxid", "gpu_lost", "gpu_fallen_off_bus", "link_down", "guard"]
EventSource = Literal["nvml", "kmsg", "agent"]


@dataclass(frozen=True, slots=True)
class Event:
    """One fault event seen on a node.

    ``gpu`` is the NVML index once the PCI address has been mapped to a GPU, else None.
    ``time_seconds`` is wall time when the agent saw it; ``kernel_time_seconds`` the
    kernel's own timestamp where the source has one (seconds since boot for /dev/kmsg).
    """

    kind: EventKind
    source: EventSource
    time_seconds: float
    message: str
    gpu: int | None = None
    pci_bus_id: str | None = None
    code: int | None = None
    device: str | None = None
    kernel_time_seconds: float | None = None
