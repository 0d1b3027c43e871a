"""The real torchrun job failing five ways, and ``sn-monitor logs analyze`` naming why.

For each mode of ``examples/pytorch/failures.py`` (a rank SIGKILLed, an out-of-memory
allocation, a NaN loss, a rank that hangs past the collective timeout, an application
exception), ``examples/pytorch/capture_failures.py`` runs the job under torchrun with 4
ranks on gloo and keeps every rank's logs and torchrun's console. The logs must show
the failure (``tests.support.torchrun_failures``), and the offline analysis
(``sn-monitor logs analyze --json``) must name the rank that failed first and the
failure's category, as the mode's ``expected.yaml`` says: never a rank that merely lost
its peer or timed out waiting for it.

Then the live path: the run's logs are written into the directory a real agent follows
(``job_logs``: torchrun's ``--log-dir`` layout and its console), as the job writes them on
its node; the agent recognises them and sends its findings as ``log`` events to a real
controller, where the job runs on that node and its ranks have reported progress (as
the training client does). The controller's ``GET /api/v1/jobs/<job>`` must name the same
first rank and category, once its triage has settled (30 s after the first finding).

``make e2e`` runs it (torch: ``pip install -e '.[examples]'``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration.cluster import Cluster
from tests.support.torch_env import torch_available
from tests.support.torchrun_failures import (
    CAPTURE,
    MODES,
    WORLD,
    assert_evidence,
    expected,
    log_paths,
)

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not torch_available(), reason="torch is not installed")]

#: One run: 4 ranks importing torch on a loaded two-core machine, the hang's 10 s timeout.
RUN_TIMEOUT = 240
ANALYZE_TIMEOUT = 60
#: The controller's triage settles 30 s after a job's first finding; the rest is the
#: agent's poll and report on a loaded machine.
ROOT_CAUSE_TIMEOUT = 120
JOB = "llm"


@pytest.mark.parametrize("mode", MODES)
def test_a_real_torchrun_failure_is_analysed_to_its_first_rank_and_category(
        mode: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(CAPTURE), "--out", str(tmp_path), "--timeout",
         str(RUN_TIMEOUT), mode],
        capture_output=True, text=True, timeout=RUN_TIMEOUT + 30, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / mode
    assert_evidence(mode, run)

    analysis = subprocess.run(
        [sys.executable, "-m", "sn_monitor.cli", "logs", "analyze", "--json",
         *map(str, log_paths(run))],
        capture_output=True, text=True, timeout=ANALYZE_TIMEOUT, check=False)
    assert analysis.returncode == 0, analysis.stderr
    report = json.loads(analysis.stdout)
    want = expected(run)
    cause = report["root_cause"]
    assert cause is not None, report["findings"]
    assert (cause["rank"], cause["category"]) == (want.root_rank, want.category), (
        cause, want.note)

    live = live_root_cause(run, tmp_path / "live")
    assert (live["rank"], live["category"]) == (want.root_rank, want.category), (
        live, want.note)
    assert live["node"] == "sim-0"


def live_root_cause(run: Path, root: Path) -> dict[str, Any]:
    """The root cause a live controller names from what a live agent read of ``run``."""
    watched = root / "job"
    cluster = Cluster(root, nodes=1, gpus=2, agent_config={"job_logs": {
        "enabled": True, "poll_interval": "0.2s", "rescan_interval": "0.5s",
        "files": [{"glob": str(watched / "logs" / "*" / "attempt_*" / "*" / "*.log"),
                   "job": JOB},
                  {"glob": str(watched / "torchrun.log"), "job": JOB}]}})
    with cluster:
        cluster.start(timeout=90)
        admin = {"Authorization": f"Bearer {cluster.admin_token}"}
        reply = requests.post(f"{cluster.url}/api/v1/jobs", headers=admin, timeout=10, json={
            "apiVersion": "training.ai/v1", "kind": "DistributedJob",
            "metadata": {"name": JOB}, "spec": {"replicas": 1, "nodes": ["sim-0"]}})
        assert reply.status_code == 201, reply.text
        for rank in range(WORLD):  # every rank trained a step before the failure
            reply = requests.post(
                f"{cluster.url}/api/v1/jobs/{JOB}/progress", timeout=10,
                headers={"Authorization": f"Bearer {cluster.agent_token}"},
                json={"rank": rank, "node": "sim-0", "world_size": WORLD,
                      "updates": [{"step": 1, "time": time.time()}]})
            assert reply.status_code == 200, reply.text
        watched.mkdir()
        shutil.copytree(run / "logs", watched / "logs")
        shutil.copy(run / "torchrun.log", watched / "torchrun.log")
        job = cluster.wait_for(lambda: cluster.get(f"/api/v1/jobs/{JOB}").get("root_cause"),
                               ROOT_CAUSE_TIMEOUT, f"the live root cause of {JOB}")
        return dict(job)

