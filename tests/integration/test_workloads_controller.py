"""A real ``sn-monitor controller`` accounts the agents' workloads: idle GPUs and energy.

Two nodes report over HTTP as agents do: a pod keeps both GPUs of ``sim-0`` busy, a
Slurm job leaves one of ``sim-1``'s two GPUs idle; each report's energy counters have
risen by 50 J a GPU. With ``workloads.idle_after`` at 2 s the test polls until the idle
GPU shows (no sleep judged), then ``GET /api/v1/workloads`` and /metrics must show it
for the job alone, and the energy the reports add up to.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.cluster import Cluster, metric_value

pytestmark = pytest.mark.integration

POD = {"pod": "train-0", "namespace": "ml", "container": "main"}
JOB = {"slurm_job": "4242", "user": "ada", "partition": "gpu", "workload_job": "sweep"}
NODES = {"sim-0": (POD, (0.9, 0.8)), "sim-1": (JOB, (0.7, 0.0))}
JOULES = 50.0


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, nodes=0, config={"workloads": {"idle_after": "2s"}}) as c:
        c.start_controller()
        yield c


class Agents:
    """The two nodes' reports, each a step further: sequence, time, energy counters."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.sent = 0

    def report(self) -> None:
        self.sent += 1
        for node, (held, utilizations) in NODES.items():
            body = {"node": node, "instance": "i-1", "sequence": self.sent,
                    "sample_time_seconds": time.time(), "interval_seconds": 1.0,
                    "gpus": [{"index": i, "utilization_ratio": u,
                              "memory_used_bytes": 2**30,
                              "energy_joules_total": 1e6 + JOULES * self.sent,
                              "workloads": [held]} for i, u in enumerate(utilizations)]}
            reply = requests.post(f"{self.c.url}/api/v1/reports", json=body, timeout=10,
                                  headers={"Authorization": f"Bearer {self.c.agent_token}"})
            assert reply.status_code == 200, reply.text

    def workloads_once_idle(self) -> dict[str, dict[str, Any]] | None:
        """Report once more; the workloads by pod or job once the job's idle GPU shows."""
        self.report()
        found = {w["pod"] or w["slurm_job"]: w
                 for w in self.c.get("/api/v1/workloads")["workloads"]}
        return found if found.get("4242", {}).get("idle_gpus") else None


def test_the_job_leaving_a_gpu_idle_shows_it_alone_with_its_energy(
        controller: Cluster) -> None:
    c = controller
    agents = Agents(c)
    found = c.wait_for(agents.workloads_once_idle, 30, "the job's idle GPU", interval=0.5)
    pod, job = found["train-0"], found["4242"]
    assert (pod["kind"], pod["gpus"], pod["idle_gpus"]) == ("kubernetes", 2, 0)
    assert (job["kind"], job["gpus"], job["idle_gpus"]) == ("slurm", 2, 1)
    assert [(g["node"], g["gpu"]) for g in job["held"] if g["idle"]] == [("sim-1", 1)]
    assert not any(g["idle"] for g in pod["held"])
    # every report after the first adds 50 J on each of the two GPUs, to each workload
    expected = 2 * JOULES * (agents.sent - 1)
    assert job["energy_joules_total"] == pytest.approx(expected)
    assert pod["energy_joules_total"] == pytest.approx(expected)
    assert job["job"] == "sweep"
    metrics = c.controller_metrics()
    assert metric_value(metrics, "sn_workload_idle_gpus", slurm_job="4242") == 1.0
    assert metric_value(metrics, "sn_workload_idle_gpus", pod="train-0") == 0.0
    assert metric_value(metrics, "sn_workload_energy_joules_total",
                        slurm_job="4242") == pytest.approx(expected)
