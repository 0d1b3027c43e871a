"""The reporter on the reports' stream, against the real controller app on uvicorn.

test_reporter drives the reporter against a tiny HTTP server that has no stream (it
answers the opening 501), so everything there is the posted path; here the controller
is the real one (conftest's ``lane_server``, the harness of test_controller_service), or a raw
socket server that answers the opening as a standby or a hung controller would.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
from pathlib import Path

import pytest

from sn_monitor.agent.reporter import STREAM_RETRY_SECONDS, Reporter
from sn_monitor.agent.spool import EventSpool
from sn_monitor.clock import ManualClock
from sn_monitor.controller.api.app import ControllerApp
from sn_monitor.model import Command
from sn_monitor.report_stream import ASK_EVERY_SECONDS, SWITCHING
from tests.drivers.servers import wait_until
from tests.support.harness import T0, Harness
from tests.support.reporter import Controller as PostOnlyController
from tests.support.reporter import snapshot, xid
from tests.support.reporter_stream import NODE, make_reporter
from tests.support.tls import Server


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


def reported_sequence(harness: Harness) -> int | None:
    view = harness.controller.registry.get(NODE)
    return view.report.sequence if view is not None and view.report is not None else None


def test_reports_go_on_one_stream_and_reach_the_controller(lane_server: Server, harness: Harness,
                                                           clock: ManualClock,
                                                           tmp_path: Path) -> None:
    reporter = make_reporter(lane_server.url, tmp_path, clock)
    try:
        for _ in range(6):
            reporter.report(snapshot(clock))
            clock.advance(1.0)
        assert reporter.streaming
        assert reporter.failures_total == 0
        # the last report asked for nothing: the controller has it all the same
        assert wait_until(lambda: reported_sequence(harness) == 6)
    finally:
        reporter.close()


def test_events_on_a_stream_are_acknowledged_and_leave_the_spool(
        lane_server: Server, harness: Harness, clock: ManualClock, tmp_path: Path) -> None:
    reporter = make_reporter(lane_server.url, tmp_path, clock)
    try:
        reporter.report(snapshot(clock))  # the stream opens
        clock.advance(1.0)
        reporter.report(snapshot(clock, xid(1)))

        def acknowledged() -> bool:  # the writer stores them off the event loop
            clock.advance(1.0)
            reporter.report(snapshot(clock))
            return reporter.spool.pending_count == 0

        assert wait_until(acknowledged, step=0.05)
        assert reporter.streaming
        assert [e["message"] for e in harness.store.list_events(NODE)] == ["Xid 13 #1"]
    finally:
        reporter.close()


def test_a_command_comes_with_the_next_report_without_being_asked_for(
        lane_server: Server, harness: Harness, clock: ManualClock, tmp_path: Path) -> None:
    reporter = make_reporter(lane_server.url, tmp_path, clock)
    try:
        assert reporter.report(snapshot(clock)) == []
        clock.advance(1.0)
        harness.drivers.queue.put(NODE, Command(id="c-1", kind="throttle", gpu=0,
                                                power_watts=500.0))
        commands = reporter.report(snapshot(clock))  # asks for nothing

        def received() -> bool:  # its answer comes on its own; read before the next report
            clock.advance(1.0)
            commands.extend(reporter.report(snapshot(clock)))
            return bool(commands)

        assert commands or wait_until(received, step=0.05)
        assert [c.id for c in commands] == ["c-1"]
        assert reporter.streaming
    finally:
        reporter.close()


def test_a_controller_without_streams_gets_posted_reports_and_is_asked_again_later(
        clock: ManualClock, tmp_path: Path) -> None:
    old = PostOnlyController()
    reporter = make_reporter(old.url, tmp_path, clock)
    try:
        reporter.report(snapshot(clock))
        clock.advance(1.0)
        reporter.report(snapshot(clock))
        assert reporter.failures_total == 0
        assert not reporter.streaming
        assert [r.sequence for r in old.reports()] == [1, 2]
        clock.advance(STREAM_RETRY_SECONDS)
        reporter.report(snapshot(clock))  # asks for a stream again, and posts
        assert [r.sequence for r in old.reports()] == [1, 2, 3]
        assert reporter.failures_total == 0
    finally:
        reporter.close()
        old.close()


class RawController:
    """Answers every stream opening with ``answer``, then reads and says nothing more.

    :data:`~sn_monitor.report_stream.SWITCHING`: a controller that hangs once its stream
    is open; an HTTP answer: whatever that answer stands for.
    """

    def __init__(self, answer: bytes = SWITCHING) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.conns.append(conn)
            conn.settimeout(5)
            conn.recv(65536)
            conn.sendall(self.answer)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
        for conn in self.conns:
            conn.close()


def test_a_controller_that_stops_answering_is_left_for_the_next(
        lane_server: Server, harness: Harness, clock: ManualClock, tmp_path: Path) -> None:
    silent = RawController()
    reporter = make_reporter([silent.url, lane_server.url], tmp_path, clock, timeout=0.5)
    try:
        reporter.report(snapshot(clock))  # the first report on a stream asks: no answer
        assert reporter.failures_total == 1
        assert reporter.in_use == lane_server.url
        assert reporter.streaming
        for _ in range(3):
            clock.advance(ASK_EVERY_SECONDS)
            reporter.report(snapshot(clock))
        assert reporter.failures_total == 1
        assert reporter.in_use == lane_server.url
    finally:
        reporter.close()
        silent.close()


def test_a_stream_the_controller_closed_is_dropped_and_a_gone_controller_is_a_failure(
        app: ControllerApp, harness: Harness, clock: ManualClock, tmp_path: Path) -> None:
    first = Server(app)
    reporter = make_reporter(first.url, tmp_path, clock)
    try:
        reporter.report(snapshot(clock))
        assert reporter.streaming
        first.stop()  # closes its streams
        clock.advance(1.0)
        reporter.report(snapshot(clock))  # nothing listens: a failure, and backoff
        assert reporter.failures_total == 1
        assert not reporter.streaming
    finally:
        reporter.close()


STANDBY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
           b"X-SN-Controller-Role: standby\r\nRetry-After: 30\r\nContent-Length: 21\r\n"
           b"\r\n{\"error\": \"standby\"}")


def test_a_standby_answering_the_opening_sends_the_report_on_to_the_next_at_once(
        lane_server: Server, harness: Harness, clock: ManualClock, tmp_path: Path) -> None:
    standby = RawController(STANDBY)
    reporter = make_reporter([standby.url, lane_server.url], tmp_path, clock)
    try:
        reporter.report(snapshot(clock))
        assert reporter.in_use == lane_server.url
        assert reporter.backoff_until is None  # no backoff, whatever its Retry-After
        assert reporter.streaming
        assert reported_sequence(harness) == 1
    finally:
        reporter.close()
        standby.close()


def test_an_opening_refused_for_its_token_is_a_refusal_logged_once_not_a_post(
        lane_server: Server, clock: ManualClock, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    spool = EventSpool(tmp_path / "spool", clock=clock)
    reporter = Reporter(lane_server.url, "not-a-token", NODE, {}, clock, spool,
                        rng=random.Random(0))
    try:
        with caplog.at_level(logging.ERROR, logger="sn_monitor.agent.reporter"):
            for _ in range(3):
                reporter.report(snapshot(clock))
                clock.advance(60.0)  # past any backoff
        assert reporter.failures_total == 3
        assert not reporter.streaming
        assert reporter._poster.session is None  # never fell back to posting
        refusals = [r.getMessage() for r in caplog.records]
        assert refusals == [f"controller {lane_server.url} refused the report (401): "
                            "missing or unknown bearer token"]
    finally:
        reporter.close()
