"""Several supernodes, one view: a controller and a ``simulate`` per supernode (real
processes), ``sn-monitor fleet`` over them, its API read as a user would."""

from __future__ import annotations

import contextlib
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.support.ports import free_port
from tests.support.simulate import Controller, running, running_controller

pytestmark = pytest.mark.integration

SUPERNODES = 3
#: Nodes per supernode: a reduced supernode (256 in the simulator's labels), reporting
#: every 2 s, so that three of them and the view fit a loaded two-core machine.
NODES = 24
WAIT = 60.0


def _wait(probe: Any, what: str, log: Path | None = None) -> Any:
    deadline = time.monotonic() + WAIT
    while True:
        try:
            found = probe()
        except requests.RequestException:
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"never saw {what}\n" + (
            log.read_text()[-3000:] if log and log.exists() else "")
        time.sleep(0.25)


class FleetWorld:
    def __init__(self, controllers: list[Controller], url: str, token: str, log: Path) -> None:
        self.controllers = controllers
        self.url = url
        self.token = token
        self.log = log

    def get(self, path: str, token: str | None = None, **params: Any) -> requests.Response:
        return requests.get(f"{self.url}{path}", params=params or None, timeout=30,
                            headers={"Authorization": f"Bearer {token or self.token}"})


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetWorld]:
    root = tmp_path_factory.mktemp("fleet")
    with contextlib.ExitStack() as stack:
        controllers = [stack.enter_context(running_controller(root / f"sn{k:02d}"))
                       for k in range(SUPERNODES)]
        for k, ctl in enumerate(controllers):
            # the k-th supernode of 256 nodes, its first NODES: sim-0256.. for sn01
            stack.enter_context(running(
                [sys.executable, "-m", "sn_monitor.cli", "simulate", "--controller", ctl.url,
                 "--first", str(256 * k), "--nodes", str(NODES), "--interval", "2s",
                 "--connections", "2", "--token-file", str(ctl.agent_token_file),
                 "--quiet", "--duration", "600"], root / f"simulate-{k}.log"))
        token = secrets.token_hex(16)
        (root / "fleet.token").write_text(token + "\n")
        supernodes = []
        for k, ctl in enumerate(controllers):
            (root / f"sn{k:02d}.read").write_text(ctl.admin + "\n")
            # an HA pair for sn00: a controller that is not there, then the real one
            urls = ([f"http://127.0.0.1:{free_port()}"] if k == 0 else []) + [ctl.url]
            supernodes.append({"name": f"sn{k:02d}", "controllers": urls,
                               "token_file": str(root / f"sn{k:02d}.read")})
        (root / "fleet.yaml").write_text(yaml.safe_dump({
            "supernodes": supernodes, "timeout": "5s", "cache": "0.5s",
            "token_file": str(root / "fleet.token")}))
        port = free_port()
        log = root / "fleet.log"
        stack.enter_context(running(
            [sys.executable, "-m", "sn_monitor.cli", "fleet", "--config",
             str(root / "fleet.yaml"), "--listen", f"127.0.0.1:{port}"], log))
        world = FleetWorld(controllers, f"http://127.0.0.1:{port}", token, log)
        _wait(lambda: requests.get(f"{world.url}/healthz", timeout=2).ok, "the view up", log)
        yield world


def test_one_view_lists_every_node_of_every_supernode(fleet: FleetWorld) -> None:
    def complete() -> dict[str, Any] | None:
        doc: dict[str, Any] = fleet.get("/api/v1/nodes").json()
        return doc if len(doc["nodes"]) == SUPERNODES * NODES else None
    doc = _wait(complete, "every node in the view", fleet.log)
    assert doc["partial"] is False
    by_supernode: dict[str, set[str]] = {}
    for node in doc["nodes"]:
        by_supernode.setdefault(node["supernode"], set()).add(node["name"])
        # the view's supernode is the controller's; the simulator labels agree
        assert node["labels"]["supernode"] == node["supernode"]
    assert by_supernode == {
        f"sn{k:02d}": {f"sim-{256 * k + i:04d}" for i in range(NODES)}
        for k in range(SUPERNODES)}
    # each supernode's own controller agrees with what the view says of it
    for k, ctl in enumerate(fleet.controllers):
        own = {n["name"] for n in ctl.get("/api/v1/nodes")["nodes"]}
        assert own == by_supernode[f"sn{k:02d}"]
    status = {s["name"]: s for s in doc["supernodes"]}
    assert status["sn00"]["controller"] == fleet.controllers[0].url  # past the absent one
    metrics = requests.get(f"{fleet.url}/metrics", timeout=30).text
    for k in range(SUPERNODES):
        assert f'sn_fleet_supernode_up{{supernode="sn{k:02d}"}} 1.0' in metrics
        assert f'sn_fleet_nodes{{state="healthy",supernode="sn{k:02d}"}} {NODES}.0' in metrics


def test_the_view_needs_its_own_token(fleet: FleetWorld) -> None:
    assert fleet.get("/api/v1/nodes", token="not-the-token").status_code == 401
    assert requests.get(f"{fleet.url}/api/v1/nodes", timeout=30).status_code == 401
    # a supernode controller's token is not the view's
    assert fleet.get("/api/v1/nodes", token=fleet.controllers[1].admin).status_code == 401


def test_a_supernode_down_makes_the_view_partial_not_empty(fleet: FleetWorld) -> None:
    down = fleet.controllers[-1]
    down.proc.terminate()
    down.proc.wait(timeout=30)

    def partial() -> dict[str, Any] | None:
        doc: dict[str, Any] = fleet.get("/api/v1/nodes").json()
        return doc if doc["partial"] else None
    doc = _wait(partial, "the view partial", fleet.log)
    status = {s["name"]: s for s in doc["supernodes"]}
    last = f"sn{SUPERNODES - 1:02d}"
    assert status[last]["up"] is False
    assert "unreachable" in status[last]["error"]
    assert {n["supernode"] for n in doc["nodes"]} == {f"sn{k:02d}" for k in
                                                     range(SUPERNODES - 1)}
    assert len(doc["nodes"]) == (SUPERNODES - 1) * NODES
    incidents = fleet.get("/api/v1/incidents", status="open").json()
    assert incidents["partial"] is True
    assert all(i["supernode"] != last for i in incidents["incidents"])
    metrics = requests.get(f"{fleet.url}/metrics", timeout=30).text
    assert f'sn_fleet_supernode_up{{supernode="{last}"}} 0.0' in metrics
