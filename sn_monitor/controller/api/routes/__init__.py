"""The API's routes by resource, each module a few handlers and its part of the table.

:data:`ENDPOINTS` is the route table (but ``/openapi.json``, which
:mod:`sn_monitor.controller.api.openapi` serves from this table). A handler takes a
:class:`~.call.Call` (the request, the caller, the controller) once the router has
checked the caller's role, and answers per :mod:`sn_monitor.controller.api.answers`.
May import the rest of ``api`` but ``app``, ``openapi`` and ``router``, and what ``api``
may import.
"""

from __future__ import annotations

from sn_monitor.controller.api.routes import (
    actions,
    breaker,
    fleet,
    incidents,
    intake,
    jobs,
    nodes,
    probes,
    recoveries,
    ui,
    workloads,
)
from sn_monitor.controller.api.routes.endpoint import Endpoint

#: Every route but ``/openapi.json``, in the order the OpenAPI document lists them.
ENDPOINTS: tuple[Endpoint, ...] = (
    *intake.ENDPOINTS, *nodes.ENDPOINTS, *incidents.ENDPOINTS, *actions.ENDPOINTS,
    *jobs.ENDPOINTS, *recoveries.ENDPOINTS, *breaker.ENDPOINTS, *fleet.ENDPOINTS,
    *workloads.ENDPOINTS, *ui.ENDPOINTS, *probes.ENDPOINTS,
)
