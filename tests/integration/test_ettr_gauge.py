"""``sn_job_effective_training_ratio`` of a real controller equals the job history's truth.

A real ``sn-monitor controller`` process is told a job's history over HTTP, the way the
training client tells it (``POST .../progress`` and ``.../checkpoints``, with the steps'
own wall times): steps, blocking checkpoint saves, a stall, a fault and a restart from
an older checkpoint that redoes steps (tests/support/ettr_history.py). The history ends
now, so its wall time is known to the test: the gauge scraped from ``/metrics`` must be
the productive seconds worked out by hand over it, within 0.1 point.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.cluster import Cluster, metric_value
from tests.support.ettr_history import END, KEPT, STEP, history

pytestmark = pytest.mark.integration

JOB = "ettr"
NODE = "sim-0"


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, nodes=0) as c:
        c.start_controller()
        yield c


def _post(c: Cluster, path: str, body: dict[str, Any], token: str) -> None:
    reply = requests.post(f"{c.url}{path}", json=body, timeout=10,
                          headers={"Authorization": f"Bearer {token}"})
    assert reply.status_code < 300, reply.text


def test_the_gauge_is_the_histories_productive_time_over_its_wall_time(
        controller: Cluster, tmp_path: Path) -> None:
    c = controller
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _post(c, "/api/v1/jobs", {
        "apiVersion": "sn-monitor/v1", "kind": "DistributedJob", "metadata": {"name": JOB},
        "spec": {"replicas": 1, "nodes": [NODE], "checkpointInterval": "1h",
                 "hangTimeout": "1h", "checkpoint": {"dir": str(ckpt), "marker": "COMPLETE"}},
    }, c.admin_token)
    start = time.time() - END  # the history ends now: every time it reports is past
    for kind, step, value in history():
        if kind == "step":
            _post(c, f"/api/v1/jobs/{JOB}/progress", {
                "rank": 0, "node": NODE, "world_size": 1,
                "updates": [{"step": step, "time": start + value}],
                "step_time_seconds": STEP}, c.agent_token)
        elif kind == "save":
            path = ckpt / f"step_{step:09d}"
            path.mkdir(exist_ok=True)
            (path / "COMPLETE").touch()
            _post(c, f"/api/v1/jobs/{JOB}/checkpoints", {
                "rank": 0, "node": NODE, "step": step, "path": str(path),
                "save_seconds": value}, c.agent_token)
    gauge = metric_value(c.controller_metrics(), "sn_job_effective_training_ratio", job=JOB)
    scraped = time.time()  # the wall time ran until the scrape, at most this long
    assert gauge is not None
    truth = KEPT / (scraped - start)
    assert gauge == pytest.approx(truth, abs=0.001), (gauge, truth)
    api = c.get(f"/api/v1/jobs/{JOB}")["effective_training_ratio"]
    assert api == pytest.approx(truth, abs=0.001), (api, truth)
