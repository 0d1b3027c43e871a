"""Event-only reports: the fast path's events sent at once, between two sampled reports."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sn_monitor.agent.commands import CommandExecutor
from sn_monitor.agent.daemon import ReportLoop
from sn_monitor.agent.guard import ThermalGuard
from sn_monitor.agent.report import build_events_report
from sn_monitor.agent.settings import GuardSettings
from sn_monitor.clock import ManualClock
from sn_monitor.controller.ingest.decode import decode_report
from tests.support.reporter import Controller, make_reporter, snapshot, xid

WAIT = 10.0


@pytest.fixture
def controller() -> Iterator[Controller]:
    server = Controller()
    yield server
    server.close()


def test_send_events_sends_a_valid_events_only_report(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    reporter.report(snapshot(clock), set())
    clock.advance(0.3)
    reporter.spool_events([xid(1), xid(2)])
    assert reporter.send_events() == []
    _, _, body = controller.requests[-1]
    report = decode_report(body)  # what the controller's ingest makes of it
    assert report.events_only
    assert (report.node, report.instance, report.sequence) == (
        "gpu-node-017", reporter.instance, 2)  # the sampled reports' sequence
    assert report.sample_time_seconds == clock.time()
    assert [(e.id, e.kind, e.code, e.gpu) for e in report.events] == [
        (0, "xid", 13, 0), (1, "xid", 13, 0)]
    assert (report.gpus, report.infiniband, report.network, report.host, report.findings,
            report.topology) == ([], [], [], None, [], None)
    assert report.labels == {"supernode": "sn0"}
    assert reporter.spool.pending_count == 0  # the answer acknowledged them
    reporter.close()


def test_send_events_with_nothing_spooled_sends_nothing(controller, tmp_path):
    reporter = make_reporter(controller.url, tmp_path, ManualClock())
    assert reporter.send_events() == []
    assert controller.requests == []
    reporter.close()


def test_an_events_only_report_needs_an_event():
    with pytest.raises(ValueError, match="at least one event"):
        build_events_report("n1", instance="i", sequence=1, time_seconds=1.0, labels={},
                            interval=1.0, events=[])


def test_a_controller_refusing_events_only_reports_gets_the_events_with_the_next_sample(
        controller, tmp_path, caplog):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    reporter.spool_events([xid(1)])
    controller.script.append(
        (400, {"error": "malformed report: Object contains unknown field `events_only`"}, {}))
    caplog.set_level(logging.WARNING, logger="sn_monitor.agent.reporter")
    reporter.send_events()
    assert reporter.spool.pending_count == 1  # kept
    assert reporter.backoff_until is None  # the next sample is reported as usual
    reporter.spool_events([xid(2)])
    reporter.send_events()  # not to this controller again
    assert len(controller.requests) == 1
    reporter.report(snapshot(clock), set())
    sampled = controller.reports()[-1]
    assert not sampled.events_only
    assert [e.id for e in sampled.events] == [0, 1]
    assert reporter.spool.pending_count == 0
    assert len([r for r in caplog.records if "event-only" in r.getMessage()]) == 1
    reporter.close()


def executor(tmp_path: Path, clock: ManualClock) -> CommandExecutor:
    """An agent's executor (no command comes in these tests)."""

    def no_power(gpu: int, watts: float) -> None:
        raise AssertionError("no power limit is set in these tests")

    return CommandExecutor(ThermalGuard(GuardSettings(), no_power, tmp_path, clock), clock)


def test_report_loop_sends_events_now_without_waiting_for_a_sample(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    answered = threading.Event()
    original = controller.reply

    def reply(body: bytes):
        outcome = original(body)
        answered.set()
        return outcome

    controller.reply = reply
    loop = ReportLoop(reporter, executor(tmp_path, clock))
    loop.start()
    reporter.spool_events([xid(7)])
    loop.send_events_now()
    assert answered.wait(WAIT)
    loop.stop(timeout=WAIT)
    [report] = controller.reports()
    assert report.events_only
    assert [e.message for e in report.events] == ["Xid 13 #7"]
    reporter.close()


def test_report_loop_puts_due_events_in_the_waiting_snapshot_report(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    loop = ReportLoop(reporter, executor(tmp_path, clock))
    reporter.spool_events([xid(3)])
    loop.offer(snapshot(clock), frozenset())
    loop.send_events_now()  # both due before the thread runs: one sampled report
    answered = threading.Event()
    original = controller.reply

    def reply(body: bytes):
        outcome = original(body)
        answered.set()
        return outcome

    controller.reply = reply
    loop.start()
    assert answered.wait(WAIT)
    loop.stop(timeout=WAIT)
    [report] = controller.reports()
    assert not report.events_only
    assert [e.message for e in report.events] == ["Xid 13 #3"]
    reporter.close()
