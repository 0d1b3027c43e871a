"""The topology page in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by selenium, against a real controller and simulated agents.

The page must draw the simulated supernode (every node in its rack, the 8 rails), show a
port that an injected fault took down as failed, and open a node's GPUs and NICs on a
click. A screenshot is kept in ``build/test-artifacts/topology.png``.

Without Chromium the test is skipped, unless ``REQUIRE_CHROMIUM`` is set (``.ci/run``
sets it): then it fails.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.integration.cluster import ROOT, Cluster

pytestmark = pytest.mark.integration

T = TypeVar("T")

ARTIFACT = ROOT / "build" / "test-artifacts" / "topology.png"
#: Node -> rack, all in supernode sn0.
RACKS = {"sim-0": "r0", "sim-1": "r0", "sim-2": "r1", "sim-3": "r1"}
RAILS = 8
#: The port the test takes down.
NODE, DEVICE = "sim-2", "mlx5_3"
#: Generous: the machine running the tests may be loaded. The page polls every 2 s and
#: normally shows a change within a few seconds.
WAIT = 60.0
RED = "#e5484d"


def _chromium() -> tuple[str, str]:
    """The browser and its driver, or skip (fail with REQUIRE_CHROMIUM) naming what is absent."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", browser), ("chromedriver", driver))
               if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (pip install -e '.[dev]')")
    if missing:
        why = f"no {', '.join(missing)}: apt-get install chromium chromium-driver"
        if os.environ.get("REQUIRE_CHROMIUM"):
            pytest.fail(f"REQUIRE_CHROMIUM is set but there is {why}")
        pytest.skip(why)
    assert browser is not None
    assert driver is not None
    return browser, driver


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    binary, driver = _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1600,1000", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(driver, log_output=str(tmp_path / "chromedriver.log"))
    chrome = webdriver.Chrome(service=service, options=options)
    chrome.set_page_load_timeout(60)
    try:
        yield chrome
    finally:
        chrome.quit()


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


def wait_page(chrome: Any, c: Cluster, probe: Callable[[], T], what: str,
              timeout: float = WAIT) -> T:
    """Poll the page (through ``probe``) until it answers something truthy, or fail."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            status = chrome.execute_script(
                "const s = document.getElementById('status'); "
                "return s ? s.dataset.state + ': ' + s.textContent : null")
            raise AssertionError(f"waited {timeout:g}s for {what}; last: {last!r}; page status: "
                                 f"{status}\n{c.logs()}")
        time.sleep(0.2)


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

    errors = [e for e in chrome.get_log("browser")
              if e["level"] == "SEVERE" and e.get("source") != "network"]
    assert errors == [], errors
