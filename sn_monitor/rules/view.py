"""What the controller knows about each node between reports."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from sn_monitor.model import Report

NodeState = Literal["healthy", "degraded", "lost", "cordoned", "evicted"]


@dataclass
class NodeView:
    """One node as the rules see it.

    Times are the controller's own clock (``received_*``: monotonic seconds), never the
    agent's: detection must not depend on a node's clock being right.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    report: Report | None = None
    received_monotonic: float = 0.0
    received_wall: float = 0.0
    state: NodeState = "healthy"
