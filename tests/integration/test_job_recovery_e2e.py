"""Job recovery end to end: controller, simulated agents, a launcher and real training ranks.

Every process is real: ``sn-monitor controller`` (with ``--jobs DIR`` or jobs posted to
the API), ``sn-monitor agent --simulate 8`` per node, and the job's ranks, one
``sn_monitor.sim.train`` per node started by ``sn_monitor.sim.launcher`` (the job's
``spec.control`` command; it kills and restarts ranks on ``restore``). Evictions go to the
command script of ``cluster.py`` (``evict.log``); checkpoint / restore go to each job's
launcher.

The 16-node job (16 agents + 2 spares, 18 agents in all) is test (a); test (e) reuses
its cluster with a fresh 16-node elastic job. The others use 4 nodes + 1 spare on a
cluster of their own, so that one test's faults never touch another's job.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sn_monitor.dcp import is_complete
from sn_monitor.sim import launcher
from tests.integration.cluster import Cluster, metric_value
from tests.support.job_recovery import (
    SMALL,
    SPARE,
    WAIT,
    _actions_of,
    assert_done_with_mttr,
    assert_finished_without_repeating,
    assert_restored_once,
    cluster_with,
    complete_steps,
    evictions,
    new_job,
    start_a_slow_recovery,
)

pytestmark = pytest.mark.integration

#: The node-lost rule's heartbeat timeout (10 s), settle, a sweep, slack.
LOST_WAIT = 10.0 + 40.0
#: A big incomplete checkpoint: newest by step, data present, no .metadata.
DECOY = "step_999999999"


def make_decoy(ckpt: Path) -> Path:
    """A newer checkpoint still being written: data, no .metadata."""
    decoy = ckpt / DECOY
    decoy.mkdir()
    (decoy / "__0_0.distcp").write_bytes(b"\0" * 4096)
    assert not is_complete(decoy)
    return decoy


# ---------------------------------------------------------------------- 16 nodes


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """18 agents (sim-0 .. sim-17); the 16-node job of test (a) comes from --jobs DIR."""
    root = tmp_path_factory.mktemp("big")
    with cluster_with(root, 18, jobs_dir=root / "jobs", sim_speed=5.0) as c:
        job = new_job(c, "big", [f"sim-{i}" for i in range(16)], ["sim-16", "sim-17"])
        job.write(root / "jobs")
        c.start(timeout=90)
        yield c


def test_a_fatal_xid_evicts_the_node_takes_a_spare_and_restores(big: Cluster) -> None:
    c = big
    job = c.jobs[0]  # type: ignore[attr-defined]
    assert job.get()["source"].endswith("big")  # loaded from the --jobs directory
    job.start()
    failed = "sim-5"
    make_decoy(job.ckpt)
    c.agents[failed].fault("fall-off-bus", 0)

    rec = job.wait_recovery("done")
    # the node is out, the first spare in, the rest of the job where it was
    assert rec["failed_nodes"] == [failed]
    assert rec["replacement_nodes"] == ["sim-16"]
    assert rec["nodes"] == [f"sim-{i}" for i in range(16) if i != 5][:5] + ["sim-16"] + \
        [f"sim-{i}" for i in range(6, 16)]
    assert rec["kind"] == "fatal"
    doc = job.get()
    assert failed not in doc["nodes"]
    assert "sim-16" in doc["nodes"]
    assert len(doc["nodes"]) == 16
    assert doc["spares"][0] == "sim-17"  # and sim-5 itself, once repaired (below)
    assert doc["failed_nodes"] == [failed]
    assert doc["generation"] == 1 == rec["generation"]
    # the ranks on a GPU that fell off the bus died with it: no checkpoint is waited
    # for, and the latest *complete* one is restored
    events = [h["event"] for h in rec["history"]]
    assert events[:2] == ["detected", "evict-done"], events
    assert rec["checkpoint"] is not None
    assert rec["checkpoint"]["path"] != str(job.ckpt / DECOY)
    assert rec["checkpoint"]["step"] in complete_steps(job.ckpt)
    assert rec["checkpoint"]["step"] == max(
        s for s in complete_steps(job.ckpt)
        if (job.ckpt / f"step_{s:09d}" / ".metadata").stat().st_mtime
        <= rec["times"]["restore_sent"])
    assert not is_complete(job.ckpt / DECOY)
    call = assert_restored_once(job, rec)
    assert len(call["killed"]) == 16
    assert [r["node"] for r in job.state()["ranks"]] == rec["nodes"]
    # evicted once, through the node driver
    ev = evictions(c, failed)
    assert len(ev) == 1, ev
    assert json.loads(ev[0]["SN_PARAMS"])["job"] == "big"
    resumed = job.wait_resumed(rec)
    assert resumed["last_step"] > rec["checkpoint"]["step"]
    assert_done_with_mttr(c, job, rec)
    assert metric_value(c.controller_metrics(), "sn_job_generation", job="big") == 1.0
    # XID 79, from NVML's event or the kernel log's line (one fault, one incident)
    fatal = [i for i in c.incidents(node=failed) if i["rule"] == "fatal-xid"]
    assert fatal
    assert fatal[0]["id"] in rec["incident_ids"]
    # the node itself is repaired with no person: XID 79 (NVIDIA: RESTART_BM) starts the
    # remediation ladder at a reboot, the simulated agent reboots (its GPU is back), its
    # check passes, and the job takes it back as a spare
    c.wait_for(lambda: failed in job.get()["spares"], 120,
               f"{failed} back in the spare pool after its repair")
    (repair,) = [r for r in c.get("/api/v1/remediation", node=failed)["repairs"]
                 if r["step"] == "done"]
    assert repair["rung"] == "reboot"
    assert any(line.split(" ", 1)[1].startswith("verified") for line in repair["history"])
    back = [a for a in c.actions(node=failed) if a["action"] == "return-to-service"]
    assert len(back) == 1, back
    assert failed not in job.get()["nodes"]


def test_e_elastic_shrinks_to_15_nodes_without_spares(big: Cluster) -> None:
    c = big
    for other in c.jobs:  # type: ignore[attr-defined]
        other.close()
        with contextlib.suppress(requests.HTTPError):
            requests.delete(f"{c.url}/api/v1/jobs/{other.name}", timeout=10,
                            headers={"Authorization": f"Bearer {c.admin_token}"})
    healthy = [n["name"] for n in c.get("/api/v1/nodes")["nodes"] if n["state"] == "healthy"]
    healthy.sort(key=lambda n: int(n.split("-")[1]))
    assert len(healthy) >= 16, healthy
    nodes = healthy[:16]
    job = new_job(c, "wide", nodes, [], strategy="elastic", min_replicas=8)
    job.post()
    job.start()
    failed = nodes[7]
    c.agents[failed].fault("xid", 1, code=79)

    rec = job.wait_recovery("done")
    assert rec["strategy"] == "elastic"
    assert rec["failed_nodes"] == [failed]
    assert rec["replacement_nodes"] == []
    assert rec["nodes"] == [n for n in nodes if n != failed]
    doc = job.wait_resumed(rec)
    assert len(doc["nodes"]) == 15
    assert failed not in doc["nodes"]
    assert doc["world_size"] == 15
    call = assert_restored_once(job, rec)
    assert len(call["params"]["nodes"]) == 15
    assert len(evictions(c, failed)) == 1
    assert_done_with_mttr(c, job, rec)


# ---------------------------------------------------------------------- 4 nodes + 1 spare


def test_b_a_lost_node_is_recovered_like_a_fatal_xid(tmp_path: Path) -> None:
    with cluster_with(tmp_path, 5) as c:
        c.start()
        job = new_job(c, "lost", SMALL, [SPARE])
        job.post()
        job.start()
        failed = "sim-2"
        c.agents[failed].kill(signal.SIGKILL)  # the node is gone: its agent and its rank
        launcher.kill_ranks([job.rank_of(failed)["pid"]])

        rec = job.wait_recovery("done", timeout=LOST_WAIT + WAIT)
        assert rec["kind"] == "lost"
        assert rec["failed_nodes"] == [failed]
        lost = [i for i in c.incidents(node=failed) if i["rule"] == "node-lost"]
        assert lost
        assert lost[0]["id"] in rec["incident_ids"]
        # not alive: no checkpoint first
        assert "checkpointing" not in [h["event"] for h in rec["history"]]
        assert rec["nodes"] == ["sim-0", "sim-1", SPARE, "sim-3"]
        assert_restored_once(job, rec)
        assert len(evictions(c, failed)) == 1
        job.wait_resumed(rec)
        assert_done_with_mttr(c, job, rec)


def test_c_a_hung_rank_opens_a_job_hang_incident_and_is_recovered(tmp_path: Path) -> None:
    # The culprit (rank 2) stops at step 80; the others stop 60 steps (3 s) later, as
    # ranks waiting for it in a collective would: the job as a whole stalls.
    with cluster_with(tmp_path, 5) as c:
        c.start()
        job = new_job(c, "hang", SMALL, [SPARE], hang_timeout="3s",
                      rank_args={0: "--hang-at 140", 1: "--hang-at 140", 2: "--hang-at 80",
                                 3: "--hang-at 140"})
        job.post()
        job.start()

        def hang_incident() -> dict[str, Any] | None:
            found = [i for i in c.incidents(status="open") if i["rule"] == "job-hang"]
            return found[0] if found else None
        incident = c.wait_for(hang_incident, WAIT, "an open job-hang incident")
        assert incident["node"] == "sim-2"
        assert incident["subject"] == "job:hang"
        assert "rank(s) 2 on sim-2" in incident["message"] or \
            "ranks 2 on sim-2" in incident["message"], incident
        rec = job.wait_recovery("done")
        assert rec["kind"] == "hang"
        assert rec["failed_nodes"] == ["sim-2"]
        assert incident["id"] in rec["incident_ids"]
        assert rec["nodes"] == ["sim-0", "sim-1", SPARE, "sim-3"]
        assert_restored_once(job, rec)
        assert len(evictions(c, "sim-2")) == 1
        job.wait_resumed(rec)  # generation 1 runs without --hang-at
        assert_done_with_mttr(c, job, rec)
        c.wait_for(lambda: not [i for i in c.incidents(status="open")
                                if i["rule"] == "job-hang"], WAIT,
                   "the job-hang incident closed once the job runs again")


def test_d_more_than_max_failures_fails_the_job_and_pages(tmp_path: Path) -> None:
    with cluster_with(tmp_path, 5) as c:
        c.start()
        job = new_job(c, "fragile", SMALL, [SPARE], max_failures=0)
        job.post()
        job.start()
        c.agents["sim-1"].fault("fall-off-bus", 0)

        rec = job.wait_recovery("failed")
        assert "maxFailures" in rec["error"]
        doc = job.get()
        assert doc["state"] == "failed"
        assert "maxFailures" in doc["state_reason"]

        def page() -> list[dict[str, Any]]:
            return [a for a in c.actions() if a["action"] == "alert"
                    and a["rule"] == "job-failed" and a["severity"] == "critical"
                    and a["state"] == "succeeded"]
        alerts = c.wait_for(page, WAIT, "a critical job-failed alert")
        assert len(alerts) == 1
        assert alerts[0]["params"]["job"] == "fragile"
        assert job.calls("restore") == []  # given up: never restored
        assert len(evictions(c, "sim-1")) == 1  # the broken node still leaves
        c.wait_sweeps(2, WAIT, "the failed job looked at again")  # it stays failed
        c.wait_settled(WAIT, "no action for the failed job")
        assert job.get()["state"] == "failed"
        assert job.calls("restore") == []


def test_f_manual_recovery_waits_for_approval(tmp_path: Path) -> None:
    with cluster_with(tmp_path, 5) as c:
        c.start()
        job = new_job(c, "careful", SMALL, [SPARE], strategy="manual")
        job.post()
        job.start()
        c.agents["sim-3"].fault("fall-off-bus", 0)

        rec = job.wait_recovery("awaiting_approval")
        assert rec["nodes"] == ["sim-0", "sim-1", "sim-2", SPARE]
        assert job.get()["state"] == "awaiting_approval"
        # nobody approved: the sweeps go by, nothing happens
        c.wait_sweeps(2, WAIT, "the recovery looked at again without an approval")
        c.wait_settled(WAIT, "no action without an approval")
        assert job.recoveries()[0]["state"] == "awaiting_approval"
        assert job.calls("restore") == []
        approved = requests.post(f"{c.url}/api/v1/recoveries/{rec['id']}/approve", timeout=10,
                                 headers={"Authorization": f"Bearer {c.admin_token}"})
        assert approved.status_code == 200, approved.text
        done = job.wait_recovery("done")
        assert done["id"] == rec["id"]
        assert "approved" in [h["event"] for h in done["history"]]
        assert_restored_once(job, done)
        job.wait_resumed(done)
        assert_done_with_mttr(c, job, done)
        again = requests.post(f"{c.url}/api/v1/recoveries/{rec['id']}/approve", timeout=10,
                              headers={"Authorization": f"Bearer {c.admin_token}"})
        assert again.status_code == 409


def test_g_a_controller_killed_mid_recovery_resumes_without_repeating(
        tmp_path: Path) -> None:
    # Restored ranks start 6 s late (a slow scheduler): the controller is killed after
    # the launcher took the restore and before the new generation made progress.
    with cluster_with(tmp_path, 5) as c:
        c.start()
        job, rec = start_a_slow_recovery(c)
        assert c.controller.kill(signal.SIGKILL) == -signal.SIGKILL
        before = {a["key"] for a in _actions_of(c, rec["id"], running=False)}
        c.start_controller()
        assert_finished_without_repeating(c, job, rec, before)


