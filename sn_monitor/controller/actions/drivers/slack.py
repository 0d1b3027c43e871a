"""Slack (and Slack-compatible: Mattermost, Rocket.Chat) incoming webhooks.

The message has a plain ``text`` (what notifications and old clients show), ``blocks``
(the formatted message) and one ``attachments`` entry whose ``color`` draws the
severity bar down the side: blocks alone cannot carry a colour.

The incoming-webhook URL is itself the credential (``/services/T…/B…/secret``), so the
HTTP client hides its path in every log line and message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sn_monitor.config import Duration, positive, setting
from sn_monitor.controller.actions.base import Outcome
from sn_monitor.controller.actions.drivers.http import HttpClient
from sn_monitor.controller.actions.drivers.webhook import alert_status
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.transport import check_http_url

#: severity -> (emoji, colour). Unknown severities look like warnings.
SEVERITY_STYLE: dict[str, tuple[str, str]] = {
    "critical": (":rotating_light:", "#d0021b"),
    "error": (":red_circle:", "#d0021b"),
    "warning": (":warning:", "#f5a623"),
    "info": (":information_source:", "#4a90e2"),
}
RESOLVED_STYLE = (":white_check_mark:", "#2eb67d")

#: Slack truncates section text past 3000 characters; keep well inside.
MAX_TEXT = 2900


@dataclass(frozen=True)
class SlackSettings:
    """The incoming-webhook URL (keep it secret: it is the credential)."""

    url: str = setting(check=check_http_url)
    timeout: Duration = setting(default=Duration(5.0), check=positive)
    ca_file: str | None = None


def slack_message(request: ActionRequest) -> dict[str, Any]:
    """The Slack payload for ``request`` (pure, for tests and previews)."""
    status = alert_status(request)
    resolved = status == "resolved"
    emoji, colour = RESOLVED_STYLE if resolved else SEVERITY_STYLE.get(
        request.severity, SEVERITY_STYLE["warning"])
    what = request.rule or request.action
    where = request.node or "cluster"
    if request.gpu is not None:
        where += f" GPU {request.gpu}"
    head = "RESOLVED" if resolved else request.severity.upper()
    text = f"{emoji} [{head}] {what} on {where}: {request.reason}"[:MAX_TEXT]
    context = [f"action `{request.action}`", f"id `{request.id}`"]
    if request.incident_id is not None:
        context.append(f"incident #{request.incident_id}")
    context += [f"{k}=`{v}`" for k, v in sorted(request.labels.items())]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": (
            f"{emoji} *{head}* {'(resolved) ' if resolved else ''}*{what}* on *{where}*\n"
            f"{request.reason}")[:MAX_TEXT]}},
        {"type": "context", "elements": [
            {"type": "mrkdwn", "text": " · ".join(context)[:MAX_TEXT]}]},
    ]
    return {
        "text": text,
        "blocks": blocks,
        "attachments": [{"color": colour, "fallback": text}],
    }


class SlackDriver:
    """Posts one message per action to a Slack incoming webhook."""

    name = "slack"
    #: A retry after a lost reply posts the message twice: Slack does not deduplicate.
    idempotent = False

    def __init__(self, settings: SlackSettings) -> None:
        self.settings = settings
        self.http = HttpClient(self.name, timeout=settings.timeout,
                               verify=settings.ca_file or True, secret_path=True)

    def run(self, request: ActionRequest) -> Outcome:
        """Post the message; Slack answers 200 ``ok`` or a 4xx naming the problem."""
        body = json.dumps(slack_message(request), ensure_ascii=False).encode("utf-8")
        response = self.http.post(self.settings.url, body)
        where = self.http.where(self.settings.url)
        return Outcome(f"posted to {where}", {"status": response.status})

    def reconcile(self, request: ActionRequest) -> bool | None:
        """Slack cannot be asked whether a message arrived: unknown."""
        return None

    def close(self) -> None:
        """Close the HTTP session."""
        self.http.close()
