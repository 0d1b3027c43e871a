"""The fleet as others read it: the topology graph, and Prometheus service discovery."""

from __future__ import annotations

from starlette.responses import Response

from sn_monitor.controller.api.answers import json_off_loop
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import ANY_JSON, ERROR, query_param
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation


async def topology(call: Call) -> Response:
    call.only_query("job")
    job = call.query("job")
    return await json_off_loop(lambda: call.controller.topology(job))


async def service_discovery(call: Call) -> Response:
    return await json_off_loop(call.controller.service_discovery)


ENDPOINTS = (
    Endpoint("GET", "/api/v1/topology", "read", topology, Operation(
        "The fleet graph: supernodes, racks, nodes (GPUs, NICs, NVLink peers, PCIe "
        "affinity), rails, live link rates and health, jobs and fail-slow bottlenecks",
        {"200": ANY_JSON, "422": ERROR}, parameters=[query_param("job")])),
    Endpoint("GET", "/api/v1/sd", "read", service_discovery, Operation(
        "Prometheus HTTP service discovery of every agent",
        {"200": {"description": "targets", "content": {
            "application/json": {"schema": {"type": "array"}}}}})),
)
