"""Plain webhooks: one signed JSON POST per action.

The body (UTF-8 JSON, keys sorted, no spaces) is::

    {"id": "<action id>", "action": "alert", "node": "gpu-node-017", "gpu": 3,
     "rule": "gpu-overheat", "severity": "critical", "reason": "...",
     "labels": {...}, "params": {...}, "status": "firing" | "resolved",
     "incident_id": 42, "created": 1700000000.0}

``status`` is ``params["status"]`` (default ``firing``); ``created`` is when the action
was recorded (unix seconds).

How a receiver verifies it — two schemes, same key, pick one:

1. `Standard Webhooks <https://www.standardwebhooks.com/>`_ (libraries exist for most
   languages): headers ``webhook-id`` (the action id; the same on every retry, so use it
   to drop duplicates), ``webhook-timestamp`` (unix seconds; reject if far from now, to
   stop replays) and ``webhook-signature: v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>``.
2. Simple: ``X-SN-Signature: sha256=<hex HMAC-SHA256(key, body)>``.

Compute the HMAC over the raw body bytes as received, and compare with a constant-time
comparison. The key: a secret that starts with ``whsec_`` is base64 after the prefix
(the Standard Webhooks format) and its decoded bytes are the key; the specification
asks for 24 to 64 random bytes, and shorter or longer ones are refused at start
(``echo whsec_$(head -c 32 /dev/urandom | base64)`` makes one). Any other secret is
used as its UTF-8 bytes, for the simple scheme; the Standard Webhooks libraries
base64-decode every secret they are given, so give them (and us) a ``whsec_`` secret.
Without a secret, no signature headers are sent.

Per the specification, ``webhook-id`` stays the same across retries while
``webhook-timestamp`` is the time of each attempt; the signature header holds one
``v1,`` entry (a receiver splits it on spaces, for key rotation). A redirect is a failed
delivery, never followed (see :mod:`.http`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sn_monitor.clock import Clock, SystemClock
from sn_monitor.config import Duration, positive, setting
from sn_monitor.controller.actions.base import Outcome, PermanentError
from sn_monitor.controller.actions.drivers.http import HttpClient
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.transport import check_http_url

STANDARD_WEBHOOKS_PREFIX = "whsec_"
#: Key sizes the Standard Webhooks specification allows for a ``whsec_`` secret.
MIN_KEY_BYTES, MAX_KEY_BYTES = 24, 64


def _secret(value: str | None) -> None:
    if value is not None:
        signing_key(value)


@dataclass(frozen=True)
class WebhookSettings:
    """Where to POST and how to sign.

    ``secret_file`` (read once at start, surrounding whitespace stripped) keeps the key
    out of the config file; set at most one of ``secret`` and ``secret_file``.
    ``headers`` are added to every request (e.g. ``Authorization``) and never logged.
    """

    url: str = setting(check=check_http_url)
    secret: str | None = setting(default=None, check=_secret)
    secret_file: str | None = None
    timeout: Duration = setting(default=Duration(5.0), check=positive)
    headers: dict[str, str] = field(default_factory=dict)
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if self.secret is not None and self.secret_file is not None:
            raise ValueError("set secret or secret_file, not both")


def signing_key(secret: str) -> bytes:
    """The HMAC key for ``secret``: ``whsec_<base64>`` decoded, anything else as UTF-8."""
    if secret.startswith(STANDARD_WEBHOOKS_PREFIX):
        try:
            key = base64.b64decode(secret[len(STANDARD_WEBHOOKS_PREFIX):], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a whsec_ secret must be base64 after the prefix") from None
        if not key:
            raise ValueError("the whsec_ secret is empty")
        if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
            raise ValueError(f"a whsec_ secret must decode to {MIN_KEY_BYTES} to "
                             f"{MAX_KEY_BYTES} bytes (Standard Webhooks), got {len(key)}")
        return key
    if not secret:
        raise ValueError("the secret is empty")
    return secret.encode("utf-8")


def sign(key: bytes, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The signature headers for one delivery (both schemes, see the module docstring)."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    standard = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    simple = hmac.new(key, body, hashlib.sha256).hexdigest()
    return {
        "webhook-signature": f"v1,{standard}",
        "X-SN-Signature": f"sha256={simple}",
    }


def webhook_body(request: ActionRequest) -> bytes:
    """The JSON body for ``request``: exactly the bytes that are signed and sent."""
    doc: dict[str, Any] = {
        "id": request.id,
        "action": request.action,
        "node": request.node,
        "gpu": request.gpu,
        "rule": request.rule,
        "severity": request.severity,
        "reason": request.reason,
        "labels": dict(request.labels),
        "params": dict(request.params),
        "status": alert_status(request),
        "incident_id": request.incident_id,
        "created": request.created_seconds,
    }
    try:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as err:
        raise PermanentError(f"action params are not JSON: {err}") from None
    return text.encode("utf-8")


def alert_status(request: ActionRequest) -> str:
    """``params["status"]``: ``firing`` (the default) or ``resolved``."""
    status = request.params.get("status", "firing")
    if status not in ("firing", "resolved"):
        raise PermanentError(f"params.status must be firing or resolved, got {status!r}")
    return str(status)


class WebhookDriver:
    """POSTs every action it is given, signed, to one URL.

    Idempotent in the sense that matters: a retry carries the same ``webhook-id``, so a
    receiver that drops duplicates sees each action once.
    """

    name = "webhook"
    idempotent = True

    def __init__(self, settings: WebhookSettings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        secret = settings.secret
        if settings.secret_file is not None:
            try:
                secret = Path(settings.secret_file).read_text(encoding="utf-8").strip()
            except OSError as err:
                raise ValueError(f"cannot read secret_file: {err.strerror}") from None
        self._key = signing_key(secret) if secret is not None else None
        self.http = HttpClient(self.name, timeout=settings.timeout, headers=settings.headers,
                               verify=settings.ca_file or True)

    def run(self, request: ActionRequest) -> Outcome:
        """POST the action; 2xx is success, anything else raises (see actions.http)."""
        if "." in request.id or not request.id:
            # The signed content is "{id}.{timestamp}.{body}": a dot in the id would let
            # one (id, timestamp) pair pass for another (the specification forbids it).
            raise PermanentError(f"action id {request.id!r} cannot be a webhook-id")
        body = webhook_body(request)
        timestamp = int(self.clock.time())
        headers = {"webhook-id": request.id, "webhook-timestamp": str(timestamp)}
        if self._key is not None:
            headers.update(sign(self._key, request.id, timestamp, body))
        response = self.http.post(self.settings.url, body, headers)
        where = self.http.where(self.settings.url)
        return Outcome(f"posted to {where}", {"status": response.status, "url": where})

    def reconcile(self, request: ActionRequest) -> bool | None:
        """A webhook cannot be asked whether it got a message: unknown."""
        return None

    def close(self) -> None:
        """Close the HTTP session."""
        self.http.close()
