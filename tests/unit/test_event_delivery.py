"""Events travel once: the answer to the report that carries them acknowledges them.

The controller here is the daemon's shape: its writer stores events on its own thread
(as ``sn-monitor controller`` runs it), behind a real uvicorn with the reports' lane. The
agent is the real :class:`~sn_monitor.agent.reporter.Reporter` with its spool, posting or
streaming. What the controller was sent is counted as it is handed each report; what the
agent had acknowledged is its spool's; what was stored is the store's.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sn_monitor.agent.reporter import Reporter
from sn_monitor.agent.spool import EventSpool
from sn_monitor.clock import ManualClock
from sn_monitor.controller.api.app import build_app
from sn_monitor.controller.security.auth import Identity, TokenBook
from sn_monitor.report_stream import ACK, frame
from tests.support.api import AGENT, write_tokens
from tests.support.harness import T0, Harness, report_body
from tests.support.report_lane import MAX_BODY, Reader, request
from tests.support.report_stream import open_stream
from tests.support.reporter import snapshot, xid
from tests.support.tls import Server

NODE = "gpu-node-017"
REPORTS = 6


class CountingController:
    """The controller, counting the events in every report it is handed (what was sent)."""

    def __init__(self, harness: Harness) -> None:
        self._controller = harness.controller
        self.events_received = 0

    def ingest(self, body: bytes, identity: Identity, peer: str | None) -> Any:
        doc = msgspec.json.decode(body)
        self.events_received += len(doc.get("events", ())) if isinstance(doc, dict) else 0
        return self._controller.ingest(body, identity, peer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._controller, name)


@pytest.fixture
def counting(harness: Harness) -> Iterator[CountingController]:
    """``harness``'s controller with its writer on a thread of its own, as in the daemon."""
    stop = threading.Event()
    writer = threading.Thread(target=harness.controller.writer.run, args=(stop,),
                              name="writer", daemon=True)
    writer.start()
    yield CountingController(harness)
    stop.set()
    writer.join(timeout=10)
    assert not writer.is_alive(), "the writer did not stop"


@pytest.fixture
def server(counting: CountingController, tmp_path: Path) -> Iterator[Server]:
    s = Server(build_app(counting, TokenBook.load(write_tokens(tmp_path)), MAX_BODY))
    yield s
    s.stop()


def stored_events(harness: Harness) -> int:
    assert harness.controller.writer.flush(10), "the writer did not catch up in 10 s"
    return len(harness.controller.list_events(NODE, None, 1000))


@pytest.mark.parametrize("streams", [False, True], ids=["post", "stream"])
def test_each_event_is_sent_once_acknowledged_by_its_answer_and_stored_once(
        streams: bool, server: Server, counting: CountingController, harness: Harness,
        tmp_path: Path) -> None:
    clock = ManualClock(T0)
    spool = EventSpool(tmp_path / "spool", clock=clock)
    reporter = Reporter(server.url, AGENT, NODE, {"supernode": "sn0"}, clock, spool,
                        timeout=10.0, rng=random.Random(0), streams=streams)
    try:
        waiting_after_answer = []
        for n in range(REPORTS):
            reporter.report(snapshot(clock, xid(n)))
            waiting_after_answer.append(spool.pending_count)
            clock.advance(1.0)
        assert reporter.streaming is streams
        assert reporter.failures_total == 0
    finally:
        reporter.close()
    acknowledged = spool.acknowledged_through + 1  # ids count from 0
    # sent, acknowledged, stored: each event once
    assert (counting.events_received, acknowledged, stored_events(harness)) == (
        REPORTS, REPORTS, REPORTS)
    assert waiting_after_answer == [0] * REPORTS  # each answer acknowledged its events


def event_report(sequence: int) -> bytes:
    return report_body(NODE, temps=[50.0], sequence=sequence, events=[{
        "id": sequence, "kind": "xid", "source": "nvml", "time_seconds": T0,
        "message": f"Xid 13 #{sequence}", "gpu": 0, "code": 13}])


@pytest.mark.parametrize("path", ["plain", "chunked", "asgi"])
def test_every_path_of_a_post_acknowledges_the_events_in_its_answer(
        path: str, server: Server, harness: Harness) -> None:
    """The lane's plain path, its httptools path (chunked) and the ASGI handler."""
    extra = "Expect: 100-continue\r\n" if path == "asgi" else ""
    with server.connect() as sock:
        reader = Reader(sock)
        for sequence in (1, 2):
            sock.sendall(request(event_report(sequence), chunked=path == "chunked",
                                 extra=extra))
            status, _, body = reader.response()
            if status == 100:
                status, _, body = reader.response()
            assert (status, msgspec.json.decode(body)["events_stored_through"]) == (
                200, sequence)
    assert stored_events(harness) == 2


def test_answers_behind_one_that_waits_for_its_events_keep_their_order(
        server: Server, harness: Harness) -> None:
    with server.connect() as sock:
        reader = Reader(sock)
        sock.sendall(request(event_report(1))
                     + request(report_body(NODE, temps=[50.0], sequence=2))
                     + b"GET /healthz HTTP/1.1\r\nHost: controller\r\n\r\n"
                     + request(event_report(3), chunked=True))
        answers = [reader.response() for _ in range(4)]
    assert [status for status, _, _ in answers] == [200] * 4
    first, second, health, last = (msgspec.json.decode(body) for _, _, body in answers)
    assert (first["sequence"], first["events_stored_through"]) == (1, 1)
    assert second["sequence"] == 2
    assert "store" in health
    assert (last["sequence"], last["events_stored_through"]) == (3, 3)


def test_stream_answers_behind_one_that_waits_keep_their_order_and_the_close_waits(
        server: Server) -> None:
    with server.connect() as sock:
        stream = open_stream(sock)
        stream.send(event_report(1), ACK)
        stream.send(report_body(NODE, temps=[50.0], sequence=2))
        stream.send(report_body(NODE, temps=[50.0], sequence=3), ACK)
        first, second = stream.answer(), stream.answer()
        assert (first.sequence, first.accepted, first.reply.events_stored_through) == (1, 1, 1)
        assert (second.sequence, second.accepted) == (3, 2)
        # an events report, then a frame over the limit, in one write: the events are
        # acknowledged before the 413, and only then does the stream close
        sock.sendall(frame(event_report(4), ACK) + frame(b"x" * (MAX_BODY + 1)))
        acknowledged, refused = stream.answer(), stream.answer()
        assert (acknowledged.sequence, acknowledged.reply.events_stored_through) == (4, 4)
        assert refused.status == 413
        assert stream.closed()
