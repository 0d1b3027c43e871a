"""Every mutating API call leaves an audit record naming the token that made it.

Through the real app (tokens, roles) around a real controller: cordon, uncordon,
approving an action, creating and deleting a job, returning a node to a job's spares and
approving a job's recovery each appear in ``GET /api/v1/actions`` with ``requested_by``
the token's name. (Alertmanager's webhook: tests/unit/test_alert_intake.py,
``rule:<rule> via alertmanager:<token name>``.) A call that is refused says so in its
record, and a store that takes no writes refuses the call instead of acting unrecorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from sn_monitor.controller.actions.policy import PolicySettings
from tests.support.api import ADMIN, READ, Api, make_api
from tests.support.audit import _job
from tests.support.jobs import checkpoint


def _trail(client: Api) -> list[dict[str, Any]]:
    client.h.settle()
    return list(client.get("/api/v1/actions", params={"limit": 1000}).json()["actions"])


def test_every_mutating_call_names_its_token(tmp_path: Path) -> None:
    client, h = make_api(tmp_path, policy=PolicySettings(approval=["cordon"],
                                                          max_unavailable="100%"))
    try:
        with client.client:
            for node in ("gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6"):
                assert client.report(node).status_code == 200
            # a cordon by hand, awaiting approval, approved; then an uncordon
            asked = client.post("/api/v1/nodes/gpu-2/cordon", json={"reason": "fan"})
            assert asked.status_code == 202
            waiting = asked.json()
            assert waiting["state"] == "awaiting_approval", waiting
            assert client.post(f"/api/v1/actions/{waiting['id']}/approve").status_code == 200
            h.settle()
            assert client.post("/api/v1/nodes/gpu-2/uncordon").status_code == 202
            h.settle()
            # a job: created, a manual recovery approved, a node back to the spares, deleted
            spec = _job(tmp_path)
            checkpoint(Path(spec["spec"]["checkpoint"]["dir"]), 100, h.clock)
            created = client.post("/api/v1/jobs", json=spec)
            assert created.status_code == 201, created.text
            (recovery,) = h.controller.jobs.on_node_fault("gpu-4", "fatal", None, False,
                                                          h.clock.time())
            h.settle()  # the eviction runs; a manual recovery then waits for a person
            (listed,) = client.get("/api/v1/recoveries").json()["recoveries"]
            assert (listed["id"], listed["state"]) == (recovery.id, "awaiting_approval")
            approved = client.post(f"/api/v1/recoveries/{recovery.id}/approve")
            assert approved.status_code == 200, approved.text
            back = client.post("/api/v1/jobs/llm/spares/gpu-4")
            assert back.status_code == 200, back.text
            deleted = client.client.delete("/api/v1/jobs/llm",
                                           headers={"Authorization": f"Bearer {ADMIN}"})
            assert deleted.status_code in (200, 204), deleted.text

            trail = _trail(client)
            mine = {(a["action"], a["node"]): a for a in trail
                    if a["requested_by"] in ("oncall", "root")}
            assert mine[("cordon", "gpu-2")]["requested_by"] == "oncall"
            assert mine[("uncordon", "gpu-2")]["requested_by"] == "oncall"
            assert mine[("add-job", None)]["params"]["job"] == "llm"
            assert mine[("add-job", None)]["reason"] == "job llm added (by oncall)"
            assert mine[("approve-recovery", None)]["params"]["recovery"] == recovery.id
            assert mine[("return-to-pool", "gpu-4")]["params"]["job"] == "llm"
            assert mine[("delete-job", None)]["requested_by"] == "root"
            for record in mine.values():
                assert record["state"] in ("succeeded", "running", "pending"), record
            cordon = next(a for a in trail if a["id"] == waiting["id"])
            assert cordon["verdict"].startswith("approved by oncall")
            assert cordon["state"] == "succeeded"
            # the job's spec (its control may hold a secret) stays out of the record
            assert "control" not in msgspec.json.encode(mine[("add-job", None)]).decode()
            # records of API calls are not actions: no driver ran them, no metric counts them
            metrics = h.controller.metrics().decode()
            assert "add-job" not in metrics
    finally:
        h.controller.close()
        h.store.close()


def test_a_refused_call_is_recorded_as_refused(tmp_path: Path) -> None:
    client, h = make_api(tmp_path)
    try:
        with client.client:
            assert client.post("/api/v1/recoveries/nope/approve").status_code == 404
            assert client.post("/api/v1/jobs/nope/spares/gpu-1").status_code == 404
            assert client.client.delete(
                "/api/v1/jobs/nope", headers={"Authorization": f"Bearer {ADMIN}"}
            ).status_code == 404
            assert client.post("/api/v1/recoveries/nope/approve",
                               token=READ).status_code == 403
            trail = _trail(client)
            assert sorted((a["action"], a["state"], a["requested_by"]) for a in trail) == [
                ("approve-recovery", "refused", "oncall"),
                ("return-to-pool", "refused", "oncall"),
            ]  # an unknown job is a 404 before anything is recorded; a 403 records nothing
            assert {a["outcome"] for a in trail} == {"no such recovery", "no such job"}
    finally:
        h.controller.close()
        h.store.close()


def test_no_record_no_change(tmp_path: Path) -> None:
    """A store that takes no writes: the job is not added, and the caller is told why."""
    from tests.support.disk import FullDisk

    client, h = make_api(tmp_path)
    try:
        with client.client, FullDisk(h.store):
            response = client.post("/api/v1/jobs", json=_job(tmp_path))
            assert response.status_code == 503, response.text
            assert "refusing to act" in response.json()["error"]
            assert h.controller.jobs.job("llm") is None
            cordon = client.post("/api/v1/nodes/gpu-1/cordon")
            assert cordon.status_code in (404, 503)
    finally:
        h.controller.close()
        h.store.close()
