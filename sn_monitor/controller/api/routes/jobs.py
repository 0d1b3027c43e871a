"""Training jobs: add, read, remove; their ranks' progress and checkpoints; spares.

Also the point a job resumes from, and returning a repaired node to its spare pool.
"""

from __future__ import annotations

from starlette.responses import Response

from sn_monitor.controller.api.answers import found, json_off_loop, off_loop
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.docs import (
    ANY_JSON,
    BODY_ERRORS,
    ERROR,
    JOB_NAME,
    NODE_NAME,
    json_body,
    path_param,
)
from sn_monitor.controller.api.routes.endpoint import Endpoint, Operation


async def jobs(call: Call) -> Response:
    return await json_off_loop(lambda: {"jobs": call.controller.list_jobs()})


async def add_job(call: Call) -> Response:
    body = await call.body(yaml_allowed=True)
    admin = call.identity.at_least("admin")
    return await json_off_loop(lambda: call.controller.add_job(body, call.who, admin), 201)


async def job(call: Call) -> Response:
    name = call.path("name")
    return await json_off_loop(lambda: found(call.controller.get_job(name),
                                             f"no job {name!r}"))


async def delete_job(call: Call) -> Response:
    await off_loop(call.controller.delete_job, call.path("name"), call.who)
    return Response(status_code=204)


async def progress(call: Call) -> Response:
    body = await call.body()
    name = call.path("name")
    return await json_off_loop(lambda: call.controller.job_progress(name, body))


async def checkpoint(call: Call) -> Response:
    body = await call.body()
    name = call.path("name")
    return await json_off_loop(lambda: call.controller.job_checkpoint(name, body))


async def restore_point(call: Call) -> Response:
    name = call.path("name")
    return await json_off_loop(lambda: found(call.controller.restore_point(name),
                                             "no complete checkpoint yet"))


async def return_to_pool(call: Call) -> Response:
    name, node = call.path("name"), call.path("node")
    return await json_off_loop(lambda: call.controller.return_to_pool(name, node, call.who))


_JOB = [path_param("name", JOB_NAME)]

ENDPOINTS = (
    Endpoint("GET", "/api/v1/jobs", "read", jobs, Operation(
        "Every DistributedJob with its state", {"200": ANY_JSON})),
    Endpoint("POST", "/api/v1/jobs", "operate", add_job, Operation(
        "Add or replace a DistributedJob (JSON, or YAML: application/yaml, "
        "application/x-yaml or text/yaml)",
        {"201": ANY_JSON, **BODY_ERRORS, "409": ERROR},
        request_body={"required": True, "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "string"}}}})),
    Endpoint("GET", "/api/v1/jobs/{name}", "read", job, Operation(
        "One job with its recent recoveries", {"200": ANY_JSON, "404": ERROR},
        parameters=_JOB)),
    Endpoint("DELETE", "/api/v1/jobs/{name}", "operate", delete_job, Operation(
        "Stop managing a job", {"204": {"description": "removed"}, "404": ERROR},
        parameters=_JOB)),
    Endpoint("POST", "/api/v1/jobs/{name}/progress", "agent", progress, Operation(
        "A rank's progress (the training client, batched); the reply asks for "
        "checkpoints and carries restores",
        {"200": ANY_JSON, "404": ERROR, **BODY_ERRORS},
        parameters=_JOB, request_body=json_body("ProgressBody"))),
    Endpoint("POST", "/api/v1/jobs/{name}/checkpoints", "agent", checkpoint, Operation(
        "A checkpoint the job saved (verified before it counts)",
        {"200": ANY_JSON, "404": ERROR, **BODY_ERRORS},
        parameters=_JOB, request_body=json_body("CheckpointBody"))),
    Endpoint("GET", "/api/v1/jobs/{name}/restore-point", "agent", restore_point, Operation(
        "The latest complete checkpoint to resume from", {"200": ANY_JSON, "404": ERROR},
        parameters=_JOB)),
    Endpoint("POST", "/api/v1/jobs/{name}/spares/{node}", "operate", return_to_pool, Operation(
        "Return a repaired node to the job's spare pool",
        {"200": ANY_JSON, "404": ERROR, "409": ERROR},
        parameters=[*_JOB, path_param("node", NODE_NAME)])),
)
