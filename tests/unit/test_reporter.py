from __future__ import annotations

import logging
import random
import re
import socket
from collections.abc import Iterator

import msgspec
import pytest

from sn_monitor.agent.reporter import REPORTS_PATH, RULES_RETRY_SECONDS, Reporter
from sn_monitor.agent.spool import EventSpool
from sn_monitor.clock import ManualClock
from sn_monitor.model import CommandResult, Event
from sn_monitor.transport import TokenError, error_text, is_standby, read_token, redact_url
from tests.support.ports import free_port
from tests.support.reporter import TOKEN, Controller, make_reporter, snapshot, xid


@pytest.fixture
def controller() -> Iterator[Controller]:
    server = Controller()
    yield server
    server.close()


def test_happy_path(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    controller.commands = [{"id": "c1", "kind": "throttle", "gpu": 0, "power_watts": 500.0}]
    commands = reporter.report(snapshot(clock, xid(1), xid(2)), {0})
    path, headers, _ = controller.requests[0]
    assert path == "/api/v1/reports"
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["Content-Type"] == "application/json"
    [report] = controller.reports()
    assert report.node == "gpu-node-017"
    assert report.labels == {"supernode": "sn0"}
    assert report.sequence == 1
    assert report.gpus[0].guard_throttled
    assert [(e.id, e.message) for e in report.events] == [(0, "Xid 13 #1"), (1, "Xid 13 #2")]
    assert [(c.id, c.kind, c.power_watts) for c in commands] == [("c1", "throttle", 500.0)]
    assert reporter.spool.pending_count == 0
    assert reporter.failures_total == 0
    assert reporter.last_success_wall == clock.time()
    reporter.close()


def test_sequence_increments_and_instance_is_stable(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    for _ in range(3):
        clock.advance(1.0)
        reporter.report(snapshot(clock), set())
    reports = controller.reports()
    assert [r.sequence for r in reports] == [1, 2, 3]
    assert {r.instance for r in reports} == {reporter.instance}
    assert re.fullmatch(r"[0-9a-f]{32}", reporter.instance)
    other = make_reporter(controller.url, tmp_path / "other", clock)
    assert other.instance != reporter.instance  # random per agent start
    assert len(controller.requests) == 3
    reporter.close()


def test_command_results_are_sent_until_the_controller_has_them(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    reporter.add_command_results([CommandResult(id="c1", ok=True, time_seconds=1.0)])
    controller.script.append((503, {"error": "busy"}, {}))
    reporter.report(snapshot(clock), set())
    clock.advance(60)
    reporter.report(snapshot(clock), set())
    clock.advance(60)
    reporter.report(snapshot(clock), set())
    assert [[r.id for r in rep.command_results] for rep in controller.reports()] == [
        ["c1"], ["c1"], []]
    reporter.close()


def test_controller_down_then_up_delivers_every_event_in_order(tmp_path, caplog):
    clock = ManualClock()
    port = free_port()
    reporter = make_reporter(f"http://127.0.0.1:{port}", tmp_path, clock,
                             max_events_per_report=2)
    sent = 0
    delays: list[float] = []
    with caplog.at_level(logging.DEBUG):
        for _ in range(120):  # two minutes without a controller
            clock.advance(1.0)
            before = reporter.reports_total
            commands = reporter.report(snapshot(clock, xid(sent)), set())
            sent += 1
            assert commands == []
            if reporter.reports_total != before:  # it tried, and failed
                assert reporter.backoff_until is not None
                delays.append(reporter.backoff_until - clock.monotonic())
    assert TOKEN not in caplog.text
    assert reporter.failures_total == len(delays)
    # Backoff: from one interval, doubling with +-20 % jitter, never past 10 s, so far
    # fewer attempts than cycles.
    assert 0.8 <= delays[0] <= 1.2
    assert 1.6 <= delays[1] <= 2.4
    assert max(delays) <= 10.0
    assert delays[-1] >= 8.0
    assert reporter.failures_total < 25
    assert reporter.spool.pending_count == 120
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith(f"controller http://127.0.0.1:{port} unreachable: "
                              "connection refused; retrying in ")

    up = Controller(port)
    try:
        for _ in range(200):
            if reporter.spool.pending_count == 0:
                break
            clock.advance(1.0)
            reporter.report(snapshot(clock), set())
        delivered = [e.id for r in up.reports() for e in r.events]
        assert delivered == list(range(120))
        assert all(len(r.events) <= 2 for r in up.reports())
        assert reporter.backoff_until is None
        assert up.requests[0][1]["Authorization"] == f"Bearer {TOKEN}"
    finally:
        up.close()
        reporter.close()


def test_spooled_events_survive_an_agent_restart(tmp_path):
    clock = ManualClock()
    port = free_port()
    first = make_reporter(f"http://127.0.0.1:{port}", tmp_path, clock)
    first.report(snapshot(clock, xid(0), xid(1)), set())
    first.close()
    up = Controller(port)
    try:
        second = make_reporter(up.url, tmp_path, clock)
        second.report(snapshot(clock, xid(2)), set())
        assert [e.id for e in up.reports()[0].events] == [0, 1, 2]
        assert up.reports()[0].instance == second.instance != first.instance
        second.close()
    finally:
        up.close()


def test_bad_request_message_is_logged_once(controller, tmp_path, caplog):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    message = "Expected `float`, got `str` - at `$.gpus[0].power_watts`"
    for _ in range(3):
        controller.script.append((400, {"error": message}, {}))
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            clock.advance(60.0)
            reporter.report(snapshot(clock, xid(0)), set())
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert message in errors[0].getMessage()
    assert "400" in errors[0].getMessage()
    assert reporter.failures_total == 3
    assert reporter.spool.pending_count == 3  # kept for when the controller accepts reports
    controller.script.append((401, b"bad token", {}))
    clock.advance(60.0)
    reporter.report(snapshot(clock), set())
    assert "bad token" in caplog.records[-1].getMessage()
    assert TOKEN not in caplog.text
    reporter.close()


def test_429_honours_retry_after(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    controller.script.append((429, {"error": "slow down"}, {"Retry-After": "10"}))
    reporter.report(snapshot(clock), set())
    assert reporter.backoff_until == pytest.approx(clock.monotonic() + 10.0)
    clock.advance(9.0)
    reporter.report(snapshot(clock), set())
    assert len(controller.requests) == 1  # no call while backing off
    clock.advance(1.0)
    reporter.report(snapshot(clock), set())
    assert len(controller.requests) == 2
    assert reporter.failures_total == 1
    reporter.close()


def test_unknown_command_gets_a_failed_result_and_the_rest_still_run(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    controller.commands = [{"id": "new", "kind": "self_destruct"},
                           {"id": "ok", "kind": "release", "gpu": 1}]
    commands = reporter.report(snapshot(clock, xid(0)), set())
    assert [c.id for c in commands] == ["ok"]
    assert reporter.spool.pending_count == 0  # the reply still acknowledged the event
    reporter.report(snapshot(clock), set())
    [result] = controller.reports()[1].command_results
    assert result.id == "new"
    assert not result.ok
    reporter.close()


def test_an_acknowledgement_past_what_was_sent_is_clamped(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock, max_events_per_report=1)
    controller.script.append((200, {"sequence": 1, "events_stored_through": 5}, {}))
    reporter.report(snapshot(clock, xid(0), xid(1), xid(2)), set())
    assert reporter.spool.pending_count == 2  # only event 0 was sent, so only it is dropped
    reporter.close()


def test_big_events_are_split_across_reports_to_stay_under_the_body_limit(
        controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    big = [Event("xid", "kmsg", float(n), "x" * 4000, code=13) for n in range(300)]
    reporter.report(snapshot(clock, *big), set())
    while reporter.spool.pending_count:
        reporter.report(snapshot(clock), set())
    sizes = [len(body) for _, _, body in controller.requests]
    assert len(sizes) == 3
    assert max(sizes) < 1 << 20
    assert [e.id for r in controller.reports() for e in r.events] == list(range(300))
    reporter.close()


def test_a_garbled_reply_is_a_failure(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    controller.script.append((200, b"<html>proxy</html>", {}))
    assert reporter.report(snapshot(clock, xid(0)), set()) == []
    assert reporter.failures_total == 1
    assert reporter.spool.pending_count == 1
    reporter.close()


def test_read_token(tmp_path):
    path = tmp_path / "agent.token"
    path.write_text(f"  {TOKEN}\n")
    assert read_token(path) == TOKEN
    path.write_text("\n")
    with pytest.raises(TokenError, match="is empty"):
        read_token(path)
    with pytest.raises(TokenError, match="cannot read token file"):
        read_token(tmp_path / "missing")


# ------------------------------------------------------- several controllers (HA)

STANDBY = (503, {"error": "standby", "active": "ctl-a"},
           {"Retry-After": "1", "X-SN-Controller-Role": "standby"})


@pytest.fixture
def second() -> Iterator[Controller]:
    server = Controller()
    yield server
    server.close()


def test_first_controller_refuses_connections_the_second_gets_the_report_at_once(
        controller, tmp_path, caplog):
    clock = ManualClock()
    dead = f"http://127.0.0.1:{free_port()}"
    reporter = make_reporter([dead, controller.url], tmp_path, clock)
    with caplog.at_level(logging.INFO, logger="sn_monitor.agent.reporter"):
        reporter.report(snapshot(clock, xid(0)), set())
    assert [r.sequence for r in controller.reports()] == [1]  # the same cycle, no wait
    assert reporter.backoff_until is None
    assert reporter.url == reporter.in_use == controller.url
    assert reporter.spool.pending_count == 0
    assert (reporter.reports_total, reporter.failures_total) == (2, 1)
    [switch] = [r for r in caplog.records if "switching" in r.getMessage()]
    assert switch.levelno == logging.INFO
    assert dead in switch.getMessage()
    assert controller.url in switch.getMessage()
    assert "unreachable" in switch.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert TOKEN not in caplog.text
    reporter.close()


def test_a_standby_answer_moves_on_without_waiting_its_retry_after(
        controller, second, tmp_path, caplog):
    clock = ManualClock()
    reporter = make_reporter([controller.url, second.url], tmp_path, clock)
    controller.script.append(STANDBY)
    with caplog.at_level(logging.INFO, logger="sn_monitor.agent.reporter"):
        commands = reporter.report(snapshot(clock, xid(0)), set())
    assert commands == []
    assert len(controller.requests) == 1
    assert [[e.id for e in r.events] for r in second.reports()] == [[0]]
    assert reporter.backoff_until is None  # Retry-After: 1 did not hold the report back
    assert reporter.url == second.url
    assert second.requests[0][1]["Authorization"] == f"Bearer {TOKEN}"
    [switch] = [r for r in caplog.records if "switching" in r.getMessage()]
    assert "standby" in switch.getMessage()
    message = switch.getMessage()
    assert message.index(controller.url + " ") < message.index(second.url)  # from, to
    reporter.close()


def test_an_unanswered_request_times_out_and_the_next_controller_gets_it(controller, tmp_path):
    clock = ManualClock()
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        hung = f"http://127.0.0.1:{silent.getsockname()[1]}"
        reporter = Reporter([hung, controller.url], TOKEN, "gpu-node-017", {}, clock,
                            EventSpool(tmp_path / "spool", clock=clock), timeout=0.2,
                            rng=random.Random(0))
        reporter.report(snapshot(clock, xid(0)), set())
    assert len(controller.reports()) == 1
    assert reporter.url == controller.url
    assert reporter.backoff_until is None
    reporter.close()


def test_it_stays_with_the_controller_that_last_accepted(controller, second, tmp_path):
    clock = ManualClock()
    reporter = make_reporter([controller.url, second.url], tmp_path, clock)
    reporter.report(snapshot(clock), set())
    assert reporter.in_use == controller.url
    assert reporter.switches_total == 0
    controller.script.append(STANDBY)  # a hand-over: the first became the standby
    for _ in range(5):
        clock.advance(1.0)
        reporter.report(snapshot(clock), set())
    assert len(controller.requests) == 2  # no going back while the second accepts
    assert len(second.requests) == 5
    assert reporter.in_use == second.url
    assert reporter.switches_total == 1
    second.script.append(STANDBY)  # and back again
    clock.advance(1.0)
    reporter.report(snapshot(clock), set())
    clock.advance(1.0)
    reporter.report(snapshot(clock), set())
    assert (len(controller.requests), len(second.requests)) == (4, 6)
    assert reporter.in_use == controller.url
    assert reporter.switches_total == 2
    assert reporter.failures_total == 2
    assert [r.sequence for r in controller.reports()] == [1, 2, 7, 8]  # 2: as standby
    reporter.close()


def test_when_every_controller_fails_the_backoff_applies(controller, tmp_path, caplog):
    clock = ManualClock()
    dead = f"http://127.0.0.1:{free_port()}"
    reporter = make_reporter([dead, controller.url], tmp_path, clock)
    controller.script.extend([STANDBY] * 3)
    with caplog.at_level(logging.DEBUG, logger="sn_monitor.agent.reporter"):
        reporter.report(snapshot(clock, xid(0)), set())
        assert (reporter.reports_total, len(controller.requests)) == (2, 1)  # one round
        assert reporter.backoff_until is not None
        first = reporter.backoff_until - clock.monotonic()
        assert 1.0 <= first <= 1.2  # one interval, jittered, and not below Retry-After
        assert reporter.url == dead  # the next round starts where this one did
        clock.advance(0.5)
        reporter.report(snapshot(clock), set())
        assert reporter.reports_total == 2  # no call while backing off
        clock.advance(1.0)
        reporter.report(snapshot(clock), set())
        assert (reporter.reports_total, len(controller.requests)) == (4, 2)
        assert 1.6 <= reporter.backoff_until - clock.monotonic() <= 2.4
        for _ in range(30):
            clock.advance(1.0)
            reporter.report(snapshot(clock), set())
    assert reporter.backoff_until is None  # the standby turned active (script ran out)
    assert reporter.in_use == controller.url
    assert reporter.failures_total == 7  # three rounds of two, then the dead one again
    assert [e.id for e in controller.reports()[3].events] == [0]  # the first accepted
    assert reporter.spool.pending_count == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "no controller accepted the report" in warnings[0]
    assert dead in warnings[0]
    assert "standby" in warnings[0]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert sum("switching" in m for m in infos) == 1  # once per outage, not per round
    assert any("reachable again" in m and controller.url in m for m in infos)
    assert TOKEN not in caplog.text
    reporter.close()


def test_events_are_delivered_exactly_once_across_a_failover(controller, second, tmp_path):
    clock = ManualClock()
    reporter = make_reporter([controller.url, second.url], tmp_path, clock,
                             max_events_per_report=2)
    reporter.report(snapshot(clock, xid(0), xid(1)), set())
    controller.script.append(STANDBY)  # sees events 2 and 3, stores nothing
    clock.advance(1.0)
    reporter.report(snapshot(clock, xid(2), xid(3)), set())
    controller.close()  # and then it is gone for good
    for n in range(4, 10):
        clock.advance(1.0)
        reporter.report(snapshot(clock, xid(n)), set())
    while reporter.spool.pending_count:
        clock.advance(1.0)
        reporter.report(snapshot(clock), set())
    accepted = [e.id for e in controller.reports()[0].events] + [
        e.id for r in second.reports() for e in r.events]
    assert accepted == list(range(10))
    assert reporter.failures_total == 1  # the standby; the first stays unasked after it
    reporter.close()


def test_a_plain_503_or_a_redirect_backs_off_on_the_same_controller(
        controller, second, tmp_path):
    clock = ManualClock()
    reporter = make_reporter([controller.url, second.url], tmp_path, clock)
    controller.script.append((503, {"error": "overloaded"}, {"Retry-After": "3"}))
    reporter.report(snapshot(clock, xid(0)), set())
    assert reporter.url == controller.url
    assert reporter.backoff_until == pytest.approx(clock.monotonic() + 3.0)
    controller.script.append((307, b"", {"Location": second.url + "/api/v1/reports"}))
    clock.advance(3.0)
    reporter.report(snapshot(clock), set())
    assert second.requests == []  # a redirect is a failed delivery, not followed
    assert reporter.url == controller.url
    assert reporter.failures_total == 2
    assert reporter.spool.pending_count == 1
    reporter.close()


def test_one_url_in_a_list_behaves_as_one_url(tmp_path):
    clock = ManualClock()
    reporter = make_reporter([f"http://127.0.0.1:{free_port()}/"], tmp_path, clock)
    reporter.report(snapshot(clock), set())
    assert reporter.failures_total == 1
    assert 0.8 <= reporter.backoff_until - clock.monotonic() <= 1.2
    assert reporter.endpoint.endswith(":" + reporter.url.rsplit(":", 1)[1] + REPORTS_PATH)
    reporter.close()


def test_the_controller_list_is_checked(tmp_path):
    clock = ManualClock()
    with pytest.raises(ValueError, match="no controller URL"):
        make_reporter([], tmp_path, clock)
    with pytest.raises(ValueError, match="one scheme"):
        make_reporter(["http://a:9848", "https://b:9848"], tmp_path, clock)


def test_credentials_in_a_url_stay_out_of_log_lines():
    assert redact_url("https://user:pw@ctl-a:9848/x?token=s") == "https://ctl-a:9848/x"
    assert redact_url("http://ctl-b:9848") == "http://ctl-b:9848"


@pytest.mark.parametrize(("status", "headers", "standby"), [
    (503, {"X-SN-Controller-Role": "standby"}, True),
    (503, {"x-sn-controller-role": "Standby "}, True),  # names as read off the wire
    (503, {"x-sn-controller-role": "active"}, False),
    (503, {}, False),
    (500, {"x-sn-controller-role": "standby"}, False),
])
def test_a_standby_answer_is_told_whatever_the_case_of_its_header(
        status: int, headers: dict[str, str], standby: bool) -> None:
    assert is_standby(status, headers) is standby


@pytest.mark.parametrize(("body", "text"), [
    (b'{"error": "missing or unknown bearer token"}', "missing or unknown bearer token"),
    (b'{"detail": "Not Found"}', "Not Found"),
    (b'["a", 1]', "['a', 1]"),
    (b"<html>bad gateway</html>\n", "<html>bad gateway</html>"),
    (b"\xff\xfe not utf-8", "\ufffd\ufffd not utf-8"),
    (b"", ""),
])
def test_an_error_answer_is_told_in_its_own_words(body: bytes, text: str) -> None:
    assert error_text(body) == text
    assert error_text(b'{"error": "' + b"x" * 50 + b'"}', limit=10) == "x" * 10


# ----------------------------------------------------------------- node-local rules

HOT_RULES = {"version": "v1", "keep": ["gpu_utilization_ratio"], "rules": [
    {"name": "gpu-overheat", "metric": "gpu_temperature_celsius", "above": 65}]}


def test_rules_in_a_reply_are_evaluated_on_the_next_samples_and_reports_are_trimmed(
        controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    controller.script.append((200, {"sequence": 1, "edge_rules": HOT_RULES}, {}))
    reporter.report(snapshot(clock))
    reporter.report(snapshot(clock, xid(1)))
    first, second = controller.reports()
    assert first.takes_rules
    assert first.rules_version == ""
    assert first.gpus[0].uuid == "GPU-0"
    assert second.rules_version == "v1"
    assert second.gpus == [type(second.gpus[0])(index=0)]  # no utilization sampled: nothing kept
    assert [(f.rule, f.subject, f.gpu, f.value) for f in second.findings] == [
        ("gpu-overheat", "gpu=0", 0, 70.0)]
    assert [e.message for e in second.events] == ["Xid 13 #1"]  # events still travel
    assert msgspec.json.decode(controller.requests[1][2])["labels"] == {"supernode": "sn0"}
    reporter.close()


def test_rules_that_are_not_rules_leave_the_reports_full(controller, tmp_path, caplog):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    controller.script.append((200, {"sequence": 1, "edge_rules": {"version": 5}}, {}))
    reporter.report(snapshot(clock))
    reporter.report(snapshot(clock))
    assert reporter.rules is None
    assert [(r.takes_rules, r.rules_version) for r in controller.reports()] == [
        (True, ""), (False, "")]
    assert reporter.failures_total == 0  # the reply's acknowledgement still counted
    assert any("node-local rules" in r.getMessage() for r in caplog.records)
    reporter.close()


def test_rules_the_agent_cannot_take_leave_the_reports_full_and_are_logged_once(
        controller, tmp_path, caplog):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    newer = {"version": "v2", "rules": [{"name": "x", "metric": "gpu_from_the_future",
                                         "above": 1}]}
    for n in range(3):
        controller.script.append((200, {"sequence": n + 1, "edge_rules": newer}, {}))
        reporter.report(snapshot(clock))
    reporter.report(snapshot(clock))
    assert [r.rules_version for r in controller.reports()] == ["", "", "", ""]
    # after the refusal it leaves every rule to the controller, until it asks again
    assert [r.takes_rules for r in controller.reports()] == [True, False, False, False]
    clock.advance(RULES_RETRY_SECONDS)
    reporter.report(snapshot(clock))
    assert controller.reports()[-1].takes_rules
    assert all(r.gpus[0].uuid == "GPU-0" for r in controller.reports())
    logged = [r for r in caplog.records if "node-local rules" in r.getMessage()]
    assert len(logged) == 1
    assert "gpu_from_the_future" in logged[0].getMessage()
    assert reporter.failures_total == 0
    reporter.close()
