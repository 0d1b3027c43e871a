"""Grafana dashboards (grafana/dashboards/*.json): they validate against Grafana's published
JSON schemas (tests/fixtures/grafana-schema/), every panel has a unit and the `datasource`
variable, and every panel query returns data from a real Prometheus scraping a running
``sn-monitor demo`` (agents through the controller's /api/v1/sd, the controller itself,
rules/prometheus/*.yml loaded so the recording rules exist)."""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from jsonschema import Draft7Validator

from tests.conftest import FIXTURES, ROOT, require_tool
from tests.drivers.servers import wait_until
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

T = TypeVar("T")

GRAFANA = ROOT / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
SCHEMAS = FIXTURES / "grafana-schema"
RULES_DIR = ROOT / "rules" / "prometheus"
UIDS = {"sn-overview", "sn-node", "sn-gpu-health", "sn-jobs", "sn-controller", "sn-workloads"}

#: What each variable becomes when a query is sent to Prometheus by hand.
SUBSTITUTE = {"supernode": ".*", "node": ".*", "gpu": ".*", "job": ".*",
              "slurm_job": ".*", "pod": ".*",
              "__rate_interval": "1m", "__interval": "30s", "__range": "5m"}


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def schema(name: str) -> dict[str, Any]:
    return dict(json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text()))


def definition(name: str, key: str) -> Draft7Validator | None:
    """A validator for ``#/definitions/key`` of a panel schema, its $refs resolved in the file."""
    path = SCHEMAS / f"{name}.jsonschema.json"
    if not path.exists():
        return None
    defs = schema(name)["definitions"]
    if key not in defs:
        return None
    return Draft7Validator({"$ref": f"#/definitions/{key}", "definitions": defs})


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board.get("panels", []):
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def queries() -> Iterator[tuple[str, str, str]]:
    for path in DASHBOARDS:
        board = load(path)
        for panel in panels(board):
            for target in panel.get("targets", []):
                yield board["uid"], f"{panel['title']} [{target['refId']}]", target["expr"]


def substitute(expr: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in SUBSTITUTE, f"unknown variable ${name} in {expr}"
        return SUBSTITUTE[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def errors(validator: Draft7Validator, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)]


# --- static checks -------------------------------------------------------------------------

def test_dashboards_and_provisioning_exist():
    assert {load(p)["uid"] for p in DASHBOARDS} == UIDS
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids))
    titles = [load(p)["title"] for p in DASHBOARDS]
    assert len(titles) == len(set(titles))
    datasources = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "sn-monitor.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    providers = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "sn-monitor.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"]


def test_schema_fixtures_are_the_published_ones():
    assert "Apache License" in (SCHEMAS / "LICENSE").read_text()
    Draft7Validator.check_schema(schema("dashboard"))


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_validates_against_grafana_schema(path: Path):
    board = load(path)
    found = errors(Draft7Validator(schema("dashboard")), board)
    target = Draft7Validator(schema("prometheus"))
    for panel in panels(board):
        where = f"panel {panel['title']!r}"
        options = definition(panel["type"], "Options")
        if options is not None:
            found += [f"{where} options: {e}" for e in errors(options, panel.get("options", {}))]
        custom = definition(panel["type"], "FieldConfig")
        defaults = panel["fieldConfig"]["defaults"]
        if custom is not None and "custom" in defaults:
            found += [f"{where} custom: {e}" for e in errors(custom, defaults["custom"])]
        for query in panel.get("targets", []):
            found += [f"{where} target: {e}" for e in errors(target, query)]
    assert found == []


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_panels_have_unit_and_datasource_variable(path: Path):
    text = path.read_text()
    board = load(path)
    assert "__inputs" not in board
    assert "DS_PROMETHEUS" not in text
    variables = {v["name"]: v for v in board["templating"]["list"]}
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    used = set(re.findall(r"\$\{?(\w+)", text)) - {"datasource"}
    assert {u for u in used if not u.startswith("__")} <= set(variables), used
    for name in ("supernode", "node", "gpu", "job", "slurm_job"):
        if name in variables:
            assert variables[name]["type"] == "query"
            assert variables[name]["query"].startswith("label_values(")
            assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        where = panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit"
        assert panel["targets"], where
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], where
            if "rate(" in target["expr"] or "increase(" in target["expr"]:
                windows = re.findall(r"\[([^\]]+)\]", target["expr"])
                assert all(w in ("$__rate_interval", "$__range", "5m", "1h") for w in windows), \
                    f"{where}: {windows}"


def test_temperature_thresholds_match_the_rules():
    temperature_panels = 0
    for path in DASHBOARDS:
        for panel in panels(load(path)):
            if not any(re.search(r"sn_gpu_temperature_celsius(:max)?\{", t["expr"])
                       and "slowdown" not in t["expr"] for t in panel["targets"]):
                continue
            temperature_panels += 1
            defaults = panel["fieldConfig"]["defaults"]
            assert defaults["unit"] == "celsius", panel["title"]
            steps = {s["value"]: s["color"] for s in defaults["thresholds"]["steps"]}
            assert steps == {None: "green", 80: "yellow", 85: "red"}, panel["title"]
    assert temperature_panels >= 3


# --- every query against a real Prometheus scraping the demo -----------------------------

def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)


def _query(api: str, expr: str) -> list[dict[str, Any]]:
    doc = _get(f"{api}/query?{urllib.parse.urlencode({'query': expr})}")
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def _eventually(probe: Callable[[], T], done: Callable[[T], bool] = bool) -> T:
    """``probe``'s answer once ``done`` says it is there, or its last one after 300 s.

    The bound is for a loaded machine, not a margin: the assertions that follow judge it.
    """
    answers: list[T] = []

    def ready() -> bool:
        answers.append(probe())
        return done(answers[-1])

    wait_until(ready, timeout=300.0, step=1.0)
    return answers[-1]


def _shows_something(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


DEMO_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus-demo.yml"


#: The alert the idle-job test waits for, and the hold it gets here: 30 minutes of the
#: shipped rule would outlast the test; the expression and labels are the shipped ones.
IDLE_ALERT, IDLE_ALERT_HOLD = "SnWorkloadIdleGpus", "30s"


def demo_rules(directory: Path) -> list[Path]:
    """rules/prometheus/*.yml copied into ``directory``, the idle-GPU alert's hold shortened."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sorted(RULES_DIR.glob("*.yml")):
        doc = yaml.safe_load(source.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == IDLE_ALERT:
                    rule["for"] = IDLE_ALERT_HOLD
        written.append(directory / source.name)
        written[-1].write_text(yaml.safe_dump(doc, sort_keys=False))
    return written


def demo_prometheus_config(listen: str, rules_dir: Path) -> dict[str, Any]:
    """The shipped demo config (docs/getting-started/demo.md), for a demo on ``listen``, every 1 s.

    Only the address, the intervals and the rule files (copies in ``rules_dir``, see
    :func:`demo_rules`) change; labels, relabelling and honor_labels are as shipped.
    """
    text = DEMO_CONFIG.read_text().replace("127.0.0.1:9848", listen)
    config = yaml.safe_load(text)
    (rule_files,) = config["rule_files"]
    assert (DEMO_CONFIG.parent / rule_files).resolve().parent == RULES_DIR.resolve()
    config["rule_files"] = [str(path) for path in demo_rules(rules_dir)]
    config["global"].update(scrape_interval="1s", scrape_timeout="1s",
                            evaluation_interval="1s")
    for scrape in config["scrape_configs"]:
        for sd in scrape.get("http_sd_configs", ()):
            sd["refresh_interval"] = "1s"
    return config


@dataclass(frozen=True)
class DemoStack:
    """The running demo's controller and the Prometheus scraping it (their base URLs)."""

    controller: str
    prometheus: str


@pytest.fixture(scope="module")
def prometheus(demo_stack: DemoStack) -> str:
    """The Prometheus HTTP API of :func:`demo_stack`."""
    return demo_stack.prometheus


@pytest.fixture(scope="module")
def demo_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    binary = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("grafana")
    listen = f"127.0.0.1:{free_port()}"
    # 8 nodes (6 in the job, 2 spares): the smallest fleet the default scenario fits; x10
    # rather than x20 so that a loaded CI machine does not trip the breaker before the
    # fall-off-bus fault is failed over (hold times are divided by the speed).
    demo = subprocess.Popen(
        [sys.executable, "-m", "sn_monitor.cli", "demo", "--headless", "--keep-running",
         "--nodes", "8", "--speed", "10", "--listen", listen, "--state-dir", str(tmp / "sn")],
        stdout=subprocess.DEVNULL, stderr=open(tmp / "demo.log", "w"))  # noqa: SIM115
    config = demo_prometheus_config(listen, tmp / "rules")
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    prom = subprocess.Popen(
        [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        # Ready when the agents are scraped, the recording rules have run and the demo's
        # fall-off-bus fault has been recovered from (a recovery in the histogram).
        deadline = time.monotonic() + 90
        ready = ["instance:sn_gpu_utilization_ratio:avg", "state:sn_node_state:count",
                 "sn_recovery_duration_seconds_count", "sn_gpu_xid_errors_total"]
        while ready and time.monotonic() < deadline:
            assert prom.poll() is None, prom.stderr.read() if prom.stderr else ""
            assert demo.poll() is None, (tmp / "demo.log").read_text()[-3000:]
            with contextlib.suppress(OSError):
                ready = [m for m in ready if not _query(api, m)]
            time.sleep(1)
        assert not ready, f"no {ready} after 90 s: {(tmp / 'demo.log').read_text()[-3000:]}"
        yield DemoStack(controller=f"http://{listen}", prometheus=api)
    finally:
        prom.terminate()
        demo.terminate()
        prom.wait(timeout=30)
        demo.wait(timeout=60)


def test_variables_have_values(prometheus: str):
    for name, match in (("supernode", 'up{job="sn-agent"}'), ("node", "sn_gpu_info"),
                        ("gpu", "sn_gpu_info"), ("job", "sn_job_state"),
                        ("slurm_job", "sn_workload_gpus")):
        url = f"{prometheus}/label/{name}/values?{urllib.parse.urlencode({'match[]': match})}"
        assert _get(url)["data"], name


def test_every_panel_query_returns_data(prometheus: str):
    pending = {(uid, title): substitute(expr) for uid, title, expr in queries()}
    assert len(pending) >= 60
    empty: dict[tuple[str, str], str] = {}
    deadline = time.monotonic() + 45  # a few series (rates over 1m) need a little history
    while pending:
        empty = {}
        for key, expr in pending.items():
            if not _shows_something(_query(prometheus, expr)):
                empty[key] = expr
        pending = empty
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert empty == {}, "\n".join(f"{uid} / {title}: {expr}"
                                  for (uid, title), expr in empty.items())


def test_the_idle_slurm_job_alone_holds_idle_gpus(prometheus: str):
    """The demo's notebook (Slurm job 1002) leaves its GPUs idle; the training job does not.

    Idle shows once the notebook's GPUs have stayed quiet for ``workloads.idle_after``
    (10 simulated minutes); every workload's energy grows from the start.
    """
    idle = _eventually(lambda: _query(prometheus, "sn_workload_idle_gpus > 0"))
    assert {(s["metric"]["slurm_job"], s["value"][1]) for s in idle} == {("1002", "4")}
    energy = _query(prometheus, "sn_workload_energy_joules_total > 0")
    assert {s["metric"]["slurm_job"] for s in energy} == {"1001", "1002"}


def test_the_api_lists_each_job_s_idle_gpus_and_energy(demo_stack: DemoStack):
    """GET /api/v1/workloads, the controller's own accounting behind those series."""
    def by_job() -> dict[str, dict[str, Any]]:
        listed = _get(f"{demo_stack.controller}/api/v1/workloads")["workloads"]
        return {w["slurm_job"]: w for w in listed if w.get("slurm_job")}

    jobs = _eventually(by_job, lambda seen: bool(seen.get("1002", {}).get("idle_gpus")))
    assert set(jobs) == {"1001", "1002"}
    assert (jobs["1002"]["gpus"], jobs["1002"]["idle_gpus"]) == (4, 4)
    assert jobs["1001"]["idle_gpus"] == 0
    assert jobs["1001"]["gpus"] > 0
    assert all(w["energy_joules_total"] > 0 for w in jobs.values())


def test_the_idle_gpu_alert_fires_for_the_idle_job_alone(prometheus: str):
    """The shipped SnWorkloadIdleGpus (its hold shortened, see :data:`IDLE_ALERT_HOLD`)
    fires for the notebook, Slurm job 1002, and for no other workload."""
    firing = f'ALERTS{{alertname="{IDLE_ALERT}",alertstate="firing"}}'
    alerts = _eventually(lambda: _query(prometheus, firing))
    assert [(a["metric"]["slurm_job"], a["metric"]["severity"]) for a in alerts] == [
        ("1002", "warning")]
    assert _query(prometheus, f'ALERTS{{alertname="{IDLE_ALERT}",slurm_job!="1002"}}') == []
