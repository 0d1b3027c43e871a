"""The controller's HTTP API in-process: input limits, tokens and roles, shapes, OpenAPI.

The app is the real one around a real controller (see test_controller_service for the
harness); cordon and uncordon go to the command driver, a small script in tmp_path, so
a cordon through the API is carried out end to end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from jsonschema import Draft202012Validator
from starlette.routing import Route
from starlette.testclient import TestClient

from sn_monitor.controller.actions.policy import PolicySettings
from sn_monitor.controller.api.app import build_app
from sn_monitor.controller.api.openapi import openapi_document
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.storage.store import Store
from tests.conftest import assert_promtool_clean
from tests.support.api import (
    ADMIN,
    AGENT,
    JSON,
    MAX_BODY,
    OPERATE,
    READ,
    Api,
    bearer,
    make_api,
)
from tests.support.harness import (
    HOT_RULE,
    make_harness,
    report_body,
    rules_from,
    xid,
)

# --------------------------------------------------------------------------- reports in


def test_report_accepted(api: Api) -> None:
    response = api.report("gpu-1", temps=[50], metrics_port=9847)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    # nothing stored, no commands: defaults omitted
    assert response.json() == {"sequence": 1, "node": "gpu-1"}


def test_bad_field_is_422_naming_it(api: Api) -> None:
    body = msgspec.json.encode({
        "node": "gpu-1", "instance": "i", "sequence": 1, "sample_time_seconds": 1.0,
        "gpus": [{"index": 0, "power_watts": "hot"}]})
    response = api.client.post("/api/v1/reports", content=body, headers=bearer(AGENT))
    assert response.status_code == 422
    assert "$.gpus[0].power_watts" in response.json()["error"]
    assert "Expected `float | null`, got `str`" in response.json()["error"]


@pytest.mark.parametrize(("change", "where"), [
    ({"sequence": -1}, "$.sequence"),
    ({"node": "../etc"}, "$.node"),
    ({"unknown_key": 1}, "unknown_key"),
    ({"labels": {f"k{i}": "v" for i in range(17)}}, "$.labels"),
    ({"interval_seconds": 0}, "$.interval_seconds"),
])
def test_other_bad_fields(api: Api, change: dict[str, Any], where: str) -> None:
    doc = {"node": "gpu-1", "instance": "i", "sequence": 1, "sample_time_seconds": 1.0}
    doc.update(change)
    response = api.client.post("/api/v1/reports", content=msgspec.json.encode(doc),
                               headers=bearer(AGENT))
    assert response.status_code == 422
    assert where in response.json()["error"]


def test_malformed_json_is_400(api: Api) -> None:
    response = api.client.post("/api/v1/reports", content=b'{"node": "gpu-1",',
                               headers=bearer(AGENT))
    assert response.status_code == 400
    assert response.json()["error"].startswith("malformed JSON")


def test_oversized_body_is_413_with_content_length(api: Api) -> None:
    body = report_body("gpu-1", labels={"pad": "x"}) + b" " * MAX_BODY
    response = api.client.post("/api/v1/reports", content=body, headers=bearer(AGENT))
    assert response.status_code == 413
    assert str(MAX_BODY) in response.json()["error"]


def test_oversized_body_is_413_without_content_length(api: Api) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(MAX_BODY // 1024 + 2):
            yield b" " * 1024

    response = api.client.post("/api/v1/reports", content=chunks(), headers=bearer(AGENT))
    assert response.status_code == 413
    assert api.h.controller.get_node("gpu-1") is None


def test_a_body_at_the_limit_is_read(api: Api) -> None:
    body = report_body("gpu-1")
    body += b" " * (MAX_BODY - len(body))
    assert api.client.post("/api/v1/reports", content=body,
                           headers=bearer(AGENT)).status_code == 200


def test_too_many_gpus_or_events_are_refused(api: Api) -> None:
    gpus = api.report("gpu-1", temps=[50.0] * 65)
    assert gpus.status_code == 422
    assert "$.gpus" in gpus.json()["error"]
    events = [xid(i, 13, 1.0) for i in range(1001)]
    many = api.report("gpu-1", events=events)
    assert many.status_code == 422
    assert "$.events" in many.json()["error"]
    assert api.h.store.count_events() == 0
    assert api.report("gpu-1", temps=[50.0] * 64, events=events[:1000]).status_code == 200
    assert api.h.store.count_events() == 1000


def test_unknown_or_missing_token_is_401(api: Api) -> None:
    body = report_body("gpu-1")
    for headers in ({}, bearer("not-a-known-token-at-all"), {"Authorization": AGENT},
                    {"Authorization": f"Basic {AGENT}"}):
        response = api.client.post("/api/v1/reports", content=body, headers=headers)
        assert response.status_code == 401, headers
        assert api.client.get("/api/v1/nodes", headers=headers).status_code == 401
    assert api.h.controller.get_node("gpu-1") is None


def test_agent_may_report_only_for_its_nodes(api: Api) -> None:
    response = api.report("cpu-1")
    assert response.status_code == 403
    assert "fleet-agents may not report for node cpu-1" in response.json()["error"]
    assert api.report("cpu-1", token=ADMIN).status_code == 200  # admins may, for tests
    assert api.report("gpu-9", token=READ).status_code == 403  # readers do not report
    assert 'sn_controller_reports_total{outcome="forbidden"} 2.0' in \
        api.client.get("/metrics").text


def test_roles(api: Api) -> None:
    api.report("gpu-1")
    assert api.get("/api/v1/nodes", token=AGENT).status_code == 403
    for token in (READ, OPERATE, ADMIN):
        assert api.get("/api/v1/nodes", token=token).status_code == 200
    refused = api.post("/api/v1/nodes/gpu-1/cordon", token=READ)
    assert refused.status_code == 403
    assert refused.json() == {"error": "dashboards (read) may not do this"}
    assert api.post("/api/v1/nodes/gpu-1/cordon", token=AGENT).status_code == 403
    assert api.h.controller.list_actions(None, None, 10) == []
    assert not api.log.exists()


# --------------------------------------------------------------------------- by hand


def test_operator_cordons_through_the_policy(api: Api) -> None:
    for node in ("gpu-1", "gpu-2", "gpu-3"):
        api.report(node)
    response = api.post("/api/v1/nodes/gpu-1/cordon", json={"reason": "fan noise"})
    assert response.status_code == 202
    record = response.json()
    assert record["action"] == "cordon"
    assert record["node"] == "gpu-1"
    assert record["requested_by"] == "oncall"
    assert record["reason"] == "fan noise (by oncall)"
    api.h.settle()
    assert api.log.read_text().split()[:2] == ["cordon", "gpu-1"]
    (done,) = api.get("/api/v1/actions", params={"node": "gpu-1"}).json()["actions"]
    assert done["state"] == "succeeded"
    assert done["outcome"] == "cordon of gpu-1 done"

    # 10% of 3 nodes is one node: the policy refuses a second one
    second = api.post("/api/v1/nodes/gpu-2/cordon")
    assert second.status_code == 202
    assert second.json()["state"] == "refused"
    assert second.json()["verdict"].startswith("max_unavailable")
    assert second.json()["reason"] == "by hand (by oncall)"
    api.h.settle()
    assert len(api.log.read_text().splitlines()) == 1


def test_uncordon_of_a_node_we_did_not_cordon_is_refused(api: Api) -> None:
    api.report("gpu-1")
    response = api.post("/api/v1/nodes/gpu-1/uncordon")
    assert response.status_code == 202
    assert response.json()["state"] == "refused"
    assert "did not cordon gpu-1" in response.json()["verdict"]
    api.h.settle()
    assert not api.log.exists()


def test_cordon_body_problems(api: Api) -> None:
    api.report("gpu-1")
    bad = api.post("/api/v1/nodes/gpu-1/cordon", content=b"{nope")
    assert bad.status_code == 400
    wrong = api.post("/api/v1/nodes/gpu-1/cordon", json={"reason": 5})
    assert wrong.status_code == 422
    assert api.post("/api/v1/nodes/gpu-1/cordon", json=[1]).status_code == 422
    big = api.post("/api/v1/nodes/gpu-1/cordon", content=b" " * (MAX_BODY + 1))
    assert big.status_code == 413
    assert api.post("/api/v1/nodes/nobody/cordon").status_code == 404
    assert api.h.controller.list_actions(None, None, 10) == []


def test_approve_over_the_api(tmp_path: Path) -> None:
    client, h = make_api(tmp_path, policy=PolicySettings(approval=["evict"]))
    try:
        with client.client:
            client.report("gpu-1", events=[xid(0, 48, h.clock.time())])
            h.settle()
            (waiting,) = client.get("/api/v1/actions",
                                    params={"state": "awaiting_approval"}).json()["actions"]
            assert waiting["action"] == "evict"
            assert not client.log.exists()
            path = f"/api/v1/actions/{waiting['id']}/approve"
            assert client.post(path, token=READ).status_code == 403
            approved = client.post(path)
            assert approved.status_code == 200
            assert approved.json()["verdict"].startswith("approved by oncall")
            h.settle()
            assert client.log.read_text().split()[:2] == ["evict", "gpu-1"]
            again = client.post(path)
            assert again.status_code == 409
            assert "not awaiting approval" in again.json()["error"]
            assert client.post("/api/v1/actions/nope/approve").status_code == 404
    finally:
        h.controller.close()
        h.store.close()


# --------------------------------------------------------------------------- reading


def test_get_shapes(api: Api) -> None:
    labels = {"supernode": "sn-1", "rack": "r3", "job": "train"}
    api.report("gpu-2", temps=[40, 41], labels=labels, metrics_port=9847)
    seen = api.h.clock.time()
    for _ in range(6):  # the agent retries the event until the reply acknowledges it
        api.report("gpu-1", temps=[90, 50], events=[xid(0, 13, seen)])
        api.h.clock.advance(1)
    api.h.settle()

    nodes = api.get("/api/v1/nodes").json()["nodes"]
    assert [n["name"] for n in nodes] == ["gpu-1", "gpu-2"]
    assert set(nodes[0]) == {"name", "labels", "state", "last_report_age_seconds", "gpus",
                             "gpus_lost", "hottest_gpu_celsius", "firing", "cordoned_by_us",
                             "jobs"}
    assert nodes[1]["labels"] == labels
    assert nodes[1]["gpus"] == 2
    assert nodes[0]["hottest_gpu_celsius"] == 90
    assert nodes[0]["firing"] == ["gpu-hot"]

    node = api.get("/api/v1/nodes/gpu-1").json()
    assert node["state"] == "degraded"
    (incident_ref,) = node["incidents"]

    incidents = api.get("/api/v1/incidents", params={"status": "open"}).json()["incidents"]
    assert [i["id"] for i in incidents] == [incident_ref["id"]]
    assert api.get("/api/v1/incidents", params={"status": "closed"}).json() == {"incidents": []}
    assert api.get("/api/v1/incidents", params={"node": "gpu-2"}).json() == {"incidents": []}
    incident = api.get(f"/api/v1/incidents/{incident_ref['id']}").json()
    assert incident["rule"] == "gpu-hot"
    assert incident["gpu"] == 0
    assert incident["detection_latency_seconds"] == 5.0
    assert {a["action"] for a in incident["actions"]} == {"throttle", "alert"}

    actions = api.get("/api/v1/actions").json()["actions"]
    assert {a["action"] for a in actions} == {"throttle", "alert"}
    assert set(actions[0]) >= {"id", "key", "action", "node", "state", "verdict", "outcome",
                               "requested_by", "incident_id", "params", "attempts"}
    assert api.get("/api/v1/actions", params={"limit": 1}).json()["actions"][0] == actions[0]
    assert api.get("/api/v1/actions", params={"state": "failed"}).json() == {"actions": []}

    events = api.get("/api/v1/events").json()["events"]
    assert len(events) == 1  # retried six times, stored once
    assert events[0]["node"] == "gpu-1"
    assert events[0]["code"] == 13
    assert api.get("/api/v1/events", params={"kind": "gpu_lost"}).json() == {"events": []}

    sd = api.get("/api/v1/sd").json()
    assert sd == [{"targets": ["10.1.2.3:9847"],
                   "labels": {"node": "gpu-2", "supernode": "sn-1", "rack": "r3",
                              "job": "train"}}]


def test_limits_in_range(api: Api) -> None:
    for limit in ("1", "1000", "007"):
        assert api.get("/api/v1/actions", params={"limit": limit}).status_code == 200


@pytest.mark.parametrize("path", ["/api/v1/incidents", "/api/v1/actions", "/api/v1/events"])
@pytest.mark.parametrize("limit", ["0", "1001", "-1", "ten", "1.5", "", " 5",
                                   "\u00b2", "\u0661\u0660", "99999999999999999999999"])
def test_limit_is_validated(api: Api, path: str, limit: str) -> None:
    response = api.get(path, params={"limit": limit})
    assert response.status_code == 422, response.text
    assert "limit" in response.json()["error"]


def test_an_incident_older_than_the_newest_thousand_actions_shows_its_actions(api: Api
                                                                              ) -> None:
    """Its actions are asked for by its id, not picked from the newest 1,000 of all."""
    api.report("gpu-1", gpus=[{"index": 0, "temperature_celsius": 90}])
    api.h.clock.advance(6)
    api.report("gpu-1", gpus=[{"index": 0, "temperature_celsius": 90}])
    api.h.settle()
    (incident,) = api.get("/api/v1/incidents", params={"status": "open"}).json()["incidents"]
    mine = {a["action"] for a in api.get(f"/api/v1/incidents/{incident['id']}").json()[
        "actions"]}
    assert mine == {"throttle", "alert"}
    later = api.h.clock.time() + 1
    for n in range(1001):
        api.h.store.record_action(ActionRequest(
            id=f"later-{n}", key=f"later-{n}", action="alert", node="gpu-2", reason="later",
            incident_id=None, created_seconds=later + n))
    assert len(api.get("/api/v1/actions", params={"limit": 1000}).json()["actions"]) == 1000
    shown = api.get(f"/api/v1/incidents/{incident['id']}").json()["actions"]
    assert {a["action"] for a in shown} == mine
    assert {a["incident_id"] for a in shown} == {incident["id"]}


def test_incident_status_is_validated(api: Api) -> None:
    response = api.get("/api/v1/incidents", params={"status": "maybe"})
    assert response.status_code == 422


@pytest.mark.parametrize("path", [
    "/api/v1/nodes/nobody", "/api/v1/incidents/12345", "/api/v1/incidents/abc",
    "/api/v1/incidents/-1", "/api/v1/incidents/\u00b2", "/api/v1/incidents/99999999999999999999",
    "/api/v1/incidents/9223372036854775808", "/api/v1/incidents/\u0661",
])
def test_unknown_things_are_404(api: Api, path: str) -> None:
    response = api.get(path)
    assert response.status_code == 404, response.text
    assert "error" in response.json()


# --------------------------------------------------------------------------- service


def test_healthz(api: Api) -> None:
    response = api.client.get("/healthz")  # no token: load balancers ask it
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "nodes": 0,
                               "breaker": {"open": False, "reason": ""}, "store": "ok"}


def test_healthz_503_when_the_store_is_read_only(tmp_path: Path) -> None:
    path = tmp_path / "controller.db"
    Store(path).close()
    client, h = make_api(tmp_path, store=Store(f"file:{path}?mode=ro"))
    try:
        with client.client:
            assert client.report("gpu-1", temps=[99]).status_code == 200
            response = client.client.get("/healthz")
            assert response.status_code == 503
            assert response.json()["status"] == "refusing to act"
            cordon = client.post("/api/v1/nodes/gpu-1/cordon")
            assert cordon.status_code == 503
            assert "refusing to act" in cordon.json()["error"]
            h.settle()
            assert not client.log.exists()
    finally:
        h.controller.close()
        h.store.close()


def test_metrics(api: Api) -> None:
    api.report("gpu-1", temps=[50], events=[xid(0, 13, 1.0)])
    api.report("gpu-1", temps=["hot"])  # type: ignore[list-item]
    response = api.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    for family in ("sn_controller_reports_total", "sn_controller_events_total",
                   "sn_controller_ingest_seconds_bucket", "sn_detection_latency_seconds_count",
                   "sn_node_state", "sn_controller_nodes", "sn_rule_firing",
                   "sn_incidents_open", "sn_actions", "sn_breaker_open",
                   "sn_controller_store_up", "sn_controller_info"):
        assert f"# TYPE {family.removesuffix('_bucket').removesuffix('_count')}" in text \
            or family in text, family
    assert 'sn_controller_reports_total{outcome="accepted"} 1.0' in text
    assert 'sn_controller_reports_total{outcome="invalid"} 1.0' in text
    assert 'sn_controller_events_total{kind="xid"} 1.0' in text
    assert 'sn_node_state{node="gpu-1",state="healthy"} 1.0' in text
    assert_promtool_clean(text)


def test_node_states_written_by_hand_read_as_prometheus_client_writes_them() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.parser import text_string_to_metric_families

    from sn_monitor.controller.telemetry.metrics import node_state_exposition

    states = {"gpu-2": "cordoned", "gpu-1": "healthy", 'odd"\\\nname': "lost"}

    class Reference:
        def collect(self) -> Any:
            family = GaugeMetricFamily("sn_node_state", "1 for each node's current state.",
                                       labels=["node", "state"])
            for node, state in sorted(states.items()):
                family.add_metric([node, state], 1.0)
            yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Reference())  # type: ignore[arg-type]
    expected = generate_latest(registry)
    ours = node_state_exposition(states)
    assert ours == expected
    (family,) = text_string_to_metric_families(ours.decode())
    assert {s.labels["node"]: s.labels["state"] for s in family.samples} == states
    assert_promtool_clean(ours.decode())


# --------------------------------------------------------------------------- OpenAPI


def test_openapi_is_valid_3_1(api: Api) -> None:
    response = api.client.get("/openapi.json")
    assert response.status_code == 200
    doc = response.json()
    assert doc == msgspec.json.decode(msgspec.json.encode(openapi_document()))
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["title"]
    assert doc["info"]["version"]
    schemas = doc["components"]["schemas"]
    assert {"Report", "ReportReply", "GpuReport", "EventRecord", "Command"} <= set(schemas)
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)
        assert name
    # every $ref points at a schema that is there
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    for ref in refs:
        assert ref.startswith("#/components/schemas/")
        assert ref.rsplit("/", 1)[1] in schemas, ref
    # a real report validates against the published Report schema
    validator = Draft202012Validator({"$ref": "#/components/schemas/Report",
                                      "components": {"schemas": schemas}})
    good = msgspec.json.decode(report_body("gpu-1", temps=[50], events=[xid(0, 79, 1.0)]))
    validator.validate(good)
    assert not validator.is_valid({**good, "sequence": -1})
    for path_item in doc["paths"].values():
        for operation in path_item.values():
            assert operation["responses"], operation
            for parameter in operation.get("parameters", []):
                Draft202012Validator.check_schema(parameter["schema"])
    # every security requirement names a declared scheme; reports take either kind
    schemes = doc["components"]["securitySchemes"]
    assert schemes["mutualTLS"]["type"] == "mutualTLS"
    for path_item in doc["paths"].values():
        for operation in path_item.values():
            for requirement in operation.get("security", doc["security"]):
                assert set(requirement) <= set(schemes), requirement
    assert doc["paths"]["/api/v1/reports"]["post"]["security"] == [
        {"bearer": []}, {"mutualTLS": []}]


def test_openapi_documents_every_route(api: Api) -> None:
    doc = openapi_document()
    app = api.client.app
    routes = [r for r in app.routes if isinstance(r, Route)]  # type: ignore[attr-defined]
    assert routes
    for route in routes:
        assert route.path in doc["paths"], route.path
        for method in route.methods or ():
            if method == "HEAD":
                continue
            assert method.lower() in doc["paths"][route.path], (route.path, method)
    documented = {(p, m) for p, item in doc["paths"].items() for m in item}
    served = {(r.path, m.lower()) for r in routes for m in (r.methods or ()) if m != "HEAD"}
    assert documented == served


def test_a_route_needs_a_token_unless_its_document_says_none(api: Api) -> None:
    """The roles of the route table and the document's security agree, route by route."""
    names = {"{name}": "x", "{node}": "gpu-1", "{incident_id}": "1", "{action_id}": "ab12",
             "{recovery_id}": "ab12"}
    for path, item in openapi_document()["paths"].items():
        url = path
        for param, value in names.items():
            url = url.replace(param, value)
        for method, operation in item.items():
            status = api.client.request(method.upper(), url).status_code
            if operation.get("security") == []:
                assert status not in (401, 403), (method, path, status)
            else:
                assert status == 401, (method, path, status)


def test_head_answers_as_get(api: Api) -> None:
    for path in ("/api/v1/breaker", "/api/v1/jobs", "/api/v1/nodes", "/healthz"):
        head = api.client.head(path, headers=bearer(READ))
        assert (head.status_code, head.content) == (api.get(path).status_code, b""), path


def test_documented_statuses(api: Api) -> None:
    """What the API answers in these tests is what the document says it may answer."""
    paths = openapi_document()["paths"]
    api.report("gpu-1")
    seen = [
        ("/api/v1/reports", "post", api.report("gpu-1").status_code),
        ("/api/v1/reports", "post", api.report("cpu-1").status_code),
        ("/api/v1/reports", "post", api.client.post("/api/v1/reports").status_code),
        ("/api/v1/nodes", "get", api.get("/api/v1/nodes", token=AGENT).status_code),
        ("/api/v1/nodes/{name}", "get", api.get("/api/v1/nodes/x").status_code),
        ("/api/v1/nodes/{name}/cordon", "post",
         api.post("/api/v1/nodes/gpu-1/cordon", content=b"{").status_code),
        ("/api/v1/nodes/{name}/cordon", "post",
         api.post("/api/v1/nodes/gpu-1/cordon", json={"reason": 1}).status_code),
        ("/api/v1/incidents", "get", api.get("/api/v1/incidents?limit=0").status_code),
        ("/api/v1/actions", "get", api.get("/api/v1/actions?limit=0").status_code),
        ("/api/v1/events", "get", api.get("/api/v1/events?limit=0").status_code),
        ("/api/v1/sd", "get", api.get("/api/v1/sd", token=AGENT).status_code),
        ("/api/v1/incidents/{incident_id}", "get",
         api.get("/api/v1/incidents/1", token="unknown-token-xxxxxxxx").status_code),
    ]
    for path, method, status in seen:
        assert str(status) in paths[path][method]["responses"], (path, method, status)


def test_no_tokens_means_open_access(tmp_path: Path) -> None:
    h = make_harness(tmp_path, rules_from(HOT_RULE))
    try:
        with TestClient(build_app(h.controller, None), headers=JSON) as client:
            body = report_body("anything", temps=[50])
            assert client.post("/api/v1/reports", content=body).status_code == 200
            assert client.get("/api/v1/nodes").json()["nodes"][0]["name"] == "anything"
    finally:
        h.controller.close()
        h.store.close()


def test_errors_are_json_objects_without_tracebacks(api: Api) -> None:
    # error bodies are JSON objects with one string, never a traceback
    response = api.client.post("/api/v1/reports", content=b"\xff\xfe", headers=bearer(AGENT))
    assert response.status_code == 400
    assert list(response.json()) == ["error"]
    assert os.sep + "sn_monitor" not in response.text
