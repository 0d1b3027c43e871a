"""Alerts to Alertmanager (``POST /api/v2/alerts``), the way Prometheus sends them.

Alertmanager forgets an alert at its ``endsAt``. Like Prometheus, we send a firing alert
with ``endsAt = now + 4 * resend_interval`` and re-send every firing alert each
``resend_interval`` (:meth:`AlertmanagerDriver.resend_firing`, called by the
controller), so an alert stays up while we keep saying so and resolves by itself within
four intervals if the controller dies. A resolved alert is sent once with
``endsAt = now`` and forgotten.

An alert's identity is its label set (Alertmanager's fingerprint): ``alertname`` (the
rule), ``node``, ``gpu`` when set, ``severity``, ``source=sn-monitor`` and the request's
labels. ``startsAt`` is kept from the first firing so re-sends do not move it.

Several URLs are the members of one Alertmanager cluster: each gets every alert (the
cluster deduplicates notifications); delivery succeeds if any member accepted it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sn_monitor.clock import Clock, SystemClock
from sn_monitor.config import Duration, optional, positive, setting
from sn_monitor.controller.actions.base import ActionError, Outcome, PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.http import HttpClient
from sn_monitor.controller.actions.drivers.webhook import alert_status
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.transport import check_http_url

log = logging.getLogger(__name__)

ALERTS_PATH = "/api/v2/alerts"
#: How many resend intervals a firing alert outlives its last send (as Prometheus does).
ENDS_AFTER_INTERVALS = 4
_LABEL_NAME_BAD = re.compile(r"[^A-Za-z0-9_]")


def _urls(value: list[str]) -> None:
    if not value:
        raise ValueError("name at least one Alertmanager URL")
    for url in value:
        check_http_url(url)


@dataclass(frozen=True)
class AlertmanagerSettings:
    """The members of one Alertmanager cluster and how often firing alerts are re-sent.

    ``urls`` are base URLs (``http://alertmanager:9093``, or with a path prefix when it
    sits behind a proxy); ``/api/v2/alerts`` is appended. ``generator_url`` links each
    alert back to the controller's UI or API.
    """

    urls: list[str] = setting(check=_urls)
    resend_interval: Duration = setting(default=Duration(60.0), check=positive)
    timeout: Duration = setting(default=Duration(5.0), check=positive)
    generator_url: str | None = setting(default=None, check=optional(check_http_url))
    headers: dict[str, str] = field(default_factory=dict)
    ca_file: str | None = None


def rfc3339(seconds: float) -> str:
    """Unix seconds -> ``2023-11-14T22:13:20.000Z`` (what Alertmanager parses)."""
    moment = datetime.fromtimestamp(seconds, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def label_name(name: str) -> str:
    """Make ``name`` a valid Prometheus label name (``a.b/c`` -> ``a_b_c``)."""
    clean = _LABEL_NAME_BAD.sub("_", name)
    return clean if clean and not clean[0].isdigit() else f"_{clean}"


def alert_labels(request: ActionRequest) -> dict[str, str]:
    """The label set (the alert's identity) for ``request``."""
    labels = {label_name(k): str(v) for k, v in request.labels.items()}
    labels.update({
        "alertname": request.rule or request.action,
        "severity": request.severity,
        "source": "sn-monitor",
    })
    if request.node is not None:
        labels["node"] = request.node
    if request.gpu is not None:
        labels["gpu"] = str(request.gpu)
    # What the incident is about within the node (an IB port, a job): two incidents of
    # one rule on one node are two alerts. A GPU's subject is its gpu label already.
    subject = request.params.get("subject")
    if isinstance(subject, str) and subject and subject != f"gpu={request.gpu}":
        labels["subject"] = subject
    return labels


@dataclass
class _Firing:
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_seconds: float


class AlertmanagerDriver:
    """Sends ``alert`` actions to Alertmanager and keeps firing ones alive.

    Safe to call from several threads: the map of firing alerts is guarded by a lock,
    and sends happen outside it.
    """

    name = "alertmanager"
    #: Alertmanager deduplicates by label set: sending twice is harmless.
    idempotent = True

    def __init__(self, settings: AlertmanagerSettings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.http = HttpClient(self.name, timeout=settings.timeout, headers=settings.headers,
                               verify=settings.ca_file or True)
        self._lock = threading.Lock()
        self._firing: dict[tuple[tuple[str, str], ...], _Firing] = {}

    # ------------------------------------------------------------------ actions

    def run(self, request: ActionRequest) -> Outcome:
        """Send one firing or resolved alert (``params["status"]``)."""
        status = alert_status(request)
        now = self.clock.time()
        labels = alert_labels(request)
        key = tuple(sorted(labels.items()))
        annotations = {
            "summary": f"{labels['alertname']} on {request.node or 'cluster'}"
                       + (f" GPU {request.gpu}" if request.gpu is not None else ""),
            "description": request.reason,
        }
        if request.incident_id is not None:
            annotations["incident_id"] = str(request.incident_id)
        with self._lock:
            if status == "firing":
                known = self._firing.get(key)
                entry = _Firing(labels, annotations, known.starts_seconds if known else now)
                self._firing[key] = entry
            else:
                known = self._firing.pop(key, None)
                entry = _Firing(labels, annotations, known.starts_seconds if known else now)
        alert = self._alert(entry, now, resolved=status == "resolved")
        try:
            accepted = self._post([alert])
        except PermanentError:
            # Alertmanager refused this alert: re-sending it every minute cannot help.
            if status == "firing":
                with self._lock:
                    self._firing.pop(key, None)
            raise
        # On TemporaryError a firing alert stays in the map: the next resend delivers it.
        return Outcome(f"alert {status} sent to {len(accepted)} of "
                       f"{len(self.settings.urls)} Alertmanager(s)",
                       {"accepted": accepted, "labels": labels})

    def resend_firing(self) -> int:
        """Re-send every firing alert with a fresh ``endsAt``; returns how many.

        Raises TemporaryError / PermanentError like :meth:`run` when no member took them.
        """
        now = self.clock.time()
        with self._lock:
            entries = list(self._firing.values())
        if not entries:
            return 0
        self._post([self._alert(entry, now, resolved=False) for entry in entries])
        return len(entries)

    def firing(self) -> list[dict[str, str]]:
        """The label sets of the alerts currently firing (for the API and tests)."""
        with self._lock:
            return [dict(entry.labels) for entry in self._firing.values()]

    def reconcile(self, request: ActionRequest) -> bool | None:
        """Re-sending is harmless (idempotent), so a crashed send is simply run again."""
        return None

    def close(self) -> None:
        """Close the HTTP session."""
        self.http.close()

    # ------------------------------------------------------------------ wire

    def _alert(self, entry: _Firing, now: float, *, resolved: bool) -> dict[str, Any]:
        ends = now if resolved else now + ENDS_AFTER_INTERVALS * self.settings.resend_interval
        alert: dict[str, Any] = {
            "labels": entry.labels,
            "annotations": entry.annotations,
            "startsAt": rfc3339(min(entry.starts_seconds, now)),
            "endsAt": rfc3339(ends),
        }
        if self.settings.generator_url is not None:
            alert["generatorURL"] = self.settings.generator_url
        return alert

    def _post(self, alerts: list[dict[str, Any]]) -> list[str]:
        """POST to every member; return the (redacted) URLs that accepted."""
        body = json.dumps(alerts, ensure_ascii=False).encode("utf-8")
        accepted: list[str] = []
        errors: list[ActionError] = []
        for base in self.settings.urls:
            url = base.rstrip("/") + ALERTS_PATH
            try:
                self.http.post(url, body)
            except (TemporaryError, PermanentError) as err:
                errors.append(err)
                continue
            accepted.append(self.http.where(url))
        if accepted:
            if errors:
                log.warning("alertmanager: %d of %d members failed: %s", len(errors),
                            len(self.settings.urls), "; ".join(map(str, errors)))
            return accepted
        summary = "; ".join(map(str, errors))
        if all(isinstance(err, PermanentError) for err in errors):
            raise PermanentError(f"every Alertmanager refused the alerts: {summary}")
        waits = [e.retry_after for e in errors
                 if isinstance(e, TemporaryError) and e.retry_after is not None]
        raise TemporaryError(f"no Alertmanager accepted the alerts: {summary}",
                             retry_after=min(waits) if waits else None)
