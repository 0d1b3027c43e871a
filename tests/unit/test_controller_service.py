"""The controller's decisions, on a manual clock: reports in, findings, incidents, actions.

The controller here is the real one (real rules, real store on tmp_path, real runner and
policy, the real agent command queue); only the outside systems are fakes, registered
in ``drivers.by_action`` the way a configured driver would be. Time moves only through
``clock.advance`` and ``controller.sweep()``; actions run in the runner's worker threads,
so tests wait for ``runner.wait_idle`` before looking at what a driver did.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sn_monitor.controller.actions.policy import BreakerSettings, PolicySettings
from sn_monitor.controller.security.auth import OPEN_ACCESS, Identity
from sn_monitor.controller.storage.store import Store
from sn_monitor.model import ReportReply
from sn_monitor.rules.spec import Rule, load_rules
from tests.conftest import ROOT
from tests.support.harness import (
    HEARTBEAT_RULE,
    HOT_RULE,
    T0,
    XID_RULE,
    Harness,
    make_harness,
    report_body,
    rules_from,
    xid,
)


@pytest.fixture
def harnesses(tmp_path: Path) -> Iterator[list[Harness]]:
    made: list[Harness] = []
    yield made
    for h in made:
        h.controller.close()
        h.store.close()


@pytest.fixture
def make(tmp_path: Path, harnesses: list[Harness]) -> Any:
    def build(rules: Sequence[Rule] | str, **kw: Any) -> Harness:
        parsed = rules_from(rules) if isinstance(rules, str) else rules
        h = make_harness(tmp_path, parsed, **kw)
        harnesses.append(h)
        return h
    return build


def hot_for(h: Harness, node: str, seconds: int, temp: float = 90.0) -> ReportReply:
    """Hot reports once a second, ``seconds`` + 1 of them (t = 0 .. seconds); the last reply."""
    reply = None
    for second in range(seconds + 1):
        if second:
            h.clock.advance(1)
        reply = h.report(node, temps=[temp])
        h.controller.sweep()
    assert reply is not None
    return reply


# --------------------------------------------------------------------------- thresholds


def test_threshold_fires_after_hold_and_opens_one_incident(make: Any) -> None:
    h = make(HOT_RULE)
    started = h.clock.time()
    hot_for(h, "n1", 4)
    assert h.controller.list_incidents(None, None, 10) == []  # 4 s is not 5 s

    h.clock.advance(1)
    h.report("n1", temps=[91])
    h.clock.advance(1)
    h.report("n1", temps=[92])
    h.controller.sweep()

    incidents = h.controller.list_incidents(None, None, 10)
    assert len(incidents) == 1
    incident = incidents[0]
    assert (incident["rule"], incident["node"], incident["gpu"]) == ("gpu-hot", "n1", 0)
    assert incident["status"] == "open"
    # observed at the first hot sample, detected when the 5 s hold completed
    assert incident["observed_at"] == started
    assert incident["detected_at"] == started + 5
    assert incident["detection_latency_seconds"] == 5.0
    node = h.controller.get_node("n1")
    assert node is not None
    assert node["firing"] == ["gpu-hot"]
    assert node["state"] == "degraded"
    assert [i["id"] for i in node["incidents"]] == [incident["id"]]
    assert b"sn_detection_latency_seconds_count 1.0" in h.controller.metrics()


def test_hold_completes_on_sweep_without_a_new_report(make: Any) -> None:
    h = make(HOT_RULE)
    h.report("n1", temps=[90])
    h.clock.advance(5)
    assert h.controller.list_incidents(None, None, 10) == []
    h.controller.sweep()
    assert len(h.controller.list_incidents("open", "n1", 10)) == 1


def test_throttle_goes_out_in_the_reply_and_the_result_comes_back(make: Any) -> None:
    h = make(HOT_RULE)
    fired = hot_for(h, "n1", 5)
    (throttle,) = h.actions("throttle")
    assert throttle["state"] == "succeeded"
    assert throttle["verdict"] == "within policy limits"
    assert throttle["gpu"] == 0
    alert = h.actions("alert")
    assert [a["params"]["status"] for a in alert] == ["firing"]
    assert h.fakes["alert"].actions() == ["alert"]

    # the runner queues the command in a worker thread: it rides on the reply to the
    # report that fired the rule if the worker was quick, else on the next one
    h.clock.advance(1)
    reply = h.report("n1", temps=[90])
    commands = [*fired.commands, *reply.commands]
    assert [(c.id, c.kind, c.gpu) for c in commands] == [(throttle["id"], "throttle", 0)]
    assert commands[0].power_fraction == pytest.approx(0.7)
    h.clock.advance(1)
    assert h.report("n1", temps=[89]).commands == []  # delivered once, not every reply

    h.clock.advance(1)
    result = {"id": throttle["id"], "ok": True, "time_seconds": h.clock.time(),
              "message": "power limit 490 W"}
    h.report("n1", temps=[88], command_results=[result])
    (after,) = h.actions("throttle")
    assert after["outcome"] == "agent done: power limit 490 W"


def test_cooling_resolves_with_alert_and_release(make: Any) -> None:
    h = make(HOT_RULE)
    hot_for(h, "n1", 5)
    (incident,) = h.controller.list_incidents("open", None, 10)

    h.clock.advance(1)
    h.report("n1", temps=[82])  # below 85 but not below clear_below: still firing
    assert h.controller.list_incidents("open", None, 10) != []
    h.clock.advance(1)
    cooled = h.report("n1", temps=[79])
    closed = h.controller.get_incident(incident["id"])
    assert closed is not None
    assert closed["status"] == "closed"
    assert closed["closed_at"] == h.clock.time()

    alerts = h.actions("alert")
    assert sorted(a["params"]["status"] for a in alerts) == ["firing", "resolved"]
    assert sorted(a["key"] for a in alerts) == [
        f"incident:{incident['id']}:alert", f"incident:{incident['id']}:alert:resolved"]
    (release,) = h.actions("release")
    assert release["state"] == "succeeded"
    assert {a["action"] for a in closed["actions"]} == {"alert", "throttle", "release"}

    h.clock.advance(1)
    reply = h.report("n1", temps=[70])
    assert release["id"] in [c.id for c in [*cooled.commands, *reply.commands]]
    h.controller.sweep()
    node = h.controller.get_node("n1")
    assert node is not None
    assert node["firing"] == []
    assert node["state"] == "healthy"


# --------------------------------------------------------------------------- events, settle


def test_event_rule_submits_evict_and_failover_after_settle(make: Any) -> None:
    h = make(XID_RULE.format(clear_after="10m"), settle=3.0)
    h.report("n1", temps=[50], events=[xid(0, 79, h.clock.time())])
    h.settle()
    assert h.fakes["alert"].actions() == ["alert"]  # alerts do not wait
    assert h.fakes["evict"].calls == []
    assert h.fakes["failover"].calls == []

    h.clock.advance(2)
    h.controller.sweep()
    h.settle()
    assert h.fakes["evict"].calls == []  # 2 s is within the settle time

    h.clock.advance(1)
    h.controller.sweep()
    h.settle()
    assert h.fakes["evict"].actions() == ["evict"]
    assert h.fakes["failover"].actions() == ["failover"]
    for action in ("evict", "failover"):
        (record,) = h.actions(action)
        assert record["state"] == "succeeded"
        assert record["verdict"] == "within policy limits"  # asked the policy
        assert record["rule"] == "fatal-xid"
    # the runner recorded the cordon it now holds
    assert h.store.get_node("n1").cordoned_by_us  # type: ignore[union-attr]

    h.clock.advance(10)
    h.controller.sweep()  # nothing new: keys are idempotent, the settle queue is empty
    h.settle()
    assert h.fakes["evict"].actions() == ["evict"]


def test_settling_actions_and_sweeps_are_in_the_metrics(make: Any) -> None:
    """What a test (or an operator) waits on instead of the settle time: the node-taking
    actions still settling, and the sweeps done."""
    h = make(XID_RULE.format(clear_after="10m"), settle=3.0)

    def metrics() -> str:
        return h.controller.metrics().decode()

    assert "sn_controller_actions_settling 0.0" in metrics()
    assert "sn_controller_sweeps_total 0.0" in metrics()
    h.report("n1", temps=[50], events=[xid(0, 79, h.clock.time())])
    h.settle()
    assert "sn_controller_actions_settling 2.0" in metrics()  # evict and failover
    h.clock.advance(2)
    h.controller.sweep()
    assert "sn_controller_actions_settling 2.0" in metrics()
    assert "sn_controller_sweeps_total 1.0" in metrics()
    h.clock.advance(1)
    h.controller.sweep()
    h.settle()
    assert "sn_controller_actions_settling 0.0" in metrics()
    assert "sn_controller_sweeps_total 2.0" in metrics()
    assert h.fakes["evict"].actions() == ["evict"]


def test_event_cleared_within_settle_takes_no_node(make: Any) -> None:
    h = make(XID_RULE.format(clear_after="1s"), settle=3.0)
    h.report("n1", temps=[50], events=[xid(0, 79, h.clock.time())])
    h.clock.advance(3)
    h.controller.sweep()
    h.settle()
    assert h.controller.list_incidents("closed", "n1", 10) != []
    assert h.fakes["evict"].calls == []
    assert h.fakes["failover"].calls == []
    assert h.actions("evict") == []
    assert h.actions("failover") == []
    assert sorted(a["params"]["status"] for a in h.actions("alert")) == ["firing", "resolved"]


def test_other_xid_codes_do_not_match(make: Any) -> None:
    h = make(XID_RULE.format(clear_after="10m"), settle=0.0)
    h.report("n1", events=[xid(0, 13, h.clock.time())])
    assert h.controller.list_incidents(None, None, 10) == []


# --------------------------------------------------------------------------- sequences


def test_duplicate_report_is_answered_not_applied(make: Any) -> None:
    h = make("- {name: hot, metric: gpu_temperature_celsius, above: 85}")
    assert h.report("n1", temps=[50], sequence=5).sequence == 5
    reply = h.report("n1", temps=[99], sequence=5)  # same instance and sequence
    assert reply.sequence == 5
    assert h.controller.list_incidents(None, None, 10) == []
    node = h.controller.get_node("n1")
    assert node is not None
    assert node["hottest_gpu_celsius"] == 50


def test_reordered_report_is_answered_not_applied(make: Any) -> None:
    h = make("- {name: hot, metric: gpu_temperature_celsius, above: 85}")
    h.report("n1", temps=[50], sequence=7)
    reply = h.report("n1", temps=[99], sequence=6)  # an older report arriving late
    assert reply.sequence == 6
    assert h.controller.list_incidents(None, None, 10) == []
    node = h.controller.get_node("n1")
    assert node is not None
    assert node["hottest_gpu_celsius"] == 50
    metrics = h.controller.metrics().decode()
    assert 'sn_controller_reports_total{outcome="stale"} 1.0' in metrics
    assert 'sn_controller_reports_total{outcome="accepted"} 1.0' in metrics


def test_restarted_agent_is_applied(make: Any) -> None:
    h = make("- {name: hot, metric: gpu_temperature_celsius, above: 85}")
    h.report("n1", temps=[50], instance="before", sequence=900)
    h.report("n1", temps=[99], instance="after", sequence=1)
    (incident,) = h.controller.list_incidents("open", "n1", 10)
    assert incident["value"] == 99
    node = h.controller.get_node("n1")
    assert node is not None
    assert node["hottest_gpu_celsius"] == 99


def test_events_are_stored_once_and_acknowledged(make: Any) -> None:
    h = make(XID_RULE.format(clear_after="10m"), settle=0.0)
    now = h.clock.time()
    first = [xid(0, 13, now), xid(1, 79, now)]
    assert h.report("n1", events=first).events_stored_through == 1
    # the reply was lost: the agent sends both again, with a new one
    again = [*first, xid(2, 79, now + 1)]
    assert h.report("n1", events=again).events_stored_through == 2
    # and a duplicate of that report (same sequence) is acknowledged too
    assert h.report("n1", events=again, sequence=2).events_stored_through == 2
    assert h.store.count_events("n1") == 3
    stored = h.controller.list_events("n1", None, 100)
    assert sorted(e["event_id"] for e in stored) == [0, 1, 2]
    assert [e["code"] for e in h.controller.list_events(None, "xid", 100)] == [79, 79, 13]
    # one incident: XID 79 twice on GPU 0 is one incident, and a retry counts nothing
    assert len(h.controller.list_incidents(None, None, 10)) == 1
    assert h.report("n1").events_stored_through == -1  # no events: nothing to acknowledge


# --------------------------------------------------------------------------- breaker


def test_breaker_opens_when_two_of_four_nodes_are_lost(make: Any) -> None:
    policy = PolicySettings(breaker=BreakerSettings(max_faulted=1, min_faulted=2))
    h = make(HEARTBEAT_RULE, settle=3.0, policy=policy)
    nodes = ["n1", "n2", "n3", "n4"]
    for node in nodes:
        h.report(node)
    for _ in range(11):  # n3 and n4 go silent; n1 and n2 keep reporting
        h.clock.advance(1)
        for node in ("n1", "n2"):
            h.report(node)
        h.controller.sweep()
    breaker = h.controller.policy.breaker_state()
    assert breaker.open
    assert "2 of 4 nodes faulted" in breaker.reason
    ok, health = h.controller.health()
    assert ok
    assert health["breaker"]["open"] is True

    for _ in range(4):  # past the settle time
        h.clock.advance(1)
        for node in ("n1", "n2"):
            h.report(node)
        h.controller.sweep()
    h.settle()
    assert h.fakes["evict"].calls == []
    assert h.fakes["failover"].calls == []
    taken = h.actions("evict") + h.actions("failover")
    assert sorted((a["action"], a["node"]) for a in taken) == [
        ("evict", "n3"), ("evict", "n4"), ("failover", "n3"), ("failover", "n4")]
    for record in taken:
        assert record["state"] == "refused"
        assert record["verdict"].startswith("circuit breaker open: 2 of 4 nodes")
    # a person is paged about the breaker itself
    breaker_alerts = [a for a in h.actions("alert") if a["rule"] == "circuit-breaker"]
    assert len(breaker_alerts) == 1
    assert breaker_alerts[0]["severity"] == "critical"
    assert "sn_breaker_open 1.0" in h.controller.metrics().decode()
    states = {n["name"]: n["state"] for n in h.controller.list_nodes()}
    assert states == {"n1": "healthy", "n2": "healthy", "n3": "lost", "n4": "lost"}


def test_one_lost_node_is_failed_over_after_settle(make: Any) -> None:
    policy = PolicySettings(breaker=BreakerSettings(max_faulted=1, min_faulted=2))
    h = make(HEARTBEAT_RULE, settle=3.0, policy=policy)
    for node in ("n1", "n2", "n3", "n4"):
        h.report(node)
    for _ in range(14):
        h.clock.advance(1)
        for node in ("n1", "n2", "n3"):
            h.report(node)
        h.controller.sweep()
    h.settle()
    assert not h.controller.policy.breaker_state().open
    assert [r.node for r in h.fakes["evict"].calls] == ["n4"]
    assert [r.node for r in h.fakes["failover"].calls] == ["n4"]


def test_node_back_within_settle_is_not_taken(make: Any) -> None:
    h = make(HEARTBEAT_RULE, settle=3.0)
    h.report("n1")
    h.clock.advance(10)
    h.controller.sweep()
    assert h.controller.list_incidents("open", "n1", 10) != []
    h.clock.advance(1)
    h.report("n1")  # it blinked: back before the settle time is over
    h.clock.advance(3)
    h.controller.sweep()
    h.settle()
    assert h.fakes["evict"].calls == []
    assert h.fakes["failover"].calls == []
    assert h.controller.list_incidents("open", "n1", 10) == []


# --------------------------------------------------------------------------- store down


def test_store_unavailable_refuses_to_act(tmp_path: Path, harnesses: list[Harness]) -> None:
    path = tmp_path / "controller.db"
    Store(path).close()
    # chmod does not stop root; a read-only open does (see test_store)
    read_only = Store(f"file:{path}?mode=ro")
    h = make_harness(tmp_path, rules_from(HOT_RULE.replace("for: 5s", "for: 0s")
                                          + XID_RULE.format(clear_after="10m")),
                     store=read_only)
    harnesses.append(h)

    reply = h.report("n1", temps=[95], events=[xid(0, 79, h.clock.time())])
    assert reply.events_stored_through == -1  # not stored: the agent keeps them
    h.clock.advance(5)
    h.report("n1", temps=[95])
    h.controller.sweep()
    h.settle()
    ok, body = h.controller.health()
    assert not ok
    assert body["status"] == "refusing to act"
    assert "readonly" in body["store"]
    for fake in h.fakes.values():
        assert fake.calls == []
    assert h.drivers.queue.pending("n1") == []  # no throttle queued for the agent either
    assert h.controller.list_actions(None, None, 100) == []
    assert "sn_controller_store_up 0.0" in h.controller.metrics().decode()


# --------------------------------------------------------------------------- by hand


def test_manual_cordon_goes_through_the_policy(make: Any) -> None:
    h = make(HOT_RULE)  # max_unavailable 10% of 4 nodes: one node
    for node in ("n1", "n2", "n3", "n4"):
        h.report(node)
    first = h.controller.manual_action("cordon", "n1", "alice", "bad fan")
    assert first["requested_by"] == "alice"
    assert first["reason"] == "bad fan (by alice)"
    h.settle()
    assert [r.node for r in h.fakes["cordon"].calls] == ["n1"]
    second = h.controller.manual_action("cordon", "n2", "alice", "also")
    h.settle()
    assert second["state"] == "refused"
    assert second["verdict"].startswith("max_unavailable: 1 of 4 nodes already out")
    assert [r.node for r in h.fakes["cordon"].calls] == ["n1"]


def test_uncordon_only_what_we_cordoned(make: Any) -> None:
    h = make(HOT_RULE)
    h.report("n1")
    h.report("n2")
    refused = h.controller.manual_action("uncordon", "n2", "bob", "looks fine")
    assert refused["state"] == "refused"
    assert "did not cordon n2" in refused["verdict"]

    h.controller.manual_action("cordon", "n1", "bob", "check it")
    h.settle()
    h.clock.advance(6)
    h.controller.sweep()
    assert h.controller.get_node("n1")["state"] == "cordoned"  # type: ignore[index]
    done = h.controller.manual_action("uncordon", "n1", "bob", "fixed")
    h.settle()
    assert done["state"] != "refused"
    assert h.fakes["uncordon"].actions() == ["uncordon"]
    assert h.store.get_node("n1").cordoned_by_us is False  # type: ignore[union-attr]


def test_approval_flow(make: Any) -> None:
    from sn_monitor.controller.api.statuses import status_of
    from sn_monitor.controller.errors import ControllerError

    policy = PolicySettings(approval=["evict"])
    h = make("""
- name: ecc
  event: xid
  codes: [48]
  severity: critical
  actions: [evict]
""", policy=policy)
    h.report("n1", events=[xid(0, 48, h.clock.time())])
    (waiting,) = h.actions("evict")
    assert waiting["state"] == "awaiting_approval"
    assert h.fakes["evict"].calls == []

    approved = h.controller.approve(waiting["id"], "carol")
    assert approved["verdict"].startswith("approved by carol")
    h.settle()
    assert h.fakes["evict"].actions() == ["evict"]
    (done,) = h.actions("evict")
    assert done["state"] == "succeeded"

    with pytest.raises(ControllerError) as twice:
        h.controller.approve(waiting["id"], "carol")
    assert status_of(twice.value) == 409
    with pytest.raises(ControllerError) as unknown:
        h.controller.approve("no-such-action", "carol")
    assert status_of(unknown.value) == 404


# --------------------------------------------------------------------------- reload, sd


def test_reload_keeps_firing_state(make: Any) -> None:
    h = make(HOT_RULE)
    hot_for(h, "n1", 5)
    (incident,) = h.controller.list_incidents("open", None, 10)
    before = len(h.actions())

    # the same rule with another severity, and a new rule: nothing resolves or re-fires
    changed = HOT_RULE.replace("severity: critical", "severity: warning") + """
- name: hbm-hot
  metric: gpu_memory_temperature_celsius
  above: 95
"""
    h.controller.reload_rules(rules_from(changed))
    h.clock.advance(1)
    h.report("n1", temps=[90])
    h.controller.sweep()
    assert [i["id"] for i in h.controller.list_incidents("open", None, 10)] == [incident["id"]]
    assert len(h.actions()) == before
    assert h.controller.get_node("n1")["firing"] == ["gpu-hot"]  # type: ignore[index]

    # a pending for-timer also survives a reload
    h.report("n2", temps=[90])
    h.clock.advance(3)
    h.controller.reload_rules(rules_from(changed))
    h.clock.advance(2)
    h.controller.sweep()
    assert len(h.controller.list_incidents("open", "n2", 10)) == 1

    # removing the rule resolves what it had firing
    h.controller.reload_rules(rules_from("- {name: other, metric: gpu_power_watts, above: 1}"))
    assert h.controller.list_incidents("open", None, 10) == []


def test_default_rules_load_and_run(tmp_path: Path, harnesses: list[Harness]) -> None:
    rules = load_rules([ROOT / "sn_monitor" / "rules" / "default.yaml"])
    h = make_harness(tmp_path, rules, settle=3.0)
    harnesses.append(h)
    hot_for(h, "n1", 5, temp=86)
    assert {i["rule"] for i in h.controller.list_incidents("open", None, 10)} == {"gpu-overheat"}
    assert h.actions("throttle")[0]["state"] == "succeeded"


def test_service_discovery_lists_agents(make: Any) -> None:
    h = make(HOT_RULE)
    labels = {"supernode": "sn1", "rack": "r7", "job": "llm", "zone": "a"}
    h.report("n2", labels=labels, metrics_port=9847, peer="10.0.0.2")
    h.report("n1", labels={"rack": "r1"}, metrics_port=9100, peer="fd00::1")
    h.report("n3", labels=labels, peer="10.0.0.3")  # no metrics port: nothing to scrape
    assert h.controller.service_discovery() == [
        {"targets": ["[fd00::1]:9100"], "labels": {"node": "n1", "rack": "r1"}},
        {"targets": ["10.0.0.2:9847"],
         "labels": {"node": "n2", "supernode": "sn1", "rack": "r7", "job": "llm"}},
    ]


def test_forbidden_node_is_refused(make: Any) -> None:
    from sn_monitor.controller.api.statuses import status_of
    from sn_monitor.controller.errors import ControllerError

    h = make(HOT_RULE)
    agent = Identity("rack-1", "agent", ("r1-*",))
    h.report("r1-n1", identity=agent)
    with pytest.raises(ControllerError) as refused:
        h.report("r2-n1", identity=agent)
    assert status_of(refused.value) == 403
    assert h.controller.get_node("r2-n1") is None


def test_a_late_report_from_before_an_agent_restart_is_not_applied(make: Any) -> None:
    h = make("- {name: hot, metric: gpu_temperature_celsius, above: 85}")
    h.controller.ingest(report_body("n1", temps=[50], instance="after", sequence=1,
                                    sample_time=T0 + 10), OPEN_ACCESS, None)
    h.controller.ingest(report_body("n1", temps=[99], instance="before", sequence=900,
                                    sample_time=T0 + 5), OPEN_ACCESS, None)
    assert h.controller.list_incidents("open", "n1", 10) == []
    node = h.controller.get_node("n1")
    assert node is not None
    assert node["hottest_gpu_celsius"] == 50


def test_an_open_breaker_survives_a_controller_restart(make: Any, tmp_path: Path) -> None:
    from sn_monitor.controller.actions.policy import BreakerState

    h = make("- {name: lost, heartbeat_timeout: 10s, actions: [alert]}")
    until = h.clock.time() + 300
    h.controller.policy.restore_breaker(
        BreakerState(open=True, reason="2 of 4 nodes faulted", since=h.clock.time(), until=until))
    h.controller.sweep()
    again = make_harness(tmp_path / "second", [], store=h.store)
    again.controller.start()
    state = again.controller.policy.breaker_state()
    assert state.open
    assert state.reason == "2 of 4 nodes faulted"


INSTANT_HOT = "- {name: hot, metric: gpu_temperature_celsius, above: 85, actions: [alert]}"


def test_an_incident_that_cleared_during_a_restart_is_resolved_after_the_grace(
        make: Any) -> None:
    first = make(INSTANT_HOT)
    first.report("n1", temps=[95])
    (incident,) = first.controller.list_incidents("open", "n1", 10)
    # the controller restarts; the GPU cooled down meanwhile
    second = make(INSTANT_HOT, store=first.store)
    second.report("n1", temps=[40])
    second.controller.sweep()
    assert second.controller.list_incidents("open", "n1", 10), "closed before the grace"
    second.clock.advance(61)
    second.report("n1", temps=[40])
    second.controller.sweep()
    assert second.controller.list_incidents("open", "n1", 10) == []
    resolved = [a for a in second.actions("alert") if a["key"].endswith(":resolved")]
    assert [a["incident_id"] for a in resolved] == [incident["id"]]


def test_an_incident_still_firing_after_a_restart_keeps_its_id(make: Any) -> None:
    first = make(INSTANT_HOT)
    first.report("n1", temps=[95])
    (incident,) = first.controller.list_incidents("open", "n1", 10)
    second = make(INSTANT_HOT, store=first.store)
    second.clock.advance(61)
    second.report("n1", temps=[95])
    second.controller.sweep()
    (still,) = second.controller.list_incidents("open", "n1", 10)
    assert still["id"] == incident["id"]
    assert len([a for a in second.actions("alert") if a["incident_id"] == incident["id"]]) == 1


def test_nodes_of_a_job_get_its_label_for_peer_rules(make: Any, tmp_path: Path) -> None:
    from sn_monitor.controller.jobs.spec import job_from_json

    h = make("- {name: hot, metric: gpu_temperature_celsius, above: 85}")
    job = job_from_json(msgspec.json.encode({
        "apiVersion": "sn-monitor/v1", "kind": "DistributedJob", "metadata": {"name": "llm"},
        "spec": {"replicas": 2, "nodes": ["n1", "n2"], "checkpoint": {"dir": str(tmp_path)},
                 "control": {"command": ["/bin/true"]}}}))
    h.controller.jobs.add_job(job, "test")
    h.report("n1", temps=[40])
    h.report("n3", temps=[40], labels={"job": "other"})
    h.report("n4", temps=[40])
    views = h.controller.registry.views()
    assert views["n1"].labels == {"job": "llm"}
    assert views["n3"].labels == {"job": "other"}  # what the agent says wins
    assert views["n4"].labels == {}
    h.report("n1", temps=[41])  # a later report keeps it, and is no label change
    assert views["n1"].labels == {"job": "llm"}
