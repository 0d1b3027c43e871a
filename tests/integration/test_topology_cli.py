"""``sn-monitor topology``: the fabric of a real controller's simulated nodes, as text."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path, nodes=2, agent_labels={"supernode": "sn0", "rack": "r0"}) as c:
        c.start()
        yield c


def topology(c: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sn_monitor.cli", "topology",
                           "--controller", c.url, *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_terminal_names_a_port_that_went_down(cluster: Cluster) -> None:
    c = cluster
    token = ["--token-file", str(c.root / "admin.token")]
    c.agents["sim-1"].fault("ib-port-down", device="mlx5_3")

    def shown() -> subprocess.CompletedProcess[str] | None:
        done = topology(c, *token)
        assert done.returncode == 0, done.stderr
        return done if "sim-1/mlx5_3 failed (DOWN)" in done.stdout else None

    done = c.wait_for(shown, 60, "sim-1/mlx5_3 failed in `sn-monitor topology`")
    lines = done.stdout.splitlines()
    assert lines[0].startswith("topology at ")
    assert "supernode sn0" in lines
    assert "  rack r0" in lines
    nodes = {line.split()[0]: line for line in lines if line.startswith("     sim-")}
    assert set(nodes) == {"sim-0", "sim-1"}
    assert "mlx5_3 failed (DOWN)" in nodes["sim-1"]
    rails = [line for line in lines if line.startswith("  rail ")]
    assert len(rails) == 8, lines

    refused = topology(c)
    assert refused.returncode == 1
    assert "401" in refused.stderr


def test_no_controller_is_a_failure() -> None:
    done = subprocess.run([sys.executable, "-m", "sn_monitor.cli", "topology",
                           "--controller", "http://127.0.0.1:9"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "no active controller answered" in done.stderr
