"""``sn-monitor simulate`` against a real ``sn-monitor controller``: load, refusals, a scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port
from tests.support.simulate import ROOT, Controller, running_controller

pytestmark = pytest.mark.integration


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    with running_controller(tmp_path) as ctl:
        yield ctl


def simulate(*args: str, timeout: float = 60) -> tuple[int, dict[str, Any], str]:
    """Run ``sn-monitor simulate --json``; (exit status, the summary, stderr)."""
    result = subprocess.run([sys.executable, "-m", "sn_monitor.cli", "simulate", "--json",
                             "--quiet", *args], capture_output=True, text=True,
                            timeout=timeout, cwd=ROOT, check=False)
    try:
        summary = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"no JSON summary (exit {result.returncode}):\n{result.stdout}\n"
                    f"{result.stderr}")
    return result.returncode, summary, result.stderr


def test_a_thousand_nodes_every_two_seconds(controller: Controller) -> None:
    status, summary, err = simulate("--controller", controller.url, "--nodes", "1000",
                                    "--interval", "2s", "--duration", "6",
                                    "--token-file", str(controller.agent_token_file))
    assert status == 0, err
    assert 2700 <= summary["accepted"] <= 3300, summary
    assert summary["refused"] == {}, summary
    assert summary["failed"]["connection"] == 0, summary
    assert summary["latency_ms"]["p50"] is not None
    nodes = controller.get("/api/v1/nodes")["nodes"]
    assert len(nodes) == 1000
    assert {n["name"] for n in nodes} == {f"sim-{i:04d}" for i in range(1000)}


def test_posted_reports_are_counted_as_streamed_ones_are(controller: Controller) -> None:
    status, summary, err = simulate("--controller", controller.url, "--nodes", "200",
                                    "--interval", "1s", "--duration", "3", "--post-reports",
                                    "--token-file", str(controller.agent_token_file))
    assert status == 0, err
    assert 500 <= summary["accepted"] == summary["sent"], summary
    assert summary["latency_ms"]["n"] == summary["sent"]  # every report answered
    status, summary, err = simulate("--controller", controller.url, "--nodes", "200",
                                    "--interval", "1s", "--duration", "3",
                                    "--token-file", str(controller.agent_token_file))
    assert status == 0, err
    assert 500 <= summary["accepted"] == summary["sent"], summary
    # every report counted, by the answers to the few that asked
    assert summary["latency_ms"]["n"] < summary["sent"] / 2


def test_a_wrong_token_is_refused_and_said_so(controller: Controller, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text("not-a-token\n")
    status, summary, _ = simulate("--controller", controller.url, "--nodes", "20",
                                  "--interval", "500ms", "--duration", "1.5",
                                  "--token-file", str(wrong))
    assert status == 1
    assert summary["accepted"] == 0, summary
    assert summary["refused"].get("401", 0) >= 20, summary
    assert any(m.startswith("401") for m in summary["messages"]), summary


def test_no_controller_is_a_failure_not_a_quiet_success() -> None:
    status, summary, err = simulate("--controller", f"http://127.0.0.1:{free_port()}",
                                    "--nodes", "3", "--interval", "500ms", "--duration", "1.5")
    assert status == 1, (summary, err)
    assert summary["accepted"] == 0
    assert "accepted no report" in err


def test_a_fault_of_the_demo_job_is_refused_before_anything_starts() -> None:
    """``rank-error`` acts on the demo's training job; simulate has none."""
    result = subprocess.run([sys.executable, "-m", "sn_monitor.cli", "simulate", "--controller",
                             f"http://127.0.0.1:{free_port()}", "--scenario", "job-failure"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert result.returncode == 2
    assert "plays rank-error, a fault of the demo's training job" in result.stderr
    assert "sn-monitor demo" in result.stderr
    assert result.stdout == ""


def play(controller: Controller, tmp_path: Path, fault: str,
         *args: str) -> tuple[int, dict[str, Any], str]:
    """``simulate`` of 16 nodes every 500 ms with a one-fault scenario, as an agent."""
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(f"kind: Scenario\nname: one-fault\nfaults:\n  - {fault}\n")
    return simulate("--controller", controller.url, "--nodes", "16", "--interval", "500ms",
                    "--scenario", str(scenario), "--token-file",
                    str(controller.agent_token_file), *args)


def test_an_overheat_scenario_opens_an_incident_and_is_throttled(
        controller: Controller, tmp_path: Path) -> None:
    status, summary, err = play(controller, tmp_path,
                                "{at: 10s, node: 2, gpu: 3, fault: overheat, factor: 2.0}",
                                "--speed", "10", "--duration", "10")
    assert status == 0, err
    assert summary["faults_played"] == ["t=10s: overheat factor=2.0 on sim-0002 GPU 3"]
    incidents = controller.get("/api/v1/incidents", node="sim-0002", limit=100)["incidents"]
    assert any(i["rule"] == "gpu-overheat" and i["gpu"] == 3 for i in incidents), incidents
    assert summary["commands"].get("throttle", 0) >= 1, summary
    actions = controller.get("/api/v1/actions", node="sim-0002", limit=100)["actions"]
    throttles = [a for a in actions if a["action"] == "throttle" and a["rule"] == "gpu-overheat"]
    assert throttles, actions
    assert throttles[0]["state"] == "succeeded", throttles


def test_a_counter_that_rises_on_a_node_judging_its_own_rules_is_caught(
        controller: Controller, tmp_path: Path) -> None:
    # The node's rules (ecc-uncorrectable: an increase over 5 minutes) run in simulate
    # once the node is faulted; they must have seen the counter before the fault, as an
    # agent evaluating every sample has (the soak missed every such fault otherwise).
    status, _, err = play(controller, tmp_path,
                          "{at: 3s, node: 5, gpu: 1, fault: ecc-uncorrectable, count: 1}",
                          "--duration", "6")
    assert status == 0, err
    incidents = controller.get("/api/v1/incidents", node="sim-0005", limit=100)["incidents"]
    assert any(i["rule"] == "ecc-uncorrectable" and i["gpu"] == 1 for i in incidents), incidents


@pytest.mark.parametrize("fast", [True, False], ids=["at-once", "at-next-report"])
def test_a_faults_events_go_at_once_in_an_events_only_report(
        controller: Controller, tmp_path: Path, fast: bool) -> None:
    """Nodes that report every 10 minutes: only the fast path brings the XID in the run.

    The nodes' first reports are spread over the first interval (seeded: the same in both
    runs), so the faulted node's next report falls far after the run (and the one report
    that ends the stream is node 0's); with the fast path its events go at once, and the
    incident opens.
    """
    args = () if fast else ("--events-at-next-report",)
    status, summary, err = simulate(
        "--controller", controller.url, "--nodes", "4", "--interval", "10m",
        "--duration", "6", "--connections", "1", "--token-file", str(controller.agent_token_file),
        "--scenario", str(_one_fault(tmp_path, "{at: 2s, node: 1, gpu: 2, fault: xid, "
                                               "code: 79}")), *args)
    assert status == 0, err
    assert len(summary["faults_played"]) == 1, summary
    incidents = controller.get("/api/v1/incidents", node="sim-0001", limit=100)["incidents"]
    fatal = [i for i in incidents if i["rule"] == "fatal-xid" and i["gpu"] == 2]
    if fast:
        assert fatal, incidents
        assert summary["events"]["acknowledged"] == 1, summary
    else:
        assert fatal == [], incidents  # its next report is minutes away


def _one_fault(tmp_path: Path, fault: str) -> Path:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(f"kind: Scenario\nname: one-fault\nfaults:\n  - {fault}\n")
    return scenario
