"""``GET /api/v1/workloads`` and the ``sn_workload_*`` families, through the HTTP edge.

Two nodes report on a manual clock: a pod busy on gpu-1, a Slurm job on gpu-2 with one
of its two GPUs left idle; reports carry the GPUs' energy counters.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.api import AGENT, Api, make_api

POD = {"pod": "train-0", "namespace": "ml", "container": "main"}
JOB = {"slurm_job": "4242", "user": "ada", "partition": "gpu"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    made, h = make_api(tmp_path)
    yield made
    h.controller.close()
    h.store.close()


def _gpus(held: dict[str, str], utilizations: list[float], energy: float) -> list[dict[str, Any]]:
    return [{"index": i, "utilization_ratio": u, "memory_used_bytes": 2**30,
             "energy_joules_total": energy, "workloads": [held]}
            for i, u in enumerate(utilizations)]


def _run(api: Api, minutes: int) -> None:
    for second in range(0, minutes * 60 + 1, 30):
        if second:
            api.h.clock.advance(30)
        for node, held, utilizations in (("gpu-1", POD, [0.9, 0.8]),
                                         ("gpu-2", JOB, [0.7, 0.0])):
            answer = api.report(node, gpus=_gpus(held, utilizations, 1_000.0 + 10 * second))
            assert answer.status_code == 200, answer.text


def test_the_job_that_leaves_a_gpu_idle_shows_it_and_its_energy(api: Api) -> None:
    _run(api, minutes=11)
    answer = api.get("/api/v1/workloads")
    assert answer.status_code == 200, answer.text
    found = {(w["kind"], w["pod"] or w["slurm_job"]): w for w in answer.json()["workloads"]}
    pod, job = found["kubernetes", "train-0"], found["slurm", "4242"]
    assert (pod["gpus"], pod["idle_gpus"], job["gpus"], job["idle_gpus"]) == (2, 0, 2, 1)
    assert [(g["node"], g["gpu"]) for g in job["held"] if g["idle"]] == [("gpu-2", 1)]
    # 22 intervals of 30 s, 300 J each, on each of two GPUs
    assert job["energy_joules_total"] == pytest.approx(2 * 22 * 300.0)
    assert job["sm_utilization_ratio"] == pytest.approx(0.35)
    assert (job["memory_used_bytes"], job["partition"]) == (2 * 2**30, "gpu")
    metrics = api.get("/metrics").text
    assert 'sn_workload_idle_gpus{namespace="",pod="",slurm_job="4242",user=""} 1.0' in metrics
    assert 'sn_workload_idle_gpus{namespace="ml",pod="train-0",slurm_job="",user=""} 0.0' \
        in metrics
    assert ('sn_workload_energy_joules_total{namespace="",pod="",slurm_job="4242",user=""} '
            '13200.0') in metrics


def test_the_workloads_are_read_only_and_in_the_openapi_document(api: Api) -> None:
    assert api.client.get("/api/v1/workloads").status_code == 401
    assert api.get("/api/v1/workloads", token=AGENT).status_code == 403
    assert api.get("/api/v1/workloads").json() == {"workloads": []}
    assert "/api/v1/workloads" in api.get("/openapi.json").json()["paths"]
