"""The ``nvml`` collector: every GPU of the node, read through the NVML adapter.

A node without NVML (no libnvidia-ml, or no kernel driver) is not an error: the collector
logs one line, raises :class:`SourceMissing` so the registry records "no data", and tries
``nvmlInit`` again at most once a minute, in case the driver is loaded later.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sn_monitor.agent.collectors.attribution import WorkloadAttribution
from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.nvml import (
    NVLINK_LINK_INTERVAL_SECONDS,
    PCIE_THROUGHPUT_INTERVAL_SECONDS,
    NvmlError,
    NvmlLibrary,
    NvmlUnavailable,
)
from sn_monitor.agent.snapshot import Collected
from sn_monitor.agent.workloads.model import AllocationSource
from sn_monitor.agent.workloads.processes import JobOf
from sn_monitor.clock import Clock, SystemClock

logger = logging.getLogger(__name__)

INIT_RETRY_SECONDS = 60.0


class NvmlCollector:
    """GPU samples and NVML XID events, one :class:`Collected` per cycle.

    ``nvml_module`` is ``pynvml`` (see :func:`sn_monitor.agent.nvml.load_pynvml`) or
    :mod:`sn_monitor.sim.fake_nvml`; ``clock`` stamps events and paces init retries.
    ``pcie_throughput_interval`` and ``nvlink_link_interval`` go to the adapter
    (:class:`~sn_monitor.agent.nvml.NvmlLibrary`), which validates them. ``procfs``
    (the host's /proc) is where each GPU process's command, user, container and pod are
    looked up (``<procfs>/<pid>/``); None leaves processes without them. ``sources``
    say which workload holds which GPU (the kubelet, Slurm), asked once a cycle; see
    :class:`~sn_monitor.agent.collectors.attribution.WorkloadAttribution`.
    """

    name = "nvml"

    def __init__(
        self,
        nvml_module: Any,
        clock: Clock | None = None,
        *,
        retry_seconds: float = INIT_RETRY_SECONDS,
        pcie_throughput_interval: float = PCIE_THROUGHPUT_INTERVAL_SECONDS,
        nvlink_link_interval: float = NVLINK_LINK_INTERVAL_SECONDS,
        procfs: Path | None = None,
        sources: Sequence[AllocationSource] = (),
        job_of: JobOf | None = None,
    ) -> None:
        self._clock: Clock = clock or SystemClock()
        self._attribution = WorkloadAttribution(
            None if procfs is None else Path(procfs), sources, job_of=job_of)
        self._library = NvmlLibrary(
            nvml_module,
            self._clock,
            pcie_throughput_interval=pcie_throughput_interval,
            nvlink_link_interval=nvlink_link_interval,
        )
        self._retry_seconds = retry_seconds
        self._next_init: float | None = None
        self._missing_logged = False

    @property
    def library(self) -> NvmlLibrary:
        """The adapter, shared with whoever else needs NVML (the thermal guard)."""
        return self._library

    def collect(self) -> Collected:
        if not self._library.initialized:
            self._init()
        cycle = self._attribution.begin()
        try:
            collected = self._library.collect(cycle)
        except NvmlError as error:
            raise CollectorError(str(error)) from error
        return replace(collected, sources=cycle.finish())

    def close(self) -> None:
        self._attribution.close()
        self._library.close()

    def _init(self) -> None:
        now = self._clock.monotonic()
        if self._next_init is not None and now < self._next_init:
            wait = self._next_init - now
            raise SourceMissing(f"NVML library not found (next try in {wait:.0f} s)")
        try:
            self._library.init()
        except NvmlUnavailable as error:
            self._next_init = now + self._retry_seconds
            if not self._missing_logged:
                self._missing_logged = True
                logger.warning(
                    "NVML library not found: no GPU metrics on this node; "
                    "host collectors keep running (%s)",
                    error,
                )
            raise SourceMissing(f"NVML library not found: {error}") from error
        except NvmlError as error:
            self._next_init = now + self._retry_seconds
            raise CollectorError(str(error)) from error
        self._next_init = None
        if self._missing_logged:
            logger.warning("NVML is available now: GPU metrics resume")
            self._missing_logged = False
