"""A simulated cluster running a real training job (the launcher under the simulator):
starting it, killing nodes, and the checks that a recovery restored the job once and
finished it. Shared by the job-recovery, compound-fault, HA and crash-recovery
integration tests."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
import yaml

from sn_monitor.dcp import is_complete
from sn_monitor.sim import launcher
from tests.integration.cluster import Cluster, metric_value

LAUNCHER = launcher.LAUNCHER


#: Bounded waits, generous for a loaded two-core machine.
WAIT = 60.0


STEP_TIME = 0.05


CHECKPOINT_EVERY = 40


#: Evictions to the logging command script; job actions to each job's own launcher.
ROUTES = {"evict": ["command"], "cordon": ["command"], "uncordon": ["command"]}


CONFIG: dict[str, Any] = {
    "policy": {"breaker": {"window": "5s"}},
    "recovery": {"checkpoint_wait": "15s", "scan_interval": "2s", "evict_timeout": "30s",
                 "restore_timeout": "60s"},
}


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


SMALL = [f"sim-{i}" for i in range(4)]


SPARE = "sim-4"


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
