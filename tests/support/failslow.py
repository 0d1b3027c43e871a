"""A fleet of eight simulated nodes with one topology, feeding the controller's fail-slow
detector; used by its tests and by the topology API's and page's. :class:`SlowJob` runs
a job on them against a controller in process, at a pace a test sets."""

from __future__ import annotations

import json
import random
from pathlib import Path

import msgspec

from sn_monitor.controller.jobs.spec import job_from_json
from sn_monitor.controller.security.auth import OPEN_ACCESS
from sn_monitor.model import (
    GpuReport,
    GpuTopology,
    IbPortReport,
    NicPortTopology,
    NicTopology,
    NodeTopology,
    Report,
)
from tests.support.harness import Harness

NODES = [f"n{i}" for i in range(8)]


GB = 1e9 / 8  # a gigabit in bytes


TOPOLOGY = NodeTopology(
    gpus=[GpuTopology(index=i, nics={f"mlx5_{i}": "PIX"}) for i in range(8)],
    nics=[NicTopology(device=f"mlx5_{i}", role="rail", rail=i,
                      ports=[NicPortTopology(port=1, link_layer="InfiniBand")])
          for i in range(8)]
    + [NicTopology(device="mlx5_8", role="storage",
                   ports=[NicPortTopology(port=1, link_layer="Ethernet")])],
)


class Fleet:
    """Eight nodes' counters, advanced by hand; faults are edits of the per-second rates."""

    def __init__(self, seed: int = 1, roce: bool = False) -> None:
        self.roce = roce  # RoCE rails: ECN marks and CNPs, no port_xmit_wait
        self.ecn = {(n, f"mlx5_{i}"): 50.0 for n in NODES for i in range(9)}
        self.rng = random.Random(seed)
        self.totals: dict[tuple[str, str, str], float] = {}
        self.rate = {(n, f"mlx5_{i}"): 400 * GB for n in NODES for i in range(9)}
        self.wait = {(n, f"mlx5_{i}"): 2e4 for n in NODES for i in range(9)}
        self.clock = {(n, g): 1.98e9 for n in NODES for g in range(8)}
        self.reasons: dict[tuple[str, int], list[str]] = {}
        self.processes = {(n, g): 1 for n in NODES for g in range(8)}
        self.nvlink_errors = {(n, g): 0.0 for n in NODES for g in range(8)}

    def _bump(self, key: tuple[str, str, str], per_second: float, dt: float) -> int:
        value = self.totals.get(key, 0.0) + per_second * dt * self.rng.uniform(0.9, 1.1)
        self.totals[key] = value
        return int(value)

    def report(self, node: str, dt: float) -> Report:
        ports = []
        for i in range(9):
            device = f"mlx5_{i}"
            rate = self.rate[(node, device)]
            counters = {
                "transmitted_bytes": self._bump((node, device, "tx"), 0.7 * rate, dt),
                "received_bytes": self._bump((node, device, "rx"), 0.7 * rate, dt),
                "symbol_errors": 0,
            }
            if self.roce:
                marked = self._bump((node, device, "ecn"), self.ecn[(node, device)], dt)
                counters.update(np_ecn_marked_roce_packets=marked, np_cnp_sent=marked)
            else:
                counters["transmit_wait"] = self._bump((node, device, "wait"),
                                                       self.wait[(node, device)], dt)
            ports.append(IbPortReport(device=device, port=1, state=4,
                                      rate_bytes_per_second=rate, counters=counters))
        gpus = [GpuReport(
            index=g, sm_clock_hertz=self.clock[(node, g)], sm_max_clock_hertz=1.98e9,
            throttle_reasons=self.reasons.get((node, g), []),
            processes=self.processes[(node, g)], utilization_ratio=0.95,
            nvlink_replay_errors_total=self._bump((node, f"gpu{g}", "nverr"),
                                                  self.nvlink_errors[(node, g)], dt),
            nvlink_transmitted_bytes_total=self._bump((node, f"gpu{g}", "nvtx"), 2e11, dt),
        ) for g in range(8)]
        return Report(node=node, instance="i", sequence=1, sample_time_seconds=0.0,
                      infiniband=ports, gpus=gpus, topology=TOPOLOGY, topology_digest="t")


class SlowJob:
    """The job ``llm`` on the eight nodes of a :class:`Fleet`, against ``h``'s controller.

    :meth:`play` moves the controller's clock, 5 s at a time: every node reports its
    counters and every rank the steps it took, at the pace given.
    """

    def __init__(self, h: Harness, checkpoints: Path) -> None:
        self.h = h
        doc = {"apiVersion": "training.ai/v1", "kind": "DistributedJob",
               "metadata": {"name": "llm"},
               "spec": {"replicas": len(NODES), "nodes": NODES,
                        "checkpoint": {"dir": str(checkpoints)}}}
        h.controller.jobs.add_job(job_from_json(json.dumps(doc).encode()), "test")
        self.fleet = Fleet()
        self.sequences = dict.fromkeys(NODES, 0)
        self.step, self.step_at = 0, h.clock.time()

    def play(self, seconds: int, step_time: float) -> None:
        """``seconds`` of the job at ``step_time`` seconds a step."""
        h, fleet = self.h, self.fleet
        for _ in range(seconds // 5):
            h.clock.advance(5.0)
            now = h.clock.time()
            updates = []  # the steps the ranks took in these 5 s, at the job's pace
            while self.step_at + step_time <= now:
                self.step_at += step_time * fleet.rng.uniform(0.99, 1.01)
                self.step += 1
                updates.append((self.step, min(self.step_at, now)))
            for rank, node in enumerate(NODES):
                self.sequences[node] += 1
                report = msgspec.structs.replace(
                    fleet.report(node, 5.0), node=node, sequence=self.sequences[node],
                    sample_time_seconds=now)
                h.controller.ingest(msgspec.json.encode(report), OPEN_ACCESS, None)
                h.controller.jobs.progress("llm", rank, node, len(NODES), updates, None)
            h.controller.sweep()
