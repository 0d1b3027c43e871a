"""The job file users copy (deploy/jobs/minimal.yaml, training.ai/v1, four fields) as a
whole job through the API: its nodes are where its ranks report from, its checkpoints are
what the client reports, and with no launcher named the training client is the channel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sn_monitor.controller.audit import ActionRequest
from tests.support.api import OPERATE, READ, YAML, Api

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "deploy" / "jobs" / "minimal.yaml"
JOB = "trillion-model"


def _progress(api: Api, rank: int, node: str, step: int) -> None:
    now = api.h.clock.time()
    reply = api.post(f"/api/v1/jobs/{JOB}/progress", token=OPERATE, json={
        "rank": rank, "node": node, "world_size": 2,
        "updates": [{"step": step, "time": now}]})
    assert reply.status_code == 200, reply.text


def _post_seed(api: Api) -> Any:
    return api.post("/api/v1/jobs", token=OPERATE, content=SEED.read_bytes(), headers=YAML)


def test_the_seed_file_is_accepted_as_written(api: Api) -> None:
    created = _post_seed(api)
    assert created.status_code == 201, created.text
    doc = api.get(f"/api/v1/jobs/{JOB}", token=READ).json()
    assert (doc["state"], doc["state_reason"]) == ("pending", "waiting for ranks 0/128")
    assert doc["effective_training_ratio"] is None
    assert (doc["replicas"], doc["max_failures"], doc["strategy"]) == (128, 40, "elastic")
    assert doc["nodes"] == []
    assert doc["spares"] == []
    assert doc["spec"]["apiVersion"] == "training.ai/v1"


def test_its_nodes_are_those_its_ranks_report_from(api: Api) -> None:
    assert _post_seed(api).status_code == 201
    _progress(api, 0, "gpu-001", 1)
    _progress(api, 1, "gpu-002", 1)
    doc = api.get(f"/api/v1/jobs/{JOB}", token=READ).json()
    assert (doc["state"], doc["nodes"]) == ("running", ["gpu-001", "gpu-002"])
    assert api.h.controller.jobs.jobs_of_node("gpu-002") == [JOB]


def test_with_no_launcher_the_training_client_is_the_channel(api: Api) -> None:
    assert _post_seed(api).status_code == 201
    router = api.h.controller.drivers.by_action["restore"]
    request = ActionRequest(id="r1", key="k1", action="restore", node=None, reason="test",
                            params={"job": JOB, "nodes": ["gpu-001"]})
    outcome = router.run(request)
    assert outcome.details["via"] == "client"
    assert "progress replies" in outcome.message
