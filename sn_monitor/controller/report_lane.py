"""The reports' lane: ``POST /api/v1/reports`` answered inside uvicorn's HTTP protocol.

Every node reports every interval: 4,096 reports a second for 8,192 nodes. Through ASGI
each one costs a scope, a request/response cycle object, an ``asyncio.Event``, a task,
and two ``send`` messages, about as much CPU as the ingest itself. This protocol, a
subclass of uvicorn's httptools protocol, recognises a plain report request when its
headers are complete, keeps its body, and writes the answer of
:class:`~sn_monitor.controller.app.ReportGate` (the same code the ASGI handler calls)
straight to the transport when the body is complete. Anything else (another path, a
query string, ``Expect: 100-continue``, a pipelined request behind an unanswered one)
takes uvicorn's ordinary ASGI path, unchanged.

When the server verifies client certificates, the connection's certificate is read once
when the connection is made (the TLS handshake is complete by then) and goes to the gate
with every report on it; a request that takes the ASGI path carries it in its scope's
``extensions`` (:data:`~sn_monitor.controller.peer_identity.SCOPE_EXTENSION`).

It leans on uvicorn's ``HttpToolsProtocol`` internals (parser callbacks, ``cycle``,
``on_response_complete``); ``tests/unit/test_report_lane.py`` drives it over a socket
so that a uvicorn upgrade that breaks it fails there.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from sn_monitor.controller.app import REPORTS_PATH, ReportGate
from sn_monitor.controller.auth import Identity
from sn_monitor.controller.errors import ApiError
from sn_monitor.controller.peer_identity import (
    SCOPE_EXTENSION,
    ClientCertificate,
    client_certificate,
)

_PATH = REPORTS_PATH.encode()


class _LaneRequest:
    """One report request on the lane: who sent it (or why it is refused), its body."""

    __slots__ = ("chunks", "identity", "keep_alive", "refusal", "size")

    def __init__(self, identity: Identity | None, refusal: ApiError | None,
                 keep_alive: bool) -> None:
        self.identity = identity
        self.refusal = refusal
        self.keep_alive = keep_alive
        self.chunks: list[bytes] = []
        self.size = 0


class ReportLaneProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the reports' lane (see the module docstring)."""

    gate: ReportGate  # set on the subclass :func:`report_lane` makes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lane: _LaneRequest | None = None
        self._certificate: ClientCertificate | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.gate.certificates:
            self._certificate = client_certificate(transport)

    def on_headers_complete(self) -> None:
        parser = self.parser
        if (self.url != _PATH or parser.get_method() != b"POST" or self.expect_100_continue
                or parser.should_upgrade()
                or (self.cycle is not None and not self.cycle.response_complete)):
            self._lane = None
            if self._certificate is not None:
                extensions = self.scope.setdefault("extensions", {})
                extensions[SCOPE_EXTENSION] = {"certificate": self._certificate}
            super().on_headers_complete()
            return
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        try:
            self._lane = _LaneRequest(self.gate.admit(dict(self.headers), self._certificate),
                                      None, keep_alive)
        except ApiError as err:
            self._lane = _LaneRequest(None, err, keep_alive)

    def on_body(self, body: bytes) -> None:
        lane = self._lane
        if lane is None:
            super().on_body(body)
            return
        lane.size += len(body)
        if lane.refusal is None and lane.size <= self.gate.max_body_bytes:
            lane.chunks.append(body)  # a refused or oversized body is read and dropped

    def on_message_complete(self) -> None:
        lane = self._lane
        if lane is None:
            super().on_message_complete()
            return
        self._lane = None
        if self.transport.is_closing():
            return
        gate = self.gate
        if lane.refusal is not None:
            status, body = lane.refusal.status, gate.error_body(lane.refusal.message)
        elif lane.size > gate.max_body_bytes or lane.identity is None:
            status = 413
            body = gate.error_body(f"body larger than {gate.max_body_bytes} bytes")
        else:
            peer = self.client[0] if self.client else None
            status, body = gate.answer(lane.identity, b"".join(lane.chunks), peer)
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\ncontent-length: ")
        head.append(str(len(body)).encode())
        head.append(b"\r\n\r\n" if lane.keep_alive else b"\r\nconnection: close\r\n\r\n")
        head.append(body)
        self.transport.write(b"".join(head))
        if lane.keep_alive:
            self.on_response_complete()
        else:
            self.transport.close()


def report_lane(gate: ReportGate) -> type[ReportLaneProtocol]:
    """The protocol class to give uvicorn (``Config(http=...)``) for this ``gate``."""
    return type("BoundReportLaneProtocol", (ReportLaneProtocol,), {"gate": gate})
