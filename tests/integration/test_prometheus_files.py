"""Prometheus and Alertmanager files: promtool and amtool accept them, every alert is
tested firing and not firing, rules use only metrics the agent and controller export,
and a real Prometheus discovers agents through the controller's /api/v1/sd."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import FIXTURES, ROOT, require_tool
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
CONFIGS = sorted(PROMETHEUS_DIR.glob("*.yml"))
RULES_DIR = ROOT / "rules" / "prometheus"
RULE_FILES = sorted(RULES_DIR.glob("*.yml"))
RULE_TESTS = sorted((RULES_DIR / "tests").glob("*.yml"))
ALERTMANAGER = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
GOLDEN = FIXTURES / "golden" / "h100-node.prom"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, check=False,
                          timeout=timeout)


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def alerts() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in RULE_FILES:
        for group in load(path)["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    assert rule["alert"] not in found, f"{rule['alert']} defined twice"
                    found[rule["alert"]] = rule
    return found


def all_rules() -> Iterator[dict[str, Any]]:
    for path in RULE_FILES:
        for group in load(path)["groups"]:
            yield from group["rules"]


def with_repo_rules(config: Path, tmp_path: Path) -> Path:
    """``config`` with its rule_files pointed at this checkout's rules (deployed: /etc).

    The demo's config already points at them, relative to itself: it is checked as it is.
    """
    data = load(config)
    if config.name == "prometheus-demo.yml":
        assert data["rule_files"] == ["../../rules/prometheus/*.yml"]
        return config
    assert data["rule_files"] == ["/etc/prometheus/sn-monitor/rules/*.yml"]
    data["rule_files"] = [str(RULES_DIR / "*.yml")]
    copy = tmp_path / config.name
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def test_files_exist():
    assert [p.name for p in CONFIGS] == ["prometheus-demo.yml", "prometheus-static.yml",
                                         "prometheus.yml"]
    assert len(RULE_FILES) >= 2
    assert RULE_TESTS
    # Prometheus' rules and the controller's rules (packaged) stay apart
    assert not list((ROOT / "rules").glob("*.y*ml"))
    assert not list((ROOT / "sn_monitor" / "rules").glob("*.yml"))
    assert not list(RULES_DIR.glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_promtool_check_config(config: Path, tmp_path: Path):
    promtool = require_tool("promtool")
    as_shipped = run(promtool, "check", "config", str(config))
    assert as_shipped.returncode == 0, as_shipped.stdout + as_shipped.stderr
    checked = run(promtool, "check", "config", str(with_repo_rules(config, tmp_path)))
    output = checked.stdout + checked.stderr
    assert checked.returncode == 0, output
    for rules in RULE_FILES:  # the rule files were found and checked with the config
        assert f"Checking {rules}" in output, output


def test_agents_come_from_controller_sd():
    data = load(PROMETHEUS_DIR / "prometheus.yml")
    jobs = {job["job_name"]: job for job in data["scrape_configs"]}
    assert set(jobs) == {"sn-controller", "sn-agent"}
    (sd,) = jobs["sn-agent"]["http_sd_configs"]
    assert sd["url"].endswith(":9848/api/v1/sd")
    assert sd["authorization"]["credentials_file"]
    assert jobs["sn-controller"]["static_configs"][0]["targets"][0].endswith(":9848")


@pytest.mark.parametrize("rules", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(rules: Path):
    result = run(require_tool("promtool"), "check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("tests", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_test_rules(tests: Path):
    result = run(require_tool("promtool"), "test", "rules", str(tests), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_tested_firing_and_not_firing():
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        data = load(path)
        tested = {(path.parent / f).resolve() for f in data["rule_files"]}
        assert tested <= {p.resolve() for p in RULE_FILES}, f"{path.name}: {tested}"
        for case in data["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = set(alerts())
    assert names - fires == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested not firing"
    assert (fires | quiet) - names == set(), "tests of alerts that do not exist"


def test_alerts_have_severity_and_runbook():
    for name, rule in alerts().items():
        assert re.fullmatch(r"Sn[A-Z][A-Za-z]+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        for key in ("summary", "description", "runbook"):
            assert rule["annotations"].get(key, "").strip(), f"{name}: no {key}"


def exported_names() -> set[str]:
    """Every family the agent (golden exposition, exporter) and controller export."""
    names = set(re.findall(r"^# TYPE (\S+)", GOLDEN.read_text(), re.M))
    for source in ("sn_monitor/agent/exporter.py", "sn_monitor/controller/telemetry/metrics.py"):
        names |= set(re.findall(r'"(sn_[a-z0-9_]+)"', (ROOT / source).read_text()))
    return names | {"up"}


def test_rules_use_exported_metrics():
    known = exported_names()
    recorded = {rule["record"] for rule in all_rules() if "record" in rule}
    for rule in all_rules():
        expr = str(rule["expr"])
        used_recorded = set(re.findall(r"[a-z_]+:[a-z0-9_:]+", expr))
        assert used_recorded <= recorded, expr
        bare = re.sub(r"[a-z_]+:[a-z0-9_:]+", " ", re.sub(r'"[^"]*"', '""', expr))
        names = re.findall(r"\bsn_[a-z0-9_]+\b", bare)
        assert names or used_recorded or "up{" in bare, expr
        for name in names:
            stem = re.sub(r"_(total|bucket|sum|count)$", "", name)
            assert name in known or stem in known, f"{name} is not exported ({expr})"


def test_amtool_check_config():
    result = run(require_tool("amtool"), "check-config", str(ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(("labels", "receiver"), [
    (["severity=critical", "alertname=SnGpuFatalXid"], "critical"),
    (["severity=warning", "alertname=SnGpuHot"], "warning"),
    (["severity=info"], "webhook"),
])
def test_alertmanager_routes_by_severity(labels: list[str], receiver: str):
    result = run(require_tool("amtool"), "config", "routes", "test",
                 f"--config.file={ALERTMANAGER}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == receiver


def test_alertmanager_inhibits_node_alerts_when_agent_down():
    config = load(ALERTMANAGER)
    node_alerts = [a for a in alerts() if a.startswith(("SnGpu", "SnInfiniband"))]
    rule = next(r for r in config["inhibit_rules"]
                if r["source_matchers"] == ['alertname="SnAgentDown"'])
    assert rule["equal"] == ["instance"]
    (matcher,) = rule["target_matchers"]
    pattern = re.fullmatch(r'alertname=~"(.+)"', matcher)
    assert pattern is not None
    for name in [*node_alerts, "SnAgentCollectorFailing", "SnAgentSamplingStalled"]:
        assert re.fullmatch(pattern.group(1), name), name
    assert not re.fullmatch(pattern.group(1), "SnAgentDown")


# --- a real Prometheus with the shipped config: discovery, relabelling, rules -----------

class _Stub(BaseHTTPRequestHandler):
    routes: dict[str, bytes] = {}
    token = "sd-token"

    def do_GET(self) -> None:
        if self.path == "/api/v1/sd" and (
                self.headers.get("Authorization") != f"Bearer {self.token}"):
            self.send_response(401)
            self.end_headers()
            return
        body = self.routes.get(self.path)
        self.send_response(200 if body is not None else 404)
        if self.path == "/api/v1/sd":  # Prometheus requires it of HTTP SD
            self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args: object) -> None:
        pass


def _serve(routes: dict[str, bytes]) -> ThreadingHTTPServer:
    handler = type("Handler", (_Stub,), {"routes": routes})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.load(reply)["data"]


def test_prometheus_discovers_agents_through_controller(tmp_path: Path):
    prometheus = require_tool("prometheus")
    agent = _serve({"/metrics": GOLDEN.read_bytes()})
    controller_metrics = (b'# TYPE sn_job_state gauge\n'
                          b'sn_job_state{job="llm",state="running"} 1\n'
                          b'# TYPE sn_breaker_open gauge\nsn_breaker_open 0\n')
    controller = _serve({"/metrics": controller_metrics})
    agent_port, controller_port = agent.server_address[1], controller.server_address[1]
    controller.RequestHandlerClass.routes["/api/v1/sd"] = json.dumps([  # type: ignore[attr-defined]
        {"targets": [f"127.0.0.1:{agent_port}"],
         "labels": {"node": "gpu-node-001", "supernode": "sn0", "rack": "r01", "job": "llm"}},
        {"targets": [f"localhost:{agent_port}"],
         "labels": {"node": "gpu-node-002", "supernode": "sn0", "rack": "r01"}},
    ]).encode()
    token = tmp_path / "controller.token"
    token.write_text("sd-token\n")
    data = load(PROMETHEUS_DIR / "prometheus.yml")
    data["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    data["rule_files"] = [str(RULES_DIR / "*.yml")]
    data.pop("alerting")
    jobs = {job["job_name"]: job for job in data["scrape_configs"]}
    jobs["sn-controller"]["static_configs"][0]["targets"] = [f"127.0.0.1:{controller_port}"]
    sd = jobs["sn-agent"]["http_sd_configs"][0]
    sd["url"] = f"http://127.0.0.1:{controller_port}/api/v1/sd"
    sd["authorization"]["credentials_file"] = str(token)
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    port = free_port()
    api = f"http://127.0.0.1:{port}/api/v1"
    proc = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        targets: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                targets = _get(f"{api}/targets")["activeTargets"]
                if (len(targets) == 3 and all(t["health"] == "up" for t in targets)):
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.5)
        labels = {t["labels"].get("node", "controller"): t["labels"] for t in targets}
        assert [t["health"] for t in targets] == ["up"] * 3, targets
        assert labels["gpu-node-001"]["job"] == "sn-agent"
        assert labels["gpu-node-001"]["training_job"] == "llm"
        assert labels["gpu-node-001"]["rack"] == "r01"
        assert labels["gpu-node-002"]["job"] == "sn-agent"
        assert "training_job" not in labels["gpu-node-002"]
        assert labels["controller"]["job"] == "sn-controller"
        # honor_labels: the controller's training-job label stays `job`
        query = urllib.parse.quote('sn_job_state{state="running"}')
        (series,) = _get(f"{api}/query?query={query}")["result"]
        assert series["metric"]["job"] == "llm"
        groups = _get(f"{api}/rules")["groups"]
        loaded = {r["name"] for g in groups for r in g["rules"] if r["type"] == "alerting"}
        assert loaded == set(alerts())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        agent.shutdown()
        controller.shutdown()
