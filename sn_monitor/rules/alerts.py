"""Alertmanager's alerts in: the webhook payload, and alert rules turning alerts into findings.

Alertmanager posts its notifications (webhook payload version 4) to
``POST /api/v1/alertmanager``. Each alert is matched against every alert rule
(:class:`~sn_monitor.rules.spec.AlertRule`); each rule that matches makes
findings like any other rule, so the incident and its actions go through the same
safety policy as a report's.

- **Node**: the rule's ``node_label`` (default ``node``), else the ``instance`` label
  without its port. A name that is not a valid node name (the same rule as a report's)
  or no name at all: the alert is skipped and counted, the rest of the payload stands.
- **Subject**: one incident per (rule, node, gpu, alert): ``gpu=3,alertname=X,
  fingerprint=F`` with Alertmanager's fingerprint (the hash of the alert's label set;
  computed here when the payload has none). Two alerts of one name on one node (two
  ports down) are two incidents, and one resolving does not close the other.
- **Repeats**: Alertmanager re-sends firing alerts (``repeat_interval``, every group
  change); a subject already firing emits nothing, so no second incident and no actions
  run again. A resolved alert that is not firing here emits nothing either.
- **Time**: a firing finding was observed at ``startsAt``, a resolved one at ``endsAt``;
  detected on the controller's clock.
- **Loops**: alerts that sn-monitor itself sent (``source="sn-monitor"``, see
  :mod:`sn_monitor.controller.actions.drivers.alertmanager`) are never acted on again.

The engine never feeds reports or time to these evaluators (they neither observe nor
sweep); it only keeps them, so that a SIGHUP reload keeps, updates or resolves what they
have firing like any other rule's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Final, Literal

import msgspec

from sn_monitor.errors import SnMonitorError
from sn_monitor.model import MAX_GPUS, is_node_name
from sn_monitor.rules.base import Evaluator, Finding, Now
from sn_monitor.rules.spec import REGEX_MATCH, AlertRule

#: The only webhook payload version Alertmanager has sent so far (0.x), and we read.
WEBHOOK_VERSION: Final = "4"
#: The ``source`` label of the alerts sn-monitor sends (actions/alertmanager.py).
OWN_SOURCE: Final = "sn-monitor"

Timestamp = Annotated[datetime, msgspec.Meta(tz=True)]
AlertStatus = Literal["firing", "resolved"]


class WebhookAlert(msgspec.Struct, frozen=True, kw_only=True):
    """One alert of a notification."""

    status: AlertStatus
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    starts_at: Timestamp = msgspec.field(name="startsAt")
    ends_at: Timestamp | None = msgspec.field(default=None, name="endsAt")
    generator_url: str = msgspec.field(default="", name="generatorURL")
    fingerprint: Annotated[str, msgspec.Meta(max_length=128)] = ""


class WebhookPayload(msgspec.Struct, frozen=True, kw_only=True):
    """Alertmanager's webhook notification (``version: "4"``); unknown fields are ignored."""

    version: str
    status: AlertStatus
    alerts: list[WebhookAlert]
    group_key: str = msgspec.field(default="", name="groupKey")
    receiver: str = ""
    group_labels: dict[str, str] = msgspec.field(default_factory=dict, name="groupLabels")
    common_labels: dict[str, str] = msgspec.field(default_factory=dict, name="commonLabels")
    common_annotations: dict[str, str] = msgspec.field(default_factory=dict,
                                                      name="commonAnnotations")
    external_url: str = msgspec.field(default="", name="externalURL")
    truncated_alerts: int = msgspec.field(default=0, name="truncatedAlerts")


class _Version(msgspec.Struct):
    version: object = None


class WebhookRejected(ValueError, SnMonitorError):
    """A payload that cannot be read: a message naming the field."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


_decoder = msgspec.json.Decoder(WebhookPayload)
_version_decoder = msgspec.json.Decoder(_Version)


def decode_webhook(body: bytes) -> WebhookPayload:
    """Decode and check one notification; WebhookRejected says what is wrong."""
    try:
        payload = _decoder.decode(body)
    except msgspec.ValidationError as err:
        _check_version(body)
        raise WebhookRejected(f"invalid Alertmanager payload: {err}") from None
    except msgspec.DecodeError as err:
        raise WebhookRejected(f"malformed JSON: {err}") from None
    if payload.version != WEBHOOK_VERSION:
        raise WebhookRejected(_version_message(payload.version))
    return payload


def _check_version(body: bytes) -> None:
    """A payload of another version fails on its version, not on a field it lacks."""
    try:
        version = _version_decoder.decode(body).version
    except (msgspec.ValidationError, msgspec.DecodeError):
        return
    if isinstance(version, str) and version != WEBHOOK_VERSION:
        raise WebhookRejected(_version_message(version))


def _version_message(version: str) -> str:
    return (f"unsupported Alertmanager webhook version {version!r} - at `$.version`: "
            f"sn-monitor reads version {WEBHOOK_VERSION!r}")


def webhook_schema_types() -> list[type[msgspec.Struct]]:
    """The payload's types, for the OpenAPI document."""
    return [WebhookPayload, WebhookAlert]


# ------------------------------------------------------------------ matching


Matcher = Callable[[Mapping[str, str]], bool]


def compile_matchers(matchers: Mapping[str, str]) -> list[Matcher]:
    """One predicate per ``label: value`` (equality; ``=~regex``: a full match).

    A missing label reads as ``""``, as in Prometheus: ``label: ""`` matches its absence.
    """
    return [_full_match(label, re.compile(value[len(REGEX_MATCH):]))
            if value.startswith(REGEX_MATCH) else _equal(label, value)
            for label, value in matchers.items()]


def _equal(label: str, value: str) -> Matcher:
    def match(labels: Mapping[str, str]) -> bool:
        return labels.get(label, "") == value
    return match


def _full_match(label: str, pattern: re.Pattern[str]) -> Matcher:
    def match(labels: Mapping[str, str]) -> bool:
        return pattern.fullmatch(labels.get(label, "")) is not None
    return match


def node_of(labels: Mapping[str, str], node_label: str) -> str | None:
    """The node an alert is about: ``node_label``, else ``instance`` without its port."""
    node = labels.get(node_label, "")
    if not node:
        node = _without_port(labels.get("instance", ""))
    return node if is_node_name(node) else None  # the same rule as for a report's node


def _without_port(instance: str) -> str:
    host, sep, port = instance.rpartition(":")
    if not sep or not port.isdigit():
        return instance
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host


def gpu_of(labels: Mapping[str, str]) -> int | None:
    """The ``gpu`` label as an index, or None when there is none or it is not one."""
    text = labels.get("gpu", "")
    if text.isascii() and text.isdigit() and int(text) < MAX_GPUS:
        return int(text)
    return None


def fingerprint_of(alert: WebhookAlert) -> str:
    """Alertmanager's fingerprint, or one computed the same way: from the label set."""
    if alert.fingerprint:
        return alert.fingerprint
    text = "\xff".join(f"{k}\xff{v}" for k, v in sorted(alert.labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def subject_of(alert: WebhookAlert, gpu: int | None) -> str:
    """``gpu=3,alertname=SnNvlinkDown,fingerprint=5f1c...``: one incident per alert."""
    parts = [] if gpu is None else [f"gpu={gpu}"]
    name = alert.labels.get("alertname", "")
    if name:
        parts.append(f"alertname={name}")
    parts.append(f"fingerprint={fingerprint_of(alert)}")
    return ",".join(parts)


def _seconds(moment: datetime | None) -> float | None:
    """Unix seconds; None for no time (Alertmanager writes its zero time, year 1)."""
    if moment is None:
        return None
    seconds = moment.timestamp()
    return seconds if seconds > 0 else None


class AlertEvaluator(Evaluator[AlertRule]):
    """One :class:`AlertRule`: Alertmanager says when its alerts fire and resolve.

    Neither observes reports nor sweeps (the engine leaves it alone); the controller
    hands it alerts through :func:`receive_alerts`.
    """

    def __init__(self, rule: AlertRule) -> None:
        super().__init__(rule)
        self._matchers = compile_matchers(rule.alert)
        # The alert's own severity of each firing subject: a reload that drops the rule's
        # severity gives it back.
        self._alert_severity: dict[tuple[str, str], str] = {}

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether an alert with ``labels`` is one of this rule's."""
        return all(matcher(labels) for matcher in self._matchers)

    def in_scope(self, node_labels: Mapping[str, str] | None) -> bool:
        """Whether the rule's ``scope`` takes the node (an unknown node has no labels)."""
        for label, pattern in self._scope:
            value = (node_labels or {}).get(label)
            if value is None or pattern.fullmatch(value) is None:
                return False
        return True

    def receive(self, alert: WebhookAlert, node: str, now: Now, out: list[Finding],
                source: str) -> None:
        """Apply one alert about ``node``: a firing or resolved finding unless a repeat."""
        rule = self.rule
        gpu = gpu_of(alert.labels)
        subject = subject_of(alert, gpu)
        name = alert.labels.get("alertname", "alert")
        subjects = self._firing.setdefault(node, {})
        if alert.status == "firing":
            if subject in subjects:
                return
            severity = alert.labels.get("severity") or "warning"
            started = _seconds(alert.starts_at)
            finding = Finding(
                rule=rule.name, kind=self.kind, node=node, subject=subject, gpu=gpu,
                status="firing", severity=rule.severity or severity, actions=self._actions,
                dry_run=rule.dry_run, value=None,
                message=alert.annotations.get("summary") or f"{name} firing in Alertmanager",
                observed_wall=min(now.wall, started) if started is not None else now.wall,
                detected_wall=now.wall, source=source)
            subjects[subject] = finding
            self._alert_severity[(node, subject)] = severity
            out.append(finding)
            return
        started_finding = subjects.pop(subject, None)
        if not subjects:
            del self._firing[node]
        if started_finding is None:
            return
        self._alert_severity.pop((node, subject), None)
        ended = _seconds(alert.ends_at)
        out.append(dataclasses.replace(
            started_finding, status="resolved", message=f"{name} resolved in Alertmanager",
            observed_wall=min(now.wall, ended) if ended is not None else now.wall,
            detected_wall=now.wall, source=source))

    def set_rule(self, rule: AlertRule) -> None:
        """A reload that changed what the rule does: its firing findings follow."""
        self.rule = rule
        self._actions = tuple(rule.actions)
        for node, subjects in self._firing.items():
            for key, finding in subjects.items():
                severity = rule.severity or self._alert_severity.get((node, key), "warning")
                subjects[key] = dataclasses.replace(
                    finding, severity=severity, actions=self._actions, dry_run=rule.dry_run)

    def restore(self, finding: Finding) -> bool:
        """An incident open before a restart: Alertmanager will say when it resolves.

        Alertmanager re-sends a firing alert only every ``repeat_interval`` (hours), so
        this rule cannot rediscover it; it takes it back as firing instead.
        """
        self._firing.setdefault(finding.node, {})[finding.subject] = finding
        self._alert_severity[(finding.node, finding.subject)] = finding.severity
        return True

    def forget_node(self, node: str) -> None:
        super().forget_node(node)
        for key in [k for k in self._alert_severity if k[0] == node]:
            del self._alert_severity[key]


@dataclass
class AlertIntake:
    """What one notification did: counts for the reply and the findings to handle.

    ``accepted``: alerts that matched a rule and named a node; ``skipped``: alerts that
    matched a rule but named no usable node, or that sn-monitor sent itself (``why``
    says which); ``unmatched``: alerts no rule (in scope) takes.
    """

    accepted: int = 0
    skipped: int = 0
    unmatched: int = 0
    findings: list[Finding] = field(default_factory=list)
    why: list[str] = field(default_factory=list)


def receive_alerts(evaluators: Sequence[AlertEvaluator], alerts: Sequence[WebhookAlert],
                   labels_of: Callable[[str], Mapping[str, str] | None], now: Now,
                   source: str) -> AlertIntake:
    """Apply a notification's alerts to the alert rules; see the module docstring."""
    intake = AlertIntake()
    for alert in alerts:
        name = alert.labels.get("alertname", "(no alertname)")
        if alert.labels.get("source") == OWN_SOURCE:
            intake.skipped += 1
            intake.why.append(f"{name}: sent by sn-monitor itself")
            continue
        matched = [e for e in evaluators if e.matches(alert.labels)]
        took = no_node = False
        for evaluator in matched:
            node = node_of(alert.labels, evaluator.rule.node_label)
            if node is None:
                no_node = True
                continue
            if not evaluator.in_scope(labels_of(node)):
                continue
            evaluator.receive(alert, node, now, intake.findings, source)
            took = True
        if took:
            intake.accepted += 1
        elif no_node:
            intake.skipped += 1
            labels = sorted({e.rule.node_label for e in matched})
            intake.why.append(f"{name}: no node name in label {' or '.join(labels)} or "
                              "instance")
        else:
            intake.unmatched += 1
    return intake
