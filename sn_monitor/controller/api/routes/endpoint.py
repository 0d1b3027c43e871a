"""A route of the API as data: method, path, the role it needs, its handler and its doc.

The route table (:data:`sn_monitor.controller.api.routes.ENDPOINTS`) is a tuple of
:class:`Endpoint`; the router serves it and the OpenAPI document is made from it, so
nothing is served undocumented and nothing documented is not served.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from starlette.responses import Response

from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.security.auth import Role

Handler = Callable[[Call], Awaitable[Response]]
Method = Literal["GET", "POST", "DELETE"]


@dataclass(frozen=True)
class Operation:
    """A route's OpenAPI operation, less what its access adds (``api/openapi.py``).

    ``security`` only where it differs from the document's (bearer tokens): the reports
    take a client certificate too.
    """

    summary: str
    responses: Mapping[str, Any]
    parameters: Sequence[Mapping[str, Any]] | None = None
    request_body: Mapping[str, Any] | None = None
    security: Sequence[Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class Endpoint:
    """One method on one path: who may call it, what answers, how it is documented.

    ``role`` None: public (no token; probes, scrapers and the page), and the handler
    answers for itself (a domain error it raises is the server's, a 500). Otherwise the
    caller must hold ``role`` and the handler's domain errors become their statuses.
    """

    method: Method
    path: str
    role: Role | None
    handler: Handler
    doc: Operation
