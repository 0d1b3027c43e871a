"""The HTTP wrapper, the webhook driver and the Slack driver against a real local server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import socket
from pathlib import Path

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.actions.base import PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.http import HttpClient
from sn_monitor.controller.actions.drivers.job_control import JobControlDriver
from sn_monitor.controller.actions.drivers.slack import SlackDriver, SlackSettings, slack_message
from sn_monitor.controller.actions.drivers.webhook import (
    WebhookDriver,
    WebhookSettings,
    signing_key,
)
from sn_monitor.transport import parse_retry_after, redact_url
from tests.drivers.servers import RecordingHTTPServer, Reply
from tests.support.drivers_http import request

SECRET_BYTES = b"0123456789abcdef0123456789abcdef"
WHSEC = "whsec_" + base64.b64encode(SECRET_BYTES).decode()


def webhook(url: str, secret: str | None = "s3cret", timeout: float = 2.0) -> WebhookDriver:
    return WebhookDriver(WebhookSettings(url=url, secret=secret, timeout=timeout),  # type: ignore[arg-type]
                         clock=ManualClock(1_700_000_123.0))


# ------------------------------------------------------------------ webhook


def test_webhook_posts_the_action_as_json(server: RecordingHTTPServer) -> None:
    outcome = webhook(server.url + "/hook").run(request())
    (call,) = server.calls("POST", "/hook")
    body = call.json()
    assert body == {
        "id": "act-1", "action": "alert", "node": "gpu-node-017", "gpu": 3,
        "rule": "gpu-overheat", "severity": "critical", "reason": "GPU 3 at 91 C",
        "labels": {"rack": "r12"}, "params": {"status": "firing"}, "status": "firing",
        "incident_id": 42, "created": 1_700_000_000.0,
    }
    assert call.header("Content-Type") == "application/json"
    assert call.header("webhook-id") == "act-1"
    assert call.header("webhook-timestamp") == "1700000123"
    assert outcome.details["status"] == 200


def test_webhook_status_defaults_to_firing_and_says_resolved(server: RecordingHTTPServer) -> None:
    driver = webhook(server.url + "/hook")
    driver.run(request(params={}))
    driver.run(request(id="act-2", params={"status": "resolved"}))
    first, second = server.calls("POST", "/hook")
    assert first.json()["status"] == "firing"
    assert second.json()["status"] == "resolved"
    with pytest.raises(PermanentError):
        driver.run(request(params={"status": "maybe"}))


def test_webhook_signatures_verify(server: RecordingHTTPServer) -> None:
    webhook(server.url + "/hook", secret="s3cret").run(request())
    (call,) = server.calls()
    key = b"s3cret"
    signed = f"{call.header('webhook-id')}.{call.header('webhook-timestamp')}.".encode() + call.body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert call.header("webhook-signature") == f"v1,{expected}"
    simple = hmac.new(key, call.body, hashlib.sha256).hexdigest()
    assert call.header("X-SN-Signature") == f"sha256={simple}"


def test_webhook_whsec_secret_is_base64_decoded(server: RecordingHTTPServer) -> None:
    assert signing_key(WHSEC) == SECRET_BYTES
    webhook(server.url + "/hook", secret=WHSEC).run(request())
    (call,) = server.calls()
    signed = f"act-1.{call.header('webhook-timestamp')}.".encode() + call.body
    expected = base64.b64encode(hmac.new(SECRET_BYTES, signed, hashlib.sha256).digest())
    assert call.header("webhook-signature") == "v1," + expected.decode()


def test_webhook_without_secret_sends_no_signature(server: RecordingHTTPServer) -> None:
    webhook(server.url + "/hook", secret=None).run(request())
    (call,) = server.calls()
    assert call.header("webhook-signature") is None
    assert call.header("X-SN-Signature") is None


def test_webhook_secret_file(server: RecordingHTTPServer, tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("from-file\n")
    WebhookDriver(WebhookSettings(url=server.url + "/h", secret_file=str(path))).run(request())
    (call,) = server.calls()
    assert call.header("X-SN-Signature") == "sha256=" + hmac.new(
        b"from-file", call.body, hashlib.sha256).hexdigest()


@pytest.mark.parametrize("secret", ["whsec_not base64!", "whsec_", ""])
def test_bad_secrets_are_refused_at_start(secret: str) -> None:
    with pytest.raises(ValueError, match="secret"):
        signing_key(secret)


@pytest.mark.parametrize(("status", "error"), [
    (500, TemporaryError), (502, TemporaryError), (503, TemporaryError),
    (408, TemporaryError), (409, TemporaryError), (429, TemporaryError),
    (400, PermanentError), (401, PermanentError), (403, PermanentError),
    (404, PermanentError), (422, PermanentError),
])
def test_status_codes_map_to_the_error_model(server: RecordingHTTPServer, status: int,
                                             error: type[Exception]) -> None:
    server.script("/hook", Reply(status, b"nope"))
    with pytest.raises(error, match=str(status)):
        webhook(server.url + "/hook").run(request())


def test_retry_after_is_passed_on(server: RecordingHTTPServer) -> None:
    server.script("/hook", Reply(429, b"slow down", {"Retry-After": "7"}))
    with pytest.raises(TemporaryError) as caught:
        webhook(server.url + "/hook").run(request())
    assert caught.value.retry_after == 7.0


def test_scripted_503_then_200(server: RecordingHTTPServer) -> None:
    server.script("/hook", Reply(503), Reply(503), Reply(200))
    driver = webhook(server.url + "/hook")
    for _ in range(2):
        with pytest.raises(TemporaryError):
            driver.run(request())
    driver.run(request())
    assert len(server.calls()) == 3  # no retries of its own: the runner does them


def test_redirect_is_not_followed(server: RecordingHTTPServer) -> None:
    server.script("/hook", Reply(302, b"", {"Location": server.url + "/elsewhere?token=x"}))
    with pytest.raises(PermanentError, match="redirect") as caught:
        webhook(server.url + "/hook").run(request())
    assert "token" not in str(caught.value)
    assert server.calls(path="/elsewhere") == []


def test_timeout_is_temporary(server: RecordingHTTPServer) -> None:
    server.script("/slow", Reply(200, delay=2.0))
    with pytest.raises(TemporaryError, match="timed out"):
        webhook(server.url + "/slow", timeout=0.2).run(request())


def test_connection_refused_is_temporary() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(TemporaryError, match="connection refused"):
        webhook(f"http://127.0.0.1:{port}/hook").run(request())


def test_credentials_never_reach_logs_or_errors(server: RecordingHTTPServer,
                                                caplog: pytest.LogCaptureFixture) -> None:
    host = server.url.removeprefix("http://")
    url = f"http://user:hunter2@{host}/hook?token=sekrit"
    server.script("/hook", Reply(500))
    # Our own loggers; urllib3's DEBUG lines quote the request line (a library, at DEBUG).
    caplog.set_level(logging.DEBUG, logger="sn_monitor")
    with pytest.raises(TemporaryError) as caught:
        webhook(url).run(request())
    text = str(caught.value) + caplog.text
    assert "hunter2" not in text
    assert "sekrit" not in text
    assert f"http://{host}/hook" in str(caught.value)


@pytest.mark.parametrize(("url", "secret_path", "shown"), [
    ("https://u:p@h.example:8443/a/b?t=1#f", False, "https://h.example:8443/a/b"),
    ("https://hooks.slack.com/services/T/B/X", True, "https://hooks.slack.com/…"),
    ("http://[::1]:9/x", False, "http://[::1]:9/x"),
    ("http://host:notaport/", False, "<invalid url>"),
])
def test_redact_url(url: str, secret_path: bool, shown: str) -> None:
    assert redact_url(url, secret_path=secret_path) == shown


def test_parse_retry_after() -> None:
    assert parse_retry_after("12") == 12.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0


def test_http_client_requires_a_timeout() -> None:
    with pytest.raises(ValueError, match="timeout"):
        HttpClient("x", timeout=0)


def test_settings_refuse_both_secret_and_file() -> None:
    with pytest.raises(ValueError, match="not both"):
        WebhookSettings(url="http://x/", secret="a", secret_file="/b")


# ------------------------------------------------------------------ slack


def test_slack_message_firing_and_resolved(server: RecordingHTTPServer) -> None:
    driver = SlackDriver(SlackSettings(url=server.url + "/services/T/B/secret"))
    driver.run(request())
    driver.run(request(id="act-2", params={"status": "resolved"}))
    firing, resolved = (c.json() for c in server.calls("POST"))
    assert firing["text"].startswith(":rotating_light: [CRITICAL] gpu-overheat on gpu-node-017")
    assert firing["attachments"][0]["color"] == "#d0021b"
    assert firing["blocks"][0]["type"] == "section"
    assert "incident #42" in json.dumps(firing["blocks"])
    assert "RESOLVED" in resolved["text"]
    assert "resolved" in resolved["blocks"][0]["text"]["text"]
    assert resolved["attachments"][0]["color"] == "#2eb67d"


def test_slack_errors_hide_the_webhook_path(server: RecordingHTTPServer) -> None:
    server.script("/services/T/B/secret", Reply(404, b"no_service"))
    driver = SlackDriver(SlackSettings(url=server.url + "/services/T/B/secret"))
    with pytest.raises(PermanentError, match="no_service") as caught:
        driver.run(request())
    assert "secret" not in str(caught.value)


def test_slack_severity_styles() -> None:
    assert slack_message(request(severity="warning"))["text"].startswith(":warning:")
    assert slack_message(request(severity="odd"))["attachments"][0]["color"] == "#f5a623"
    assert "cluster" in slack_message(request(node=None, gpu=None))["text"]


# ------------------------------------------------------------------ job control (webhook)


def test_job_control_posts_through_the_webhook(server: RecordingHTTPServer) -> None:
    driver = JobControlDriver(webhook=webhook(server.url + "/control"))
    outcome = driver.run(request(action="restore", params={"job": "trillion",
                                                           "checkpoint": "/ckpt/step-900"}))
    (call,) = server.calls("POST", "/control")
    assert call.json()["action"] == "restore"
    assert call.json()["params"]["checkpoint"] == "/ckpt/step-900"
    assert outcome.details["via"] == "webhook"
    with pytest.raises(PermanentError):
        driver.run(request(action="cordon"))
    with pytest.raises(ValueError, match="exactly one"):
        JobControlDriver()
