"""The fleet as others read it: the topology graph, and Prometheus service discovery."""

from __future__ import annotations

from typing import Any, Final

from starlette.responses import Response

from sn_monitor.controller.api.answers import edition_answer, json_off_loop, off_loop
from sn_monitor.controller.api.body_headers import whole_number
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import ERROR, query_param
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation
from sn_monitor.controller.errors import Invalid
from sn_monitor.controller.fabric.view import FabricScope


async def topology(call: Call) -> Response:
    call.only_query("job", "supernode", "rack")
    job, headers = call.query("job"), call.request.headers
    supernode, rack = call.query("supernode"), call.query("rack")
    scope = None if supernode is None and rack is None else FabricScope(supernode, rack)
    return await off_loop(lambda: edition_answer(headers, call.controller.topology(job, scope)))


async def topology_overview(call: Call) -> Response:
    call.only_query("job", "since")
    job, since, headers = call.query("job"), call.query("since"), call.request.headers
    version = whole_number(since) if since is not None else None
    if since is not None and version is None:
        raise Invalid("since must be a version the overview answered: a whole number")
    return await off_loop(lambda: edition_answer(
        headers, call.controller.topology_overview(job, version)))


async def service_discovery(call: Call) -> Response:
    return await json_off_loop(call.controller.service_discovery)


#: What a cached topology answer may be: whole, or not modified since the tag the
#: request names (``If-None-Match``); gzip when ``Accept-Encoding`` takes it.
_CACHED: Final[dict[str, Any]] = {"304": {
    "description": "not modified: the tag in If-None-Match is still the answer's; no body",
    "headers": {"ETag": {"schema": {"type": "string"}}}}}
_ENTITY: Final[dict[str, Any]] = {"ETag": {"schema": {"type": "string"}},
                                  "Content-Encoding": {"schema": {"enum": ["gzip"]}}}
_OVERVIEW_ROW: Final[dict[str, Any]] = {
    "type": "array", "minItems": 8, "maxItems": 8,
    "description": "[name, supernode, rack, health, state, gpus, rails, job]: gpus and "
                   "rails one letter each (o ok, d degraded, f failed, u unknown); job "
                   "the node's first job, or null",
    "items": {"type": ["string", "null"]}}
_OVERVIEW: Final[dict[str, Any]] = {
    "description": "the overview, whole (full) or the rows changed since a version",
    "headers": _ENTITY,
    "content": {"application/json": {"schema": {"type": "object", "properties": {
        "version": {"type": "integer"}, "full": {"type": "boolean"},
        "since": {"type": ["integer", "null"]}, "job": {"type": ["string", "null"]},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "rails": {"type": "object", "additionalProperties": {"type": "string"}},
        "nodes": {"type": "array", "items": _OVERVIEW_ROW},
        "removed": {"type": "array", "items": {"type": "string"}},
        "fail_slow": {"type": "array", "items": {"type": "object"},
                      "description": "the standing fail-slow bottlenecks, as the "
                                     "document's fail_slow"}},
        "required": ["version", "full", "counts", "rails", "nodes", "removed"]}}}}

ENDPOINTS = (
    Endpoint("GET", "/api/v1/topology", "read", topology, Operation(
        "The fleet graph: supernodes, racks, nodes (GPUs, NICs, NVLink peers, PCIe "
        "affinity), rails, live link rates and health, jobs and fail-slow bottlenecks. "
        "Built at most once a second (longer at thousands of nodes) for every reader; "
        "ETag / If-None-Match, gzip when asked. supernode= and rack= narrow it to those "
        "nodes (a rack's wiring without the fleet's; an unlabelled node's label is empty)",
        {"200": {"description": "the fleet graph", "headers": _ENTITY,
                 "content": {"application/json": {"schema": {"type": "object"}}}},
         **_CACHED, "422": ERROR},
        parameters=[query_param("job"), query_param("supernode"), query_param("rack")])),
    Endpoint("GET", "/api/v1/topology/overview", "read", topology_overview, Operation(
        "The fleet at a glance: one row per node (health, state, a letter per GPU and "
        "per rail, its job), the nodes counted by health, each rail's health; with "
        "since=VERSION only the rows changed since (full: false), or the whole when "
        "that version is no longer kept (full: true). Under 1 MB at 8,192 nodes; "
        "ETag (the version) / If-None-Match, gzip when asked",
        {"200": _OVERVIEW, **_CACHED, "422": ERROR},
        parameters=[query_param("job"),
                    query_param("since", {"type": "integer", "minimum": 0})])),
    Endpoint("GET", "/api/v1/sd", "read", service_discovery, Operation(
        "Prometheus HTTP service discovery of every agent",
        {"200": {"description": "targets", "content": {
            "application/json": {"schema": {"type": "array"}}}}})),
)
