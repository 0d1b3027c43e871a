"""``sn-monitor slurm-health`` against a real slurmctld (tests/slurm.py) and a simulated
agent process (``sn-monitor agent --simulate 8``, faults through ``POST /sim/fault``).

The command runs in this process (``cli.main``), except once as slurmd runs a
HealthCheckProgram: a child process with ``SLURMD_NODENAME`` and no ``--node``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from sn_monitor.cli import main
from sn_monitor.controller.actions.drivers.slurm import parse_show_node
from sn_monitor.slurm_health import HEALTH_PREFIX, parse_samples
from tests.integration.cluster import Agent
from tests.slurm import SlurmCluster
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODE = "n2"


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    try:
        yield slurm_cluster
    finally:
        slurm_cluster.reset()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """A simulated agent with 8 GPUs (no controller), sampling every second."""
    root = tmp_path_factory.mktemp("agent")
    port = free_port()
    process = Agent(NODE, [
        sys.executable, "-m", "sn_monitor.cli", "agent", "--simulate", "8", "--node", NODE,
        "--listen", f"127.0.0.1:{port}", "--state-dir", str(root / "state"),
        "--log-format", "json"], root / "agent.log", port)
    process.start()
    try:
        deadline = time.monotonic() + 30
        while not _healthy(process.url):
            assert process.running, process.tail()
            assert time.monotonic() < deadline, f"agent not healthy:\n{process.tail()}"
            time.sleep(0.2)
        yield process
    finally:
        process.kill(15)


def _healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def health(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["slurm-health", "--node", NODE, *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def wait_value(agent: Agent, name: str, gpu: int, value: float) -> None:
    """Until the agent's /metrics shows ``name{gpu=...}`` at ``value`` (its next samples)."""
    deadline = time.monotonic() + 15
    while True:
        found = [s.value for s in parse_samples(agent.metrics())
                 if s.name == name and s.labels.get("gpu") == str(gpu)]
        if found == [value]:
            return
        assert time.monotonic() < deadline, f"{name} of GPU {gpu}: {found}, not {value}"
        time.sleep(0.2)


def reason(slurm: SlurmCluster) -> str | None:
    return parse_show_node(slurm.show_node(NODE)).reason


def test_agent_fault_drains_and_repair_resumes(slurm: SlurmCluster, agent: Agent,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, out = health(capsys, "--agent", agent.url)
    assert code == 0, out
    assert "healthy (agent)" in out
    assert slurm.node_state(NODE) == "IDLE"

    agent.fault("row-remap-pending", 2)
    wait_value(agent, "sn_gpu_row_remap_pending", 2, 1.0)
    try:
        # a dry run says what it would do and changes nothing
        code, out = health(capsys, "--agent", agent.url, "--dry-run")
        assert code == 1, out
        assert "would drain" in out
        assert slurm.node_state(NODE) == "IDLE"

        code, out = health(capsys, "--agent", agent.url)
        assert code == 1, out
        assert slurm.node_state(NODE) == "IDLE+DRAIN"
        assert reason(slurm) == (f"{HEALTH_PREFIX} GPU 2 row remap pending (needs a reset)")
        # again: drained already, the same reason
        code, out = health(capsys, "--agent", agent.url)
        assert code == 1, out
        assert "drained already" in out
    finally:
        agent.fault("gpu-reset", 2)
    wait_value(agent, "sn_gpu_row_remap_pending", 2, 0.0)
    code, out = health(capsys, "--agent", agent.url)
    assert code == 0, out
    assert "resume our drain" in out
    assert "DRAIN" not in slurm.node_state(NODE)


def test_someone_elses_drain_is_left_alone(slurm: SlurmCluster, agent: Agent,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    for other in ("bad DIMM, ticket 4711", "sn-monitor: GPU 3 XID 79"):  # the controller's
        slurm.run("scontrol", "update", f"NodeName={NODE}", "State=DRAIN", f"Reason={other}")
        code, out = health(capsys, "--agent", agent.url)
        assert code == 0, out
        assert "left alone" in out
        assert slurm.node_state(NODE) == "IDLE+DRAIN"
        assert reason(slurm) == other
    # unhealthy: still drained by someone else, whose reason stays
    code, out = health(capsys, "--agent", "", "--simulate", "8", "--fault", "nvlink-down@1")
    assert code == 1, out
    assert "already drained by someone else" in out
    assert reason(slurm) == "sn-monitor: GPU 3 XID 79"


def test_without_an_agent_the_gpus_are_checked_here(slurm: SlurmCluster,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    code, out = health(capsys, "--agent", nobody, "--simulate", "8", "--fault", "nvlink-down@1")
    assert code == 1, out
    drained = reason(slurm)
    assert drained is not None
    assert drained.startswith(f"{HEALTH_PREFIX} nvlinks: ")
    assert slurm.node_state(NODE) == "IDLE+DRAIN"
    code, out = health(capsys, "--agent", nobody, "--simulate", "8")
    assert code == 0, out
    assert "healthy (nvml)" in out
    assert "DRAIN" not in slurm.node_state(NODE)


def test_scontrol_failures_exit_2(slurm: SlurmCluster,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["slurm-health", "--node", "n9", "--agent", "", "--simulate", "8"])
    out = capsys.readouterr()
    assert code == 2
    assert "Node n9 not found" in out.err


def test_as_slurmd_runs_it(slurm: SlurmCluster, agent: Agent) -> None:
    """A child process, the node named by ``SLURMD_NODENAME`` as slurmd sets it."""
    agent.fault("fall-off-bus", 5)
    wait_value(agent, "sn_gpu_lost", 5, 1.0)
    env = dict(os.environ, SLURM_CONF=str(slurm.conf), SLURMD_NODENAME=NODE,
               PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-m", "sn_monitor.cli", "slurm-health",
                             "--agent", agent.url], env=env, capture_output=True, text=True,
                            timeout=60, check=False, cwd=ROOT)
    assert result.returncode == 1, result.stdout + result.stderr
    assert reason(slurm) == f"{HEALTH_PREFIX} GPU 5 lost (fallen off the bus or NVML errors)"
