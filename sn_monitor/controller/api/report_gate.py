"""The reports' gate: who may report, how large a report may be, the answer to one.

One copy of it, used by the ASGI handler (:mod:`sn_monitor.controller.api.app`) and by
uvicorn's protocol for the reports' lane (:mod:`sn_monitor.controller.api.report_lane`)
and its stream (:mod:`sn_monitor.controller.api.stream_lane`), which bypass ASGI.
"""

from __future__ import annotations

import asyncio

import msgspec
from starlette.types import ASGIApp, Receive, Scope, Send

from sn_monitor.controller.api.body_headers import JSON_MEDIA, announces_over, check_body_headers
from sn_monitor.controller.api.controller_api import ControllerApi
from sn_monitor.controller.api.statuses import status_of
from sn_monitor.controller.errors import ControllerError, Forbidden, Unauthenticated
from sn_monitor.controller.security.auth import OPEN_ACCESS, Identity, TokenBook
from sn_monitor.controller.security.peer_identity import (
    AgentAuth,
    ClientCertificate,
    report_identity,
)
from sn_monitor.controller.storage.writer import PendingReply
from sn_monitor.model import ReportReply

_encoder = msgspec.json.Encoder()


def _latin1(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


REPORTS_PATH = "/api/v1/reports"


class ReportGate:
    """Who may report, how large a report may be, and the answer to one: one copy of it.

    Used by the ASGI handler (``ControllerApp``) and by uvicorn's protocol for the
    reports' lane (:mod:`sn_monitor.controller.api.report_lane`), which bypasses ASGI.
    With ``certificates`` (the server verifies client certificates) a report may come
    with a token, a client certificate or both, as ``agent_auth`` says
    (:mod:`sn_monitor.controller.security.peer_identity`).
    """

    def __init__(self, controller: ControllerApi, tokens: TokenBook | None,
                 max_body_bytes: int, *, certificates: bool = False,
                 agent_auth: AgentAuth = "either") -> None:
        self._controller = controller
        self._tokens = tokens
        self.max_body_bytes = max_body_bytes
        self.certificates = certificates
        self._agent_auth = agent_auth

    def admit(self, headers: dict[bytes, bytes],
              certificate: ClientCertificate | None = None) -> Identity:
        """Check the headers and client certificate; Unauthenticated, Forbidden, 413, 415.

        Runs before the body is read. ``certificate`` is the connection's verified client
        certificate, if any.
        """
        identity = OPEN_ACCESS
        if self.certificates:
            authorization = headers.get(b"authorization")
            identity = report_identity(
                self._tokens, authorization.decode("latin-1") if authorization else None,
                certificate, self._agent_auth)
        elif self._tokens is not None:
            found = self._tokens.identify(headers.get(b"authorization", b"").decode("latin-1"))
            if found is None:
                raise Unauthenticated("missing or unknown bearer token")
            if not found.at_least("agent"):
                raise Forbidden(f"{found.name} ({found.role}) may not report")
            identity = found
        check_body_headers(_latin1(headers.get(b"content-length")),
                           _latin1(headers.get(b"transfer-encoding")),
                           _latin1(headers.get(b"content-type")),
                           limit=self.max_body_bytes, accepted=JSON_MEDIA)
        return identity

    def announces_too_much(self, headers: dict[bytes, bytes]) -> bool:
        """Whether ``headers`` announce a body over the limit (one never to be read)."""
        return announces_over(_latin1(headers.get(b"content-length")), self.max_body_bytes)

    def answer(self, identity: Identity, body: bytes, peer: str | None
               ) -> tuple[int, bytes] | PendingReply:
        """Ingest one report: (HTTP status, JSON body), or the reply its events wait for.

        A :class:`PendingReply` is answered once its ``written`` future is done
        (:meth:`answer_when_written`), and nothing behind it on the connection before.
        """
        try:
            reply = self.ingest(identity, body, peer)
        except ControllerError as err:
            return status_of(err), self.error_body(err.message)
        if isinstance(reply, PendingReply):
            return reply
        return 200, _encoder.encode(reply)

    def ingest(self, identity: Identity, body: bytes, peer: str | None
               ) -> ReportReply | PendingReply:
        """Ingest one report; ControllerError if refused (the stream answers it itself)."""
        return self._controller.ingest(body, identity, peer)

    @staticmethod
    def answer_when_written(pending: PendingReply) -> ASGIApp:
        """An ASGI app that answers ``pending`` once its report's events are written."""
        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            await asyncio.wrap_future(pending.written)
            await send_report_answer(send, 200, _encoder.encode(pending.reply()))
        return answer

    @staticmethod
    def error_body(message: str) -> bytes:
        return _encoder.encode({"error": message})




async def send_report_answer(send: Send, status: int, body: bytes) -> None:
    """Answer a report on ASGI: ``status`` and its JSON ``body``, nothing more."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
