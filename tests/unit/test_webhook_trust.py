"""Outgoing webhooks as a receiver sees them: signed per Standard Webhooks, never
redirected, and no credential in a log line or an audit record.

The verifier below is written from the specification (standard-webhooks/standard-webhooks,
``spec/standard-webhooks.md`` 1.0.0, "Signature scheme", "Webhook headers", "Verifying
signatures"), not from :mod:`sn_monitor.controller.actions.drivers.webhook`: if both were wrong
the same way, the known-answer vector (from the reference library's own tests) would
still catch it. The servers are real HTTP servers on 127.0.0.1; the controller around
the drivers is the real one (see test_controller_service).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.actions.base import PermanentError
from sn_monitor.controller.actions.drivers.alertmanager import AlertmanagerSettings
from sn_monitor.controller.actions.drivers.http import REQUEST_LINES
from sn_monitor.controller.actions.drivers.slack import SlackSettings
from sn_monitor.controller.actions.drivers.webhook import (
    WebhookDriver,
    WebhookSettings,
    sign,
    signing_key,
)
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.settings import DriverSettings
from tests.drivers.servers import RecordingHTTPServer, Reply
from tests.support.drivers_http import request as driver_request
from tests.support.harness import Harness, make_harness, rules_from, xid

#: The specification's recommended replay window.
TOLERANCE_SECONDS = 5 * 60
KEY = bytes(range(32))
WHSEC = "whsec_" + base64.b64encode(KEY).decode()


class Rejected(Exception):
    """The delivery does not verify."""


def verify(secret: str, headers: Mapping[str, str], body: bytes, now: float) -> None:
    """A Standard Webhooks receiver (symmetric scheme), from the specification's text.

    Raises :class:`Rejected` naming the first check that failed.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id = lower.get("webhook-id")
    timestamp = lower.get("webhook-timestamp")
    signatures = lower.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        raise Rejected("missing webhook-id, webhook-timestamp or webhook-signature")
    if "." in msg_id:
        raise Rejected("a webhook-id must not contain '.'")
    if not timestamp.isdigit():
        raise Rejected(f"webhook-timestamp is not integer unix seconds: {timestamp!r}")
    if abs(now - int(timestamp)) > TOLERANCE_SECONDS:
        raise Rejected("webhook-timestamp outside the tolerance")
    if not secret.startswith("whsec_"):
        raise Rejected("not a whsec_ secret")
    key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    content = msg_id.encode() + b"." + timestamp.encode() + b"." + body
    expected = hmac.new(key, content, hashlib.sha256).digest()
    for entry in signatures.split(" "):
        version, _, value = entry.partition(",")
        if version != "v1":
            continue  # v1a (asymmetric) and unknown versions are someone else's
        try:
            candidate = base64.b64decode(value, validate=True)
        except binascii.Error:
            continue
        if hmac.compare_digest(candidate, expected):
            return
    raise Rejected("no v1 signature matches")


def request(**overrides: Any) -> ActionRequest:
    """test_drivers_http's action, with an id that is not all letters and digits."""
    return driver_request(**{"id": "0f3c9a", **overrides})


# ------------------------------------------------------------------ signing


def test_known_answer_vector_from_the_reference_library() -> None:
    # standard-webhooks libraries/python/tests/test_webhooks.py, test_sign_function
    key = signing_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    headers = sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert headers["webhook-signature"] == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_a_delivery_verifies_with_an_independent_receiver(server: RecordingHTTPServer) -> None:
    clock = ManualClock(1_700_000_123.0)
    driver = WebhookDriver(WebhookSettings(url=server.url + "/hook", secret=WHSEC),
                           clock=clock)
    driver.run(request())
    (call,) = server.calls("POST", "/hook")
    # The exact header names of the specification, as sent on the wire.
    sent = set(call.headers)
    assert {"webhook-id", "webhook-timestamp", "webhook-signature"} <= sent
    assert call.header("webhook-id") == "0f3c9a"
    assert call.header("webhook-timestamp") == "1700000123"
    assert call.header("webhook-signature").startswith("v1,")  # type: ignore[union-attr]
    verify(WHSEC, call.headers, call.body, now=clock.time())

    with pytest.raises(Rejected, match="no v1 signature"):
        verify(WHSEC, call.headers, call.body.replace(b"91 C", b"19 C"), now=clock.time())
    other = "whsec_" + base64.b64encode(bytes(32)).decode()
    with pytest.raises(Rejected, match="no v1 signature"):
        verify(other, call.headers, call.body, now=clock.time())
    with pytest.raises(Rejected, match="tolerance"):
        verify(WHSEC, call.headers, call.body, now=clock.time() + TOLERANCE_SECONDS + 1)
    # the signed body is the body sent: parse and re-serialize would not verify
    assert json.loads(call.body)["id"] == "0f3c9a"


def test_a_retry_keeps_the_id_and_signs_a_new_timestamp(server: RecordingHTTPServer) -> None:
    clock = ManualClock(1_700_000_000.0)
    server.script("/hook", Reply(503), Reply(200))
    driver = WebhookDriver(WebhookSettings(url=server.url + "/hook", secret=WHSEC),
                           clock=clock)
    with pytest.raises(Exception, match="503"):
        driver.run(request())
    clock.advance(30)
    driver.run(request())
    first, second = server.calls("POST", "/hook")
    assert first.header("webhook-id") == second.header("webhook-id") == "0f3c9a"
    assert int(second.header("webhook-timestamp") or 0) \
        - int(first.header("webhook-timestamp") or 0) == 30
    verify(WHSEC, first.headers, first.body, now=1_700_000_000.0)
    verify(WHSEC, second.headers, second.body, now=clock.time())


@pytest.mark.parametrize("size", [16, 23, 65])
def test_whsec_keys_outside_the_specified_size_are_refused(size: int) -> None:
    secret = "whsec_" + base64.b64encode(bytes(size)).decode()
    with pytest.raises(ValueError, match="24 to 64 bytes"):
        signing_key(secret)


def test_an_id_with_a_dot_is_never_signed(server: RecordingHTTPServer) -> None:
    driver = WebhookDriver(WebhookSettings(url=server.url + "/hook", secret=WHSEC))
    with pytest.raises(PermanentError, match="webhook-id"):
        driver.run(request(id="a.b"))
    assert server.calls() == []


# ------------------------------------------------------------------ through the controller

XID_ALERT = """
- name: fatal-xid
  event: xid
  codes: [79]
  clear_after: 10m
  severity: critical
  actions: [alert]
"""

SECRETS = ("hunter2", "q-sekrit", "SLACKSECRET", "am-bearer-token", "hdr-token")


@pytest.fixture
def servers() -> Iterator[dict[str, RecordingHTTPServer]]:
    made = {name: RecordingHTTPServer() for name in ("webhook", "slack", "alertmanager")}
    for srv in made.values():
        srv.start()
    yield made
    for srv in made.values():
        srv.stop()


def _controller(tmp_path: Path, servers: dict[str, RecordingHTTPServer]) -> Harness:
    """A controller whose alerts go to a webhook, Slack and Alertmanager, every URL and
    header carrying a credential."""
    hook = servers["webhook"].url.replace("http://", "http://user:hunter2@")
    drivers = DriverSettings(
        webhook=WebhookSettings(url=hook + "/hook?token=q-sekrit", secret=WHSEC,
                                headers={"Authorization": "Bearer hdr-token"},
                                timeout=2.0),  # type: ignore[arg-type]
        slack=SlackSettings(url=servers["slack"].url + "/services/T0/B0/SLACKSECRET",
                            timeout=2.0),  # type: ignore[arg-type]
        alertmanager=AlertmanagerSettings(
            urls=[servers["alertmanager"].url],
            headers={"Authorization": "Bearer am-bearer-token"}, timeout=2.0),  # type: ignore[arg-type]
    )
    return make_harness(tmp_path, rules_from(XID_ALERT), drivers=drivers,
                        fake=("cordon", "evict", "failover"))


def _stored_text(h: Harness) -> str:
    """Every column of every action row, as text."""
    conn = sqlite3.connect(h.store.path)
    try:
        rows = conn.execute("SELECT * FROM actions").fetchall()
    finally:
        conn.close()
    return json.dumps(rows, default=str)


def test_no_credential_in_logs_or_audit_records(tmp_path: Path,
                                                servers: dict[str, RecordingHTTPServer],
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, urllib3's request lines included
    servers["webhook"].script("/hook", Reply(500, b"down"), Reply(200))
    servers["slack"].script("/services/T0/B0/SLACKSECRET", Reply(404, b"no_service"))
    h = _controller(tmp_path, servers)
    try:
        h.report("n1", events=[xid(0, 79, h.clock.time())])
        h.settle()
        h.clock.advance(60)
        h.controller.sweep()  # the runner retries the alert
        h.settle()
        (alert,) = h.actions("alert")
        assert servers["webhook"].calls("POST", "/hook"), "the webhook was never called"
        assert servers["alertmanager"].calls("POST", "/api/v2/alerts")
        assert servers["slack"].calls("POST")
        got = servers["webhook"].calls("POST", "/hook")[-1]
        assert got.query == {"token": ["q-sekrit"]}  # the credential did go where it belongs
        verify(WHSEC, got.headers, got.body, now=h.clock.time())

        logged = caplog.text
        stored = _stored_text(h)
        for secret in SECRETS:
            assert secret not in logged, f"{secret!r} in a log line"
            assert secret not in stored, f"{secret!r} in the audit trail"
            assert secret not in json.dumps(alert), f"{secret!r} in the API's action"
        # ... while the lines still say where things went
        assert "/services/T0/B0/SLACKSECRET" not in logged
        assert "POST /hook?… HTTP/1.1" in logged
        assert '"POST /… HTTP/1.1" 404' in logged
    finally:
        h.controller.close()
        h.store.close()


def test_a_redirect_is_a_failed_delivery_with_a_clear_message(
        tmp_path: Path, servers: dict[str, RecordingHTTPServer]) -> None:
    target = servers["webhook"].url + "/elsewhere?token=q-sekrit"
    servers["webhook"].script("/hook", Reply(302, b"", {"Location": target}))
    drivers = DriverSettings(webhook=WebhookSettings(
        url=servers["webhook"].url + "/hook", secret=WHSEC, timeout=2.0))  # type: ignore[arg-type]
    h = make_harness(tmp_path, rules_from(XID_ALERT), drivers=drivers,
                     fake=("cordon", "evict", "failover"))
    try:
        h.report("n1", events=[xid(0, 79, h.clock.time())])
        h.settle()
        (alert,) = h.actions("alert")
        assert alert["state"] == "failed", alert
        assert "302 redirect" in alert["outcome"], alert
        assert "not followed" in alert["outcome"], alert
        assert "q-sekrit" not in alert["outcome"]
        assert servers["webhook"].calls(path="/elsewhere") == []
        assert len(servers["webhook"].calls("POST", "/hook")) == 1  # permanent: no retry
        metrics = h.controller.metrics().decode()
        assert 'sn_actions_total{action="alert",outcome="failed"} 1.0' in metrics
    finally:
        h.controller.close()
        h.store.close()


def test_request_line_filter_redacts_only_request_lines() -> None:
    REQUEST_LINES.hide_path("https://hooks.example/services/A/B/C")
    line = logging.LogRecord("urllib3.connectionpool", logging.DEBUG, __file__, 1,
                             '%s://%s:%s "%s %s %s" %s %s',
                             ("https", "h", 443, "POST", "/services/A/B/C?x=1", "HTTP/1.1",
                              200, 2), None)
    assert REQUEST_LINES.filter(line)
    assert line.getMessage() == 'https://h:443 "POST /…?… HTTP/1.1" 200 2'
    other = logging.LogRecord("urllib3.connectionpool", logging.DEBUG, __file__, 1,
                              "Starting new HTTP connection (%d): %s:%s", (1, "h", 80), None)
    assert REQUEST_LINES.filter(other)
    assert other.getMessage() == "Starting new HTTP connection (1): h:80"
    assert REQUEST_LINES.redact("/plain") == "/plain"
