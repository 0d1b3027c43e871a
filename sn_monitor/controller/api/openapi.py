"""The OpenAPI 3.1 document of the v1 API, made from the route table, and its route.

Each :class:`~sn_monitor.controller.api.routes.endpoint.Endpoint` documents itself
(summary, parameters, body, answers); its access adds the rest: a public route needs no
token, and every other one answers 401 (no or unknown token) and 403 (its role). The
report schemas come from the wire types themselves.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import msgspec
from starlette.responses import JSONResponse, Response

from sn_monitor import __version__
from sn_monitor.controller.api.routes import ENDPOINTS
from sn_monitor.controller.api.routes.breaker import BreakerChange
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import ANY_JSON, ERROR
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation
from sn_monitor.model import CheckpointBody, ProgressBody, Report, ReportReply
from sn_monitor.rules.alerts import webhook_schema_types


async def openapi(call: Call) -> Response:
    del call
    return JSONResponse(openapi_document())


#: ``GET /openapi.json``: this document.
OPENAPI_ENDPOINT = Endpoint("GET", "/openapi.json", None, openapi,
                            Operation("This document", {"200": ANY_JSON}))

#: Every route the router serves, this document's among them.
SERVED: tuple[Endpoint, ...] = (*ENDPOINTS, OPENAPI_ENDPOINT)


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1 for the v1 API; the report schemas come from the wire types themselves."""
    _, components = msgspec.json.schema_components([Report, ReportReply, ProgressBody,
                                                    CheckpointBody, BreakerChange,
                                                    *webhook_schema_types()],
                                                   ref_template="#/components/schemas/{name}")
    return {
        "openapi": "3.1.0",
        "info": {"title": "sn-monitor controller", "version": __version__},
        "paths": paths(SERVED),
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "mutualTLS": {"type": "mutualTLS", "description": (
                    "A client certificate from tls.client_ca_file; its one DNS name (else "
                    "its CN) is the only node it may report for")},
            },
        },
        "security": [{"bearer": []}],
    }


def paths(endpoints: Iterable[Endpoint]) -> dict[str, Any]:
    """The document's ``paths``: each endpoint's operation under its path and method.

    A copy throughout: the caller may change it without changing the routes' docs.
    """
    items: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        items.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation(endpoint)
    return copy.deepcopy(items)


def operation(endpoint: Endpoint) -> dict[str, Any]:
    """An endpoint's OpenAPI operation: its doc and what its access adds."""
    doc = endpoint.doc
    found: dict[str, Any] = {"summary": doc.summary, "responses": dict(doc.responses)}
    if endpoint.role is None:  # no token needed: probes and scrapers
        found["security"] = []
    else:  # every authenticated route answers 401 (no or unknown token) and 403 (role)
        found["responses"].update({"401": ERROR, "403": ERROR})
    for key, value in (("parameters", doc.parameters), ("requestBody", doc.request_body),
                       ("security", doc.security)):
        if value is not None:
            found[key] = value
    return found
