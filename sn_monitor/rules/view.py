"""What the controller knows about each node between reports."""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from sn_monitor.model import Report

NodeState = Literal["healthy", "degraded", "lost", "cordoned", "evicted"]
#: The GPUs (indexes) and NICs (names) a report names, in its order.
NamedParts = tuple[tuple[int, ...], tuple[str, ...]]

_INDEX = operator.attrgetter("index")
_DEVICE = operator.attrgetter("device")


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
    #: Which GPUs and NICs ``report`` names (:func:`named_parts`), where whoever sets the
    #: report keeps it (the node registry does; None: not kept). One tuple for as long as
    #: they stay the same, so that a reader of every node (the topology's overview) sees
    #: by its identity that a new report names nothing new, without reading the report.
    named: NamedParts | None = None


def named_parts(report: Report, held: NamedParts | None = None) -> NamedParts:
    """Which GPUs and NICs ``report`` names; ``held`` itself where they are the same."""
    named = tuple(map(_INDEX, report.gpus)), tuple(map(_DEVICE, report.infiniband))
    return held if named == held and held is not None else named
