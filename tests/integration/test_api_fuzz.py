"""Schema-driven fuzzing of the controller's HTTP API, from its own OpenAPI document.

schemathesis reads ``openapi_document()`` and generates requests for every operation:
invalid ones (negative mode: each breaks the document somewhere, in the body, a
parameter or a type) and valid ones (positive mode). They go over a real socket to a real
uvicorn serving the real app (the reports' lane included) around a real controller (the
harness of test_controller_service, with fake outside systems and a command driver that
writes down what it is asked), with the tokens of every role, none, or a wrong one.

Every answer must be documented (status code, content type, body schema), no answer may
be a 5xx, and each request has ``REQUEST_TIMEOUT`` seconds (a hang fails the test). After
the invalid requests, nothing was done: no incident, no action recorded (the audit
records of refused API calls aside), no driver called. The valid requests run with the
policy in dry-run: whatever they trigger, no outside system is touched.

The budget is ``SN_FUZZ_EXAMPLES`` examples per operation and mode (default small, for
``make test``); ``make fuzz`` runs it with a large one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from sn_monitor.controller.actions.drivers.command import CommandSettings
from sn_monitor.controller.actions.policy import PolicySettings
from sn_monitor.controller.api.app import build_app
from sn_monitor.controller.api.openapi import openapi_document
from sn_monitor.controller.jobs.spec import job_from_json
from sn_monitor.controller.security.auth import TokenBook
from sn_monitor.controller.settings import DriverSettings
from tests.support.api import (
    ADMIN,
    AGENT,
    OPERATE,
    READ,
    cordon_script,
    write_tokens,
)
from tests.support.harness import Harness, make_harness, report_body, rules_from
from tests.support.tls import Server

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("SN_FUZZ_EXAMPLES", "40"))
REQUEST_TIMEOUT = 10.0
MAX_BODY = 64 * 1024

# Rules that act at once on a valid report (no ``for``, no settle): if invalid data got
# through, it would show as an incident and an action.
RULES = """
- name: hot
  metric: gpu_temperature_celsius
  above: 85
  severity: critical
  actions: [throttle, alert, cordon]
- name: any-xid
  event: xid
  severity: critical
  actions: [alert, evict]
- name: node-lost
  heartbeat_timeout: 10s
  actions: [alert, failover]
- name: prometheus-bad
  alert: {alertname: SnBad}
  actions: [alert, cordon]
"""

JOB = {
    "apiVersion": "sn-monitor/v1", "kind": "DistributedJob", "metadata": {"name": "seeded"},
    "spec": {"replicas": 2, "nodes": ["gpu-1", "gpu-2"], "checkpoint": {"dir": "/ckpt"},
             "control": {"command": ["/bin/true"]}},
}

#: Who sends each request: every role, no token, and a token nobody issued. The
#: strongest roles come more often, so that most requests get past authentication.
TOKENS = st.sampled_from([ADMIN, ADMIN, OPERATE, OPERATE, READ, AGENT, None,
                          "not-a-token-anyone-issued"])

OPERATIONS = sorted(f"{method.upper()} {path}"
                    for path, item in openapi_document()["paths"].items() for method in item)
#: Those with something to break (a parameter or a body): the others have no invalid input.
WITH_INPUT = sorted(f"{method.upper()} {path}"
                    for path, item in openapi_document()["paths"].items()
                    for method, operation in item.items()
                    if operation.get("parameters") or operation.get("requestBody"))

CONFIG = schemathesis.Config.from_dict({
    # The token is ours to choose (TOKENS): schemathesis leaves Authorization alone.
    "generation": {"with-security-parameters": False},
    # What refusing invalid data may look like here: 413 is a body over the limit.
    "checks": {"negative_data_rejection": {
        "expected-statuses": [400, 401, 403, 404, 405, 409, 413, 422]}},
})

CHECKS = {
    GenerationMode.NEGATIVE: [not_a_server_error, status_code_conformance,
                              content_type_conformance, response_schema_conformance,
                              negative_data_rejection],
    GenerationMode.POSITIVE: [not_a_server_error, status_code_conformance,
                              content_type_conformance, response_schema_conformance],
}


@dataclass
class Served:
    """The controller behind a real server, and what its outside systems were asked."""

    harness: Harness
    server: Server
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def get(self, path: str) -> Any:
        response = requests.get(self.url + path, headers={"Authorization": f"Bearer {READ}"},
                                timeout=REQUEST_TIMEOUT)
        assert response.status_code == 200, response.text
        return response.json()

    def acted(self) -> list[str]:
        """What was done or recorded as done: nothing, after invalid data."""
        h = self.harness
        h.settle()
        done = [f"{name}: {len(fake.calls)} calls" for name, fake in h.fakes.items()
                if fake.calls]
        if self.log.exists():
            done.append(f"command driver: {self.log.read_text()!r}")
        done += [f"action {a['action']} ({a['state']}) by {a['requested_by']}"
                 for a in self.get("/api/v1/actions?limit=1000")["actions"]
                 if a["params"].get("status") != "api"]  # audit records of API calls
        done += [f"incident {i['rule']} on {i['node']}"
                 for i in self.get("/api/v1/incidents?limit=1000")["incidents"]]
        return done


def _serve(tmp: Path, dry_run: bool) -> Iterator[Served]:
    script, log = cordon_script(tmp)
    h = make_harness(tmp, rules_from(RULES), policy=PolicySettings(dry_run=dry_run),
                     drivers=DriverSettings(command=CommandSettings(program=[str(script)])),
                     fake=("alert", "evict", "failover", "checkpoint", "restore"))
    # Something to find: a node that reports, and a job.
    h.report("gpu-1", temps=[40.0], metrics_port=9847)
    h.controller.jobs.add_job(job_from_json(msgspec.json.encode(JOB)), "seed")
    app = build_app(h.controller, TokenBook.load(write_tokens(tmp)), MAX_BODY)
    server = Server(app)
    try:
        yield Served(h, server, log)
    finally:
        server.stop()
        h.controller.close()
        h.store.close()


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The controller for invalid data: acting for real, so that any action would show."""
    yield from _serve(tmp_path_factory.mktemp("refusing"), dry_run=False)


@pytest.fixture(scope="module")
def dry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The controller for valid data: in dry-run."""
    yield from _serve(tmp_path_factory.mktemp("dry"), dry_run=True)


def _fuzz(served: Served, label: str, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_dict(openapi_document(), config=CONFIG)
    method, path = label.split(" ", 1)
    operation = schema[path][method.lower()]
    checks = CHECKS[mode]

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode), token=TOKENS)
    def fuzz(case: Any, token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        response = case.call(base_url=served.url, headers=headers, timeout=REQUEST_TIMEOUT)
        case.validate_response(response, checks=checks)

    fuzz()


@pytest.mark.parametrize("label", WITH_INPUT)
def test_invalid_requests_are_refused_as_documented_and_change_nothing(
        refusing: Served, label: str) -> None:
    _fuzz(refusing, label, GenerationMode.NEGATIVE)
    assert refusing.acted() == [], label


@pytest.mark.parametrize("label", OPERATIONS)
def test_valid_requests_are_answered_as_documented(dry: Served, label: str) -> None:
    _fuzz(dry, label, GenerationMode.POSITIVE)
    h = dry.harness
    h.settle()
    touched = [name for name, fake in h.fakes.items() if name != "alert" and fake.calls]
    assert touched == [], label  # dry-run: nothing disruptive ran
    assert not dry.log.exists()


def test_the_documents_operations_are_all_fuzzed() -> None:
    assert len(OPERATIONS) >= 20
    assert "POST /api/v1/reports" in OPERATIONS
    assert set(WITH_INPUT) < set(OPERATIONS)


def test_valid_data_would_be_acted_on(tmp_path: Path) -> None:
    """The "nothing was done" above means something: this controller acts on a fault."""
    serving = _serve(tmp_path, dry_run=False)
    served = next(serving)
    try:
        body = report_body("gpu-1", sequence=2, temps=[95.0],
                           sample_time=served.harness.clock.time())
        response = requests.post(served.url + "/api/v1/reports", data=body, timeout=10,
                                 headers={"Authorization": f"Bearer {AGENT}",
                                          "Content-Type": "application/json"})
        assert response.status_code == 200
        assert "incident hot on gpu-1" in served.acted()
    finally:
        serving.close()
