"""A real Prometheus scraping the demo's simulated supernode, as a new user would set it up.

The supernode is the demo's own (:class:`sn_monitor.sim.supernode.Supernode`: a
controller, simulated agents with their supernode and rack labels, a training job with
a spare), small; Prometheus runs ``deploy/prometheus/prometheus-demo.yml`` (agents found
through the controller's service discovery) with the repository's rules, on 1 s scrape
and evaluation intervals. Checked: every dashboard variable has values and the topology
groups the nodes by rack; one XID reads 1 in "XIDs in the last hour"; after the job's
first recovery, its recovery p90 is a number. Both counters were created by their first
event before, so ``increase()`` read 0 and the p90 NaN.

The first agent's port is taken by another process between the demo's probe and the
agent's bind, as a second demo starting on the machine at the same moment does: that
agent moves to another port and the start goes on.
"""

from __future__ import annotations

import json
import math
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sn_monitor.sim import supernode as supernode_module
from sn_monitor.sim.supernode import JOB, Supernode, SupernodeOptions
from tests.conftest import ROOT
from tests.support.ports import free_port
from tests.support.prometheus import Prometheus

pytestmark = pytest.mark.integration

DEMO_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus-demo.yml"
RULES = ROOT / "rules" / "prometheus"
DASHBOARDS = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
#: Five nodes (racks of four: r00 holds four, r01 one), the last one the job's spare.
NODES, GPUS = 5, 2
XIDS_LAST_HOUR = "instance:sn_gpu_xid_errors:increase1h"
RECOVERY_P90 = "job:sn_recovery_duration_seconds:p90"


def demo_config(controller: str, tmp_path: Path) -> Path:
    """The shipped demo config, pointed at this controller, with 1 s intervals."""
    data = yaml.safe_load(DEMO_CONFIG.read_text())
    data["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    data["rule_files"] = [str(RULES / "*.yml")]
    jobs = {job["job_name"]: job for job in data["scrape_configs"]}
    jobs["sn-controller"]["static_configs"][0]["targets"] = [controller.split("//")[1]]
    (sd,) = jobs["sn-agent"]["http_sd_configs"]
    sd.update(url=f"{controller}/api/v1/sd", refresh_interval="1s")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def taken() -> Iterator[list[socket.socket]]:
    """The listener that takes the first agent's port after the demo probed it."""
    listeners: list[socket.socket] = []
    yield listeners
    for listener in listeners:
        listener.close()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory,
         taken: list[socket.socket]) -> Iterator[tuple[Supernode, Prometheus]]:
    root = tmp_path_factory.mktemp("prometheus-demo")
    supernode = Supernode(SupernodeOptions(
        state_dir=root / "demo", nodes=NODES, gpus=GPUS, spares=1,
        listen=f"127.0.0.1:{free_port()}"))
    prometheus: Prometheus | None = None
    probe = supernode_module.free_ports

    def probed_then_taken(host: str, after: int, count: int) -> list[int]:
        ports = probe(host, after, count)
        if not taken:
            listener = socket.create_server((host, ports[0]))
            taken.append(listener)
        return ports
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(supernode_module, "free_ports", probed_then_taken)
            supernode.start(timeout=120)
        prometheus = Prometheus(demo_config(supernode.url, root), root / "tsdb")

        def every_target_up() -> bool:
            targets = prometheus.get("targets")["activeTargets"]  # type: ignore[union-attr]
            return len(targets) == NODES + 1 and all(t["health"] == "up" for t in targets)
        prometheus.wait(every_target_up, "the controller and every agent scraped", 90)
        yield supernode, prometheus
    finally:
        if prometheus is not None:
            prometheus.close()
        supernode.close()


def test_an_agent_whose_port_was_taken_after_the_probe_moves_to_another(demo, taken):
    supernode, _ = demo
    (listener,) = taken
    first = supernode.names[0]
    moved = int(supernode.agent_urls[first].rsplit(":", 1)[1])
    assert moved != listener.getsockname()[1]
    assert supernode.agents[first].running


def _variables() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in DASHBOARDS:
        for variable in json.loads(path.read_text()).get("templating", {}).get("list", []):
            if variable.get("type") == "query":
                yield path.name, variable


def label_values(prometheus: Prometheus, query: str) -> list[str]:
    """What Grafana's ``label_values(selector, label)`` / ``label_values(label)`` lists."""
    found = re.fullmatch(r"label_values\((?:(.+),\s*)?(\w+)\)", query.strip())
    assert found is not None, f"not a label_values() query: {query}"
    selector, label = found.groups()
    params: dict[str, str | list[str]] = {"match[]": [selector]} if selector else {}
    return sorted(prometheus.get(f"label/{label}/values", **params))


@pytest.mark.timeout(300)
def test_every_dashboard_variable_has_values_and_the_nodes_sit_in_racks(demo):
    supernode, prometheus = demo
    chosen: dict[str, str] = {}  # each variable set to its first value, as a person would
    listed: dict[tuple[str, str], list[str]] = {}
    variables = list(_variables())
    assert {name for name, _ in variables} == {
        "sn-gpu-health.json", "sn-jobs.json", "sn-node.json", "sn-overview.json",
        "sn-workloads.json"}
    for dashboard, variable in variables:
        query = variable["definition"] or variable["query"]
        for name, value in chosen.items():
            query = query.replace(f"${name}", value)
        values = label_values(prometheus, query)
        assert values, f"{dashboard}: ${variable['name']} ({query}) has no values"
        listed[(dashboard, variable["name"])] = values
        chosen[variable["name"]] = values[0]
        assert all(re.fullmatch(r"[\w-]+", v) for v in values), values
    for dashboard in ("sn-gpu-health.json", "sn-node.json", "sn-overview.json"):
        assert listed[(dashboard, "supernode")] == ["sn0"]
    assert listed[("sn-node.json", "node")] == supernode.names
    assert listed[("sn-node.json", "gpu")] == [str(g) for g in range(GPUS)]
    assert listed[("sn-jobs.json", "job")] == [JOB]
    assert listed[("sn-workloads.json", "slurm_job")] == [
        job.job_id for job in supernode.slurm_jobs]
    topology = supernode.get("/api/v1/topology")
    assert [(s["name"], [(r["name"], r["nodes"]) for r in s["racks"]])
            for s in topology["supernodes"]] == [
        ("sn0", [("r00", supernode.names[:4]), ("r01", supernode.names[4:])])]


@pytest.mark.timeout(300)
def test_the_first_xid_and_the_first_recovery_count(demo):
    supernode, prometheus = demo
    # an application XID on the spare: a code the agent has no series for until it is seen
    spare = supernode.spares[0]
    supernode.inject(spare, "xid", 1, {"code": 13, "message": "Graphics SM Warp Exception"})
    prometheus.wait_value(f'sum(sn_gpu_xid_errors_total{{node="{spare}", xid="13"}})',
                          lambda v: v == 1, f"Prometheus to scrape the XID of {spare}")
    prometheus.wait_value(f'{XIDS_LAST_HOUR}{{node="{spare}"}}', lambda v: v == 1,
                          f'"XIDs in the last hour" of {spare} to read 1', timeout=20)
    assert prometheus.query(XIDS_LAST_HOUR + " > 0") == prometheus.query(
        f'{XIDS_LAST_HOUR}{{node="{spare}"}}')  # the one node, the one XID
    # a fatal XID on a job node: the job fails over to the spare and restores
    broken = supernode.job_nodes[0]
    supernode.inject(broken, "xid", 0, {"code": 119, "message": "GSP RPC timeout"})
    prometheus.wait_value(f'{XIDS_LAST_HOUR}{{node="{broken}"}}', lambda v: v == 1,
                          f'"XIDs in the last hour" of {broken} to read 1', timeout=30)
    prometheus.wait_value(f'sn_recovery_duration_seconds_count{{job="{JOB}"}}',
                          lambda v: v >= 1, "the job's first recovery", timeout=180)
    seconds = prometheus.wait_value(f'{RECOVERY_P90}{{job="{JOB}"}}',
                                    lambda v: not math.isnan(v),
                                    "the recovery p90 to be a number", timeout=20)
    assert 0 < seconds <= 1800
