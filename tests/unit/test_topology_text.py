"""``sn-monitor topology``'s text: the API's JSON (tests/topology_sample.py) to lines."""

from __future__ import annotations

import pytest

from sn_monitor.topology_text import render_topology
from tests.topology_sample import sample_topology


def test_a_healthy_fleet_lists_racks_nodes_and_rails_in_order() -> None:
    lines = render_topology(sample_topology(nodes=4, racks=2, job=None))
    assert lines[0].startswith("topology at 2024-12-02 20:06:40 UTC · 4 nodes · 8 rails")
    assert "FAIL-SLOW" not in "\n".join(lines)
    text = [line.split() for line in lines[1:]]
    assert text[:7] == [
        ["supernode", "sn0"],
        ["rack", "r0"], ["sim-0", "ok", "healthy"], ["sim-1", "ok", "healthy"],
        ["rack", "r1"], ["sim-2", "ok", "healthy"], ["sim-3", "ok", "healthy"],
    ]
    rails = lines[lines.index("rails") + 1:]
    assert [r.split()[:6] for r in rails] == [
        ["rail", str(i), "ok", "4/4", "ports", "ok"] for i in range(8)]
    assert all(r.endswith("util  78 %") for r in rails)


def test_fail_slow_comes_first_and_its_node_and_port_are_named() -> None:
    doc = sample_topology(nodes=6, racks=2, port_down=("sim-3", "mlx5_3"), fail_slow=True,
                          job_nodes=3)
    lines = render_topology(doc)
    assert lines[1:4] == [
        "FAIL-SLOW (1)",
        "  ! job llm +18 %: sim-1 mlx5_3 (rail 3) congested-link since 20:05:00",
        "    job llm: step time +18 % since 10:45; rail 3 on sim-1 (mlx5_3): xmit_wait 40x "
        "the rail median",
    ]
    line = {line.split()[0]: line for line in lines if line.startswith("     ")}
    assert "ports: mlx5_3 failed (DOWN)" in line["sim-3"]
    assert "DEGRADED" in line["sim-3"]
    rail3 = next(line for line in lines if line.startswith("  rail 3 "))
    assert "degraded  4/6 ports ok" in rail3
    # the failed port before the degraded one
    assert rail3.endswith("sim-3/mlx5_3 failed (DOWN), sim-1/mlx5_3 degraded (ACTIVE)")


def test_a_jobs_nodes_are_marked() -> None:
    doc = sample_topology(nodes=4, racks=1, job="llm", job_nodes=2, fail_slow=True)
    lines = render_topology(doc, job="llm")
    assert lines[0].endswith("· job llm (2 nodes, marked *)")
    marked = {line.split()[1] for line in lines if line.startswith("   * ")}
    assert marked == {"sim-0", "sim-1"}
    sim1 = next(line for line in lines if " sim-1 " in line and line.startswith("   *"))
    assert "FAIL-SLOW mlx5_3" in sim1
    # no job asked for: nothing marked
    assert not [line for line in render_topology({**doc, "job": None})
                if line.startswith("   * ")]


def test_a_node_without_labels_or_topology_is_listed_anyway() -> None:
    doc = sample_topology(nodes=2, racks=1, job=None)
    doc["nodes"]["new-0"] = {"name": "new-0", "supernode": "", "rack": "", "state": "healthy",
                             "health": "unknown", "jobs": [], "incidents": [],
                             "has_topology": False, "nvswitches": None, "gpus": [],
                             "nics": []}
    lines = render_topology(doc)
    at = lines.index("supernode (none)")
    assert lines[at + 1] == "  rack (none)"
    assert lines[at + 2].split() == ["new-0", "unknown", "healthy", "(no", "topology", "yet)"]


@pytest.mark.parametrize(("port", "shown"), [
    ({"state": 4, "rate_bytes_per_second": 2.5e10, "max_rate_bytes_per_second": 5e10,
      "health": "degraded"}, "mlx5_0 degraded (ACTIVE, 200 of 400 Gb/s)"),
    ({"state": 4, "errors_per_second": 3.0, "health": "degraded"},
     "mlx5_0 degraded (ACTIVE, 3 errors/s)"),
    ({"state": 2, "health": "failed"}, "mlx5_0 failed (INIT)"),
    ({"state": None, "health": "failed"}, "mlx5_0 failed (state ?)"),
])
def test_what_an_unhealthy_port_shows(port: dict[str, object], shown: str) -> None:
    doc = sample_topology(nodes=1, racks=1, job=None)
    doc["nodes"]["sim-0"]["nics"][0]["ports"][0].update(port)
    line = next(line for line in render_topology(doc) if "sim-0" in line)
    assert f"ports: {shown}" in line


def test_an_empty_answer() -> None:
    lines = render_topology({"time": None, "job": None, "supernodes": [], "rails": [],
                             "nodes": {}, "jobs": [], "fail_slow": []})
    assert lines == ["topology at - · 0 nodes · 0 rails"]
