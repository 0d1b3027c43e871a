"""Faults that compound, with real processes: a partition of part of a job that heals, a
node that fails three ways at once, and a controller that stalls (paused, or starved of
CPU). The job comes back by itself, nothing is done twice, a node that blinks back is
left alone, and the controller's own stall is never taken for its nodes' silence.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import Cluster, metric_value
from tests.support.job_recovery import (
    CONFIG,
    ROUTES,
    WAIT,
    Job,
    evictions,
    new_job,
)

pytestmark = pytest.mark.integration

#: The node-lost rule's heartbeat timeout (sn_monitor/rules/default.yaml).
HEARTBEAT = 10.0


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    extra: dict[str, Any] = getattr(request, "param", {})
    config: dict[str, Any] = {**CONFIG, "settle": "2s", **extra}
    c = Cluster(tmp_path, nodes=6, config=config, routes=ROUTES)
    c.jobs = []  # type: ignore[attr-defined]
    try:
        yield c
    finally:
        for job in c.jobs:  # type: ignore[attr-defined]
            job.close()
        c.close()


def _stop(c: Cluster, node: str, sig: int) -> None:
    popen = c.agents[node].popen
    assert popen is not None
    os.killpg(popen.pid, sig)


def _open_lost(c: Cluster) -> list[dict[str, Any]]:
    return [i for i in c.incidents(status="open") if i["rule"] == "node-lost"]


PARTITION = {"policy": {**CONFIG["policy"], "breaker": {
    "window": "30s", "max_faulted": "20%", "min_faulted": 2, "hold": "10m"}}}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cluster", [PARTITION], indirect=True)
def test_a_partition_of_40_percent_of_a_job_that_heals_is_left_alone(cluster: Cluster) -> None:
    c = cluster
    c.start()
    nodes = [f"sim-{i}" for i in range(5)]
    job = new_job(c, "steady", nodes, ["sim-5"])
    job.post()
    job.start()
    cut = ["sim-1", "sim-2"]  # 40 % of the job's nodes: their agents go silent
    for node in cut:
        _stop(c, node, signal.SIGSTOP)
    c.wait_for(lambda: {i["node"] for i in _open_lost(c)} == set(cut),
               HEARTBEAT + WAIT, "node-lost on both")
    breaker = c.wait_for(lambda: (b := c.get("/api/v1/breaker"))["open"] and b, WAIT,
                         "the breaker open")
    assert set(breaker["nodes"]) >= set(cut)
    rec = job.wait_recovery("evicting")
    c.wait_for(lambda: {a["state"] for a in c.actions(state="held")
                        if a["key"].startswith(f"recovery:{rec['id']}:evict:")} == {"held"}
               and len([a for a in c.actions(state="held")
                        if a["key"].startswith(f"recovery:{rec['id']}:evict:")]) == 2,
               WAIT, "both evictions held by the breaker")
    for node in cut:  # the partition heals
        _stop(c, node, signal.SIGCONT)
    c.wait_reporting(cut, WAIT)
    cancelled = c.wait_for(lambda: (r := next(x for x in job.recoveries()
                                             if x["id"] == rec["id"]))["state"] == "cancelled"
                           and r, WAIT, "the recovery cancelled")
    closed = [i for i in c.incidents(status="closed") if i["rule"] == "node-lost"]
    healed_at = max(i["closed_at"] for i in closed if i["node"] in cut)
    # the recovery is cancelled by the heal, at a sweep after it
    assert cancelled["times"]["finished"] >= healed_at, (cancelled, healed_at)
    assert set(cancelled["evictions"].values()) == {"healed"}
    doc = job.get()
    assert (doc["state"], doc["nodes"], doc["spares"]) == ("running", nodes, ["sim-5"])
    assert _open_lost(c) == []
    c.wait_for(lambda: not c.get("/api/v1/breaker")["open"], WAIT, "the breaker closed")
    # and after: every action decided, still nothing evicted, the job trains on
    c.wait_sweeps(2, WAIT, "what the closed breaker held decided")
    c.wait_settled(WAIT, "nothing evicted once the breaker closed")
    assert [a for a in c.actions() if a["action"] == "evict" and a["state"] == "succeeded"] \
        == []
    for node in nodes:
        assert evictions(c, node) == []
    before = job.get()["last_step"]
    c.wait_for(lambda: job.get()["last_step"] > before, WAIT, "the job still training")
    assert job.get()["generation"] == 0


@pytest.mark.timeout(300)
def test_three_faults_on_one_node_are_one_recovery_and_one_eviction(cluster: Cluster) -> None:
    c = cluster
    c.start()
    job = new_job(c, "triple", ["sim-0", "sim-1", "sim-2"], ["sim-3"])
    job.post()
    job.start()
    agent = c.agents["sim-1"]
    agent.fault("ecc-uncorrectable", 2)
    agent.fault("row-remap-failure", 2)
    agent.fault("xid", 2, code=79)
    done = job.wait_recovery("done", timeout=WAIT * 2)
    rules = {i["rule"] for i in c.incidents(node="sim-1")}
    # XID 79 reaches the agent twice, as NVML's xid event and as the kernel log's Xid
    # line: one fault, one fatal-xid, whichever source the agent read first
    assert {"ecc-uncorrectable", "row-remap-failed", "fatal-xid"} <= rules, rules
    assert "gpu-fallen-off-bus" not in rules, rules
    assert len(job.recoveries()) == 1
    # The XID reaches the controller at once (the agent's fast path), the ECC counters and
    # the remap failure with the next sample: the XID's incident starts the recovery, and
    # the two that follow find the node out of the job already (or join the recovery if
    # it still runs): one recovery, one eviction either way.
    mine = {i["id"] for i in c.incidents(node="sim-1") if i["rule"] == "fatal-xid"}
    assert mine & set(done["incident_ids"]), (mine, done["incident_ids"])
    assert len(evictions(c, "sim-1")) == 1
    assert done["nodes"] == ["sim-0", "sim-3", "sim-2"]
    job.wait_resumed(done)
    ours = [a for a in c.actions(node="sim-1") if a["action"] in ("evict", "failover")]
    assert [a["key"] for a in ours] == [f"recovery:{done['id']}:evict:sim-1"], ours


def _hog(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c",
                             f"import time\nend = time.monotonic() + {seconds}\n"
                             "while time.monotonic() < end: pass"])


def _judged_alive(c: Cluster) -> None:
    """Every agent reports again, and the sweeps that judged the heartbeats since (those
    that saw the silence the controller's own stall made, first of all) are done, with
    what they decided stored: no node is taken for lost."""
    c.wait_reporting(list(c.agents), WAIT)
    c.wait_sweeps(2, WAIT, "the heartbeats judged with every agent reporting")
    c.wait_settled(WAIT, "what the sweeps decided stored")
    assert [i["node"] for i in c.incidents() if i["rule"] == "node-lost"] == []


@pytest.mark.timeout(300)
def test_a_paused_or_starved_controller_takes_no_healthy_node_for_lost(
        cluster: Cluster) -> None:
    c = cluster
    c.start()
    job: Job = new_job(c, "patient", ["sim-0", "sim-1", "sim-2"], ["sim-3"])
    job.post()
    job.start()
    controller = c.controller.popen
    assert controller is not None
    controller.send_signal(signal.SIGSTOP)
    time.sleep(3 * HEARTBEAT)  # the fault's duration: three heartbeat timeouts
    controller.send_signal(signal.SIGCONT)
    c.wait_for(lambda: metric_value(c.controller_metrics(), "sn_controller_stall_seconds_count",
                                    where="sweep"), WAIT, "the controller's stall seen")
    _judged_alive(c)
    # starved: the controller at the lowest priority, four CPU hogs for 20 s
    os.setpriority(os.PRIO_PROCESS, controller.pid, 19)
    hogs = [_hog(20.0) for _ in range(4)]
    try:
        for hog in hogs:
            hog.wait(timeout=60)
    finally:
        for hog in hogs:
            hog.kill()
    os.setpriority(os.PRIO_PROCESS, controller.pid, 0)
    _judged_alive(c)
    assert job.recoveries() == []
    text = c.controller_metrics()
    assert 'sn_controller_stall_seconds_count{where="sweep"}' in text
    assert job.get()["state"] == "running"
