"""The reports' lane over a real socket: same answers as the ASGI path, HTTP/1.1 kept.

A real uvicorn server (in a thread, on 127.0.0.1) runs the controller's app with
:func:`~sn_monitor.controller.api.report_lane.report_lane` as its protocol, around a real
controller (the harness of test_controller_service). Each request is sent as raw bytes,
so keep-alive, HTTP/1.0, pipelining and chunked bodies are what is on the wire; the
same requests through Starlette's TestClient (the ASGI handler) must get the same answers.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import time
from typing import Any

import msgspec
import pytest
from starlette.testclient import TestClient

from sn_monitor.controller.api.app import ControllerApp
from tests.drivers.servers import wait_until
from tests.support.api import AGENT, JSON, READ
from tests.support.harness import (
    Harness,
    report_body,
)
from tests.support.report_lane import MAX_BODY, Reader, request
from tests.support.tls import Server


def test_reports_on_one_kept_alive_connection(lane_server: Server, harness: Harness) -> None:
    with lane_server.connect() as sock:
        reader = Reader(sock)
        for sequence in (1, 2, 3):
            sock.sendall(request(report_body("gpu-a", temps=[60.0], sequence=sequence)))
            status, headers, body = reader.response()
            assert status == 200, body
            assert msgspec.json.decode(body)["sequence"] == sequence
            assert headers["content-type"] == "application/json"
            assert "connection" not in headers
            assert "date" in headers  # uvicorn's default headers are kept
    view = harness.controller.registry.get("gpu-a")
    assert view is not None
    assert view.report is not None
    assert view.report.sequence == 3


CASES = {
    "accepted": (report_body("gpu-b", temps=[50.0]), AGENT),
    "no token": (report_body("gpu-b", temps=[50.0]), None),
    "read role": (report_body("gpu-b", temps=[50.0]), READ),
    "another node": (report_body("cpu-1", temps=[50.0]), AGENT),
    "malformed": (b'{"node": "gpu-b", ', AGENT),
    "invalid": (b'{"node": "gpu-b", "instance": "i", "sequence": "one"}', AGENT),
    "too large": (b" " * (MAX_BODY + 1), AGENT),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_lane_answers_as_the_asgi_handler(case: str, app: ControllerApp,
                                              lane_server: Server) -> None:
    body, token = CASES[case]
    with lane_server.connect() as sock:
        sock.sendall(request(body, token=token))
        lane_status, _, lane_body = Reader(sock).response()
    # The same request through ASGI (the report was applied once: send a later sequence).
    if case == "accepted":
        body = report_body("gpu-b", temps=[50.0], sequence=2)
    with TestClient(app, headers=JSON) as client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        answer = client.post("/api/v1/reports", content=body, headers=headers)
    assert lane_status == answer.status_code
    lane = msgspec.json.decode(lane_body)
    asgi = answer.json()
    if case == "accepted":
        assert (lane["sequence"], asgi["sequence"]) == (1, 2)
    else:
        assert lane == asgi
        assert lane["error"]


def test_an_oversized_chunked_body_is_refused_and_the_connection_closed(lane_server: Server
                                                                         ) -> None:
    with lane_server.connect() as sock:
        reader = Reader(sock)
        # a report behind it, in the same write: never read, as nothing after the limit is
        sock.sendall(request(b"x" * (MAX_BODY + 10), chunked=True)
                     + request(report_body("gpu-c", temps=[50.0])))
        status, headers, body = reader.response()
        assert status == 413, body
        assert headers["connection"] == "close"
        assert reader.closed()
    with lane_server.connect() as sock:
        sock.sendall(request(report_body("gpu-c", temps=[50.0]), chunked=True))
        assert Reader(sock).response()[0] == 200


def test_http_1_0_is_answered_and_closed(lane_server: Server) -> None:
    with lane_server.connect() as sock:
        sock.sendall(request(report_body("gpu-d", temps=[50.0]), version="1.0"))
        reader = Reader(sock)
        status, headers, _ = reader.response()
        assert status == 200
        assert headers["connection"] == "close"
        assert reader.closed()


def test_pipelined_requests_are_answered_in_order(lane_server: Server) -> None:
    with lane_server.connect() as sock:
        sock.sendall(b"".join(request(report_body("gpu-e", temps=[50.0], sequence=s))
                              for s in (1, 2, 3)))
        reader = Reader(sock)
        assert [msgspec.json.decode(reader.response()[2])["sequence"]
                for _ in range(3)] == [1, 2, 3]


def test_other_requests_take_the_asgi_path_on_the_same_connection(lane_server: Server) -> None:
    with lane_server.connect() as sock:
        reader = Reader(sock)
        sock.sendall(request(report_body("gpu-f", temps=[50.0], sequence=1)))
        assert reader.response()[0] == 200
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: controller\r\n\r\n")
        status, _, body = reader.response()
        assert status == 200
        assert "store" in msgspec.json.decode(body)
        # a query string, and Expect: 100-continue, go through ASGI and get the same answer
        sock.sendall(request(report_body("gpu-f", temps=[50.0], sequence=2),
                             path="/api/v1/reports?from=test"))
        assert msgspec.json.decode(reader.response()[2])["sequence"] == 2
        sock.sendall(request(report_body("gpu-f", temps=[50.0], sequence=3),
                             extra="Expect: 100-continue\r\n"))
        status, _, body = reader.response()
        if status == 100:
            status, _, body = reader.response()
        assert status == 200
        assert msgspec.json.decode(body)["sequence"] == 3


# ----------------------------------------------------------------- plain requests
# A read holding whole plain report requests is answered without httptools; what is
# not plain, or not whole, takes httptools. Either way the answers are the same.


def _sequences(reader: Reader, n: int) -> list[int]:
    return [msgspec.json.decode(reader.response()[2])["sequence"] for _ in range(n)]


def _queued(fd: int, request: int) -> int:
    return int(struct.unpack("i", fcntl.ioctl(fd, request, b"\0" * 4))[0])


def _connection(server: Server) -> Any:
    """The lane's protocol of the one connection ``server`` has open (once accepted)."""
    connections = server.server.server_state.connections
    assert wait_until(lambda: len(connections) == 1), f"{len(connections)} connections"
    (protocol,) = connections
    return protocol


def wait_until_read(server: Server, sock: socket.socket) -> None:
    """Wait until the server has read every byte sent on ``sock`` (acknowledged, and none
    left in its socket): what is sent next comes in a read of its own."""
    theirs = _connection(server).transport.get_extra_info("socket").fileno()
    assert wait_until(lambda: _queued(sock.fileno(), termios.TIOCOUTQ) == 0
                      and _queued(theirs, termios.FIONREAD) == 0)


def test_a_request_split_over_reads_is_answered_and_the_next_ones_too(lane_server: Server) -> None:
    with lane_server.connect() as sock:
        reader = Reader(sock)
        whole = request(report_body("gpu-p", temps=[50.0], sequence=1))
        for part in (whole[:20], whole[20:-30], whole[-30:]):
            sock.sendall(part)
            wait_until_read(lane_server, sock)  # each part a read of its own
        second = request(report_body("gpu-p", temps=[50.0], sequence=2))
        third = request(report_body("gpu-p", temps=[50.0], sequence=3))
        sock.sendall(second + third[:40])  # one whole request, then part of another
        wait_until_read(lane_server, sock)
        sock.sendall(third[40:])
        assert _sequences(reader, 3) == [1, 2, 3]


def test_a_report_then_another_request_in_one_read_are_answered_in_order(
        lane_server: Server) -> None:
    with lane_server.connect() as sock:
        reader = Reader(sock)
        sock.sendall(request(report_body("gpu-q", temps=[50.0], sequence=1))
                     + b"GET /healthz HTTP/1.1\r\nHost: controller\r\n\r\n"
                     + request(report_body("gpu-q", temps=[50.0], sequence=2)))
        first = reader.response()
        health = reader.response()
        last = reader.response()
        assert msgspec.json.decode(first[2])["sequence"] == 1
        assert health[0] == 200
        assert "store" in msgspec.json.decode(health[2])
        assert msgspec.json.decode(last[2])["sequence"] == 2


@pytest.mark.parametrize(("extra", "expected"), [
    ("X-Folded: a\r\n  b\r\n", 400),                  # obsolete line folding
    ("Content-Type: application/json\r\n", 200),      # a header twice
    ("Bad Name : x\r\n", 400),                         # whitespace before the colon
], ids=["folded", "twice", "space-before-colon"])
def test_a_request_that_is_not_plain_gets_httptools_answer(lane_server: Server, extra: str,
                                                           expected: int) -> None:
    body = report_body("gpu-r", temps=[50.0], sequence=1)
    with lane_server.connect() as sock:
        sock.sendall(request(body, extra=extra))
        status, _, _ = Reader(sock).response()
    assert status == expected  # httptools' verdict, as before the plain path existed


def test_the_keep_alive_timer_spares_a_connection_in_use_and_closes_an_idle_one(
        app: ControllerApp) -> None:
    server = Server(app, keep_alive=2.0)
    try:
        with server.connect() as sock:
            reader = Reader(sock)
            sock.sendall(request(report_body("gpu-s", temps=[50.0], sequence=1)))
            assert _sequences(reader, 1) == [1]
            connection = _connection(server)
            first_timer = connection.timeout_keep_alive_task
            assert first_timer is not None
            # In use (a report every poll) until the timer has fired and, the connection
            # having been used since it was set, set itself again: spared.
            sequence = 1
            while connection.timeout_keep_alive_task is first_timer:
                assert sequence < 1000, "the keep-alive timer never fired"
                sequence += 1
                sock.sendall(request(report_body("gpu-s", temps=[50.0], sequence=sequence)))
                assert _sequences(reader, 1) == [sequence]
                time.sleep(0.05)  # the polling interval
            assert reader.closed()  # then idle: closed within the timeout (5 s allowed)
    finally:
        server.stop()
