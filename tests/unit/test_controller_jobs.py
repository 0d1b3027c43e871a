"""The controller and its jobs: faults of a job's nodes become one recovery, a node's
labels and state follow the job's membership, a partition that heals is left alone, the
breaker closes by itself or by hand, a restart never plans a recovery's incident again,
and the controller's own stall is not its nodes' silence."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from sn_monitor.config import Duration
from sn_monitor.controller.actions.policy import BreakerSettings, PolicySettings
from sn_monitor.controller.jobs.spec import job_from_json
from sn_monitor.controller.service import Controller
from sn_monitor.controller.storage.store import Store
from tests.support.harness import (
    HEARTBEAT_RULE,
    XID_RULE,
    Harness,
    make_harness,
    rules_from,
)
from tests.support.jobs import checkpoint

NODES = ["n1", "n2", "n3", "n4", "n5"]
EVICT_RULE = """
- name: ecc-uncorrectable
  event: xid
  codes: [48]
  clear_after: 10m
  severity: critical
  actions: [alert, evict]
"""
POLICY = PolicySettings(max_unavailable="100%", node_cooldown=Duration(0),
                        breaker=BreakerSettings(window=Duration(60), max_faulted="30%",
                                                min_faulted=2, hold=Duration(600)))


def _job(h: Harness, tmp_path: Path, nodes: list[str], spares: list[str]) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(exist_ok=True)
    checkpoint(ckpt, 10, h.clock)
    doc = {"apiVersion": "training.ai/v1", "kind": "DistributedJob",
           "metadata": {"name": "train"},
           "spec": {"replicas": len(nodes), "nodes": nodes, "spares": spares,
                    "checkpoint": {"dir": str(ckpt)}}}
    h.controller.jobs.add_job(job_from_json(json.dumps(doc).encode()), "test")


def _report_all(h: Harness, nodes: list[str], **extra: Any) -> None:
    for node in nodes:
        h.report(node, temps=[50.0], **extra)


def _xid(code: int, seen: float) -> list[dict[str, Any]]:
    return [{"id": 1, "kind": "xid", "source": "nvml", "time_seconds": seen, "gpu": 0,
             "code": code, "message": f"Xid {code}"}]


def _train(h: Harness, nodes: list[str], step: int) -> None:
    for rank, node in enumerate(nodes):
        h.controller.jobs.progress("train", rank, node, len(nodes),
                                   [(step, h.clock.time())], 1.0)


@pytest.fixture
def world(tmp_path: Path):
    made: list[Harness] = []

    def build(rules: str, **kw: Any) -> Harness:
        h = make_harness(tmp_path, rules_from(rules), policy=POLICY, **kw)
        made.append(h)
        return h
    yield build
    for h in made:
        h.controller.close()
        h.store.close()


def test_a_rule_s_eviction_of_a_job_node_is_the_job_s_recovery(world, tmp_path) -> None:
    h = world(EVICT_RULE + XID_RULE.format(clear_after="10m"))
    _report_all(h, [*NODES, "s1"])
    _job(h, tmp_path, NODES, ["s1"])
    h.report("n2", temps=[50.0], events=_xid(48, h.clock.time()))
    h.report("n2", temps=[50.0], events=[{**_xid(79, h.clock.time())[0], "id": 2}])
    h.controller.sweep()
    h.settle()
    h.controller.sweep()
    evictions = h.actions("evict")
    assert [e["key"].split(":")[0] for e in evictions] == ["recovery"]
    assert evictions[0]["params"]["recovery"] == evictions[0]["key"].split(":")[1]
    [recovery] = h.controller.list_recoveries("train", 10)
    assert len(recovery["incident_ids"]) == 2
    assert recovery["nodes"] == ["n1", "s1", "n3", "n4", "n5"]


def test_labels_and_state_follow_membership(world, tmp_path) -> None:
    h = world(XID_RULE.format(clear_after="10m"))
    for node in [*NODES, "s1"]:
        h.report(node, temps=[50.0], peer="10.0.0.1", metrics_port=9847)
    _job(h, tmp_path, NODES, ["s1"])
    _report_all(h, [*NODES, "s1"])
    sd = {g["labels"]["node"]: g["labels"] for g in h.controller.service_discovery()}
    assert sd["n3"]["job"] == "train"
    assert "job" not in sd["s1"]
    h.report("n3", temps=[50.0], events=_xid(79, h.clock.time()))
    h.controller.sweep()
    h.settle()
    h.controller.sweep()
    sd = {g["labels"]["node"]: g["labels"] for g in h.controller.service_discovery()}
    assert "job" not in sd["n3"]  # evicted: out of the job, at once
    assert sd["s1"]["job"] == "train"  # the spare that took its place
    h.clock.advance(10)
    h.controller.sweep()  # node states are refreshed every 5 s
    node = h.controller.get_node("n3")
    assert node["state"] == "evicted"
    assert node["jobs"] == {"train": "evicted"}
    h.controller.return_to_pool("train", "n3", "alice")
    assert h.controller.get_node("n3")["jobs"] == {"train": "spare"}


def test_a_partition_that_heals_is_left_alone_and_the_breaker_closes(world, tmp_path) -> None:
    h = world(HEARTBEAT_RULE, settle=2.0)  # the burst reaches the breaker before evictions
    everyone = [*NODES, "s1", "s2", "s3", "s4", "s5"]
    _report_all(h, everyone)
    _job(h, tmp_path, NODES, ["s1"])
    cut = ["n1", "n2", "n3", "n4"]  # 40 % of the fleet, most of the job
    for second in range(14):  # the cut nodes go silent; the rest report
        h.clock.advance(1)
        _report_all(h, [n for n in everyone if n not in cut])
        _train(h, NODES, second + 1)
        h.controller.sweep()
    h.settle()
    assert h.controller.breaker_state()["open"]
    assert set(h.controller.breaker_state()["nodes"]) == set(cut)
    [recovery] = h.controller.list_recoveries("train", 10)
    held = [a for a in h.actions("evict") if a["state"] == "held"]
    assert len(held) == len(cut)
    assert all(a["verdict"].startswith("held since") for a in held)
    h.clock.advance(1)
    _report_all(h, everyone)  # the partition heals
    _train(h, NODES, 20)
    h.controller.sweep()
    h.settle()
    [recovery] = h.controller.list_recoveries("train", 10)
    assert recovery["state"] == "cancelled"
    assert {a["state"] for a in h.actions("evict")} == {"cancelled"}
    assert h.fakes["evict"].calls == []
    assert not h.controller.breaker_state()["open"]
    assert h.controller.list_incidents("open", None, 100) == []
    job = h.controller.get_job("train")
    assert (job["state"], job["nodes"]) == ("running", NODES)
    alerts = [a for a in h.actions("alert") if a["rule"] == "circuit-breaker"]
    assert [a["params"]["status"] for a in reversed(alerts)] == ["firing", "resolved"]


def test_a_person_closes_or_opens_the_breaker_and_it_is_audited(world, tmp_path) -> None:
    h = world(XID_RULE.format(clear_after="10m"))
    _report_all(h, [*NODES, "s1"])
    _job(h, tmp_path, NODES, ["s1"])
    opened = h.controller.set_breaker(True, "alice", "switch firmware upgrade")
    assert opened["open"]
    assert opened["by_hand"]
    h.report("n2", temps=[50.0], events=_xid(79, h.clock.time()))
    h.controller.sweep()
    h.settle()
    [held] = h.actions("evict")
    assert held["state"] == "held"
    closed = h.controller.set_breaker(False, "bob", "upgrade done")
    assert not closed["open"]
    h.controller.sweep()
    h.settle()
    [evict] = h.actions("evict")
    assert (evict["id"], evict["state"]) == (held["id"], "succeeded")
    trail = {a["action"]: a for a in h.actions() if a["params"].get("status") == "api"}
    assert trail["open-breaker"]["requested_by"] == "alice"
    assert trail["close-breaker"]["requested_by"] == "bob"


def test_a_restart_never_plans_a_recovery_s_incident_again(world, tmp_path) -> None:
    h = world(XID_RULE.format(clear_after="10m"), settle=1.0)
    _report_all(h, [*NODES, "s1"])
    _job(h, tmp_path, NODES, ["s1"])
    h.report("n4", temps=[50.0], events=_xid(79, h.clock.time()))
    h.clock.advance(2)
    h.controller.sweep()  # settled: the recovery starts, evicts n4 (out of the job)
    h.settle()
    h.controller.sweep()
    before = [(a["key"], a["state"]) for a in h.actions() if a["action"] != "alert"]
    h.controller.close()
    again = Controller(h.controller.settings, h.controller.engine.rules, h.clock, h.store,
                       h.drivers)
    again.start()
    try:
        h.clock.advance(5)
        again.sweep()
        assert again.runner.wait_idle(10)
        after = [(a["key"], a["state"]) for a in again.list_actions(None, None, 1000)
                 if a["action"] != "alert"]
        assert [k for k, _ in after] == [k for k, _ in before]  # nothing new planned
    finally:
        again.close()


def test_the_controller_s_own_stall_is_not_node_silence(tmp_path) -> None:
    h = make_harness(tmp_path, rules_from(HEARTBEAT_RULE), policy=POLICY)
    stalling = make_harness(tmp_path / "b", rules_from(HEARTBEAT_RULE), policy=POLICY,
                            store=Store(tmp_path / "b.db"))
    stalling.controller.close()
    watched = Controller(stalling.controller.settings, stalling.controller.engine.rules,
                         stalling.clock, stalling.store, stalling.drivers, watch_stalls=True,
                         cpu_seconds=lambda: 0.0)  # not the real CPU: the clock is manual
    watched.start()
    try:
        for c, clock in ((h.controller, h.clock), (watched, stalling.clock)):
            for node in NODES:
                c.ingest(_body(node, clock.time()), _anyone(), None)
            c.sweep()
            clock.advance(30)  # no sweep, no report: a paused controller (or a dead fleet)
            c.sweep()
        lost_plain = {i["node"] for i in h.controller.list_incidents("open", None, 100)}
        lost_watched = {i["node"] for i in watched.list_incidents("open", None, 100)}
        assert lost_plain == set(NODES)  # without the watch, 30 s of nothing is silence
        assert lost_watched == set()  # the watch saw its own 30 s stall
        assert watched.stalls is not None
        assert watched.stalls.stalls_total == pytest.approx(30.0 - 0.5)
        for _ in range(40):  # the agents backed off meanwhile: a restart's grace, 20 s
            stalling.clock.advance(0.5)
            watched.sweep()
        assert watched.list_incidents("open", None, 100) == []
        for _ in range(6):  # past the grace and the timeout: real silence is still silence
            stalling.clock.advance(0.5)
            watched.sweep()
        assert {i["node"] for i in watched.list_incidents("open", None, 100)} == set(NODES)
        text = watched.metrics().decode()
        assert 'sn_controller_stall_seconds_count{where="sweep"} 1.0' in text
    finally:
        watched.close()
        h.controller.close()
        h.store.close()
        stalling.store.close()


def _body(node: str, now: float) -> bytes:
    from tests.support.harness import report_body
    return report_body(node, temps=[50.0], sample_time=now)


def _anyone() -> Any:
    from sn_monitor.controller.security.auth import OPEN_ACCESS
    return OPEN_ACCESS


def _ettr_samples(h: Harness) -> dict[str, float]:
    return {m[0]: float(m[1]) for m in re.findall(
        r'^sn_job_effective_training_ratio\{job="([^"]*)"\} (\S+)$',
        h.controller.metrics().decode(), re.M)}


def test_a_job_no_rank_reported_is_pending_without_ettr_until_its_first_step(world) -> None:
    h = world(HEARTBEAT_RULE)
    body = {"apiVersion": "training.ai/v1", "kind": "DistributedJob",
            "metadata": {"name": "train"}, "spec": {"replicas": 128}}  # no nodes: the ranks'
    added = h.controller.add_job(json.dumps(body).encode(), "tester", admin=True)
    assert (added["state"], added["state_reason"]) == ("pending", "waiting for ranks 0/128")
    h.clock.advance(3600)  # an hour in the queue is not an hour of lost training
    h.controller.sweep()
    doc = h.controller.get_job("train")
    assert doc is not None
    assert (doc["state"], doc["state_reason"], doc["nodes"]) == (
        "pending", "waiting for ranks 0/128", [])
    assert doc["effective_training_ratio"] is None
    exposition = h.controller.metrics().decode()
    assert 'sn_job_state{job="train",state="pending"} 1.0' in exposition.splitlines()
    assert _ettr_samples(h) == {}  # no gauge: SnJobTrainingRatioLow cannot fire for it
    for step in (1, 2, 3):
        h.clock.advance(0 if step == 1 else 10)
        h.controller.job_progress("train", json.dumps({
            "rank": 0, "node": "n1", "world_size": 128,
            "updates": [{"step": step, "time": h.clock.time()}]}).encode())
    doc = h.controller.get_job("train")
    assert doc is not None
    assert (doc["state"], doc["state_reason"], doc["nodes"]) == ("running", "", ["n1"])
    # since its first step, 20 s ago, both 10 s steps were productive (the hour it was
    # pending is not counted: that is not training lost to faults)
    assert doc["effective_training_ratio"] == pytest.approx(1.0)
    assert _ettr_samples(h) == {"train": pytest.approx(1.0)}
