"""Whose workloads hold the GPUs, and what each gets of them (the controller's accounting)."""

from __future__ import annotations

from starlette.responses import Response

from sn_monitor.controller.api.answers import json_off_loop
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import ANY_JSON
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation


async def workloads(call: Call) -> Response:
    return await json_off_loop(lambda: {"workloads": call.controller.list_workloads()})


ENDPOINTS = (
    Endpoint("GET", "/api/v1/workloads", "read", workloads, Operation(
        "Every workload the agents attribute GPUs to (a pod, a Slurm job, else a user): "
        "GPUs held and idle (which, since when), mean utilization, memory used, energy "
        "in joules", {"200": ANY_JSON})),
)
