"""NVIDIA's dcgm-exporter dashboard on a real Prometheus scraping the agent in ``dcgm`` mode.

A simulated agent (``sn-monitor agent --simulate``) with ``exposition: dcgm`` in its
config, scraped every second by a ``prometheus`` process as a dcgm-exporter target
would be. Each template variable and each panel query of the dashboard revisions
written down in tests/fixtures/dcgm/dashboard_queries.yaml is run through Prometheus'
HTTP API with the variables set to all their values (Grafana's "All"): each returns
data, one series per GPU carrying the labels its legend and ``by`` name, or one series
where the panel aggregates. The agent's own ``sn_*`` families stay beside them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.conftest import FIXTURES
from tests.support.ports import free_port
from tests.support.prometheus import Prometheus

pytestmark = pytest.mark.integration

DASHBOARDS = yaml.safe_load((FIXTURES / "dcgm" / "dashboard_queries.yaml").read_text())
GPUS = 4
NODE = "dcgm-node"


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, str]]:
    root = tmp_path_factory.mktemp("dcgm")
    port = free_port()
    config = root / "agent.yaml"
    config.write_text("exposition: dcgm\n")
    target = f"127.0.0.1:{port}"
    agent = subprocess.Popen(
        [sys.executable, "-m", "sn_monitor.cli", "agent", "--simulate", str(GPUS),
         "--config", str(config), "--listen", target, "--node", NODE,
         "--state-dir", str(root / "state"), "--duration", "300"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=(root / "agent.log").open("wb"))
    (root / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "gpu-metrics",
                            "static_configs": [{"targets": [target]}]}],
    }))
    prometheus = Prometheus(root / "prometheus.yml", root / "tsdb")
    try:
        def every_gpu_scraped() -> bool:
            assert agent.poll() is None, (root / "agent.log").read_text()[-3000:]
            return len(prometheus.query("DCGM_FI_DEV_GPU_TEMP")) == GPUS
        prometheus.wait(every_gpu_scraped, "the agent's GPUs in Prometheus", 90)
        yield prometheus, target
    finally:
        prometheus.close()
        agent.terminate()
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(timeout=10)


def _with(text: str, chosen: dict[str, list[str]]) -> str:
    """``text`` with each ``$variable`` as Grafana writes "All": an alternation of values,
    each escaped for a regular expression inside a PromQL string."""
    for name in sorted(chosen, key=len, reverse=True):
        values = (re.escape(v).replace("\\", "\\\\") for v in chosen[name])
        text = text.replace(f"${name}", "|".join(values))
    return text


def _results(prometheus: Prometheus, expr: str) -> list[dict[str, Any]]:
    return list(prometheus.get("query", query=expr)["result"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("board", DASHBOARDS["dashboards"], ids=lambda b: b["name"])
def test_every_dashboard_query_returns_data_grouped_by_its_labels(scraped, board):
    prometheus, target = scraped
    chosen: dict[str, list[str]] = {}
    for variable in board["variables"]:
        values = prometheus.get(f"label/{variable['label']}/values",
                                **{"match[]": [_with(variable["metric"], chosen)]})
        assert values, f"{board['name']}: ${variable['name']} has no values"
        chosen[variable["name"]] = sorted(values)
    assert chosen["gpu"] == [str(gpu) for gpu in range(GPUS)]
    if "instance" in chosen:
        assert chosen["instance"] == [target]
    if "Hostname" in chosen:
        assert chosen["Hostname"] == [NODE]
    for query in board["queries"]:
        expr = _with(query["expr"], chosen)
        found = prometheus.wait(lambda expr=expr: _results(prometheus, expr),
                                f"{board['name']} / {query['panel']}: {expr}", 30)
        if query.get("aggregated"):
            assert len(found) == 1, (query["panel"], found)
            assert float(found[0]["value"][1]) >= 0
            continue
        for series in found:
            labels = series["metric"]
            missing = [name for name in query["labels"] if not labels.get(name)]
            assert not missing, (query["panel"], missing, labels)
        gpus = sorted(series["metric"]["gpu"] for series in found)
        assert gpus == chosen["gpu"], (query["panel"], found)


@pytest.mark.timeout(120)
def test_the_agents_own_families_stay_beside_dcgm_exporters(scraped):
    prometheus, _ = scraped
    # one reading under two names, in one scrape: the same temperatures
    same = prometheus.wait(
        lambda: prometheus.query("DCGM_FI_DEV_GPU_TEMP - on(gpu) sn_gpu_temperature_celsius"),
        "DCGM_FI_DEV_GPU_TEMP beside sn_gpu_temperature_celsius", 30)
    assert len(same) == GPUS
    assert set(same.values()) == {0.0}
    energy = prometheus.query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert len(energy) == GPUS
    assert prometheus.query("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total") == {}
