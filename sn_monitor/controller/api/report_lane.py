"""The reports' lane: ``POST /api/v1/reports`` answered inside uvicorn's HTTP protocol.

Every node reports every interval: 4,096 reports a second for 8,192 nodes. Through ASGI
each one costs a scope, a request/response cycle object, an ``asyncio.Event``, a task,
and two ``send`` messages, about as much CPU as the ingest itself. This protocol, a
subclass of uvicorn's httptools protocol, recognises a plain report request when its
headers are complete, keeps its body, and writes the answer of
:class:`~sn_monitor.controller.api.report_gate.ReportGate` (the same code the ASGI handler calls)
straight to the transport when the body is complete. Anything else (another path, a
query string, ``Expect: 100-continue``, a pipelined request behind an unanswered one)
takes uvicorn's ordinary ASGI path.

A body over the limit is never read: a report whose headers announce one is answered 413
when they are complete, one that crosses the limit while it streams (chunked) when it
does, and the connection is closed (:meth:`ReportLaneProtocol._close_lingering`). A
request on the ASGI path that announces or sends too much is closed the same way once
its handler has answered it (413, from the handler's own check).

When the server verifies client certificates, the connection's certificate is read once
when the connection is made (the TLS handshake is complete by then) and goes to the gate
with every report on it; a request that takes the ASGI path carries it in its scope's
``extensions`` (:data:`~sn_monitor.controller.security.peer_identity.SCOPE_EXTENSION`).

Most reports never reach httptools either: a read that begins, at a message boundary,
with ``POST /api/v1/reports HTTP/1.1`` and holds the whole request, with plain headers (no
folding, no header twice, a Content-Length within the limit, no Transfer-Encoding,
Expect or Upgrade), is read by :func:`_plain_request` (a split of the head and one pass
over its lines) and answered at once; anything else, or the rest of a read after it, goes
to httptools as before. The keep-alive timer is not re-armed per request on that path:
it checks, when it fires, whether the connection was used since
(:meth:`ReportLaneProtocol.timeout_keep_alive_handler`).

**The reports' stream** (:mod:`sn_monitor.report_stream`) opens the same way: a read that
begins, at a message boundary, with ``GET /api/v1/reports/stream HTTP/1.1`` and holds a
whole plain head asking to upgrade to :data:`~sn_monitor.report_stream.UPGRADE`, with no
body, is admitted by the gate (a refusal is answered and the connection closed) and
answered ``101``; from then on every read goes to the connection's
:class:`~sn_monitor.controller.api.stream_lane.ReportStreamSession`, and the keep-alive timer
closes the stream only after :data:`~sn_monitor.report_stream.IDLE_SECONDS` without a
frame. Any other request on that path goes to the ASGI router, which knows no such route
(404): the agent then posts its reports.

It leans on uvicorn's ``HttpToolsProtocol`` internals (parser callbacks, ``cycle``,
``on_response_complete``); ``tests/unit/test_report_lane.py`` drives it over a socket
so that a uvicorn upgrade that breaks it fails there.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from sn_monitor.controller.api.report_gate import REPORTS_PATH, ReportGate
from sn_monitor.controller.api.statuses import status_of
from sn_monitor.controller.api.stream_lane import ReportStreamSession
from sn_monitor.controller.errors import ControllerError, TooLarge
from sn_monitor.controller.security.auth import Identity
from sn_monitor.controller.security.peer_identity import (
    SCOPE_EXTENSION,
    ClientCertificate,
    client_certificate,
)
from sn_monitor.controller.storage.writer import PendingReply
from sn_monitor.report_stream import IDLE_SECONDS, STREAM_PATH, SWITCHING, UPGRADE

_PATH = REPORTS_PATH.encode()
_PLAIN_LINE = b"POST " + _PATH + b" HTTP/1.1\r\n"
_STREAM_LINE = b"GET " + STREAM_PATH.encode() + b" HTTP/1.1\r\n"
_UPGRADE = UPGRADE.encode()
#: Headers that make a request one for httptools (and uvicorn's checks) to read.
_NOT_PLAIN = frozenset({b"transfer-encoding", b"expect", b"upgrade"})
_BLANK = frozenset(b" \t")
#: How long a connection refused for its body's size still takes (and drops) what the
#: client sends after the answer, before it is closed. Closing with the client's data
#: unread would send a TCP reset, which can destroy the answer before the client reads
#: it (the "lingering close" of RFC 9112, section 9.6); the client that got the answer
#: and closes its side ends it sooner.
LINGER_SECONDS: Final = 2.0


class _LaneRequest:
    """One report request on the lane: who sent it (or why it is refused), its body."""

    __slots__ = ("chunks", "identity", "keep_alive", "refusal", "size")

    def __init__(self, identity: Identity | None, refusal: ControllerError | None,
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
        #: The ASGI path's current request: announced or sent more than the limit; and
        #: how much of its body came so far.
        self._oversized = False
        self._body_size = 0
        #: Set once the connection is closing (see _close_lingering): the timer.
        self._closing: asyncio.TimerHandle | None = None
        #: httptools is between two messages (nothing of a next one fed to it yet).
        self._boundary = True
        #: The event loop's time of the last request answered without httptools.
        self._used_at = 0.0
        #: Set once the connection is a reports' stream.
        self._stream: ReportStreamSession | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.gate.certificates:
            self._certificate = client_certificate(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closing is not None:
            self._closing.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closing is not None:
            return  # the rest of a refused body: dropped unparsed
        if self._stream is not None:
            self._used_at = self.loop.time()
            if not self._stream.feed(data):  # closed once the answers before are out
                self._stream.after_answers(self._close_lingering)
            return
        if self._boundary and (self.cycle is None or self.cycle.response_complete):
            if data.startswith(_PLAIN_LINE):
                data = self._answer_plain(data)
            elif data.startswith(_STREAM_LINE):
                data = self._open_stream(data)
            if not data or self._closing is not None or self.transport.is_closing():
                return
            if self._stream is not None:
                self.data_received(data)  # frames right behind the upgrade request
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._boundary = False
        super().on_message_begin()

    def _answer_plain(self, data: bytes) -> bytes:
        """Answer the whole plain report requests ``data`` begins with; the rest of it."""
        gate = self.gate
        while data.startswith(_PLAIN_LINE):
            end = data.find(b"\r\n\r\n")
            headers = _plain_request(data, end, gate.max_body_bytes) if end > 0 else None
            if headers is None:
                break
            total = end + 4 + int(headers[b"content-length"])
            if len(data) < total:
                break  # the body comes in later reads: httptools collects it
            keep_alive = headers.get(b"connection", b"").lower() != b"close"
            try:
                identity = gate.admit(headers, self._certificate)
            except ControllerError as err:
                answer: tuple[int, bytes] | PendingReply = (
                    status_of(err), gate.error_body(err.message))
            else:
                peer = self.client[0] if self.client else None
                answer = gate.answer(identity, data[end + 4:total], peer)
            data = data[total:]
            if isinstance(answer, PendingReply):
                self._answer_when_written(answer, keep_alive)
                return data  # what follows waits its turn behind that answer (httptools')
            self.server_state.total_requests += 1
            self._write_answer(*answer, keep_alive)
            if not keep_alive:
                self.transport.close()
                return b""
            self._used_at = self.loop.time()
            if self.timeout_keep_alive_task is None:
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler)
        return data

    def _open_stream(self, data: bytes) -> bytes:
        """Upgrade to a reports' stream if ``data`` begins with a plain request for one.

        The rest of ``data``; unchanged (for httptools) when the request is not plain.
        """
        end = data.find(b"\r\n\r\n")
        headers = _plain_headers(data, len(_STREAM_LINE), end) if end > 0 else None
        if (headers is None or headers.get(b"upgrade", b"").lower() != _UPGRADE
                or b"upgrade" not in _tokens(headers.get(b"connection", b""))
                or headers.get(b"content-length", b"0") != b"0"
                or b"transfer-encoding" in headers):
            return data
        self.server_state.total_requests += 1
        try:
            identity = self.gate.admit(headers, self._certificate)
        except ControllerError as err:
            self._write_answer(status_of(err), self.gate.error_body(err.message),
                               keep_alive=False)
            self.transport.close()
            return b""
        self.transport.write(SWITCHING)
        self._stream = ReportStreamSession(self.gate, identity,
                                           self.client[0] if self.client else None,
                                           self._write_on_stream, self.loop.call_soon_threadsafe)
        self._used_at = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                IDLE_SECONDS, self.timeout_keep_alive_handler)
        return data[end + 4:]

    def _write_on_stream(self, data: bytes) -> None:
        """Write answers on the stream, unless the connection closed while they waited."""
        if not self.transport.is_closing():
            self.transport.write(data)

    def timeout_keep_alive_handler(self) -> None:
        """Close an idle kept-alive connection; one used since the timer was set waits on."""
        idle = IDLE_SECONDS if self._stream is not None else self.timeout_keep_alive
        left = self._used_at + idle - self.loop.time()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(
                left, self.timeout_keep_alive_handler)
            return
        super().timeout_keep_alive_handler()

    def on_headers_complete(self) -> None:
        if self._closing is not None:
            return  # a request behind a refused one, in the same read: never answered
        parser = self.parser
        headers = dict(self.headers)
        self._oversized, self._body_size = False, 0
        if (self.url != _PATH or parser.get_method() != b"POST" or self.expect_100_continue
                or parser.should_upgrade()
                or (self.cycle is not None and not self.cycle.response_complete)):
            self._lane = None
            self._oversized = self.gate.announces_too_much(headers)
            if self._certificate is not None:
                extensions = self.scope.setdefault("extensions", {})
                extensions[SCOPE_EXTENSION] = {"certificate": self._certificate}
            super().on_headers_complete()
            return
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        try:
            self._lane = _LaneRequest(self.gate.admit(headers, self._certificate),
                                      None, keep_alive)
        except ControllerError as err:
            if self.gate.announces_too_much(headers):  # never read that much, from anyone
                self._refuse_and_close(err)
            else:
                self._lane = _LaneRequest(None, err, keep_alive)

    def on_body(self, body: bytes) -> None:
        if self._closing is not None:
            return
        lane = self._lane
        if lane is None:
            self._asgi_body(body)
            return
        lane.size += len(body)
        if lane.size > self.gate.max_body_bytes:
            self._refuse_and_close(lane.refusal or TooLarge(
                f"body larger than {self.gate.max_body_bytes} bytes"))
        elif lane.refusal is None:
            lane.chunks.append(body)  # a refused body is read and dropped

    def _asgi_body(self, body: bytes) -> None:
        """Count a body on the ASGI path; once one over the limit is answered, close.

        Its handler reads no more than the limit either: it answers 413.
        """
        self._body_size += len(body)
        if self._body_size > self.gate.max_body_bytes:
            self._oversized = True
        if self._oversized and self.cycle is not None and self.cycle.response_complete:
            self._close_lingering()
            return
        super().on_body(body)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._oversized and self.cycle.response_complete:
            self._close_lingering()  # the answer to a body over the limit went out

    def on_message_complete(self) -> None:
        self._boundary = True
        if self._closing is not None:
            return
        lane = self._lane
        if lane is None:
            super().on_message_complete()
            return
        self._lane = None
        if self.transport.is_closing():
            return
        gate = self.gate
        if lane.refusal is not None:
            status, body = status_of(lane.refusal), gate.error_body(lane.refusal.message)
        else:
            assert lane.identity is not None  # admitted: the gate said who
            peer = self.client[0] if self.client else None
            answer = gate.answer(lane.identity, b"".join(lane.chunks), peer)
            if isinstance(answer, PendingReply):
                self._answer_when_written(answer, lane.keep_alive)
                return
            status, body = answer
        self._write_answer(status, body, lane.keep_alive)
        if lane.keep_alive:
            self.on_response_complete()
        else:
            self.transport.close()

    def _answer_when_written(self, pending: PendingReply, keep_alive: bool) -> None:
        """Answer a report whose events are being written once they are, as uvicorn would.

        The answer is an ASGI cycle of uvicorn's (:meth:`ReportGate.answer_when_written`),
        so that what comes behind it on the connection waits its turn: a request parsed
        while it waits is queued behind it by uvicorn, and the lane answers nothing while
        a cycle is unanswered. Only reports that carry events take this path.
        """
        scope: Any = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                      "http_version": "1.1", "server": self.server, "client": self.client,
                      "scheme": self.scheme, "root_path": self.root_path, "headers": [],
                      "method": "POST", "path": REPORTS_PATH, "raw_path": _PATH,
                      "query_string": b"", "state": {}}
        cycle = RequestResponseCycle(
            scope=scope, transport=self.transport, flow=self.flow, logger=self.logger,
            access_logger=self.access_logger, access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(), expect_100_continue=False,
            keep_alive=keep_alive, on_response=self._answered_when_written)
        cycle.more_body = False
        self.cycle = cycle
        answer: Any = self.gate.answer_when_written(pending)  # Starlette's ASGI type
        self._start_asgi_task(cycle, answer)

    def _answered_when_written(self) -> None:
        self._used_at = self.loop.time()
        self.on_response_complete()

    def _write_answer(self, status: int, body: bytes, keep_alive: bool) -> None:
        self.transport.write(b"".join((
            _head(status, self.server_state.default_headers), str(len(body)).encode(),
            b"\r\n\r\n" if keep_alive else b"\r\nconnection: close\r\n\r\n", body)))

    def _refuse_and_close(self, refusal: ControllerError) -> None:
        """Answer the lane's request now, with the rest of its body unread, and close."""
        self._lane = None
        if not self.transport.is_closing():
            self._write_answer(status_of(refusal), self.gate.error_body(refusal.message),
                               keep_alive=False)
        self._close_lingering()

    def _close_lingering(self) -> None:
        """Close once the answer is out, reading no more requests from the client.

        FIN goes now; what the client still sends is dropped unparsed
        (``data_received``), so no request behind the refused one is answered; the
        connection closes when the client closes its side, or after
        :data:`LINGER_SECONDS`.
        """
        transport = self.transport
        if self._closing is not None or transport.is_closing():
            return
        self._unset_keepalive_if_required()
        if transport.can_write_eof():  # plain TCP; TLS has no half-close in asyncio
            transport.write_eof()
        self.flow.resume_reading()  # so the client's FIN, or its data, is seen
        self._closing = self.loop.call_later(LINGER_SECONDS, transport.close)


_heads: dict[int, tuple[object, bytes]] = {}


def _head(status: int, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """An answer's head up to its Content-Length value, with uvicorn's default headers.

    uvicorn replaces ``default_headers`` (its Date) once a second; the head is built
    again only then, not for each of the thousands of answers in between.
    """
    kept = _heads.get(status)
    if kept is not None and kept[0] is default_headers:
        return kept[1]
    head = [STATUS_LINE[status]]
    for name, value in default_headers:
        head += [name, b": ", value, b"\r\n"]
    head.append(b"content-type: application/json\r\ncontent-length: ")
    built = b"".join(head)
    _heads[status] = (default_headers, built)
    return built


def _plain_headers(data: bytes, start: int, end: int) -> dict[bytes, bytes] | None:
    """The header lines ``data[start:end]`` if plain; None if not.

    Plain: every line a ``name: value`` with no folding and no name twice. Names are
    lower-cased, as httptools hands them to the gate.
    """
    headers: dict[bytes, bytes] = {}
    for line in data[start:end].split(b"\r\n"):
        name, colon, value = line.partition(b":")
        if not colon or not name or name[0] in _BLANK or name[-1] in _BLANK:
            return None  # not a header line, a folded one, or a name with blanks around
        name = name.lower()
        if name in headers:
            return None
        headers[name] = value.strip(b" \t")
    return headers


def _tokens(value: bytes) -> set[bytes]:
    """The comma-separated tokens of a header value, lower-cased."""
    return {token.strip(b" \t").lower() for token in value.split(b",")}


def _plain_request(data: bytes, end: int, limit: int) -> dict[bytes, bytes] | None:
    """The headers of the report request head ``data[:end]`` if it is plain; None if not.

    Plain: plain header lines (:func:`_plain_headers`), none of :data:`_NOT_PLAIN`, and a
    Content-Length of digits within ``limit``.
    """
    headers = _plain_headers(data, len(_PLAIN_LINE), end)
    if headers is None or not _NOT_PLAIN.isdisjoint(headers):
        return None
    length = headers.get(b"content-length")
    if length is None or not length.isdigit() or int(length) > limit:
        return None
    return headers


def report_lane(gate: ReportGate) -> type[ReportLaneProtocol]:
    """The protocol class to give uvicorn (``Config(http=...)``) for this ``gate``."""
    return type("BoundReportLaneProtocol", (ReportLaneProtocol,), {"gate": gate})
