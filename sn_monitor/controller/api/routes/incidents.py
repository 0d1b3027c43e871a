"""Incidents (a listing and one with its actions) and the events agents reported."""

from __future__ import annotations

from starlette.responses import Response

from sn_monitor.controller.api.answers import found, json_off_loop
from sn_monitor.controller.api.body_headers import whole_number
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import (
    ANY_JSON,
    ERROR,
    LISTING,
    path_param,
    query_param,
)
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation
from sn_monitor.controller.errors import Invalid, NotFound

#: The largest id SQLite stores; a bigger one in a path names nothing.
_MAX_ID = 2**63 - 1


async def incidents(call: Call) -> Response:
    call.only_query("status", "node", "limit")
    status = call.query("status")
    if status not in (None, "open", "closed"):
        raise Invalid("status must be open or closed")
    node, limit = call.query("node"), call.limit()
    return await json_off_loop(
        lambda: {"incidents": call.controller.list_incidents(status, node, limit)})


async def incident(call: Call) -> Response:
    raw = call.path("incident_id")
    number = whole_number(raw)
    if number is None or number > _MAX_ID:
        raise NotFound(f"no incident {raw!r}")
    return await json_off_loop(lambda: found(call.controller.get_incident(number),
                                             f"no incident {raw!r}"))


async def events(call: Call) -> Response:
    call.only_query("node", "kind", "limit")
    node, kind, limit = call.query("node"), call.query("kind"), call.limit()
    return await json_off_loop(
        lambda: {"events": call.controller.list_events(node, kind, limit)})


ENDPOINTS = (
    Endpoint("GET", "/api/v1/incidents", "read", incidents, Operation(
        "Incidents", {"200": ANY_JSON, "422": ERROR},
        parameters=[*LISTING, query_param("status", {"enum": ["open", "closed"]})])),
    Endpoint("GET", "/api/v1/incidents/{incident_id}", "read", incident, Operation(
        "One incident with its actions", {"200": ANY_JSON, "404": ERROR},
        parameters=[path_param("incident_id", {"type": "integer"})])),
    Endpoint("GET", "/api/v1/events", "read", events, Operation(
        "Events the agents reported (XIDs, GPU lost, guard)", {"200": ANY_JSON, "422": ERROR},
        parameters=[*LISTING, query_param("kind")])),
)
