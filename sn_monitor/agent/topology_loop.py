"""Collects the node's topology at start and every minute, on a thread of its own.

Off the sampling cycle: reading every NVLink's far end is ~50 driver calls per GPU, and a
wedged driver may hang them; here that stalls only this thread (the reports go on with the
topology collected before). A collection that fails is logged and the last good topology
stays the one the reporter sends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from sn_monitor.agent.collectors.topology import collect_topology
from sn_monitor.agent.nvml import NvmlError, NvmlLibrary
from sn_monitor.model import NodeTopology

log = logging.getLogger(__name__)

#: Seconds between two collections: NIC rates, port states and NVLinks may change.
TOPOLOGY_INTERVAL_SECONDS = 60.0


def read_topology(nvml: NvmlLibrary | None, sysfs: Path) -> NodeTopology:
    """The node's topology now, from ``nvml`` (NVLinks) and ``sysfs`` (the rest).

    ``nvml`` None or not initialized (no NVML on the node): no GPUs. Raises
    :class:`NvmlError` when NVML fails.
    """
    gpus = nvml.nvlink_topology() if nvml is not None and nvml.initialized else ()
    return collect_topology(gpus, sysfs)


class TopologyLoop:
    """Calls ``collect`` now and every ``period`` seconds; hands each result to ``deliver``."""

    def __init__(
        self,
        collect: Callable[[], NodeTopology],
        deliver: Callable[[NodeTopology], None],
        period: float = TOPOLOGY_INTERVAL_SECONDS,
        node: str = "",
    ) -> None:
        if period <= 0:
            raise ValueError("the topology period must be positive")
        self._collect = collect
        self._deliver = deliver
        self._period = period
        self._node = node
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-topology", daemon=True)
        self._last_error: str | None = None
        #: The latest topology collected (None: none yet).
        self.latest: NodeTopology | None = None

    def start(self) -> None:
        self._thread.start()

    def collect_once(self) -> NodeTopology | None:
        """One collection; None when it failed (logged; the last good one stays)."""
        try:
            topology = self._collect()
        except (NvmlError, OSError, ValueError) as err:
            self._failed(f"{type(err).__name__}: {err}")
            return None
        if self._last_error is not None:
            log.info("topology collected again", extra={"node": self._node})
            self._last_error = None
        self.latest = topology
        self._deliver(topology)
        return topology

    def _failed(self, message: str) -> None:
        kept = "keeping the last one" if self.latest is not None else "none sent yet"
        level = logging.DEBUG if message == self._last_error else logging.WARNING
        log.log(level, "topology collection failed (%s); %s, next try in %.0f s", message,
                kept, self._period, extra={"node": self._node})
        self._last_error = message

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.collect_once()
            except Exception:  # the loop must outlive a bug in one collection; it is logged
                log.exception("topology collection failed", extra={"node": self._node})
            if self._stop.wait(self._period):
                return

    def stop(self, timeout: float) -> None:
        """Stop after the collection running now, if any (waits at most ``timeout``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
