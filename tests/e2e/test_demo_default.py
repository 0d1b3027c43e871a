"""``sn-monitor demo --headless``: a whole simulated supernode plays the default scenario.

One run, as ``make demo`` runs it (a controller, 16 agents, a 14-rank job with 2 spares,
at x10) on a machine kept busy by two CPU hogs all along, checks the JSON summary: exit
0, every fault detected, no healthy node taken for lost or evicted, the throttle /
release of the hot GPU, the fail-over and restore of the fatal XID, the circuit breaker
freezing the burst and closing once the partition heals (and the demo saying when), the
job training at the end on its nodes, its effective training ratio and the one-line
verdict counted from the run. Two minutes on two cores: in ``make e2e``, with the other
packaged scenarios (tests/e2e/test_demo_scenarios.py); a broken scenario file refused
before anything starts is checked in ``make test`` (tests/integration/test_demo_refusals.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.support.demo_run import demo, faults, kill_left_over
from tests.support.ports import free_port

pytestmark = pytest.mark.integration


#: Each CPU hog spins at most this long (the demo takes about two minutes here).
HOG_SECONDS = 300


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    state = tmp_path_factory.mktemp("demo")
    hogs = [subprocess.Popen([sys.executable, "-c",
                              f"import time\nend = time.monotonic() + {HOG_SECONDS}\n"
                              "while time.monotonic() < end: pass"]) for _ in range(2)]
    try:
        done = demo("--headless", "--speed", "10", "--listen", f"127.0.0.1:{free_port()}",
                     "--state-dir", str(state), timeout=HOG_SECONDS - 20)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(timeout=10)
        kill_left_over(state)
    logs = "\n".join(f"== {p.name}\n" + "\n".join(p.read_text().splitlines()[-15:])
                     for p in sorted((state / "logs").glob("*.log"))[:3])
    assert done.returncode == 0, f"{done.stderr}\n{done.stdout[-4000:]}\n{logs}"
    doc = json.loads(done.stdout)
    doc["_stderr"] = done.stderr
    return dict(doc)


def test_every_fault_kind_is_played_and_detected(summary):
    assert summary["ok"] is True
    assert summary["undetected"] == []
    kinds = {f["fault"] for f in summary["faults"]}
    assert {"overheat", "xid", "fall-off-bus", "ib-port-down", "straggler",
            "node-lost", "node-back", "cooling-repaired"} <= kinds
    for fault in summary["faults"]:
        if fault["expects_detection"]:
            assert fault["detection_latency_seconds"] is not None, fault
            assert fault["incidents"], fault


def test_the_hot_gpu_is_throttled_and_released(summary):
    hot = faults(summary, "overheat")[0]
    assert any(i.startswith("gpu-overheat#") for i in hot["incidents"])
    actions = " ".join(hot["actions"])
    assert "throttle succeeded" in actions
    assert "release succeeded" in actions


def test_the_fatal_xid_fails_over_to_a_spare_and_the_job_restores(summary):
    dead = faults(summary, "fall-off-bus")[0]
    actions = " ".join(dead["actions"])
    assert "evict succeeded" in actions
    assert "restore succeeded" in actions
    assert [r["state"] for r in dead["recoveries"]] == ["done"]
    assert dead["recoveries"][0]["replacement_nodes"][0] in summary["spares"]
    done = [r for r in summary["recoveries"] if r["state"] == "done"]
    assert done
    assert all(r["mttr_seconds"] > 0 for r in done)


def test_the_burst_trips_the_breaker_and_evictions_are_frozen_until_it_heals(summary):
    assert summary["breaker"]["tripped"] is True
    assert "FROZEN" in summary["_stderr"]
    burst = [f for f in faults(summary, "node-lost") if f["at"] == "6m30s"]
    assert len(burst) >= 3
    # a job node's eviction was held (then cancelled when it came back), another's refused
    frozen = [a for f in burst for a in f["actions"]
              if a.split()[0] == "evict" and a.split()[1] in ("cancelled", "refused", "held")]
    assert frozen, burst
    assert summary["actions"]["evict"].get("succeeded", 0) <= 2  # the two real failures
    breaker = summary["breaker"]
    assert breaker["open"] is False  # closed by itself once the nodes were back
    # ... and the demo says when: on the live view's log and in the summary
    assert breaker["opened_at_seconds"] < breaker["closed_at_seconds"]
    assert "circuit breaker closed at t=" in summary["_stderr"]


def test_the_verdict_is_counted_from_the_run(summary):
    recovered = sum(1 for r in summary["recoveries"] if r["state"] == "done")
    assert recovered >= 1
    ettr = summary["job"]["effective_training_ratio"]
    assert summary["verdict"] == (
        f"job recovered {recovered} time{'' if recovered == 1 else 's'}, ETTR {ettr:.2f}, "
        "0 false evictions")


def test_the_page_is_named_and_each_node_still_out_says_why(summary):
    page = f"{summary['controller']}/ui/topology"
    assert summary["page"] == page
    assert f"topology page: {page}" in summary["_stderr"]
    for out in summary["out_of_service"]:
        assert out["by"] != "?", out
        assert out["awaits"], out


def test_no_healthy_node_is_taken_for_faulty_and_the_job_trains_at_the_end(summary):
    assert summary["false_node_lost"] == []
    assert summary["false_evictions"] == []
    job = summary["job"]
    assert job["training"] is True
    assert job["state"] == "running"
    assert len(job["nodes"]) == 14


def test_the_job_trained_and_its_effective_training_ratio_is_reported(summary):
    job = summary["job"]
    assert job["last_step"] > 0
    assert job["generation"] >= 1
    assert 0 < job["effective_training_ratio"] <= 1
