"""``sn-monitor breaker``: a person reads, opens and closes a real controller's breaker."""

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
    with Cluster(tmp_path, nodes=1) as c:
        c.start()
        yield c


def breaker(c: Cluster, *args: str, token: Path | None = None) -> subprocess.CompletedProcess[str]:
    token_args = ["--token-file", str(token)] if token is not None else []
    return subprocess.run([sys.executable, "-m", "sn_monitor.cli", "breaker", *args,
                           "--controller", c.url, *token_args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_open_and_close_by_hand_through_the_command(cluster: Cluster) -> None:
    c = cluster
    admin = c.root / "admin.token"
    status = breaker(c, "status", token=admin)
    assert (status.returncode, status.stdout.strip()) == (
        0, "circuit breaker: closed (evictions allowed)"), status.stderr
    refused = breaker(c, "open", "--reason", "switch maintenance")
    assert refused.returncode == 1
    assert "401" in refused.stderr
    missing = breaker(c, "close", token=c.operate_token_file)
    assert missing.returncode == 2
    assert "needs --reason" in missing.stderr
    opened = breaker(c, "open", "--reason", "switch maintenance", token=c.operate_token_file)
    assert opened.returncode == 0, opened.stderr
    assert "OPEN since" in opened.stdout
    assert "(opened by hand)" in opened.stdout
    assert "switch maintenance (by operators)" in opened.stdout
    assert c.get("/api/v1/breaker")["open"] is True
    closed = breaker(c, "close", "--reason", "done", token=c.operate_token_file)
    assert closed.returncode == 0, closed.stderr
    assert "closed" in closed.stdout
    trail = {a["action"]: a for a in c.actions() if a["action"].endswith("-breaker")}
    assert trail["open-breaker"]["requested_by"] == "operators"
    assert trail["close-breaker"]["requested_by"] == "operators"
    alerts = [a for a in c.actions() if a["rule"] == "circuit-breaker"]
    assert sorted(a["params"]["status"] for a in alerts) == ["firing", "resolved"]


def test_no_controller_is_a_failure(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "sn_monitor.cli", "breaker", "status",
                           "--controller", "http://127.0.0.1:9"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "no active controller answered" in done.stderr
