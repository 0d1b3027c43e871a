"""Findings in context: a job's own fault, a rack's fault, a repeat offender.

Through the real controller (real rules, store, runner and policy; fake outside systems)
on a manual clock: see test_controller_service's harness.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sn_monitor.config import ConfigError
from sn_monitor.controller.actions.policy import PolicySettings
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.jobs.spec import job_from_json
from sn_monitor.controller.security.auth import OPEN_ACCESS
from sn_monitor.rules.spec import load_rules
from tests.support.harness import Harness, make_harness, report_body, rules_from, xid

APP_XID = """
- name: app-xid
  event: xid
  codes: [13]
  clear_after: 2m
  severity: warning
  actions: [alert, evict]
  job_wide: {{nodes: 3, within: 30s}}
  {extra}
"""

RESET_RUNG = """
- name: xid-reset-rung
  event: xid
  codes: [999]
  severity: critical
  actions: [alert, evict]
"""


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    made: list[Harness] = []

    def build(rules: str, **kw: Any) -> Harness:
        h = make_harness(tmp_path, rules_from(rules), **kw)
        made.append(h)
        return h
    yield build
    for h in made:
        h.controller.close()
        h.store.close()


def add_job(h: Harness, tmp_path: Path, nodes: list[str], labels: dict[str, str]) -> None:
    job = job_from_json(msgspec.json.encode({
        "apiVersion": "sn-monitor/v1", "kind": "DistributedJob",
        "metadata": {"name": "llm", "labels": labels},
        "spec": {"replicas": len(nodes), "nodes": nodes, "checkpoint": {"dir": str(tmp_path)},
                 "control": {"command": ["/bin/true"]}}}))
    h.controller.jobs.add_job(job, "test")


def event_on(h: Harness, node: str, code: int, event_id: int, gpu: int = 0,
             kind: str = "xid", **extra: Any) -> None:
    event = xid(event_id, code, h.clock.time(), gpu)
    event["kind"] = kind
    if kind != "xid":
        del event["code"]
    if "gpus" not in extra:  # the lost GPU reads lost in the report of its event, as it does
        extra["gpus"] = [{"index": gpu, "temperature_celsius": 50.0,
                          "lost": kind in ("gpu_lost", "gpu_fallen_off_bus")}]
    h.report(node, events=[event], **extra)


def alerts(h: Harness) -> list[ActionRequest]:
    h.settle()
    return list(h.fakes["alert"].calls)


def test_one_jobs_crash_on_many_nodes_is_one_job_incident_and_no_node_action(
        make: Any, tmp_path: Path) -> None:
    h = make(APP_XID.format(extra=""))
    nodes = [f"n{i}" for i in range(8)]
    add_job(h, tmp_path, nodes, {"owner": "team-llm"})
    for i, node in enumerate(nodes[:6]):
        event_on(h, node, 13, i)
        h.clock.advance(1)
        h.controller.sweep()
    h.clock.advance(60)
    h.controller.sweep()

    (job_incident,) = h.controller.list_incidents("open", None, 100)
    assert job_incident["node"] == "job:llm"
    assert "6 nodes of job llm" not in job_incident["message"]  # opened at the third
    assert "3 nodes of job llm" in job_incident["message"]
    assert "no node action" in job_incident["message"]
    (alert,) = alerts(h)
    assert alert.node == "job:llm"
    assert alert.labels == {"owner": "team-llm", "job": "llm"}  # to the job's owner
    assert h.fakes["evict"].calls == []
    assert h.actions("evict") == []

    h.clock.advance(3 * 60)  # every node's XID incident clears: so does the job's
    h.controller.sweep()
    assert h.controller.list_incidents("open", None, 100) == []
    (closed,) = h.controller.list_incidents("closed", None, 100)
    assert closed["node"] == "job:llm"
    assert [a.params["status"] for a in alerts(h)] == ["firing", "resolved"]


def test_one_node_alone_is_the_nodes_fault_once_the_wait_is_over(
        make: Any, tmp_path: Path) -> None:
    h = make(APP_XID.format(extra=""))
    add_job(h, tmp_path, [f"n{i}" for i in range(8)], {})
    event_on(h, "n2", 13, 0)
    event_on(h, "n5", 13, 0)  # two of the three that make it the job's
    h.controller.sweep()
    assert h.controller.list_incidents(None, None, 100) == []  # held: part of more?
    assert h.controller.blast.held() == 2

    h.clock.advance(30)
    h.controller.sweep()
    incidents = h.controller.list_incidents("open", None, 100)
    assert sorted(i["node"] for i in incidents) == ["n2", "n5"]
    assert h.controller.blast.held() == 0
    # the nodes' own actions: a fault on a job's node is the job's recovery
    (recovery,) = h.controller.jobs.recoveries("llm")
    assert set(recovery.failed_nodes) <= {"n2", "n5"}
    assert "n2" in recovery.failed_nodes


def test_a_node_in_no_job_is_judged_at_once(make: Any) -> None:
    h = make(APP_XID.format(extra=""))
    event_on(h, "n1", 13, 0)
    h.settle()
    assert [i["node"] for i in h.controller.list_incidents("open", None, 10)] == ["n1"]
    assert [c.node for c in h.fakes["evict"].calls] == ["n1"]


RACK_LOST = """
- name: gpu-lost
  event: gpu_lost
  clear_after: 1m
  severity: critical
  actions: [alert, evict]
  domain: {label: rack, nodes: 3, within: 1m}
"""


def test_a_rack_going_bad_together_is_one_incident_of_the_rack(make: Any) -> None:
    # a fleet of 40 (five faulted nodes do not trip the breaker), room for five out
    h = make(RACK_LOST, policy=PolicySettings(max_unavailable="25%"))
    for i in range(35):
        h.report(f"other{i}", temps=[40])
    for i in range(4):
        event_on(h, f"r1n{i}", 0, 0, kind="gpu_lost", labels={"rack": "r1"})
        h.clock.advance(5)
        h.controller.sweep()
    event_on(h, "r2n0", 0, 0, kind="gpu_lost", labels={"rack": "r2"})
    h.settle()

    opened = h.controller.list_incidents("open", None, 100)
    assert sorted(i["node"] for i in opened) == [
        "r1n0", "r1n1", "r1n2", "r1n3", "r2n0", "rack:r1"]
    rack = next(i for i in opened if i["node"] == "rack:r1")
    assert "3 nodes of rack r1" in rack["message"]
    # the first two paged on their own, then the rack pages for all of them
    assert [a.node for a in alerts(h)] == ["r1n0", "r1n1", "rack:r1", "r2n0"]
    # the nodes' own actions still go to the policy, one each
    assert sorted(c.node for c in h.fakes["evict"].calls) == [
        "r1n0", "r1n1", "r1n2", "r1n3", "r2n0"]

    h.clock.advance(2 * 60)
    h.controller.sweep()
    assert h.controller.list_incidents("open", None, 100) == []
    resolved = [a.node for a in alerts(h) if a.params["status"] == "resolved"]
    assert sorted(resolved) == ["r1n0", "r1n1", "r2n0", "rack:r1"]  # folded ones: by the rack


def test_a_repeat_offender_climbs_one_rung(make: Any) -> None:
    h = make("""
- name: app-xid
  event: xid
  codes: [13]
  clear_after: 2m
  severity: warning
  actions: [alert]
  escalate: {to: xid-reset-rung, repeats: 3, within: 1h}
""" + RESET_RUNG)
    evictions = []
    for n in range(3):
        event_on(h, "n1", 13, n)
        h.settle()
        evictions.append(len(h.fakes["evict"].calls))
        h.clock.advance(3 * 60)  # cleared (2 m) before the next
        h.controller.sweep()
    assert evictions == [0, 0, 1]
    incidents = sorted(h.controller.list_incidents(None, "n1", 10), key=lambda i: i["id"])
    assert [("escalated" in i["message"]) for i in incidents] == [False, False, True]
    assert "the 3rd app-xid incident on GPU 0 within 1h" in incidents[2]["message"]
    assert incidents[2]["severity"] == "critical"
    assert incidents[2]["rule"] == "app-xid"  # still itself: counted and closed as such

    event_on(h, "n1", 13, 3, gpu=1)  # another GPU: its own count
    h.settle()
    newest = max(h.controller.list_incidents(None, "n1", 10), key=lambda i: i["id"])
    assert "escalated" not in newest["message"]
    h.clock.advance(3600)  # the first two are out of the window: the next is the 2nd
    h.controller.sweep()
    event_on(h, "n1", 13, 4)
    h.settle()
    newest = max(h.controller.list_incidents(None, "n1", 10), key=lambda i: i["id"])
    assert "escalated" not in newest["message"]


def test_a_node_taken_out_again_and_again_climbs_one_rung(make: Any) -> None:
    rules = """
- name: app-xid
  event: xid
  codes: [13]
  severity: warning
  actions: [alert]
  escalate: {to: xid-reset-rung, node_recoveries: 2, recoveries_within: 7d}
""" + RESET_RUNG
    h = make(rules)
    for n in range(2):
        request = ActionRequest(
            id=f"past-{n}", key=f"past-{n}", action="evict", node="n1", reason="earlier",
            created_seconds=h.clock.time() - 86400 * (n + 1))
        h.store.record_action(request, "succeeded", at=h.clock.time() - 86400 * (n + 1))
    event_on(h, "n1", 13, 0)
    event_on(h, "n2", 13, 0)
    h.settle()
    assert [c.node for c in h.fakes["evict"].calls] == ["n1"]
    (n1,) = h.controller.list_incidents(None, "n1", 10)
    assert "n1 was taken out of service 2 times within 7d" in n1["message"]


@pytest.mark.parametrize(("escalate", "key", "words"), [
    ("{to: nowhere, repeats: 2}", "rules[0].escalate.to", "no rule named 'nowhere'"),
    ("{to: r}", "rules[0].escalate", "say when"),
    ("{to: a, repeats: 2}", "rules[0].escalate.to", "cannot escalate to itself"),
    ("{to: r, repeats: 1}", "rules[0].escalate.repeats", "at least 2"),
])
def test_an_unsound_escalation_names_file_key_and_line(
        tmp_path: Path, escalate: str, key: str, words: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(f"- name: a\n  event: xid\n  escalate: {escalate}\n"
                    "- name: r\n  event: gpu_lost\n")
    with pytest.raises(ConfigError) as caught:
        load_rules([path])
    err = caught.value
    assert (err.key, err.line) == (key, 3)
    assert words in str(err)


# --------------------------------------------------------------------------- the catalogue


def default_rules() -> str:
    return (Path(__file__).resolve().parents[2] / "sn_monitor" / "rules"
            / "default.yaml").read_text()


@pytest.mark.parametrize(("code", "rule", "resolution"), [
    (13, "app-xid", "RESTART_APP"),
    (31, "app-xid", "RESTART_APP"),
    (95, "fatal-xid", "RESET_GPU"),
    (79, "fatal-xid", "RESTART_BM"),
    (48, "fatal-xid", "WORKFLOW_XID_48"),
    (54, "hardware-xid", "CHECK_MECHANICALS"),
    (154, "review-xid", "XID_154"),
    (43, None, "IGNORE"),  # the application stopped; the GPU is fine: no incident
    (45, None, "WORKFLOW_XID_45"),  # follow the other XID, if any: no incident alone
])
def test_the_default_rules_act_on_the_catalogues_resolution(
        make: Any, code: int, rule: str | None, resolution: str) -> None:
    h = make(default_rules())
    event_on(h, "n1", code, 0)
    h.settle()
    incidents = h.controller.list_incidents(None, "n1", 10)
    if rule is None:
        assert incidents == []
        return
    (incident,) = incidents
    assert incident["rule"] == rule
    assert f"NVIDIA's resolution {resolution}" in incident["message"]


def test_an_edited_catalogue_moves_a_code_to_another_rule(make: Any, tmp_path: Path) -> None:
    from sn_monitor.rules.xid_catalog import PACKAGED_CATALOG

    text = PACKAGED_CATALOG.read_text()
    entry = text.index("  - code: 13\n")
    end = text.index("  - code: 14\n")
    edited = tmp_path / "xids.yaml"
    edited.write_text(text[:entry] + text[entry:end].replace("RESTART_APP", "RESET_GPU")
                      + text[end:])
    h = make(default_rules(), xid_catalog=str(edited))
    event_on(h, "n1", 13, 0)
    h.settle()
    (incident,) = h.controller.list_incidents(None, "n1", 10)
    assert incident["rule"] == "fatal-xid"
    assert "NVIDIA's resolution RESET_GPU" in incident["message"]


def test_a_resolution_the_catalogue_does_not_have_names_file_key_and_line(
        tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("- name: a\n  event: xid\n  resolutions: [RESET_GPU, REBOOT]\n")
    with pytest.raises(ConfigError) as caught:
        load_rules([path])
    assert (caught.value.key, caught.value.line) == ("rules[0].resolutions", 3)
    assert "'REBOOT'" in str(caught.value)


# --------------------------------------------------------------------------- cancelled


def test_a_lost_gpu_that_reads_healthy_again_closes_its_incident(make: Any) -> None:
    h = make("""
- name: gpu-lost
  event: gpu_lost
  severity: critical
  actions: [alert]
- name: fatal-xid
  event: xid
  codes: [95]
  severity: critical
  actions: [alert]
""")
    gpus = [{"index": i, "temperature_celsius": 50.0} for i in range(4)]
    lost = [dict(g, lost=g["index"] == 2) for g in gpus]
    event_on(h, "n1", 0, 0, gpu=2, kind="gpu_lost", gpus=lost)
    event_on(h, "n1", 95, 1, gpu=1, gpus=lost)
    h.clock.advance(5)
    h.report("n1", gpus=lost)  # still lost: still open
    assert len(h.controller.list_incidents("open", "n1", 10)) == 2
    h.clock.advance(5)
    h.report("n1", gpus=gpus)  # GPU 2 answers again
    h.settle()
    (closed,) = h.controller.list_incidents("closed", "n1", 10)
    assert closed["rule"] == "gpu-lost"
    # the XID on another GPU is no lost GPU: a healthy reading says nothing of it
    (still,) = h.controller.list_incidents("open", "n1", 10)
    assert still["rule"] == "fatal-xid"
    assert [a.params["status"] for a in alerts(h) if a.rule == "gpu-lost"] == [
        "firing", "resolved"]


def test_a_reading_sampled_before_the_loss_does_not_close_it(make: Any) -> None:
    """The fast path's event can overtake the sample taken just before the fault."""
    h = make("""
- name: gpu-fallen-off-bus
  event: gpu_fallen_off_bus
  severity: critical
  actions: [alert]
""")
    gpus = [{"index": i, "temperature_celsius": 50.0} for i in range(4)]
    sampled_before = h.clock.time()
    h.clock.advance(0.3)
    fell = {"id": 0, "kind": "gpu_fallen_off_bus", "source": "kmsg", "gpu": 2,
            "time_seconds": h.clock.time(), "message": "GPU has fallen off the bus"}
    h.report("n1", events_only=True, events=[fell])
    h.clock.advance(0.2)
    # the sample taken before the fall, sent after its event: GPU 2 still answered then
    h.controller.ingest(report_body("n1", sequence=2, sample_time=sampled_before, gpus=gpus),
                        OPEN_ACCESS, None)
    h.sequences["n1/i1"] = 2
    h.settle()
    (still,) = h.controller.list_incidents("open", "n1", 10)
    assert still["rule"] == "gpu-fallen-off-bus"
    h.clock.advance(1)
    h.report("n1", gpus=gpus)  # sampled after the fall: it answers again
    h.settle()
    assert [i["rule"] for i in h.controller.list_incidents("closed", "n1", 10)] == [
        "gpu-fallen-off-bus"]
