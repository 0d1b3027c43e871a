"""What comes in: agents' reports and Alertmanager's webhook.

``POST /api/v1/reports`` is answered by the app's fast path before the router; the
route here documents it, and answers other methods on its path (405).
"""

from __future__ import annotations

import asyncio

import msgspec
from starlette.responses import Response

from sn_monitor.controller.api.answers import json_off_loop
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import BODY_ERRORS, ERROR, json_body
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation
from sn_monitor.controller.storage.writer import PendingReply

_encoder = msgspec.json.Encoder()


async def post_report(call: Call) -> Response:
    body = await call.body(shape=False)  # decode_report refuses any shape
    client = call.request.client
    reply = call.controller.ingest(body, call.identity, client.host if client else None)
    if isinstance(reply, PendingReply):
        await asyncio.wrap_future(reply.written)
        reply = reply.reply()
    return Response(_encoder.encode(reply), media_type="application/json")


async def alertmanager(call: Call) -> Response:
    body = await call.body()
    return await json_off_loop(lambda: call.controller.ingest_alerts(body, call.who))


_ALERTS_APPLIED = {"description": "applied", "content": {"application/json": {"schema": {
    "type": "object", "properties": {
        "accepted": {"type": "integer"}, "skipped": {"type": "integer"},
        "unmatched": {"type": "integer"}, "findings": {"type": "integer"},
        "by": {"type": "string"}},
    "required": ["accepted", "skipped", "unmatched", "findings", "by"]}}}}

ENDPOINTS = (
    Endpoint("POST", "/api/v1/reports", "agent", post_report, Operation(
        "An agent's report; the reply carries commands",
        {"200": {"description": "stored", "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/ReportReply"}}}},
         **BODY_ERRORS, "401": ERROR, "403": ERROR},
        request_body=json_body("Report"),
        # an agent's token, or its client certificate (tls.agent_auth says which)
        security=[{"bearer": []}, {"mutualTLS": []}])),
    Endpoint("POST", "/api/v1/alertmanager", "operate", alertmanager, Operation(
        "Alertmanager's webhook (operate role): alerts that alert rules match open and "
        "resolve incidents, acted on through the safety policy",
        {"200": _ALERTS_APPLIED, "400": ERROR, "413": ERROR, "415": ERROR},
        request_body=json_body("WebhookPayload"))),
)
