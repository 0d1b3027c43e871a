"""The ``nvml`` collector: every GPU of the node, read through the NVML adapter.

A node without NVML (no libnvidia-ml, or no kernel driver) is not an error: the collector
logs one line, raises :class:`SourceMissing` so the registry records "no data", and tries
``nvmlInit`` again at most once a minute, in case the driver is loaded later.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.collectors.processes import CgroupIdentity, container_of
from sn_monitor.agent.nvml import (
    NVLINK_LINK_INTERVAL_SECONDS,
    PCIE_THROUGHPUT_INTERVAL_SECONDS,
    NvmlError,
    NvmlLibrary,
    NvmlUnavailable,
)
from sn_monitor.agent.snapshot import Collected, GpuProcess, GpuSample
from sn_monitor.clock import Clock, SystemClock

logger = logging.getLogger(__name__)

INIT_RETRY_SECONDS = 60.0


class NvmlCollector:
    """GPU samples and NVML XID events, one :class:`Collected` per cycle.

    ``nvml_module`` is ``pynvml`` (see :func:`sn_monitor.agent.nvml.load_pynvml`) or
    :mod:`sn_monitor.sim.fake_nvml`; ``clock`` stamps events and paces init retries.
    ``pcie_throughput_interval`` and ``nvlink_link_interval`` go to the adapter
    (:class:`~sn_monitor.agent.nvml.NvmlLibrary`), which validates them. ``procfs``
    (the host's /proc) is where each GPU process's container is looked up
    (``<procfs>/<pid>/cgroup``); None leaves processes without one.
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
    ) -> None:
        self._clock: Clock = clock or SystemClock()
        self._procfs = None if procfs is None else Path(procfs)
        #: pid -> its container, for the processes seen last cycle (a process's cgroup
        #: does not change while it uses the GPU; read once, not every second).
        self._containers: dict[int, CgroupIdentity] = {}
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
        try:
            collected = self._library.collect()
        except NvmlError as error:
            raise CollectorError(str(error)) from error
        if self._procfs is None:
            return collected
        return replace(collected, gpus=self._with_containers(collected.gpus, self._procfs))

    def _with_containers(
        self, gpus: tuple[GpuSample, ...], procfs: Path
    ) -> tuple[GpuSample, ...]:
        """Each process of a GPU or MIG device with its container and pod (cgroup)."""
        known, self._containers = self._containers, {}
        out: list[GpuSample] = []
        for gpu in gpus:
            if not gpu.processes and not gpu.mig_instances:
                out.append(gpu)
                continue
            instances = tuple(
                replace(mig, processes=self._identified(mig.processes, known, procfs))
                for mig in gpu.mig_instances
            )
            out.append(replace(gpu, processes=self._identified(gpu.processes, known, procfs),
                               mig_instances=instances))
        return tuple(out)

    def _identified(
        self,
        processes: tuple[GpuProcess, ...] | None,
        known: dict[int, CgroupIdentity],
        procfs: Path,
    ) -> tuple[GpuProcess, ...] | None:
        """``processes`` with their containers: read once a pid (``known``: last cycle's)."""
        if not processes:
            return processes
        out: list[GpuProcess] = []
        for process in processes:
            identity = self._containers.get(process.pid) or known.get(process.pid)
            if identity is None:
                identity = container_of(procfs, process.pid)
            self._containers[process.pid] = identity
            out.append(replace(process, container_id=identity.container_id,
                               pod_uid=identity.pod_uid))
        return tuple(out)

    def close(self) -> None:
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
