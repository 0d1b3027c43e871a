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
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from sn_monitor.dcp import is_complete
from sn_monitor.sim import launcher
from tests.integration.cluster import Cluster, metric_value

pytestmark = pytest.mark.integration

LAUNCHER = launcher.LAUNCHER
#: Bounded waits, generous for a loaded two-core machine.
WAIT = 60.0
#: The node-lost rule's heartbeat timeout (10 s), settle, a sweep, slack.
LOST_WAIT = 10.0 + 40.0
STEP_TIME = 0.05
CHECKPOINT_EVERY = 40
#: Evictions to the logging command script; job actions to each job's own launcher.
ROUTES = {"evict": ["command"], "cordon": ["command"], "uncordon": ["command"]}
CONFIG: dict[str, Any] = {
    "policy": {"breaker": {"window": "5s"}},
    "recovery": {"checkpoint_wait": "15s", "scan_interval": "2s", "evict_timeout": "30s",
                 "restore_timeout": "60s"},
}
#: A big incomplete checkpoint: newest by step, data present, no .metadata.
DECOY = "step_999999999"


class Job:
    """A DistributedJob, its launcher's state file and its ranks."""

    def __init__(self, c: Cluster, name: str, nodes: list[str], spares: list[str], *,
                 strategy: str = "restart", max_failures: int = 3,
                 hang_timeout: str = "60s", min_replicas: int = 1,
                 rank_args: dict[int, str] | None = None, restart_delay: float = 0.0,
                 hold_file: Path | None = None) -> None:
        self.c = c
        self.name = name
        self.nodes = nodes
        self.root = c.root / f"job-{name}"
        self.root.mkdir(parents=True, exist_ok=True)
        self.ckpt = self.root / "ckpt"
        self.ckpt.mkdir(exist_ok=True)
        self.state_path = self.root / "launcher.json"
        self.spec: dict[str, Any] = {
            "apiVersion": "sn-monitor/v1", "kind": "DistributedJob",
            "metadata": {"name": name},
            "spec": {
                "replicas": len(nodes), "minReplicas": min_replicas,
                "nodes": nodes, "spares": spares,
                "checkpointInterval": "5s", "maxFailures": max_failures,
                "recoveryStrategy": strategy, "hangTimeout": hang_timeout,
                "checkpoint": {"dir": str(self.ckpt)},
                "control": {"command": {
                    "program": [*LAUNCHER, "--state",
                                str(self.state_path)],
                    "timeout": "30s"}},
            },
        }
        extra = [f"--rank-args={rank}={args}" for rank, args in (rank_args or {}).items()]
        if hold_file is not None:
            extra.append(f"--hold-file={hold_file}")
        self._launcher("init", "--controller", ",".join(c.urls), "--job", name,
                       "--token-file", str(c.root / "agent.token"),
                       "--checkpoint-dir", str(self.ckpt), "--log-dir", str(self.root / "logs"),
                       "--restart-delay", str(restart_delay), "--flush-interval", "0.5",
                       *extra, "--", "--steps", "1000000", "--step-time", str(STEP_TIME),
                       "--checkpoint-every", str(CHECKPOINT_EVERY), "--width", "16")
        c.log_sources.append(self.logs)

    def _launcher(self, *args: str) -> None:
        done = subprocess.run([*LAUNCHER, "--state", str(self.state_path),
                               *args], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"launcher {args[0]}: {done.stdout}{done.stderr}"

    # ------------------------------------------------------------------ setup

    def write(self, jobs_dir: Path) -> None:
        jobs_dir.mkdir(parents=True, exist_ok=True)
        (jobs_dir / f"{self.name}.yaml").write_text(yaml.safe_dump(self.spec))

    def post(self) -> None:
        reply = requests.post(f"{self.c.url}/api/v1/jobs", json=self.spec, timeout=10,
                              headers={"Authorization": f"Bearer {self.c.admin_token}"})
        assert reply.status_code == 201, reply.text

    def start(self) -> None:
        """Generation 0 on the job's nodes; wait until every rank reports and a
        complete checkpoint exists."""
        self._launcher("start", "--nodes", ",".join(self.nodes))

        def running() -> dict[str, Any] | None:
            doc = self.get()
            return doc if (doc["ranks_reporting"] == len(self.nodes)
                           and doc["checkpoint"] is not None) else None
        self.c.wait_for(running, WAIT, f"job {self.name}: every rank reporting, a checkpoint")

    def close(self) -> None:
        """Kill every rank this job ever started (only our train.py pids)."""
        launcher.kill_ranks(launcher.load(self.state_path).get("all_pids", []))

    # ------------------------------------------------------------------ reading

    def get(self) -> dict[str, Any]:
        return dict(self.c.get(f"/api/v1/jobs/{self.name}"))

    def state(self) -> dict[str, Any]:
        return launcher.load(self.state_path)

    def calls(self, action: str) -> list[dict[str, Any]]:
        return [c for c in self.state().get("calls", []) if c["action"] == action]

    def recoveries(self) -> list[dict[str, Any]]:
        return list(self.c.get("/api/v1/recoveries", job=self.name)["recoveries"])

    def rank_of(self, node: str) -> dict[str, Any]:
        return next(r for r in self.state()["ranks"] if r["node"] == node)

    def logs(self) -> str:
        state = self.state()
        parts = [f"===== job {self.name}: launcher state generation "
                 f"{state.get('generation')}, calls "
                 + json.dumps([{k: c.get(k) for k in ("action", "action_id", "duplicate")}
                               for c in state.get("calls", [])])]
        for rank in state.get("ranks", [])[:4]:
            path = Path(rank["log"])
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            parts.append(f"===== {path.name}\n" + "\n".join(text.splitlines()[-6:]))
        return "\n".join(parts)

    # ------------------------------------------------------------------ waits

    def wait_recovery(self, state: str, timeout: float = WAIT,
                      after: set[str] | None = None) -> dict[str, Any]:
        """The job's newest recovery (not in ``after``) once it is in ``state``."""
        def probe() -> dict[str, Any] | None:
            found = [r for r in self.recoveries() if r["id"] not in (after or set())]
            return found[0] if found and found[0]["state"] == state else None
        return self.c.wait_for(probe, timeout, f"job {self.name}: a recovery {state}")

    def wait_resumed(self, rec: dict[str, Any]) -> dict[str, Any]:
        """Generation ``rec``'s ranks made progress past the checkpoint it restored."""
        floor = rec["checkpoint"]["step"] if rec["checkpoint"] else 0

        def probe() -> dict[str, Any] | None:
            doc = self.get()
            return doc if (doc["state"] == "running" and doc["generation"] == rec["generation"]
                           and doc["last_step"] is not None
                           and doc["last_step"] > floor + 5) else None
        doc = self.c.wait_for(probe, WAIT, f"job {self.name}: progress past step {floor}")
        # The restored ranks themselves loaded one complete checkpoint, that one or a
        # newer one (the old rank 0 of this simulation, which nothing stops before the
        # launcher does, may have saved another in between).
        ranks = self.state()["ranks"]
        assert {r["generation"] for r in ranks} == {rec["generation"]}, ranks

        def loaded() -> set[int] | None:
            steps = set()
            for r in ranks:
                found = re.search(r"resuming from step (\d+) ",
                                  Path(r["log"]).read_text(errors="replace"))
                if found is None:
                    return None
                steps.add(int(found.group(1)))
            return steps
        steps = self.c.wait_for(loaded, WAIT, f"every rank of generation {rec['generation']}"
                                              " resuming from a checkpoint")
        assert len(steps) == 1, steps
        (step,) = steps
        assert step >= floor
        assert step in complete_steps(self.ckpt)
        return doc


@contextlib.contextmanager
def cluster_with(tmp: Path, nodes: int, **kwargs: Any) -> Iterator[Cluster]:
    c = Cluster(tmp, nodes=nodes, config=CONFIG, routes=ROUTES, **kwargs)
    jobs: list[Job] = []
    c.jobs = jobs  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        for job in jobs:
            job.close()
        c.close()


def new_job(c: Cluster, *args: Any, **kwargs: Any) -> Job:
    job = Job(c, *args, **kwargs)
    c.jobs.append(job)  # type: ignore[attr-defined]
    return job


def evictions(c: Cluster, node: str) -> list[dict[str, str]]:
    return [x for x in c.script_calls(c.evict_log)
            if x["SN_ACTION"] == "evict" and x["SN_NODE"] == node]


def complete_steps(ckpt: Path) -> list[int]:
    return sorted(int(d.name.removeprefix("step_")) for d in ckpt.iterdir()
                  if d.name.startswith("step_") and is_complete(d))


def make_decoy(ckpt: Path) -> Path:
    """A newer checkpoint still being written: data, no .metadata."""
    decoy = ckpt / DECOY
    decoy.mkdir()
    (decoy / "__0_0.distcp").write_bytes(b"\0" * 4096)
    assert not is_complete(decoy)
    return decoy


def assert_restored_once(job: Job, rec: dict[str, Any]) -> dict[str, Any]:
    """The launcher took exactly one restore for ``rec``, with its nodes and checkpoint."""
    restores = [x for x in job.calls("restore") if x["params"].get("recovery") == rec["id"]]
    assert len(restores) == 1, restores
    call = restores[0]
    assert not call["duplicate"]
    params = call["params"]
    assert params["nodes"] == rec["nodes"]
    assert params["generation"] == rec["generation"]
    assert params["checkpoint"] == rec["checkpoint"]
    assert call["killed"], call  # the old generation's ranks were stopped
    return call


def assert_done_with_mttr(c: Cluster, job: Job, rec: dict[str, Any]) -> None:
    assert rec["state"] == "done", rec
    times = rec["times"]
    assert rec["mttr_seconds"] is not None
    assert rec["mttr_seconds"] > 0
    assert times["fault_seen"] <= times["detected"] <= times["evicted"] \
        <= times["restore_sent"] <= times["resumed"], times
    # progress of the new generation only: resumed after the launcher started it
    restore = next(x for x in job.calls("restore") if x["params"].get("recovery") == rec["id"])
    assert times["resumed"] > restore["at"], (times, restore["at"])
    text = c.controller_metrics()
    count = metric_value(text, "sn_recovery_duration_seconds_count", job=job.name)
    assert count is not None
    assert count >= 1, count


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


SMALL = [f"sim-{i}" for i in range(4)]
SPARE = "sim-4"


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


def start_a_slow_recovery(c: Cluster) -> tuple[Job, dict[str, Any]]:
    """A 4-node job whose sim-2 falls off the bus; its recovery once the launcher took
    the restore and before the new generation (which starts 6 s late) made progress."""
    job = new_job(c, "sturdy", SMALL, [SPARE], restart_delay=6.0)
    job.post()
    job.start()
    c.agents["sim-2"].fault("fall-off-bus", 0)

    def restore_taken() -> dict[str, Any] | None:
        # the restore action recorded as succeeded, not only the launcher done: a
        # controller killed while the launcher runs cannot know whether it ran
        # (the runner fails such an action and the recovery retries the restore)
        recs = job.recoveries()
        if not recs or recs[0]["state"] != "restoring" or "restore" not in recs[0][
                "actions"]:
            return None
        ok = [a for a in c.actions() if a["id"] == recs[0]["actions"]["restore"]
              and a["state"] == "succeeded"]
        return recs[0] if ok else None
    rec = c.wait_for(restore_taken, WAIT, "the launcher took the restore")
    assert rec["times"]["resumed"] is None
    return job, rec


def assert_finished_without_repeating(c: Cluster, job: Job, rec: dict[str, Any],
                                      before: set[str]) -> None:
    """``rec`` (interrupted by the loss of its controller) is done: restored once, one
    eviction, each of its actions once (``before``: those recorded when it was lost),
    none retried, no action reached the launcher twice, and the job trains again."""
    done = job.wait_recovery("done")
    assert done["id"] == rec["id"]
    assert done["generation"] == rec["generation"] == 1
    assert_restored_once(job, done)
    assert len(evictions(c, "sim-2")) == 1
    keys = [a["key"] for a in _actions_of(c, rec["id"], running=True)]
    assert len(keys) == len(set(keys)), keys
    assert not [k for k in keys if k.rsplit(":", 1)[-1].isdigit()], keys  # no retries
    assert set(keys) >= before
    checkpoints = [x for x in job.calls("checkpoint")
                   if x["action_id"] == done["actions"].get("checkpoint")]
    assert len(checkpoints) <= 1
    for call in job.state().get("calls", []):
        assert not call.get("duplicate"), call
    job.wait_resumed(done)
    assert_done_with_mttr(c, job, done)


def _actions_of(c: Cluster, recovery: str, running: bool) -> list[dict[str, Any]]:
    """The recovery's actions (from the store file when the controller is down)."""
    if running:
        return [a for a in c.actions() if a["key"].startswith(f"recovery:{recovery}:")]
    import sqlite3

    with contextlib.closing(sqlite3.connect(c.state_dir / "controller.db")) as db:
        rows = db.execute("SELECT key FROM actions WHERE key LIKE ?",
                          (f"recovery:{recovery}:%",)).fetchall()
    return [{"key": r[0]} for r in rows]
