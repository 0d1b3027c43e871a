"""The circuit breaker on evictions: its state, and opening or closing it by hand."""

from __future__ import annotations

from typing import Annotated

import msgspec
from starlette.responses import Response

from sn_monitor.controller.api.answers import json_off_loop
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import ANY_JSON, BODY_ERRORS, ERROR, json_body
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation
from sn_monitor.controller.errors import Invalid, Malformed


class BreakerChange(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``POST /api/v1/breaker``: close it (evictions go on) or open it (they freeze)."""

    open: bool
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=500)]


async def breaker(call: Call) -> Response:
    return await json_off_loop(call.controller.breaker_state)


async def set_breaker(call: Call) -> Response:
    body = await call.body()
    try:
        doc = msgspec.json.decode(body, type=BreakerChange)
    except msgspec.ValidationError as err:
        raise Invalid(f"invalid body: {err}") from None
    except msgspec.DecodeError as err:
        raise Malformed(f"malformed JSON: {err}") from None
    return await json_off_loop(lambda: call.controller.set_breaker(doc.open, call.who,
                                                                   doc.reason))


ENDPOINTS = (
    Endpoint("GET", "/api/v1/breaker", "read", breaker, Operation(
        "The circuit breaker: open or closed, why, since and until when, the nodes it "
        "counted", {"200": ANY_JSON})),
    Endpoint("POST", "/api/v1/breaker", "operate", set_breaker, Operation(
        "Close the breaker by hand (evictions go on) or open it (they freeze for its "
        "hold); audited (operate role)",
        {"200": ANY_JSON, **BODY_ERRORS, "503": ERROR},
        request_body=json_body("BreakerChange"))),
)
