"""What probes and scrapers read, without a token: readiness, liveness, metrics."""

from __future__ import annotations

from starlette.responses import Response

from sn_monitor.controller.api.answers import json_answer, off_loop
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import ANY_JSON
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation


async def ready(call: Call) -> Response:
    ok, body = call.controller.health()
    return json_answer(body, 200 if ok else 503)


async def alive(call: Call) -> Response:
    del call
    # alive (do not restart me) even when not ready: a full disk is not cured by a
    # restart, and a standby is alive without being ready (ha/standby.py)
    return json_answer({"status": "alive", "role": "active"})


async def metrics(call: Call) -> Response:
    return Response(await off_loop(call.controller.metrics),
                    media_type="text/plain; version=0.0.4; charset=utf-8")


ENDPOINTS = (
    Endpoint("GET", "/healthz", None, ready, Operation(
        "Ready to take reports and act (the same as /readyz)",
        {"200": ANY_JSON, "503": ANY_JSON})),
    Endpoint("GET", "/readyz", None, ready, Operation(
        "Ready: the active controller, its store taking writes (503 on a standby or while "
        "the store refuses writes)", {"200": ANY_JSON, "503": ANY_JSON})),
    Endpoint("GET", "/livez", None, alive, Operation(
        "Alive (a standby is alive too)", {"200": ANY_JSON})),
    Endpoint("GET", "/metrics", None, metrics, Operation(
        "Prometheus metrics", {"200": {"description": "text exposition", "content": {
            "text/plain": {"schema": {"type": "string"}}}}})),
)
