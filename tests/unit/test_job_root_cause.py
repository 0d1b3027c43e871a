"""A job's root cause in the live controller: log events in reports, node faults, one
job incident, its alert to the job's owner, and no node taken for the application's fault.

The controller in process (tests/support/harness.py) with a manual clock: the triage's
settle time passes by moving it; the sweep runs by hand.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sn_monitor.config import Duration
from sn_monitor.controller.actions.policy import PolicySettings
from sn_monitor.controller.incidents.job_failures import JOB_FAILURE_RULE
from sn_monitor.controller.jobs.spec import job_from_json
from tests.support.api import Api
from tests.support.harness import (
    HEARTBEAT_RULE,
    XID_RULE,
    Harness,
    make_harness,
    rules_from,
)
from tests.support.jobs import train

NODES = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
OWNER = "team-llm"
POLICY = PolicySettings(max_unavailable="100%", node_cooldown=Duration(0))


JOB = {"apiVersion": "training.ai/v1", "kind": "DistributedJob",
       "metadata": {"name": "llm", "labels": {"owner": OWNER}},
       "spec": {"replicas": len(NODES), "nodes": NODES, "hangTimeout": 120}}


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Harness]:
    """The controller with the fatal-xid rule and the job ``llm`` on gpu-0..3 (owner set)."""
    h = make_harness(tmp_path, rules_from(XID_RULE.format(clear_after="10m")), policy=POLICY)
    h.controller.jobs.add_job(job_from_json(json.dumps(JOB).encode()), "test")
    yield h
    h.controller.close()
    h.store.close()


def _line(event_id: int, rank: int, category: str, line_time: float, *, root: bool,
          text: str, at: float) -> dict[str, Any]:
    return {"id": event_id, "kind": "log", "source": "joblog", "time_seconds": at,
            "message": text, "category": category, "severity": "error", "rank": rank,
            "root_candidate": root, "file": f"/logs/llm/rank{rank}.log", "line": 100 + rank,
            "signature": f"{category}-test", "line_time_seconds": line_time}


def _timeouts(h: Harness, ranks: list[int], first_id: int) -> None:
    """Each rank (one a node) reports its NCCL watchdog timeout, as its agent read it."""
    now = h.clock.time()
    for rank in ranks:
        h.report(NODES[rank], temps=[50.0], events=[_line(
            first_id + rank, rank, "nccl-timeout", now - 1, root=False, at=now,
            text=f"[Rank {rank}] Watchdog caught collective operation timeout")])


def _decide(h: Harness) -> None:
    """The writer hands the events on; the settle time passes; a sweep decides."""
    h.settle()
    h.clock.advance(31)
    h.controller.sweep()
    h.settle()


def _job_incidents(h: Harness) -> list[dict[str, Any]]:
    return [i for i in h.controller.list_incidents(None, None, 100)
            if i["rule"] == JOB_FAILURE_RULE]


def test_an_xid_then_nccl_errors_on_every_rank_is_one_job_incident_naming_the_xid(
        controller: Harness) -> None:
    h = controller
    xid_at = h.clock.time()
    h.report("gpu-2", temps=[50.0], events=[{
        "id": 1, "kind": "xid", "source": "kmsg", "time_seconds": xid_at, "code": 79,
        "gpu": 0, "message": "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."}])
    h.clock.advance(60)
    _timeouts(h, [0, 1, 3], first_id=10)  # gpu-2's rank is gone: it prints nothing
    _decide(h)
    [incident] = _job_incidents(h)
    assert incident["node"] == "job:llm"
    assert "on gpu-2 (xid-79)" in incident["message"]
    cause = h.controller.get_job("llm")["root_cause"]  # type: ignore[index]
    assert (cause["node"], cause["rank"], cause["category"]) == ("gpu-2", None, "xid-79")
    assert "fallen off the bus" in cause["excerpt"]
    assert cause["at"] == xid_at
    # more cascade later: the same failure, still one incident
    _timeouts(h, [0, 1, 3], first_id=20)
    _decide(h)
    assert len(_job_incidents(h)) == 1


def test_an_application_bug_pages_the_owner_and_takes_no_node(controller: Harness) -> None:
    h = controller
    now = h.clock.time()
    h.report("gpu-1", temps=[50.0], events=[_line(
        1, 1, "app-bug", now - 30, root=True, at=now,
        text="ZeroDivisionError: division by zero")])
    h.clock.advance(5)
    _timeouts(h, [0, 2, 3], first_id=10)
    _decide(h)
    [incident] = _job_incidents(h)
    assert "rank 1 on gpu-1 (app-bug): ZeroDivisionError" in incident["message"]
    assert "no node is taken" in incident["message"]
    [alert] = h.fakes["alert"].calls
    assert alert.labels["owner"] == OWNER
    assert alert.labels["job"] == "llm"
    assert alert.rule == JOB_FAILURE_RULE
    assert not [a for a in h.actions() if a["action"] in ("cordon", "evict", "failover")]
    assert ('sn_job_root_cause_info{category="app-bug",job="llm",node="gpu-1",rank="1"} 1.0'
            in h.controller.metrics().decode())


def _hang(h: Harness) -> list[str]:
    """Every rank trains, then rank 2 stops first and the rest follow: the job hangs.

    The node-taking actions the hang leads to, by action and node.
    """
    train(h.controller.jobs, h.clock, "llm", NODES, 1, 20)
    train(h.controller.jobs, h.clock, "llm", NODES, 21, 23, skip=frozenset({2}))
    h.clock.advance(200)
    h.controller.sweep()
    return [f"{a['action']} {a['node']}" for a in h.actions()
            if a["action"] in ("cordon", "evict", "failover")]


def test_a_hang_suspects_the_node_that_stopped_first(controller: Harness) -> None:
    """The control case for the next test: with no root cause the hang takes gpu-2."""
    h = controller
    assert "evict gpu-2" in _hang(h)


def test_a_hang_after_an_application_failure_suspects_no_node(controller: Harness) -> None:
    h = controller
    now = h.clock.time()
    h.report("gpu-2", temps=[50.0], events=[_line(
        1, 2, "nan-loss", now, root=True, at=now,
        text="RuntimeError: Rank 2: loss is nan at step 21")])
    _decide(h)
    assert _hang(h) == []
    [hang] = [i for i in h.controller.list_incidents(None, None, 100)
              if i["rule"] == "job-hang"]
    assert "the job's own failure" in hang["message"]


def test_a_hang_found_before_the_triage_settles_still_suspects_no_node(
        tmp_path: Path) -> None:
    """A rank's own failure read, the hang found before the 30 s settle has passed (a
    10 s hangTimeout): the hang asks the triage for its answer so far, not only for a
    decided one."""
    h = make_harness(tmp_path, rules_from(XID_RULE.format(clear_after="10m")), policy=POLICY)
    quick = {**JOB, "spec": {**JOB["spec"], "hangTimeout": 10}}  # type: ignore[dict-item]
    h.controller.jobs.add_job(job_from_json(json.dumps(quick).encode()), "test")
    try:
        _hang_before_the_settle(h)
    finally:
        h.controller.close()
        h.store.close()


def _hang_before_the_settle(h: Harness) -> None:
    train(h.controller.jobs, h.clock, "llm", NODES, 1, 20)
    train(h.controller.jobs, h.clock, "llm", NODES, 21, 23, skip=frozenset({2}))
    now = h.clock.time()
    h.report("gpu-2", temps=[50.0], events=[_line(
        1, 2, "app-bug", now, root=True, at=now,
        text="IndexError: list index out of range")])
    h.settle()
    assert h.controller.triage.root_cause("llm") is None  # not settled yet
    h.clock.advance(15)  # past the hang's timeout, within the settle
    h.controller.sweep()
    taken = [f"{a['action']} {a['node']}" for a in h.actions()
             if a["action"] in ("cordon", "evict", "failover")]
    assert taken == []
    [hang] = [i for i in h.controller.list_incidents(None, None, 100)
              if i["rule"] == "job-hang"]
    assert "the job's own failure" in hang["message"]


def test_the_root_cause_through_the_http_api(api: Api) -> None:
    """A job posted, reports with log events, the root cause on GET /api/v1/jobs."""
    assert api.post("/api/v1/jobs", json=JOB).status_code == 201
    now = api.h.clock.time()
    reply = api.report("gpu-3", temps=[50.0], events=[_line(
        1, 3, "cuda-oom", now - 2, root=True, at=now,
        text="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 80.00 GiB")])
    assert reply.status_code == 200, reply.text
    assert reply.json()["events_stored_through"] == 1
    _decide(api.h)
    job = api.get("/api/v1/jobs/llm").json()
    assert job["root_cause"]["rank"] == 3
    assert job["root_cause"]["category"] == "cuda-oom"
    assert job["root_cause"]["application"] is True
    [listed] = api.get("/api/v1/jobs").json()["jobs"]
    assert listed["root_cause"] == job["root_cause"]
    [banner] = api.get("/api/v1/topology").json()["jobs"]
    assert banner["root_cause"]["node"] == "gpu-3"


def test_a_malformed_job_log_event_is_refused_naming_the_field(api: Api) -> None:
    now = api.h.clock.time()
    bad = {**_line(1, 3, "app-bug", now, root=True, at=now, text="x"), "rank": -1}
    reply = api.report("gpu-3", events=[bad])
    assert reply.status_code == 422
    assert "$.events[0].rank" in reply.text
    unknown = {**_line(1, 3, "app-bug", now, root=True, at=now, text="x"), "pid": 4242}
    refused = api.report("gpu-3", events=[unknown])
    assert refused.status_code == 422
    assert "pid" in refused.text


def test_a_node_that_stopped_reporting_before_the_timeouts_is_the_root_cause(
        tmp_path: Path) -> None:
    h = make_harness(tmp_path, rules_from(HEARTBEAT_RULE), policy=POLICY)
    try:
        h.controller.jobs.add_job(job_from_json(json.dumps(JOB).encode()), "test")
        for node in NODES:
            h.report(node, temps=[50.0])
        lost_at = h.clock.time()
        h.clock.advance(15)  # gpu-2 says nothing more: past the 10 s heartbeat timeout
        for node in ("gpu-0", "gpu-1", "gpu-3"):
            h.report(node, temps=[50.0])
        h.controller.sweep()
        _timeouts(h, [0, 1, 3], first_id=10)
        _decide(h)
        cause = h.controller.get_job("llm")["root_cause"]  # type: ignore[index]
        assert (cause["node"], cause["category"]) == ("gpu-2", "node-lost")
        assert cause["at"] == lost_at
    finally:
        h.controller.close()
        h.store.close()


def test_a_hang_of_ranks_stopped_together_suspects_the_node_the_logs_name(
        controller: Harness) -> None:
    """Every rank stopped at the same step (they wait on each other): progress names no
    node; the triage's root cause, a rank's ECC error on gpu-1, does."""
    h = controller
    train(h.controller.jobs, h.clock, "llm", NODES, 1, 20)
    now = h.clock.time()
    h.report("gpu-1", temps=[50.0], events=[_line(
        1, 1, "ecc-error", now, root=True, at=now,
        text="RuntimeError: CUDA error: uncorrectable ECC error encountered")])
    _timeouts(h, [0, 2, 3], first_id=10)
    h.settle()
    h.clock.advance(200)
    h.controller.sweep()
    taken = [f"{a['action']} {a['node']}" for a in h.actions()
             if a["action"] in ("cordon", "evict", "failover")]
    assert "evict gpu-1" in taken
    assert not [t for t in taken if not t.endswith("gpu-1")]
    [hang] = [i for i in h.controller.list_incidents(None, None, 100)
              if i["rule"] == "job-hang"]
    assert "the job's logs name gpu-1" in hang["message"]


def test_a_cascade_alone_suspects_no_node_from_the_logs(controller: Harness) -> None:
    """Only timeouts were read: the first one's node is not the failure's."""
    h = controller
    train(h.controller.jobs, h.clock, "llm", NODES, 1, 20)
    _timeouts(h, [0, 1, 2, 3], first_id=10)
    h.settle()
    h.clock.advance(200)
    h.controller.sweep()
    assert not [a for a in h.actions() if a["action"] in ("cordon", "evict", "failover")]
