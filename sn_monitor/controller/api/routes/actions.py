"""The audit trail of actions, and approving an action that waits for approval."""

from __future__ import annotations

from starlette.responses import Response

from sn_monitor.controller.api.answers import json_off_loop
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import (
    ANY_JSON,
    ERROR,
    HEX_ID,
    LISTING,
    path_param,
    query_param,
)
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation


async def actions(call: Call) -> Response:
    call.only_query("node", "state", "limit")
    node, state, limit = call.query("node"), call.query("state"), call.limit()
    return await json_off_loop(
        lambda: {"actions": call.controller.list_actions(node, state, limit)})


async def approve(call: Call) -> Response:
    action = call.path("action_id")
    return await json_off_loop(lambda: call.controller.approve(action, call.who))


ENDPOINTS = (
    Endpoint("GET", "/api/v1/actions", "read", actions, Operation(
        "The audit trail of actions", {"200": ANY_JSON, "422": ERROR},
        parameters=[*LISTING, query_param("state")])),
    Endpoint("POST", "/api/v1/actions/{action_id}/approve", "operate", approve, Operation(
        "Approve an action waiting for approval",
        {"200": ANY_JSON, "404": ERROR, "409": ERROR},
        parameters=[path_param("action_id", HEX_ID)])),
)
