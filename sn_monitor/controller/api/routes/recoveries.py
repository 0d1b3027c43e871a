"""Job recoveries (a listing, approving a manual one) and the nodes' remediation ladders."""

from __future__ import annotations

from starlette.responses import Response

from sn_monitor.controller.api.answers import json_off_loop
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import (
    ANY_JSON,
    ERROR,
    HEX_ID,
    LIMIT,
    LISTING,
    path_param,
    query_param,
)
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation


async def recoveries(call: Call) -> Response:
    call.only_query("job", "limit")
    job, limit = call.query("job"), call.limit()
    return await json_off_loop(
        lambda: {"recoveries": call.controller.list_recoveries(job, limit)})


async def approve_recovery(call: Call) -> Response:
    recovery = call.path("recovery_id")
    return await json_off_loop(lambda: call.controller.approve_recovery(recovery, call.who))


async def repairs(call: Call) -> Response:
    call.only_query("node", "limit")
    node, limit = call.query("node"), call.limit()
    return await json_off_loop(lambda: {"repairs": call.controller.list_repairs(node, limit)})


ENDPOINTS = (
    Endpoint("GET", "/api/v1/recoveries", "read", recoveries, Operation(
        "Job recoveries, newest first", {"200": ANY_JSON, "422": ERROR},
        parameters=[query_param("job"), LIMIT])),
    Endpoint("POST", "/api/v1/recoveries/{recovery_id}/approve", "operate", approve_recovery,
             Operation("Approve a manual recovery", {"200": ANY_JSON, "404": ERROR,
                                                     "409": ERROR},
                       parameters=[path_param("recovery_id", HEX_ID)])),
    Endpoint("GET", "/api/v1/remediation", "read", repairs, Operation(
        "Remediation ladders (reset, reboot, replace; each verified), newest first",
        {"200": ANY_JSON, "422": ERROR}, parameters=LISTING)),
)
