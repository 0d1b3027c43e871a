"""The controller's side of the topology: asked for, kept, served; fail-slow incidents."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sn_monitor.controller.security.auth import OPEN_ACCESS
from sn_monitor.model import (
    IbPortReport,
    NicPortTopology,
    NicTopology,
    NodeTopology,
    Report,
    topology_digest,
)
from tests.support.api import AGENT, Api, bearer
from tests.support.failslow import SlowJob

TOPOLOGY = NodeTopology(nics=[
    NicTopology(device=f"mlx5_{i}", role="rail", rail=i,
                ports=[NicPortTopology(port=1, guid=f"0000:0000:0000:000{i}",
                                       link_layer="InfiniBand", rate_bytes_per_second=5e10)])
    for i in range(2)])
DIGEST = topology_digest(TOPOLOGY)


def send(api: Api, node: str, seq: int, when: float, **kw: Any) -> dict[str, Any]:
    report = Report(node=node, instance="i", sequence=seq, sample_time_seconds=when, **kw)
    response = api.client.post("/api/v1/reports", content=msgspec.json.encode(report),
                               headers=bearer(AGENT))
    assert response.status_code == 200, response.text
    return response.json()


def ports(tx: int, state: int = 4, rate: float = 5e10) -> list[IbPortReport]:
    return [IbPortReport(device=f"mlx5_{i}", port=1, state=state if i == 1 else 4,
                         rate_bytes_per_second=rate,
                         counters={"transmitted_bytes": tx, "transmit_wait": tx // 100})
            for i in range(2)]


def test_the_controller_asks_for_a_topology_it_does_not_hold(api: Api) -> None:
    t = api.h.clock.time()
    assert send(api, "gpu-1", 1, t, topology_digest=DIGEST).get("topology_wanted") is True
    assert "topology_wanted" not in send(api, "gpu-1", 2, t, topology_digest=DIGEST,
                                         topology=TOPOLOGY)
    assert "topology_wanted" not in send(api, "gpu-1", 3, t, topology_digest=DIGEST)
    # a changed topology whose report did not carry it: asked for again
    assert send(api, "gpu-1", 4, t, topology_digest="0" * 16).get("topology_wanted") is True
    assert "topology_wanted" not in send(api, "gpu-1", 5, t)  # an agent without topologies


def test_topology_serves_racks_rails_rates_and_health(api: Api) -> None:
    t = api.h.clock.time()
    labels = {"supernode": "sn0", "rack": "r1"}
    send(api, "gpu-1", 1, t, labels=labels, topology_digest=DIGEST, topology=TOPOLOGY,
         infiniband=ports(0))
    send(api, "gpu-1", 2, t + 5, labels=labels, topology_digest=DIGEST,
         infiniband=ports(5_000_000_000))
    send(api, "gpu-2", 1, t, labels={"supernode": "sn0", "rack": "r2"})
    response = api.get("/api/v1/topology")
    assert response.status_code == 200
    doc = response.json()
    assert doc["supernodes"] == [{"name": "sn0", "racks": [
        {"name": "r1", "nodes": ["gpu-1"]}, {"name": "r2", "nodes": ["gpu-2"]}]}]
    node = doc["nodes"]["gpu-1"]
    assert node["has_topology"] is True
    assert node["health"] == "ok"
    port = node["nics"][0]["ports"][0]
    assert node["nics"][0]["rail"] == 0
    assert port["guid"] == "0000:0000:0000:0000"
    assert port["transmit_bytes_per_second"] == pytest.approx(1e9)
    assert port["utilization_ratio"] == pytest.approx(0.02)
    assert [r["rail"] for r in doc["rails"]] == [0, 1]
    assert doc["rails"][0]["ports"] == [{"node": "gpu-1", "device": "mlx5_0", "port": 1}]
    assert doc["nodes"]["gpu-2"]["has_topology"] is False

    send(api, "gpu-1", 3, t + 6, labels=labels, topology_digest=DIGEST,
         infiniband=ports(6_000_000_000, state=1))
    api.h.clock.advance(1.0)  # the document is built at most once a second
    doc = api.get("/api/v1/topology").json()
    down = doc["nodes"]["gpu-1"]["nics"][1]["ports"][0]
    assert (down["state"], down["health"]) == (1, "failed")
    assert doc["nodes"]["gpu-1"]["health"] == "degraded"
    assert [r["health"] for r in doc["rails"]] == ["ok", "failed"]


def test_a_report_never_waits_for_a_reader_of_the_rates(api: Api) -> None:
    """The topology view works thousands of nodes' rates in (a second); no report waits."""
    t = api.h.clock.time()
    send(api, "gpu-1", 1, t, topology_digest=DIGEST, topology=TOPOLOGY, infiniband=ports(0))
    controller = api.h.controller
    answered = threading.Event()

    def report() -> None:
        body = msgspec.json.encode(Report(node="gpu-1", instance="i", sequence=2,
                                          sample_time_seconds=t + 5, topology_digest=DIGEST,
                                          infiniband=ports(5_000_000_000)))
        controller.ingest(body, OPEN_ACCESS, None)
        answered.set()

    sender = threading.Thread(target=report, name="report")
    with controller.finder.meter.reading():  # a reader working the rates in, meanwhile
        sender.start()
        assert answered.wait(60), "the report waited for the reader"
    sender.join()
    port = api.get("/api/v1/topology").json()["nodes"]["gpu-1"]["nics"][0]["ports"][0]
    assert port["transmit_bytes_per_second"] == pytest.approx(1e9)  # read once it was done


def test_topology_needs_a_reader_and_takes_only_job(api: Api) -> None:
    assert api.client.get("/api/v1/topology").status_code == 401
    assert api.get("/api/v1/topology?node=x").status_code == 422
    assert api.get("/api/v1/topology?job=none").json()["job"] == "none"


def test_a_slow_job_opens_one_fail_slow_incident_naming_the_link(api: Api,
                                                                  tmp_path: Path) -> None:
    h = api.h
    job = SlowJob(h, tmp_path / "ckpt")
    fleet, play = job.fleet, job.play

    play(300, 2.0)
    assert [i for i in h.controller.list_incidents("open", None, 100)] == []
    fleet.wait[("n3", "mlx5_3")] = 4e6
    play(60, 2.5)
    open_ = h.controller.list_incidents("open", None, 100)
    assert [(i["rule"], i["node"], i["subject"]) for i in open_] == [
        ("fail-slow", "n3", "job:llm/mlx5_3")]
    assert "rail 3 on n3 (mlx5_3): xmit_wait" in open_[0]["message"]
    topo = api.get("/api/v1/topology?job=llm").json()
    assert [(b["node"], b["link"], b["kind"]) for b in topo["fail_slow"]] == [
        ("n3", "mlx5_3", "congested-link")]
    assert topo["jobs"][0]["slowdown_ratio"] > 0.1
    metrics = h.controller.metrics().decode()
    assert ('sn_fail_slow{job="llm",kind="congested-link",link="mlx5_3",node="n3"} 1.0'
            in metrics)
    assert 'sn_job_slowdown_ratio{job="llm"} 0.' in metrics
    port = next(n for n in topo["nodes"]["n3"]["nics"] if n["device"] == "mlx5_3")
    assert port["ports"][0]["health"] == "degraded"
    fleet.wait[("n3", "mlx5_3")] = 2e4
    play(120, 2.0)
    assert h.controller.list_incidents("open", None, 100) == []
    assert 'sn_job_slowdown_ratio{job="llm"} 0.0' in h.controller.metrics().decode()
    assert h.controller.jobs.ranks_by_node("llm")["n3"] == [3]
