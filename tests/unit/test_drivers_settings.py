"""Every driver's settings load through the one config loader, with safe defaults."""

from __future__ import annotations

import pytest

from sn_monitor.config import ConfigError, bind, parse_yaml
from sn_monitor.controller.actions.drivers.agent import AgentQueueSettings
from sn_monitor.controller.actions.drivers.alertmanager import AlertmanagerSettings
from sn_monitor.controller.actions.drivers.command import CommandSettings
from sn_monitor.controller.actions.drivers.slack import SlackSettings
from sn_monitor.controller.actions.drivers.slurm import SlurmSettings
from sn_monitor.controller.actions.drivers.webhook import WebhookSettings
from sn_monitor.controller.k8s.settings import KubernetesSettings


@pytest.mark.parametrize(("cls", "text", "expected"), [
    (WebhookSettings, "url: https://hooks.example/x\nsecret: s\ntimeout: 500ms\n",
     {"timeout": 0.5, "secret": "s"}),
    (SlackSettings, "url: https://hooks.slack.com/services/T/B/X\n", {"timeout": 5.0}),
    (AlertmanagerSettings, "urls: [http://am-0:9093, http://am-1:9093]\nresend_interval: 1m\n",
     {"resend_interval": 60.0}),
    (KubernetesSettings, "host: http://127.0.0.1:8001\n", {"taint_key": "sn-monitor.io/unhealthy"}),
    (SlurmSettings, "timeout: 3s\n", {"scontrol": "scontrol", "timeout": 3.0}),
    (CommandSettings, "program: [/usr/local/bin/drain, --force]\nenv: {A: b}\n",
     {"timeout": 60.0, "env": {"A": "b"}}),
    (AgentQueueSettings, "redeliver_after: 5s\n", {"max_per_node": 32, "redeliver_after": 5.0}),
])
def test_settings_bind(cls: type, text: str, expected: dict[str, object]) -> None:
    settings = bind(cls, parse_yaml(text, "drivers.yaml"))
    for name, value in expected.items():
        assert getattr(settings, name) == value


def test_optional_checks_let_an_absent_value_pass() -> None:
    settings = bind(KubernetesSettings, parse_yaml("host: null\n", "drivers.yaml"))
    assert settings.host is None


@pytest.mark.parametrize(("cls", "text", "message"), [
    (WebhookSettings, "url: ftp://x/\n", "http"),
    (WebhookSettings, "url: http://x/\nsecret: whsec_***\n", "base64"),
    (WebhookSettings, "url: http://x/\nsecret: a\nsecret_file: /b\n", "not both"),
    (AlertmanagerSettings, "urls: []\n", "at least one"),
    (SlackSettings, "url: http://x/\ntimeout: 0s\n", "greater than 0"),
    (CommandSettings, "program: [x]\nshell: true\n", "unknown key"),
    (AgentQueueSettings, "power_fraction: 1.5\n", "fraction"),
    (AlertmanagerSettings, "urls: [http://am/]\ngenerator_url: ftp://x/\n",
     "generator_url: expected an http"),
    (KubernetesSettings, "host: kube-api\n", "host: expected an http"),
    (KubernetesSettings, "grace_period_seconds: -1\n", "must be 0 or more"),
])
def test_bad_settings_name_the_key(cls: type, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        bind(cls, parse_yaml(text, "drivers.yaml"))
