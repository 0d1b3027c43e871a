"""The controller's HTTP API (v1), an ASGI app: the reports' hot path, then the router.

Only HTTP lives in ``api``: reading bodies within limits, authentication, status codes
and JSON. Every decision is the :class:`~sn_monitor.controller.service.Controller`'s,
and its refusals are domain errors that :data:`~.statuses.STATUS_OF` alone turns into
HTTP statuses. The routes are a table (:mod:`sn_monitor.controller.api.routes`), served
by :mod:`~sn_monitor.controller.api.router` and documented by
:mod:`~sn_monitor.controller.api.openapi`; where each handler's work runs is the rule
of :mod:`~sn_monitor.controller.api.answers`.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from sn_monitor.controller.api.controller_api import ControllerApi
from sn_monitor.controller.api.openapi import SERVED
from sn_monitor.controller.api.report_gate import REPORTS_PATH, ReportGate, send_report_answer
from sn_monitor.controller.api.router import Router
from sn_monitor.controller.api.statuses import status_of
from sn_monitor.controller.errors import ControllerError, TooLarge
from sn_monitor.controller.security.auth import TokenBook
from sn_monitor.controller.security.peer_identity import SCOPE_EXTENSION, AgentAuth
from sn_monitor.controller.storage.writer import PendingReply


class ControllerApp:
    """The ASGI app: the reports' hot path, then Starlette's router for the rest."""

    def __init__(self, reports: ASGIApp, router: Starlette, gate: ReportGate) -> None:
        self._reports = reports
        self.router = router
        self.routes = router.routes
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["path"] == REPORTS_PATH
                and scope["method"] == "POST"):
            await self._reports(scope, receive, send)
        else:
            await self.router(scope, receive, send)


def build_app(
    controller: ControllerApi,
    tokens: TokenBook | None,
    max_body_bytes: int = 1 << 20,
    *,
    certificates: bool = False,
    agent_auth: AgentAuth = "either",
) -> ControllerApp:
    """The ASGI app; ``tokens`` None means no authentication (development only).

    ``certificates``: the server verifies client certificates, which may then identify
    agents on the reports' route (see :class:`~.report_gate.ReportGate`).

    ``POST /api/v1/reports`` — thousands a second — is answered by a bare ASGI handler
    in front of Starlette's router (no Request/Response objects on the hot path); the
    rest of the API is ordinary Starlette routes.
    """
    router = Router(controller, tokens, max_body_bytes).app(SERVED)
    gate = ReportGate(controller, tokens, max_body_bytes, certificates=certificates,
                      agent_auth=agent_auth)
    return ControllerApp(_report_handler(gate), router, gate)


def _report_handler(gate: ReportGate) -> ASGIApp:
    """The bare ASGI handler of ``POST /api/v1/reports``: admit, read, ingest, answer."""
    async def reports(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            headers = dict(scope["headers"])
            # the lane protocol puts the connection's client certificate here
            certificate = scope.get("extensions", {}).get(SCOPE_EXTENSION, {}).get("certificate")
            identity = gate.admit(headers, certificate)
            body = await _read_report(receive, gate.max_body_bytes)
            client = scope.get("client")
            answer = gate.answer(identity, body, client[0] if client else None)
        except ControllerError as err:
            answer = status_of(err), gate.error_body(err.message)
        if isinstance(answer, PendingReply):
            await gate.answer_when_written(answer)(scope, receive, send)
            return
        await send_report_answer(send, *answer)
    return reports


async def _read_report(receive: Receive, max_body_bytes: int) -> bytes:
    """The report's body, read to its end; TooLarge past ``max_body_bytes``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_body_bytes:
            raise TooLarge(f"body larger than {max_body_bytes} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
