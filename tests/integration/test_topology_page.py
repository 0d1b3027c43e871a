"""The topology page in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by selenium, against a real controller and simulated agents.

The page must draw the simulated supernode (every node in its rack, the 8 rails), show a
port that an injected fault took down as failed, and open a node's GPUs and NICs on a
click. A screenshot is kept in ``build/test-artifacts/topology.png``. Without Chromium the
test is skipped (``tests/support/browser.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.cluster import ROOT, Cluster
from tests.support.browser import console_errors, wait_page

pytestmark = pytest.mark.integration

ARTIFACT = ROOT / "build" / "test-artifacts" / "topology.png"
#: Node -> rack, all in supernode sn0.
RACKS = {"sim-0": "r0", "sim-1": "r0", "sim-2": "r1", "sim-3": "r1"}
RAILS = 8
#: The port the test takes down.
NODE, DEVICE = "sim-2", "mlx5_3"
RED = "#e5484d"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", nodes=len(RACKS), agent_labels={"supernode": "sn0"})
    for name, agent in c.agents.items():
        config = c.root / f"{name}-labels.yaml"
        config.write_text(yaml.safe_dump({"labels": {"supernode": "sn0", "rack": RACKS[name]}}))
        agent.argv[agent.argv.index("--config") + 1] = str(config)
    try:
        yield c.start()
    finally:
        c.close()


def drawing(chrome: Any) -> dict[str, Any]:
    """What the page drew, read from its data attributes."""
    return dict(chrome.execute_script("""
        const all = (sel) => [...document.querySelectorAll(sel)];
        return {
          loaded: document.body.dataset.loaded,
          nodes: Object.fromEntries(all('#topology .node[data-node]').map(
            (n) => [n.dataset.node, n.dataset.health])),
          racks: all('#topology .rack').map((r) => r.dataset.supernode + '/' + r.dataset.rack),
          supernodes: all('#topology .supernode').map((s) => s.dataset.supernode),
          rails: all('#topology .rail-switch').map((r) => Number(r.dataset.rail)),
          ports: Object.fromEntries(all('#topology .port[data-port]').map(
            (p) => [p.dataset.port, p.dataset.health])),
        };
    """))


def port_drawn(chrome: Any, port: str) -> dict[str, Any] | None:
    found = chrome.execute_script("""
        const p = document.querySelector(`#topology .port[data-port="${arguments[0]}"]`);
        return p && {health: p.dataset.health,
                     stroke: p.querySelector('line').getAttribute('stroke')};
    """, port)
    return dict(found) if found else None


@pytest.mark.timeout(300)
def test_the_page_draws_the_supernode_shows_a_port_down_and_opens_a_node(
        cluster: Cluster, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    c, chrome = cluster, browser
    page = f"{c.url}/ui/topology"

    # Without a token the controller refuses the API, and the page says so.
    chrome.get(page)
    wait_page(chrome, c, lambda: chrome.execute_script(
        "return document.getElementById('status').dataset.state === 'unauthorized'"),
        "the page to say 401")
    assert "read" in chrome.find_element(By.ID, "message").text

    # With one in the fragment it draws; the token leaves the address bar.
    chrome.get(f"{page}#token={c.admin_token}")
    expected_ports = {f"{node}/mlx5_{rail}" for node in RACKS for rail in range(RAILS)}

    def drawn() -> dict[str, Any] | None:
        d = drawing(chrome)
        complete = (d["loaded"] == "true" and set(d["nodes"]) == set(RACKS)
                    and expected_ports <= set(d["ports"]))
        return d if complete else None

    d = wait_page(chrome, c, drawn, "every node with its 8 rail ports drawn")
    assert "token" not in chrome.current_url
    assert d["supernodes"] == ["sn0"]
    assert sorted(d["racks"]) == ["sn0/r0", "sn0/r1"]
    assert sorted(d["rails"]) == list(range(RAILS))
    assert all(d["ports"][p] == "ok" for p in expected_ports), d["ports"]
    assert set(d["nodes"].values()) <= {"ok", "degraded", "failed", "unknown"}

    # A port goes down on one node: the page shows it failed, in red.
    port = f"{NODE}/{DEVICE}"
    injected = time.monotonic()
    c.agents[NODE].fault("ib-port-down", device=DEVICE)
    shown = wait_page(chrome, c, lambda: (p := port_drawn(chrome, port)) and
                      p["health"] == "failed" and p, f"{port} drawn failed")
    print(f"the page showed {port} failed {time.monotonic() - injected:.1f} s after the fault")
    assert shown["stroke"].lower() == RED
    others = drawing(chrome)["ports"]
    assert [p for p in expected_ports - {port} if others[p] == "failed"] == []

    # A click on the node opens its GPUs and NICs.
    chrome.find_element(By.CSS_SELECTOR, f'#topology .node[data-node="{NODE}"]').click()
    panel = wait_page(chrome, c, lambda: chrome.execute_script("""
        const panel = document.getElementById('node-panel');
        if (panel.hidden || panel.dataset.node !== arguments[0]) return null;
        return {
          gpus: [...panel.querySelectorAll('tr[data-gpu]')].map((r) => Number(r.dataset.gpu)),
          nics: Object.fromEntries([...panel.querySelectorAll('tr[data-nic]')].map(
            (r) => [r.dataset.nic, r.dataset.health])),
        };
    """, NODE), f"the side panel of {NODE}")
    assert sorted(panel["gpus"]) == list(range(8))
    assert {f"mlx5_{rail}" for rail in range(RAILS)} <= set(panel["nics"])
    assert panel["nics"][DEVICE] == "failed"

    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    assert chrome.save_screenshot(str(ARTIFACT))
    print(f"screenshot: {ARTIFACT}")

    errors = console_errors(chrome)
    assert errors == [], errors
