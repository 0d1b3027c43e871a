"""What a collector is, and the two ways it can fail.

A collector is an object with a ``name`` and a ``collect()`` that returns a
:class:`~sn_monitor.agent.snapshot.Collected`. It is built from its inputs (an NVML
module, a root path) and touches nothing else. It raises :class:`SourceMissing` when its
source does not exist on this node (no InfiniBand, no NVML library): that is "no data"
and logged at debug level. Any other :class:`CollectorError` is a fault, logged as an
error; the other collectors keep running either way.
"""

from __future__ import annotations

from typing import Protocol

from sn_monitor.agent.snapshot import Collected
from sn_monitor.errors import SnMonitorError


class CollectorError(SnMonitorError):
    """The collector's source is present but broken."""


class SourceMissing(CollectorError):
    """The collector's source does not exist here (no /sys/class/infiniband, no libnvidia-ml)."""


class Collector(Protocol):
    """One named source of samples."""

    name: str

    def collect(self) -> Collected:
        """Read the source once and return typed samples."""
        ...

    def close(self) -> None:
        """Release what the collector holds (file handles, NVML)."""
        ...
