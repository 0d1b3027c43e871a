"""The kubelet's pod-resources ``List``: one unary gRPC call over HTTP/2 on a unix socket.

Why not ``grpcio``: its C core adds 14-18 MB to the agent's memory (and threads of its
own), more than the whole attribution, for one unary call a refresh. The call is small
enough to make with the pure-Python HTTP/2 state machine ``h2`` (the ``kubelet`` extra;
the answer is decoded by :mod:`.message`), as gRPC's HTTP/2 protocol
specifies it (PROTOCOL-HTTP2.md in grpc/grpc): a POST to ``/v1.PodResourcesLister/List``
with ``content-type: application/grpc`` and ``te: trailers``, the request as one
length-prefixed message, the answer as one length-prefixed message and the call's
status in the trailers (``grpc-status``, ``grpc-message``), or in the headers of a
trailers-only answer.

Each call opens its own connection and closes it: the kubelet keeps nothing between
calls, and a kubelet that restarted (a new socket at the path) is simply reached anew.
A failed call raises :class:`~sn_monitor.agent.workloads.model.SourceUnavailable` saying
why in words: no answer within the timeout, nobody listening, an answer that cannot be
decoded, a gRPC status other than OK.
"""

from __future__ import annotations

import socket as sockets
import time
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from sn_monitor.agent.workloads.kubelet.answer import SOURCE
from sn_monitor.agent.workloads.kubelet.message import (
    ListPodResourcesResponse,
    WireError,
    decode_list_answer,
)
from sn_monitor.agent.workloads.model import SourceUnavailable

#: The kubelet's own bound on a pod-resources answer (its DefaultPodResourcesMaxSize).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: The gRPC method: package ``v1``, service ``PodResourcesLister``, method ``List``.
METHOD = "/v1.PodResourcesLister/List"
#: Bytes read from the socket at a time.
READ_BYTES = 65536
#: gRPC's status names, for the message (https://grpc.github.io/grpc/core/md_doc_statuscode.html).
STATUS_NAMES = {1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
                5: "NOT_FOUND", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
                12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE", 16: "UNAUTHENTICATED"}
_WINDOW = 2**31 - 1
_STREAM = 1


class _CallFailed(Exception):
    """Why one call failed, in words; the channel adds the socket."""


class PodResourcesChannel:
    """``List`` on the socket at ``socket``, a connection per call."""

    def __init__(self, socket: Path) -> None:
        self._socket = socket

    def list(self, timeout_seconds: float) -> ListPodResourcesResponse:
        """The kubelet's answer to ``List``. Raises SourceUnavailable."""
        deadline = time.monotonic() + timeout_seconds
        try:
            with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as conn:
                conn.settimeout(timeout_seconds)
                conn.connect(str(self._socket))
                payload = _UnaryCall(conn, deadline).run(b"")  # ListPodResourcesRequest: no fields
        except TimeoutError:
            raise SourceUnavailable(SOURCE, f"List on {self._socket} timed out: no answer "
                                            f"within {timeout_seconds:g} s") from None
        except OSError as err:
            raise SourceUnavailable(SOURCE, f"cannot reach the kubelet on {self._socket}: "
                                            f"{err.strerror or err}") from None
        except _CallFailed as err:
            raise SourceUnavailable(SOURCE, f"List on {self._socket} failed: {err}") from None
        try:
            return decode_list_answer(payload)
        except WireError as err:
            raise SourceUnavailable(SOURCE, f"malformed answer from {self._socket}: "
                                            f"{err}") from None

    def close(self) -> None:
        """Nothing is held between calls."""


class _UnaryCall:
    """One request, one answer on stream 1 of a fresh HTTP/2 connection."""

    def __init__(self, conn: sockets.socket, deadline: float) -> None:
        self._conn = conn
        self._deadline = deadline
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8"))
        self._body = bytearray()
        self._status: str | None = None
        self._message = ""
        self._ended = False

    def run(self, request: bytes) -> bytes:
        """The answer's one message; raises _CallFailed, TimeoutError, OSError."""
        machine = self._h2
        machine.initiate_connection()
        machine.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW})
        machine.increment_flow_control_window(_WINDOW - 65535)
        machine.send_headers(_STREAM, [
            (":method", "POST"), (":scheme", "http"), (":path", METHOD),
            (":authority", "localhost"), ("content-type", "application/grpc"),
            ("te", "trailers")])
        machine.send_data(_STREAM, b"\x00" + len(request).to_bytes(4, "big") + request,
                          end_stream=True)
        self._flush()
        while not self._ended:
            self._receive()
        status = self._status
        if status is None:
            raise _CallFailed("the answer has no grpc-status")
        if status != "0":
            name = STATUS_NAMES.get(int(status), "") if status.isdigit() else ""
            raise _CallFailed(f"gRPC status {' '.join(filter(None, (status, name)))}: "
                              f"{self._message or 'no message'}")
        return _message(bytes(self._body))

    def _receive(self) -> None:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self._conn.settimeout(remaining)
        data = self._conn.recv(READ_BYTES)
        if not data:
            raise _CallFailed("the kubelet closed the connection before answering")
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as err:
            raise _CallFailed(f"not an HTTP/2 answer: {err}") from err
        for event in events:
            self._on(event)
        self._flush()

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
            self._headers(event.headers or [])
        elif isinstance(event, h2.events.DataReceived):
            if len(self._body) + len(event.data or b"") > MAX_ANSWER_BYTES + 5:
                raise _CallFailed(f"the answer is over {MAX_ANSWER_BYTES} bytes")
            self._body += event.data or b""
            self._h2.acknowledge_received_data(event.flow_controlled_length, _STREAM)
        elif isinstance(event, h2.events.StreamEnded):
            self._ended = True
        elif isinstance(event, h2.events.StreamReset):
            raise _CallFailed(f"the kubelet reset the call (HTTP/2 error {event.error_code})")
        elif isinstance(event, h2.events.ConnectionTerminated):
            raise _CallFailed(f"the kubelet ended the connection (HTTP/2 error "
                              f"{event.error_code})")

    def _headers(self, headers: list[tuple[str, str]] | list[tuple[bytes, bytes]]) -> None:
        fields = {str(k): str(v) for k, v in headers}
        if ":status" in fields and fields[":status"] != "200":
            raise _CallFailed(f"HTTP status {fields[':status']}")
        if "grpc-status" in fields:
            self._status = fields["grpc-status"]
            self._message = fields.get("grpc-message", "")

    def _flush(self) -> None:
        outgoing = self._h2.data_to_send()
        if outgoing:
            self._conn.sendall(outgoing)


def _message(body: bytes) -> bytes:
    """The one length-prefixed gRPC message of an answer's body."""
    if len(body) < 5:
        raise _CallFailed("an answer without a message")
    if body[0] != 0:
        raise _CallFailed("a compressed answer (none was asked for)")
    length = int.from_bytes(body[1:5], "big")
    if length != len(body) - 5:
        raise _CallFailed(f"an answer of {len(body) - 5} bytes framed as {length}")
    return body[5:]
