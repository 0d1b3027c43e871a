"""Serving the route table with Starlette: the caller's role checked, refusals answered.

Every route but the reports' hot path (:mod:`sn_monitor.controller.api.app` answers
``POST /api/v1/reports`` before the router).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sn_monitor.controller.api.answers import error_answer, refusal
from sn_monitor.controller.api.controller_api import ControllerApi
from sn_monitor.controller.api.routes.call import Call
from sn_monitor.controller.api.routes.endpoint import Endpoint
from sn_monitor.controller.errors import ControllerError, Forbidden, Unauthenticated
from sn_monitor.controller.security.auth import OPEN_ACCESS, Identity, Role, TokenBook


class Router:
    """Turns endpoints into Starlette routes: identify the caller, call, answer refusals."""

    def __init__(self, controller: ControllerApi, tokens: TokenBook | None,
                 max_body_bytes: int) -> None:
        self._controller = controller
        self._tokens = tokens
        self._max_body_bytes = max_body_bytes

    def app(self, endpoints: Iterable[Endpoint]) -> Starlette:
        """A Starlette app serving ``endpoints``: one route per path, in their order."""
        by_path: dict[str, dict[str, Endpoint]] = {}
        for endpoint in endpoints:
            by_path.setdefault(endpoint.path, {})[endpoint.method] = endpoint
        routes = [Route(path, self._dispatch(methods), methods=list(methods))
                  for path, methods in by_path.items()]
        return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})

    def identify(self, request: Request, role: Role) -> Identity:
        """Who calls, by the bearer token; Unauthenticated or Forbidden below ``role``."""
        if self._tokens is None:
            return OPEN_ACCESS
        identity = self._tokens.identify(request.headers.get("authorization"))
        if identity is None:
            raise Unauthenticated("missing or unknown bearer token")
        if not identity.at_least(role):
            raise Forbidden(f"{identity.name} ({identity.role}) may not do this")
        return identity

    def _dispatch(self, methods: dict[str, Endpoint]
                  ) -> Callable[[Request], Awaitable[Response]]:
        """The handler of one path: the endpoint of the request's method (HEAD: GET's)."""
        async def dispatch(request: Request) -> Response:
            method = "GET" if request.method == "HEAD" else request.method
            return await self._answer(methods[method], request)
        return dispatch

    async def _answer(self, endpoint: Endpoint, request: Request) -> Response:
        if endpoint.role is None:  # public: answers for itself
            return await endpoint.handler(self._call(request, OPEN_ACCESS))
        try:
            identity = self.identify(request, endpoint.role)
            return await endpoint.handler(self._call(request, identity))
        except ControllerError as err:
            return refusal(err)

    def _call(self, request: Request, identity: Identity) -> Call:
        return Call(request, identity, self._controller, self._max_body_bytes)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, method not allowed) as JSON too."""
    if not isinstance(exc, HTTPException):  # pragma: no cover - registered for it
        raise exc
    response = error_answer(exc.status_code, exc.detail)
    response.headers.update(exc.headers or {})
    return response
