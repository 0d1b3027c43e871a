"""The reporter on the reports' stream, against the real controller app on uvicorn.

test_reporter drives the reporter against a tiny HTTP server that has no stream (it
answers the opening 501), so everything there is the posted path; here the controller
is the real one (test_report_lane's server, the harness of test_controller_service).
"""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sn_monitor.agent.reporter import ACK_EVERY_SECONDS, STREAM_RETRY_SECONDS, Reporter
from sn_monitor.agent.spool import EventSpool
from sn_monitor.clock import ManualClock
from sn_monitor.controller.app import ControllerApp, build_app
from sn_monitor.controller.auth import TokenBook
from sn_monitor.model import Command
from tests.unit.test_controller_api import AGENT, write_tokens
from tests.unit.test_controller_service import T0, Harness
from tests.unit.test_reporter import Controller as PostOnlyController
from tests.unit.test_reporter import snapshot, xid
from tests.unit.test_tls import Server

NODE = "gpu-node-017"


@pytest.fixture
def app(harness: Harness, tmp_path: Path) -> ControllerApp:
    return build_app(harness.controller, TokenBook.load(write_tokens(tmp_path)), 1 << 20)


@pytest.fixture
def server(app: ControllerApp) -> Iterator[Server]:
    s = Server(app)
    yield s
    s.stop()


def make_reporter(urls: str | list[str], tmp_path: Path, clock: ManualClock,
                  timeout: float = 2.0) -> Reporter:
    spool = EventSpool(tmp_path / "spool", clock=clock)
    return Reporter(urls, AGENT, NODE, {"supernode": "sn0"}, clock, spool, timeout=timeout,
                    rng=random.Random(0))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


def reported_sequence(harness: Harness) -> int | None:
    view = harness.controller.registry.get(NODE)
    return view.report.sequence if view is not None and view.report is not None else None


def test_reports_go_on_one_stream_and_reach_the_controller(server: Server, harness: Harness,
                                                           clock: ManualClock,
                                                           tmp_path: Path) -> None:
    reporter = make_reporter(server.url, tmp_path, clock)
    try:
        for _ in range(6):
            reporter.report(snapshot(clock))
            clock.advance(1.0)
        assert reporter.streaming
        assert reporter.failures_total == 0
        # the last report asked for nothing: the controller has it all the same
        for _ in range(100):
            if reported_sequence(harness) == 6:
                break
            threading.Event().wait(0.05)
        assert reported_sequence(harness) == 6
    finally:
        reporter.close()


def test_events_on_a_stream_are_acknowledged_and_leave_the_spool(
        server: Server, harness: Harness, clock: ManualClock, tmp_path: Path) -> None:
    reporter = make_reporter(server.url, tmp_path, clock)
    try:
        reporter.report(snapshot(clock))  # the stream opens
        clock.advance(1.0)
        for _ in range(20):  # the writer stores them off the event loop: a few reports
            if reporter.spool.pending_count == 0 and reporter.sequence > 1:
                break
            reporter.report(snapshot(clock, xid(1)) if reporter.sequence == 1
                            else snapshot(clock))
            clock.advance(1.0)
            threading.Event().wait(0.05)
        assert reporter.spool.pending_count == 0
        assert reporter.streaming
        assert [e["message"] for e in harness.store.list_events(NODE)] == ["Xid 13 #1"]
    finally:
        reporter.close()


def test_a_command_comes_with_the_next_report_without_being_asked_for(
        server: Server, harness: Harness, clock: ManualClock, tmp_path: Path) -> None:
    reporter = make_reporter(server.url, tmp_path, clock)
    try:
        assert reporter.report(snapshot(clock)) == []
        clock.advance(1.0)
        harness.drivers.queue.put(NODE, Command(id="c-1", kind="throttle", gpu=0,
                                                power_watts=500.0))
        commands = reporter.report(snapshot(clock))  # asks for nothing
        for _ in range(50):  # its answer comes on its own; read before the next report
            if commands:
                break
            threading.Event().wait(0.05)
            clock.advance(1.0)
            commands = reporter.report(snapshot(clock))
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


class SilentController:
    """Opens streams and then never answers (a controller that hangs)."""

    def __init__(self) -> None:
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
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n"
                         b"Upgrade: sn-reports/1\r\n\r\n")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
        for conn in self.conns:
            conn.close()


def test_a_controller_that_stops_answering_is_left_for_the_next(
        server: Server, harness: Harness, clock: ManualClock, tmp_path: Path) -> None:
    silent = SilentController()
    reporter = make_reporter([silent.url, server.url], tmp_path, clock, timeout=0.5)
    try:
        reporter.report(snapshot(clock))  # the first report on a stream asks: no answer
        assert reporter.failures_total == 1
        assert reporter.in_use == server.url
        assert reporter.streaming
        for _ in range(3):
            clock.advance(ACK_EVERY_SECONDS)
            reporter.report(snapshot(clock))
        assert reporter.failures_total == 1
        assert reporter.in_use == server.url
    finally:
        reporter.close()
        silent.close()


def test_a_stream_the_controller_closed_is_opened_again_for_the_next_report(
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
