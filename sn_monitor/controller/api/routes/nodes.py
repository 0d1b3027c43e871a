"""The nodes: every node, one node, and cordoning or uncordoning one by hand."""

from __future__ import annotations

import msgspec
from starlette.responses import Response

from sn_monitor.controller.api.answers import found, json_off_loop, off_loop
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import ANY_JSON, ERROR, NODE_NAME, path_param
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation
from sn_monitor.controller.errors import Invalid, Malformed, NotFound


async def nodes(call: Call) -> Response:
    return await json_off_loop(lambda: {"nodes": call.controller.list_nodes()})


async def node(call: Call) -> Response:
    name = call.path("name")
    return await json_off_loop(lambda: found(call.controller.get_node(name),
                                             f"no node {name!r}"))


async def cordon(call: Call) -> Response:
    return await _by_hand(call, "cordon")


async def uncordon(call: Call) -> Response:
    return await _by_hand(call, "uncordon")


async def _by_hand(call: Call, action: str) -> Response:
    """``action`` on the node the path names, through the safety policy (202 whatever it said)."""
    name = call.path("name")
    reason = _reason(await call.body())
    if await off_loop(call.controller.get_node, name) is None:
        raise NotFound(f"no node {name!r}")
    return await json_off_loop(
        lambda: call.controller.manual_action(action, name, call.who, reason), 202)


def _reason(body: bytes) -> str:
    """The optional ``{"reason": "..."}`` of an action by hand ("by hand" if none)."""
    reason = "by hand"
    if body:
        try:
            doc = msgspec.json.decode(body)
        except msgspec.DecodeError as err:
            raise Malformed(f"malformed JSON: {err}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("reason", ""), str):
            raise Invalid("expected {\"reason\": \"...\"}")
        reason = doc.get("reason") or reason
    return reason


_NODE = [path_param("name", NODE_NAME)]
_REASON_BODY = {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "properties": {"reason": {"type": "string"}}}}}}
# 202 whatever the policy said (the record's state tells); 503: no audit record possible
_BY_HAND = {"202": ANY_JSON, "400": ERROR, "404": ERROR, "413": ERROR, "415": ERROR,
            "422": ERROR, "503": ERROR}

ENDPOINTS = (
    Endpoint("GET", "/api/v1/nodes", "read", nodes, Operation("Every node", {"200": ANY_JSON})),
    Endpoint("GET", "/api/v1/nodes/{name}", "read", node, Operation(
        "One node", {"200": ANY_JSON, "404": ERROR}, parameters=_NODE)),
    Endpoint("POST", "/api/v1/nodes/{name}/cordon", "operate", cordon, Operation(
        "Cordon a node by hand (through the safety policy)", _BY_HAND,
        parameters=_NODE, request_body=_REASON_BODY)),
    Endpoint("POST", "/api/v1/nodes/{name}/uncordon", "operate", uncordon, Operation(
        "Uncordon a node sn-monitor cordoned", _BY_HAND,
        parameters=_NODE, request_body=_REASON_BODY)),
)
