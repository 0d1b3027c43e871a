"""The reports' stream: its frames, and the controller's end over a real socket.

The server is the one test_report_lane drives (a real uvicorn with the lane protocol,
around a real controller); the stream is opened and fed as raw bytes.
"""

from __future__ import annotations

from sn_monitor.model import Command
from sn_monitor.report_stream import ACK, FrameReader, frame
from tests.support.api import READ
from tests.support.harness import Harness, report_body
from tests.support.report_lane import MAX_BODY, Reader
from tests.support.report_stream import Stream, open_stream, opening
from tests.support.tls import Server

# ------------------------------------------------------------------ frames


def test_frames_come_out_whole_however_the_bytes_are_cut() -> None:
    payloads = [b"", b"a", b"x" * 300, b'{"node":"n"}']
    wire = b"".join(frame(p, ACK if i % 2 else 0) for i, p in enumerate(payloads))
    for cut in range(1, len(wire)):
        reader = FrameReader(limit=1000)
        got = reader.feed(wire[:cut]) + reader.feed(wire[cut:])
        assert got == [(ACK if i % 2 else 0, p) for i, p in enumerate(payloads)], cut
        assert reader.pending == 0
    byte_by_byte = FrameReader(limit=1000)
    got = [f for i in range(len(wire)) for f in byte_by_byte.feed(wire[i:i + 1])]
    assert [p for _, p in got] == payloads


def test_a_frame_over_the_limit_stops_the_reading_after_the_frames_before_it() -> None:
    reader = FrameReader(limit=10)
    wire = frame(b"ok") + frame(b"y" * 11) + frame(b"after")
    assert reader.feed(wire) == [(0, b"ok")]
    assert reader.too_large is not None
    assert reader.too_large.length == 11
    assert reader.feed(frame(b"more")) == []


# ------------------------------------------------------------------ the controller's end


def test_reports_on_a_stream_are_taken_and_only_those_that_ask_are_answered(
        lane_server: Server, harness: Harness) -> None:
    with lane_server.connect() as sock:
        stream = open_stream(sock)
        for sequence in (1, 2, 3):
            stream.send(report_body("gpu-a", temps=[60.0], sequence=sequence))
        stream.send(report_body("gpu-a", temps=[60.0], sequence=4), ACK)
        answer = stream.answer()
        assert (answer.status, answer.node, answer.sequence, answer.accepted) == (
            200, "gpu-a", 4, 4)
        assert answer.reply is not None
        assert answer.reply.sequence == 4
        assert stream.answers == []  # the three before it got none
    view = harness.controller.registry.get("gpu-a")
    assert view is not None
    assert view.report is not None
    assert view.report.sequence == 4


def test_a_refused_report_is_answered_with_its_status_and_the_stream_goes_on(
        lane_server: Server, harness: Harness) -> None:
    with lane_server.connect() as sock:
        stream = open_stream(sock)
        stream.send(report_body("gpu-a", temps=[60.0], sequence=1))
        stream.send(report_body("cpu-1", temps=[60.0], sequence=7))  # not this agent's
        refused = stream.answer()
        assert (refused.status, refused.node, refused.sequence, refused.accepted) == (
            403, "cpu-1", 7, 1)
        assert "may not report for node cpu-1" in refused.error
        stream.send(b'{"node": "gpu-a", ')
        malformed = stream.answer()
        assert (malformed.status, malformed.node, malformed.sequence) == (400, "", -1)
        stream.send(report_body("gpu-a", temps=[60.0], sequence=2), ACK)
        assert (stream.answer().status, harness.controller.registry.get("gpu-a") is not None
                ) == (200, True)


def test_commands_go_out_at_once_without_being_asked_for(lane_server: Server,
                                                       harness: Harness) -> None:
    with lane_server.connect() as sock:
        stream = open_stream(sock)
        stream.send(report_body("gpu-a", temps=[60.0], sequence=1), ACK)
        assert stream.answer().reply is not None
        harness.drivers.queue.put("gpu-a", Command(id="c-1", kind="throttle", gpu=0,
                                                   power_watts=500.0))
        stream.send(report_body("gpu-a", temps=[60.0], sequence=2))
        answer = stream.answer()
        assert answer.reply is not None
        assert [c.id for c in answer.reply.commands] == ["c-1"]
        assert answer.sequence == 2


def test_frames_in_the_same_read_as_the_opening_are_taken(lane_server: Server,
                                                          harness: Harness) -> None:
    with lane_server.connect() as sock:
        sock.sendall(opening() + frame(report_body("gpu-a", temps=[60.0], sequence=5), ACK))
        reader = Reader(sock)
        while b"\r\n\r\n" not in reader.buffer:
            assert reader._fill()
        head, _, rest = reader.buffer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 ")
        answer = Stream(sock, rest).answer()
        assert (answer.status, answer.sequence) == (200, 5)


def test_an_opening_without_a_token_is_refused_and_closed(lane_server: Server) -> None:
    with lane_server.connect() as sock:
        sock.sendall(opening(None))
        reader = Reader(sock)
        status, _, body = reader.response()
        assert status == 401, body
        assert reader.closed()


def test_a_token_that_may_not_report_gets_each_report_refused_as_a_post_would(
        lane_server: Server) -> None:
    with lane_server.connect() as sock:
        stream = open_stream(sock, READ)
        stream.send(report_body("gpu-a", temps=[60.0], sequence=1))
        answer = stream.answer()
        assert (answer.status, answer.node, answer.accepted) == (403, "gpu-a", 0)


def test_an_opening_for_another_protocol_is_not_a_stream(lane_server: Server) -> None:
    with lane_server.connect() as sock:
        sock.sendall(opening(upgrade="sn-reports/9"))
        status, _, _ = Reader(sock).response()
        assert status == 404  # as a controller before streams answers: the agent posts


def test_a_frame_over_the_limit_is_answered_413_and_the_stream_closed(
        lane_server: Server) -> None:
    with lane_server.connect() as sock:
        stream = open_stream(sock)
        stream.send(report_body("gpu-a", temps=[60.0], sequence=1))
        sock.sendall((MAX_BODY + 1).to_bytes(4, "big") + b"\x00" + b" " * 1000)
        answer = stream.answer()
        assert (answer.status, answer.accepted) == (413, 1)
        assert stream.closed()
