"""sn-monitor and a real Alertmanager (Debian's ``prometheus-alertmanager``), both ways.

One Alertmanager on 127.0.0.1 (no clustering, storage in tmp_path, 1 s grouping) and one
controller with two simulated agents (cluster.py), all real processes:

- controller -> Alertmanager: a GPU overheating on a simulated agent fires the
  repository's gpu-overheat rule; its ``alert`` action shows up in Alertmanager's
  ``GET /api/v2/alerts`` with the rule's name, the node, the GPU, the severity, the
  node's supernode and the annotations; the repaired fault resolves it there.
- Alertmanager -> controller: an alert posted to Alertmanager with ``sn_action="true"``
  is routed to the ``sn-monitor`` webhook receiver (bearer token of role operate, from a
  credentials_file), reaches ``POST /api/v1/alertmanager``, and the alert rule in this
  test's rules opens an incident and cordons the node through the command driver;
  Alertmanager's re-sends (repeat_interval) open nothing new; resolving the alert in
  Alertmanager closes the incident.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.integration.cluster import Cluster, Process, metric_value
from tests.support.ports import free_port

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(ALERTMANAGER is None, reason=(
        "Alertmanager is not installed (Debian: apt-get install prometheus-alertmanager; "
        ".ci/run does it)")),
]

#: Bounded waits: every step here takes a few seconds on an idle machine.
WAIT = 30.0
SUPERNODE = "sn-test"

RULES = """
- name: test-node-bad
  description: A node a PromQL alert (SnTestNodeBad) says is bad; cordon it.
  alert: {alertname: SnTestNodeBad}
  severity: critical
  actions: [alert, cordon]
"""


class Alertmanager(Process):
    """A real Alertmanager with a webhook receiver pointing at the controller."""

    def __init__(self, root: Path, port: int, controller_url: str, token_file: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.url = f"http://127.0.0.1:{port}"
        config = root / "alertmanager.yml"
        config.write_text(yaml.safe_dump({
            "route": {
                "receiver": "people", "group_by": ["..."],
                "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h",
                "routes": [{
                    # as deploy/alertmanager/alertmanager.yml: marked alerts, never our own
                    "matchers": ['sn_action="true"', 'source!="sn-monitor"'],
                    "receiver": "sn-monitor", "group_by": ["..."],
                    "group_wait": "0s", "group_interval": "1s", "repeat_interval": "2s",
                }],
            },
            "receivers": [
                {"name": "people"},  # no one: the controller's own alerts stop here
                {"name": "sn-monitor", "webhook_configs": [{
                    "url": f"{controller_url}/api/v1/alertmanager",
                    "send_resolved": True,
                    "http_config": {"authorization": {
                        "type": "Bearer", "credentials_file": str(token_file)}},
                }]},
            ],
        }, sort_keys=False))
        assert ALERTMANAGER is not None
        super().__init__("alertmanager", [
            ALERTMANAGER, f"--config.file={config}", f"--storage.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
            "--log.level=debug",
        ], root / "alertmanager.log")

    def ready(self) -> bool:
        if not self.running:
            raise AssertionError(f"alertmanager exited:\n{self.tail()}")
        try:
            return requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def alerts(self, **labels: str) -> list[dict[str, Any]]:
        """The active alerts whose labels include ``labels``."""
        reply = requests.get(f"{self.url}/api/v2/alerts", params={"active": "true"},
                             timeout=10)
        reply.raise_for_status()
        return [a for a in reply.json()
                if all(a["labels"].get(k) == v for k, v in labels.items())]

    def post(self, labels: dict[str, str], annotations: dict[str, str], *,
             starts: datetime, ends: datetime) -> None:
        reply = requests.post(f"{self.url}/api/v2/alerts", json=[{
            "labels": labels, "annotations": annotations,
            "startsAt": starts.isoformat(), "endsAt": ends.isoformat()}], timeout=10)
        assert reply.status_code == 200, reply.text

    def webhook_sends(self) -> float:
        text = requests.get(f"{self.url}/metrics", timeout=10).text
        return metric_value(text, "alertmanager_notifications_total",
                            integration="webhook") or 0.0

    def log_section(self) -> str:
        return f"===== alertmanager ({self.log_path})\n{self.tail(40)}"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Alertmanager]]:
    root = tmp_path_factory.mktemp("alertmanager")
    rules = root / "test-rules"
    rules.mkdir()
    (rules / "alert-rules.yaml").write_text(RULES)
    am_port = free_port()
    cluster = Cluster(root / "cluster", nodes=2, rules=[rules],
                      agent_labels={"supernode": SUPERNODE},
                      config={
                          "drivers": {"alertmanager": {
                              "urls": [f"http://127.0.0.1:{am_port}"], "resend_interval": "2s"}},
                          # the two tests' faults (one node each) are not a burst: this
                          # is about Alertmanager, not the breaker (it had opened once,
                          # under load, when the two came within its window)
                          "policy": {"breaker": {"window": "5s", "min_faulted": 3}}})
    am = Alertmanager(root / "am", am_port, cluster.url, cluster.operate_token_file)
    cluster.log_sources.append(am.log_section)
    try:
        am.start()
        cluster.wait_for(am.ready, WAIT, f"alertmanager ready on {am.url}")
        cluster.start(timeout=WAIT)
        yield cluster, am
    finally:
        cluster.close()
        am.kill(timeout=10)


def _open(c: Cluster, rule: str, node: str) -> dict[str, Any] | None:
    found = [i for i in c.incidents(status="open", node=node) if i["rule"] == rule]
    return found[0] if found else None


def test_a_controller_alert_reaches_alertmanager_and_resolves_there(
        setup: tuple[Cluster, Alertmanager]) -> None:
    c, am = setup
    node, gpu = "sim-0", 3
    c.agents[node].fault("overheat", gpu, factor=1.8)
    incident = c.wait_for(lambda: _open(c, "gpu-overheat", node), WAIT,
                          f"a gpu-overheat incident on {node}")
    (alert,) = c.wait_for(lambda: am.alerts(alertname="gpu-overheat", node=node), WAIT,
                          "the gpu-overheat alert in Alertmanager")
    labels = alert["labels"]
    assert labels == {"alertname": "gpu-overheat", "node": node, "gpu": str(gpu),
                      "severity": "critical", "source": "sn-monitor",
                      "supernode": SUPERNODE}, labels
    assert alert["annotations"]["summary"] == f"gpu-overheat on {node} GPU {gpu}"
    assert "°C" in alert["annotations"]["description"]
    assert alert["annotations"]["incident_id"] == str(incident["id"])
    assert alert["status"]["state"] == "active"
    assert alert["receivers"] == [{"name": "people"}]  # not back to the controller

    c.agents[node].fault("cooling-repaired", gpu)
    c.wait_for(lambda: not _open(c, "gpu-overheat", node), WAIT,
               "the gpu-overheat incident closing after the repair")
    c.wait_for(lambda: not am.alerts(alertname="gpu-overheat", node=node), WAIT,
               "the alert resolved in Alertmanager (no longer active)")


def test_an_alert_in_alertmanager_opens_an_incident_and_cordons(
        setup: tuple[Cluster, Alertmanager]) -> None:
    c, am = setup
    node = "sim-1"
    labels = {"alertname": "SnTestNodeBad", "node": node, "sn_action": "true",
              "severity": "warning"}
    started = datetime.now(UTC) - timedelta(seconds=5)
    sends = am.webhook_sends()
    am.post(labels, {"summary": f"{node} is bad (test)"}, starts=started,
            ends=started + timedelta(hours=1))

    incident = c.wait_for(lambda: _open(c, "test-node-bad", node), WAIT,
                          f"a test-node-bad incident on {node} from Alertmanager's webhook")
    assert incident["severity"] == "critical"
    assert incident["message"] == f"{node} is bad (test)"
    assert abs(incident["observed_at"] - started.timestamp()) < 1
    assert incident["subject"].startswith("alertname=SnTestNodeBad,fingerprint=")

    def cordoned() -> dict[str, Any] | None:
        found = [a for a in c.incident_actions(incident["id"]) if a["action"] == "cordon"]
        return found[0] if found and found[0]["state"] == "succeeded" else None
    cordon = c.wait_for(cordoned, WAIT, f"{node} cordoned through the command driver")
    assert cordon["requested_by"] == "rule:test-node-bad via alertmanager:operators"
    assert [call["SN_ACTION"] for call in c.script_calls(c.evict_log)
            if call["SN_NODE"] == node] == ["cordon"]
    # the controller's own alert for it goes to Alertmanager, and not back to the controller
    (own,) = c.wait_for(lambda: am.alerts(alertname="test-node-bad", node=node), WAIT,
                        "the controller's test-node-bad alert in Alertmanager")
    assert own["receivers"] == [{"name": "people"}]

    # Alertmanager re-sends it (repeat_interval 2 s): nothing new opens, nothing runs again
    c.wait_for(lambda: am.webhook_sends() >= sends + 2, WAIT,
               "Alertmanager sending the firing alert again")
    assert [i["id"] for i in c.incidents(node=node)] == [incident["id"]]
    assert len([a for a in c.actions(node=node) if a["action"] == "cordon"]) == 1

    am.post(labels, {"summary": f"{node} is bad (test)"}, starts=started,
            ends=datetime.now(UTC) - timedelta(seconds=1))
    c.wait_for(lambda: not _open(c, "test-node-bad", node), WAIT,
               "the incident closing when Alertmanager resolves the alert")
    (closed,) = [i for i in c.incidents(status="closed", node=node)
                 if i["rule"] == "test-node-bad"]
    assert closed["id"] == incident["id"]
    c.wait_for(lambda: not am.alerts(alertname="test-node-bad", node=node), WAIT,
               "the controller's own alert resolved in Alertmanager")


def test_amtool_routes_marked_alerts_to_the_controller_and_on_to_people() -> None:
    """The shipped config: sn_action alerts reach the controller and people; ours never."""
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool is not installed (Debian: prometheus-alertmanager)")
    config = Path(__file__).resolve().parents[2] / "deploy" / "alertmanager" / "alertmanager.yml"
    cases = [
        (["sn_action=true", "severity=critical"], "sn-monitor,critical"),
        (["sn_action=true"], "sn-monitor,webhook"),
        (["sn_action=true", "severity=critical", "source=sn-monitor"], "critical"),
        (["severity=warning"], "warning"),
    ]
    for labels, receivers in cases:
        result = subprocess.run([amtool, "config", "routes", "test", f"--config.file={config}",
                                 *labels], capture_output=True, text=True, timeout=30,
                                check=False)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == receivers, labels
