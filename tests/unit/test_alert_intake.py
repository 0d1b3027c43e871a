"""Alertmanager's webhook in (``POST /api/v1/alertmanager``): alert rules, in-process.

The app and the controller are the real ones (the harness of test_controller_service,
the tokens of test_controller_api); the outside systems behind ``alert`` and ``cordon``
are fakes that remember what they were asked. Payloads are what Alertmanager 0.25
posts (webhook version 4).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from sn_monitor.config import parse_yaml
from sn_monitor.controller.actions.drivers.alertmanager import rfc3339
from sn_monitor.controller.actions.policy import BreakerSettings, PolicySettings
from sn_monitor.controller.api.app import build_app
from sn_monitor.controller.api.openapi import openapi_document
from sn_monitor.controller.security.auth import TokenBook
from sn_monitor.rules.alerts import (
    WebhookAlert,
    decode_webhook,
    fingerprint_of,
    gpu_of,
    node_of,
    subject_of,
)
from sn_monitor.rules.engine import RuleEngine
from sn_monitor.rules.spec import AlertRule, parse_rules
from sn_monitor.rules.view import NodeView
from tests.support.api import (
    ADMIN,
    AGENT,
    JSON,
    OPERATE,
    READ,
    bearer,
    write_tokens,
)
from tests.support.harness import (
    HOT_RULE,
    T0,
    Harness,
    make_harness,
    report_body,
    rules_from,
)

PATH = "/api/v1/alertmanager"

RULES = HOT_RULE + """
- name: prometheus-nvlink-down
  alert: {alertname: SnNvlinkDown}
  severity: critical
  actions: [alert, cordon]
- name: prometheus-gpu
  alert: {alertname: "=~SnGpu(Hot|Lost)", sn_action: "true"}
  node_label: host
  actions: [alert]
"""


def alert(labels: dict[str, str], *, status: str = "firing", starts: float = T0 - 30,
          ends: float | None = None, summary: str | None = "NVLink down on the node",
          fingerprint: str | None = "5f1c0a9e7d3b2c41") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "status": status, "labels": labels,
        "annotations": {"summary": summary} if summary else {},
        "startsAt": rfc3339(starts),
        # Alertmanager's zero time for a firing alert, the real end for a resolved one
        "endsAt": rfc3339(ends) if ends is not None else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph?g0.expr=...",
    }
    if fingerprint is not None:
        doc["fingerprint"] = fingerprint
    return doc


def payload(*alerts: dict[str, Any], **top: Any) -> dict[str, Any]:
    doc = {
        "version": "4", "groupKey": '{}/{sn_action="true"}:{alertname="SnNvlinkDown"}',
        "truncatedAlerts": 0, "receiver": "sn-monitor",
        "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
        "groupLabels": {"alertname": "SnNvlinkDown"}, "commonLabels": {},
        "commonAnnotations": {}, "externalURL": "http://alertmanager:9093", "alerts": list(alerts),
    }
    doc.update(top)
    return doc


NVLINK = {"alertname": "SnNvlinkDown", "node": "gpu-1", "gpu": "3", "severity": "warning",
          "instance": "10.0.0.1:9847", "sn_action": "true"}


class Hook:
    """The app, the harness behind it, and a few shortcuts."""

    def __init__(self, harness: Harness, tmp_path: Path) -> None:
        self.h = harness
        app = build_app(harness.controller, TokenBook.load(write_tokens(tmp_path)), 64 * 1024)
        self.client = TestClient(app, headers=JSON)

    def post(self, doc: Any, token: str | None = OPERATE) -> Any:
        body = doc if isinstance(doc, bytes) else msgspec.json.encode(doc)
        return self.client.post(PATH, content=body,
                                headers=bearer(token) if token is not None else {})

    def incidents(self, status: str | None = None, node: str | None = None) -> list[dict]:
        return self.h.controller.list_incidents(status, node, 100)

    def calls(self, action: str) -> list[Any]:
        self.h.settle()
        return list(self.h.fakes[action].calls)


def make_hook(tmp_path: Path, rules: str = RULES, **kw: Any) -> Hook:
    return Hook(make_harness(tmp_path, rules_from(rules), **kw), tmp_path)


@pytest.fixture
def made(tmp_path: Path) -> Iterator[list[Hook]]:
    hooks: list[Hook] = []
    yield hooks
    for hook in hooks:
        hook.client.close()
        hook.h.controller.close()
        hook.h.store.close()


@pytest.fixture
def make(tmp_path: Path, made: list[Hook]) -> Any:
    def build(rules: str = RULES, sub: str = "", **kw: Any) -> Hook:
        where = tmp_path / sub if sub else tmp_path
        where.mkdir(exist_ok=True)
        hook = make_hook(where, rules, **kw)
        made.append(hook)
        return hook
    return build


@pytest.fixture
def hook(make: Any) -> Hook:
    h: Hook = make()
    for node in ("gpu-1", "gpu-2", "gpu-3"):
        h.h.report(node)
    return h


# --------------------------------------------------------------------------- the rules


def test_alert_rules_parse_with_their_defaults() -> None:
    nvlink, gpu = rules_from(RULES)[1:]
    assert isinstance(nvlink, AlertRule)
    assert nvlink.alert == {"alertname": "SnNvlinkDown"}
    assert nvlink.node_label == "node"
    assert nvlink.severity == "critical"
    assert isinstance(gpu, AlertRule)
    assert gpu.node_label == "host"
    assert gpu.severity is None  # each alert's own
    assert gpu.kind == "alert"


def test_the_engine_feeds_alert_rules_neither_reports_nor_time() -> None:
    from sn_monitor.clock import ManualClock
    from sn_monitor.controller.ingest.decode import decode_report

    rules = parse_rules(parse_yaml(
        "- {name: any-alert, alert: {alertname: '=~.*'}, node_label: node}\n", "r.yaml"))
    engine = RuleEngine(rules, ManualClock(T0))
    report = decode_report(report_body("gpu-1", temps=[99.0, 99.0]))
    view = NodeView("gpu-1", {"alertname": "x"}, report, 0.0, T0)
    assert engine.observe(view) == []
    assert engine.sweep({"gpu-1": view}) == []
    assert engine.firing() == []


@pytest.mark.parametrize(("labels", "node"), [
    ({"node": "gpu-7", "instance": "10.0.0.7:9847"}, "gpu-7"),
    ({"instance": "gpu-7:9847"}, "gpu-7"),
    ({"instance": "gpu-7.dc1.example:9847"}, "gpu-7.dc1.example"),
    ({"instance": "gpu-7"}, "gpu-7"),
    ({"node": "", "instance": "10.0.0.7:9100"}, "10.0.0.7"),
    ({"instance": "[fe80::1]:9847"}, None),  # not a node name
    ({"node": "../etc"}, None),
    ({"job": "sn-agent"}, None),
])
def test_node_of(labels: dict[str, str], node: str | None) -> None:
    assert node_of(labels, "node") == node


def test_gpu_subject_and_fingerprint() -> None:
    assert gpu_of({"gpu": "3"}) == 3
    assert gpu_of({"gpu": "GPU-3"}) is None
    assert gpu_of({"gpu": "³"}) is None
    assert gpu_of({}) is None
    one = msgspec.convert(alert(NVLINK), WebhookAlert)
    assert subject_of(one, 3) == "gpu=3,alertname=SnNvlinkDown,fingerprint=5f1c0a9e7d3b2c41"
    # no fingerprint in the payload: one computed from the label set, stable and distinct
    bare = msgspec.convert(alert(NVLINK, fingerprint=None), WebhookAlert)
    other = msgspec.convert(alert({**NVLINK, "link": "5"}, fingerprint=None), WebhookAlert)
    assert fingerprint_of(bare) == fingerprint_of(
        msgspec.convert(alert(dict(reversed(NVLINK.items())), fingerprint=None), WebhookAlert))
    assert len(fingerprint_of(bare)) == 16
    assert fingerprint_of(bare) != fingerprint_of(other)


# --------------------------------------------------------------------------- decoding


@pytest.mark.parametrize(("body", "message"), [
    (b"{", "malformed JSON"),
    (b"[]", "invalid Alertmanager payload: Expected `object`, got `array`"),
    (msgspec.json.encode({"version": "4", "status": "firing"}),
     "Object missing required field `alerts`"),
    (msgspec.json.encode(payload(alert(NVLINK, status="pending"))),
     "at `$.alerts[0].status`"),
    (msgspec.json.encode(payload({**alert(NVLINK), "labels": {"node": 1}})),
     "Expected `str`, got `int` - at `$.alerts[0].labels[...]`"),
    (msgspec.json.encode(payload({**alert(NVLINK), "startsAt": "yesterday"})),
     "at `$.alerts[0].startsAt`"),
    (msgspec.json.encode(payload({**alert(NVLINK), "startsAt": "2024-01-01T00:00:00"})),
     "at `$.alerts[0].startsAt`"),  # a time without a zone is ambiguous
    (msgspec.json.encode(payload(alert(NVLINK), version="3")),
     "unsupported Alertmanager webhook version '3' - at `$.version`"),
    # another version fails on its version, not on the first field it lacks
    (msgspec.json.encode({"version": "5", "alerts": [{"state": "active"}]}),
     "unsupported Alertmanager webhook version '5'"),
    (msgspec.json.encode(payload(alert(NVLINK), version=4)),
     "Expected `str`, got `int` - at `$.version`"),
])
def test_a_bad_payload_is_400_naming_the_field(hook: Hook, body: bytes, message: str) -> None:
    response = hook.post(body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]
    assert hook.incidents() == []


def test_unknown_fields_are_ignored_for_alertmanagers_to_come(hook: Hook) -> None:
    doc = payload({**alert(NVLINK), "silencedBy": []}, somethingNew={"a": 1})
    assert hook.post(doc).status_code == 200
    assert decode_webhook(msgspec.json.encode(doc)).alerts[0].labels["node"] == "gpu-1"


# --------------------------------------------------------------------------- auth


def test_tokens_and_roles(hook: Hook) -> None:
    doc = payload(alert(NVLINK))
    assert hook.post(doc, token=None).status_code == 401
    assert hook.post(doc, token="not-a-known-token-at-all").status_code == 401
    for weak in (AGENT, READ):
        response = hook.post(doc, token=weak)
        assert response.status_code == 403, weak
        assert "may not do this" in response.json()["error"]
    assert hook.incidents() == []
    assert hook.post(doc, token=ADMIN).status_code == 200


def test_statuses_are_documented(hook: Hook) -> None:
    responses = openapi_document()["paths"][PATH]["post"]["responses"]
    for status in (hook.post(payload(alert(NVLINK))).status_code,
                   hook.post(b"{").status_code,
                   hook.post(payload(), token=None).status_code,
                   hook.post(payload(), token=READ).status_code,
                   hook.post(b"x" * (65 * 1024)).status_code):
        assert str(status) in responses, status


# --------------------------------------------------------------------------- firing


def test_a_firing_alert_opens_an_incident_and_acts_through_the_policy(hook: Hook) -> None:
    response = hook.post(payload(alert(NVLINK)))
    assert response.status_code == 200
    assert response.json() == {"accepted": 1, "skipped": 0, "unmatched": 0, "findings": 1,
                               "by": "oncall"}
    (incident,) = hook.incidents("open")
    assert incident["rule"] == "prometheus-nvlink-down"
    assert (incident["node"], incident["gpu"]) == ("gpu-1", 3)
    assert incident["subject"] == "gpu=3,alertname=SnNvlinkDown,fingerprint=5f1c0a9e7d3b2c41"
    assert incident["severity"] == "critical"  # the rule's, over the alert's warning
    assert incident["message"] == "NVLink down on the node"
    assert incident["observed_at"] == T0 - 30  # startsAt
    assert incident["detected_at"] == T0
    (sent,) = hook.calls("alert")
    (cordon,) = hook.calls("cordon")
    assert (cordon.node, cordon.rule, cordon.incident_id) == ("gpu-1", "prometheus-nvlink-down",
                                                             incident["id"])
    assert sent.params["status"] == "firing"
    actions = hook.h.actions()
    assert {a["action"]: a["state"] for a in actions} == {"alert": "succeeded",
                                                          "cordon": "succeeded"}
    # the audit trail names who posted it
    assert {a["requested_by"] for a in actions} == {
        "rule:prometheus-nvlink-down via alertmanager:oncall"}
    assert hook.h.controller.get_node("gpu-1")["firing"] == ["prometheus-nvlink-down"]


def test_the_alerts_severity_label_is_the_default(hook: Hook) -> None:
    gpu_hot = {"alertname": "SnGpuHot", "host": "gpu-2", "severity": "page", "sn_action": "true"}
    response = hook.post(payload(alert(gpu_hot, summary=None)))
    assert response.json()["findings"] == 1
    (incident,) = hook.incidents("open")
    assert (incident["rule"], incident["node"], incident["severity"]) == (
        "prometheus-gpu", "gpu-2", "page")
    assert incident["message"] == "SnGpuHot firing in Alertmanager"
    assert incident["gpu"] is None


def test_a_repeated_alert_opens_nothing_new_and_runs_nothing_again(hook: Hook) -> None:
    assert hook.post(payload(alert(NVLINK))).json()["findings"] == 1
    hook.h.settle()
    for _ in range(3):  # repeat_interval, and group updates that list it again
        hook.h.clock.advance(60)
        again = hook.post(payload(alert(NVLINK), alert({**NVLINK, "node": "gpu-2"},
                                                       fingerprint="0123456789abcdef")))
        assert again.json()["accepted"] == 2
    assert len(hook.incidents("open")) == 2
    # one decision per incident and action (gpu-2's cordon: refused by max_unavailable)
    decided = sorted((a["action"], a["node"], a["state"]) for a in hook.h.actions())
    assert decided == [("alert", "gpu-1", "succeeded"), ("alert", "gpu-2", "succeeded"),
                       ("cordon", "gpu-1", "succeeded"), ("cordon", "gpu-2", "refused")]
    assert [c.node for c in hook.calls("cordon")] == ["gpu-1"]
    assert len(hook.calls("alert")) == 2


def test_two_alerts_of_one_name_on_one_node_are_two_incidents(hook: Hook) -> None:
    port_a = alert({**NVLINK, "link": "1"}, fingerprint="aaaaaaaaaaaaaaaa")
    port_b = alert({**NVLINK, "link": "2"}, fingerprint="bbbbbbbbbbbbbbbb")
    assert hook.post(payload(port_a, port_b)).json()["findings"] == 2
    assert len(hook.incidents("open", "gpu-1")) == 2
    hook.post(payload({**port_a, "status": "resolved", "endsAt": rfc3339(T0)}))
    (left,) = hook.incidents("open", "gpu-1")
    assert left["subject"].endswith("bbbbbbbbbbbbbbbb")


# --------------------------------------------------------------------------- resolved


def test_a_resolved_alert_resolves_the_incident(hook: Hook) -> None:
    hook.post(payload(alert(NVLINK)))
    (incident,) = hook.incidents("open")
    hook.h.clock.advance(120)
    resolved = alert(NVLINK, status="resolved", ends=T0 + 100)
    response = hook.post(payload(resolved))
    assert response.json() == {"accepted": 1, "skipped": 0, "unmatched": 0, "findings": 1,
                               "by": "oncall"}
    assert hook.incidents("open") == []
    (closed,) = hook.incidents("closed")
    assert closed["id"] == incident["id"]
    assert closed["closed_at"] == T0 + 120
    sent = [(c.params["status"], c.incident_id) for c in hook.calls("alert")]
    assert sent == [("firing", incident["id"]), ("resolved", incident["id"])]
    assert hook.h.controller.get_node("gpu-1")["firing"] == []
    # Alertmanager lists a resolved alert in later notifications too: nothing more happens
    assert hook.post(payload(resolved)).json()["findings"] == 0
    assert len(hook.calls("alert")) == 2


def test_firing_again_after_resolving_is_a_new_incident(hook: Hook) -> None:
    hook.post(payload(alert(NVLINK)))
    hook.post(payload(alert(NVLINK, status="resolved", ends=T0)))
    hook.h.clock.advance(60)
    hook.post(payload(alert(NVLINK, starts=T0 + 50)))
    assert len(hook.incidents("closed")) == 1
    (again,) = hook.incidents("open")
    assert again["observed_at"] == T0 + 50


def test_a_resolved_alert_that_never_fired_here_does_nothing(hook: Hook) -> None:
    response = hook.post(payload(alert(NVLINK, status="resolved", ends=T0)))
    assert response.json()["findings"] == 0
    assert hook.incidents() == []


# --------------------------------------------------------------------------- skipped


def test_an_alert_without_a_node_is_skipped_and_the_rest_stands(hook: Hook) -> None:
    nameless = alert({"alertname": "SnNvlinkDown", "job": "sn-agent"}, fingerprint="1" * 16)
    other = alert({"alertname": "SnSomethingElse", "node": "gpu-1"}, fingerprint="2" * 16)
    response = hook.post(payload(nameless, alert(NVLINK), other))
    assert response.status_code == 200
    assert response.json() == {"accepted": 1, "skipped": 1, "unmatched": 1, "findings": 1,
                               "by": "oncall"}
    assert [i["node"] for i in hook.incidents()] == ["gpu-1"]
    exposed = hook.client.get("/metrics", headers=bearer(OPERATE)).text
    for outcome in ("accepted", "skipped", "unmatched"):
        assert (f'sn_controller_alertmanager_alerts_total{{outcome="{outcome}"}} 1.0'
                in exposed), outcome


def test_regex_and_equality_matchers(hook: Hook) -> None:
    base = {"host": "gpu-3", "sn_action": "true"}
    cases = [({"alertname": "SnGpuLost"}, 1), ({"alertname": "SnGpuHotter"}, 0),
             ({"alertname": "SnGpuHot", "sn_action": "false"}, 0),
             ({"alertname": "SnGpuHot", "sn_action": ""}, 0)]
    for i, (labels, findings) in enumerate(cases):
        doc = payload(alert({**base, **labels}, fingerprint=f"{i:016x}"))
        assert hook.post(doc).json()["findings"] == findings, labels


def test_alerts_sn_monitor_sent_itself_are_never_acted_on(hook: Hook) -> None:
    own = {**NVLINK, "source": "sn-monitor"}
    response = hook.post(payload(alert(own)))
    assert response.json()["skipped"] == 1
    assert hook.incidents() == []


def test_scope_applies_to_the_nodes_labels(make: Any) -> None:
    hook = make("""
- name: sn0-only
  alert: {alertname: SnNvlinkDown}
  scope: {supernode: sn0}
  actions: [alert]
""")
    hook.h.report("gpu-1", labels={"supernode": "sn0"})
    hook.h.report("gpu-2", labels={"supernode": "sn1"})
    both = payload(alert(NVLINK), alert({**NVLINK, "node": "gpu-2"}, fingerprint="f" * 16),
                   alert({**NVLINK, "node": "gpu-9"}, fingerprint="e" * 16))
    assert hook.post(both).json() == {"accepted": 1, "skipped": 0, "unmatched": 2,
                                      "findings": 1, "by": "oncall"}
    assert [i["node"] for i in hook.incidents()] == ["gpu-1"]


# --------------------------------------------------------------------------- the policy


def test_dry_run_records_what_would_have_happened(make: Any) -> None:
    hook = make(policy=PolicySettings(dry_run=True))
    hook.h.report("gpu-1")
    hook.post(payload(alert(NVLINK)))
    states = {a["action"]: a for a in hook.h.actions()}
    assert states["cordon"]["state"] == "dry_run"
    assert "would have run" in states["cordon"]["verdict"]
    assert states["alert"]["state"] == "succeeded"  # the alert is how a dry run is watched
    assert hook.calls("cordon") == []


def test_max_unavailable_holds(hook: Hook) -> None:
    # three known nodes, max_unavailable 10%: one node may be out
    first = alert(NVLINK)
    second = alert({**NVLINK, "node": "gpu-2"}, fingerprint="0123456789abcdef")
    assert hook.post(payload(first, second)).json()["findings"] == 2
    cordons = {a["node"]: a for a in hook.h.actions("cordon")}
    assert cordons["gpu-1"]["state"] == "succeeded"
    assert cordons["gpu-2"]["state"] == "refused"
    assert cordons["gpu-2"]["verdict"].startswith("max_unavailable")
    assert len(hook.incidents("open")) == 2  # the incidents stand; the policy held the action


def test_the_breaker_counts_alert_faults(make: Any) -> None:
    hook = make(policy=PolicySettings(max_unavailable="100%", breaker=BreakerSettings(
        window=60, max_faulted=1, min_faulted=2)))
    for node in ("gpu-1", "gpu-2", "gpu-3", "gpu-4"):
        hook.h.report(node)
    hook.post(payload(*(alert({**NVLINK, "node": f"gpu-{i}"}, fingerprint=f"{i:016x}")
                        for i in (1, 2, 3))))
    assert hook.h.controller.policy.breaker_state().open
    cordons = {a["node"]: a["state"] for a in hook.h.actions("cordon")}
    assert cordons["gpu-1"] == "succeeded"
    assert cordons["gpu-2"] == "refused"


def test_an_unknown_node_gets_its_incident_and_the_policy_decides(hook: Hook) -> None:
    stranger = {**NVLINK, "node": "gpu-99"}
    response = hook.post(payload(alert(stranger)))
    assert response.json()["findings"] == 1
    (incident,) = hook.incidents("open", "gpu-99")
    assert incident["rule"] == "prometheus-nvlink-down"
    (cordon,) = hook.h.actions("cordon")
    assert cordon["node"] == "gpu-99"
    assert cordon["state"] == "succeeded"  # within max_unavailable: one of three out
    assert cordon["params"]["subject"] == incident["subject"]
    # it is not made a node of the fleet (that takes a report)
    assert "gpu-99" not in [n["name"] for n in hook.h.controller.list_nodes()]
    hook.h.controller.sweep()
    hook.post(payload(alert(stranger, status="resolved", ends=T0)))
    assert hook.incidents("open") == []


# --------------------------------------------------------------------------- reload, restart


def test_reload_keeps_updates_or_resolves_alert_incidents(hook: Hook) -> None:
    hook.post(payload(alert(NVLINK)))
    (incident,) = hook.incidents("open")
    controller = hook.h.controller
    # only what it does changed: the incident stays, repeats stay repeats
    controller.reload_rules(rules_from(RULES.replace("actions: [alert, cordon]",
                                                     "actions: [alert]")))
    assert hook.post(payload(alert(NVLINK))).json()["findings"] == 0
    assert hook.incidents("open") == [incident]
    # the rule removed: its incident resolves, with its alert
    controller.reload_rules(rules_from(HOT_RULE))
    assert hook.incidents("open") == []
    sent = [c.params["status"] for c in hook.calls("alert")]
    assert sent == ["firing", "resolved"]
    assert hook.post(payload(alert(NVLINK))).json()["unmatched"] == 1


def test_severity_from_the_alert_comes_back_when_the_rule_drops_its_own(hook: Hook) -> None:
    hook.post(payload(alert(NVLINK)))
    own = "  severity: critical\n  actions: [alert, cordon]"
    assert own in RULES

    def severity_after(rules: str) -> str:
        hook.h.controller.reload_rules(rules_from(rules))
        firing = {f.rule: f for f in hook.h.controller.engine.firing()}
        return firing["prometheus-nvlink-down"].severity

    assert severity_after(RULES.replace(own, "  severity: info\n  actions: [alert, cordon]")) \
        == "info"
    assert severity_after(RULES.replace(own, "  actions: [alert, cordon]")) == "warning"
    assert severity_after(RULES) == "critical"
    assert len(hook.incidents("open")) == 1


def test_an_open_alert_incident_survives_a_restart(make: Any) -> None:
    first = make(sub="first")
    first.post(payload(alert(NVLINK)))
    (incident,) = first.incidents("open")
    first.h.settle()
    second = make(sub="second", store=first.h.store)
    # Alertmanager re-sends only every repeat_interval: no grace period closes it
    second.h.clock.advance(3600)
    second.h.report("gpu-1")
    second.h.controller.sweep()
    assert second.incidents("open") == [incident]
    # a repeat is still a repeat, and the resolve closes the same incident
    assert second.post(payload(alert(NVLINK))).json()["findings"] == 0
    assert second.post(payload(alert(NVLINK, status="resolved", ends=T0 + 3600))).json()[
        "findings"] == 1
    assert second.incidents("open") == []
    (closed,) = second.incidents("closed")
    assert closed["id"] == incident["id"]
