"""The rule of api/answers.py for where a handler's work runs, checked on every route.

A recording controller answers every call and notes whether it was made on the event
loop (an asyncio loop running in the calling thread), and so does the app's JSON encoder
(msgspec's, watched). The reports and the probes run on the loop; every other route's
controller call, and the encoding of its answer, runs in the thread pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from sn_monitor.controller.api import answers
from sn_monitor.controller.api.app import build_app
from sn_monitor.controller.errors import Unavailable
from sn_monitor.controller.service.topology_desk import Edition
from sn_monitor.model import ReportReply

#: The routes whose controller call runs on the loop (memory only, microseconds).
ON_LOOP = {("POST", "/api/v1/reports"), ("GET", "/healthz"), ("GET", "/readyz")}
#: The routes whose answer is encoded on the loop (small, and not the fleet's size).
ENCODED_ON_LOOP = ON_LOOP | {("GET", "/livez")}

JSON = {"Content-Type": "application/json"}


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class RecordingController:
    """Every ControllerApi method: notes (name, on the loop?) and answers something."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        answers: dict[str, Any] = {
            "ingest": ReportReply(sequence=1), "health": (True, {"status": "ok"}),
            "metrics": b"", "delete_job": None, "restore_point": {"step": 1},
            "topology": Edition('"1"', b"{}"), "topology_overview": Edition('"1"', b"{}"),
        }

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, _on_loop()))
            if name.startswith("list_") or name == "service_discovery":
                return []
            return answers.get(name, {"name": "x"})
        return call


def _request(route: Route, method: str) -> tuple[str, dict[str, Any]]:
    path = route.path
    for param, value in (("{name}", "x"), ("{node}", "n1"), ("{incident_id}", "1"),
                         ("{action_id}", "ab12"), ("{recovery_id}", "ab12")):
        path = path.replace(param, value)
    body = {"open": True, "reason": "test"} if path == "/api/v1/breaker" else {}
    if path == "/api/v1/alertmanager":
        body = {"version": "4", "status": "firing", "alerts": [], "receiver": "r",
                "groupKey": "g", "groupLabels": {}, "commonLabels": {},
                "commonAnnotations": {}, "externalURL": "http://am", "truncatedAlerts": 0}
    if path == "/api/v1/jobs" and method == "POST":
        body = {"apiVersion": "sn-monitor/v1", "kind": "DistributedJob"}
    kwargs: dict[str, Any] = {}
    if method == "POST":
        kwargs = {"content": msgspec.json.encode(body), "headers": JSON}
    return path, kwargs


def _routes(client: TestClient) -> Iterator[tuple[str, Route]]:
    for route in client.app.router.routes:  # type: ignore[attr-defined]
        assert isinstance(route, Route)
        for method in sorted(route.methods or ()):
            if method != "HEAD":
                yield method, route


class WatchedEncoder:
    """msgspec's JSON encoder, noting whether each encoding ran on the loop."""

    def __init__(self) -> None:
        self.encoder = msgspec.json.Encoder()
        self.on_loop: list[bool] = []

    def encode(self, obj: Any) -> bytes:
        self.on_loop.append(_on_loop())
        return self.encoder.encode(obj)


@pytest.fixture
def client_and_controller() -> Iterator[tuple[TestClient, RecordingController]]:
    controller = RecordingController()
    with TestClient(build_app(controller, None)) as client:  # type: ignore[arg-type]
        yield client, controller


def test_every_route_follows_the_rule(
        client_and_controller: tuple[TestClient, RecordingController],
        monkeypatch: pytest.MonkeyPatch) -> None:
    client, controller = client_and_controller
    encoder = WatchedEncoder()
    monkeypatch.setattr(answers, "_encoder", encoder)
    checked = encoded = 0
    for method, route in _routes(client):
        controller.calls.clear()
        encoder.on_loop.clear()
        path, kwargs = _request(route, method)
        answer = client.request(method, path, **kwargs)
        assert answer.status_code < 400, (method, path, answer.text)
        on_loop = (method, route.path) in ON_LOOP
        for name, called_on_loop in controller.calls:
            assert called_on_loop == on_loop, (
                f"{method} {route.path}: controller.{name} ran "
                f"{'on the event loop' if called_on_loop else 'in the pool'}")
        if (method, route.path) not in ENCODED_ON_LOOP:
            assert not any(encoder.on_loop), f"{method} {route.path}: encoded on the loop"
        checked += bool(controller.calls)
        encoded += bool(encoder.on_loop) and not any(encoder.on_loop)
    assert checked >= 20  # every route that calls the controller was exercised
    assert encoded >= 20  # and its answer was encoded in the pool


def test_a_refusal_from_the_pool_keeps_its_status() -> None:
    class Nothing(RecordingController):
        def __getattr__(self, name: str) -> Callable[..., Any]:
            return lambda *args, **kwargs: None  # nothing found, whatever was asked

    with TestClient(build_app(Nothing(), None)) as client:  # type: ignore[arg-type]
        for path, error in (("/api/v1/nodes/n1", "no node 'n1'"),
                            ("/api/v1/incidents/7", "no incident '7'"),
                            ("/api/v1/jobs/x", "no job 'x'"),
                            ("/api/v1/jobs/x/restore-point", "no complete checkpoint yet")):
            answer = client.get(path)
            assert (answer.status_code, answer.json()) == (404, {"error": error}), path


def test_unavailable_says_when_to_ask_again() -> None:
    class Refusing(RecordingController):
        def __getattr__(self, name: str) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                raise Unavailable("store unavailable, refusing to act: disk full", 4.6)
            return call

    with TestClient(build_app(Refusing(), None)) as client:  # type: ignore[arg-type]
        answer = client.post("/api/v1/nodes/n1/cordon", content=b"", headers=JSON)
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "5"
    assert answer.json() == {"error": "store unavailable, refusing to act: disk full"}
