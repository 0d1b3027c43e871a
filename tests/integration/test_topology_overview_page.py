"""The topology page's overview of a fleet too large to draw whole, in headless Chromium
against a real controller fed by ``sn-monitor simulate``.

48 simulated nodes (``sim-0240`` .. ``sim-0287``: the last 16 of supernode sn00 and 32 of
sn01, 8 a rack), whose scenario takes a GPU off the bus on one node and a rail port down
on another. The page's detail is read only for a few nodes (a rack), so the first screen
is the overview: every node a cell, the failed one red and the rack's rail amber on it,
in the first viewport. A click on the "failed" count, or a search by name, brings the
node's rack and card up in one step, the node in the room the card leaves; the crumbs go
back up, a click on a block goes down. Eight more nodes join later: the page takes them
as an update by difference (their rows only). A screenshot is kept in
``build/test-artifacts/topology-overview.png``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import ROOT
from tests.support.browser import console_errors, wait_page
from tests.support.simulate import Controller, running, running_controller

pytestmark = pytest.mark.integration

ARTIFACT = ROOT / "build" / "test-artifacts" / "topology-overview.png"
FIRST, NODES = 240, 48
#: The node whose GPU falls off the bus, and the one whose rail port goes down.
FAILED, PORT_DOWN = "sim-0260", "sim-0270"
DEVICE, RAIL = "mlx5_3", 3
SCENARIO = f"""kind: Scenario
name: overview-page
faults:
  - {{at: 1s, node: {int(FAILED[4:]) - FIRST}, gpu: 5, fault: fall-off-bus}}
  - {{at: 1s, node: {int(PORT_DOWN[4:]) - FIRST}, fault: ib-port-down, device: {DEVICE}}}
"""
RED, AMBER, GREEN = "#e5484d", "#e5a50a", "#2fb36b"


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Controller]:
    with running_controller(tmp_path / "controller") as ctl:
        yield ctl


def simulate(ctl: Controller, tmp_path: Path, first: int, nodes: int,
             scenario: str | None = None) -> Any:
    """``sn-monitor simulate`` of ``nodes`` from ``first``, reporting every second."""
    args = [sys.executable, "-m", "sn_monitor.cli", "simulate", "--controller", ctl.url,
            "--nodes", str(nodes), "--first", str(first), "--interval", "1s",
            "--token-file", str(ctl.agent_token_file), "--duration", "600s", "--quiet",
            "--log-level", "warning"]
    if scenario is not None:
        path = tmp_path / f"scenario-{first}.yaml"
        path.write_text(scenario)
        args += ["--scenario", str(path)]
    return running(args, tmp_path / f"simulate-{first}.log")


class Page:
    """The page in the browser, read through what it draws and its ``snTopology`` probes."""

    def __init__(self, chrome: Any, ctl: Controller) -> None:
        self.chrome, self.ctl = chrome, ctl

    def run(self, script: str, *args: Any) -> Any:
        return self.chrome.execute_script(script, *args)

    def wait(self, probe: Any, what: str) -> Any:
        return wait_page(self.chrome, self.ctl, probe, what)  # type: ignore[arg-type]

    def cell(self, name: str) -> dict[str, Any] | None:
        found = self.run("return window.snTopology && window.snTopology.cell(arguments[0])",
                         name)
        return dict(found) if found else None

    def in_first_viewport(self, name: str) -> bool:
        cell = self.cell(name)
        size = self.run("return [window.innerWidth, window.innerHeight]")
        if cell is None:
            return False
        right, bottom = cell["left"] + cell["size"], cell["top"] + cell["size"]
        return bool(min(cell["left"], cell["top"]) >= 0 and right <= size[0] and bottom <= size[1])

    def card(self) -> str | None:
        return self.run(  # type: ignore[no-any-return]
            "const p = document.getElementById('node-panel'); "
            "return p.hidden ? null : p.dataset.node")

    def level(self) -> dict[str, Any]:
        return dict(self.run("return window.snTopology.level()"))

    def drawn_nodes(self) -> list[str]:
        return sorted(self.run("return [...document.querySelectorAll("
                               "'#topology .node[data-node]')].map((n) => n.dataset.node)"))

    def card_rows(self, name: str) -> dict[str, Any] | None:
        """The card's GPU and NIC rows once its wiring is read (None before)."""
        found = self.run("""
            const panel = document.getElementById('node-panel');
            if (panel.hidden || panel.dataset.node !== arguments[0]) return null;
            const gpus = [...panel.querySelectorAll('tr[data-gpu]')];
            if (!gpus.length) return null;
            return {gpus: Object.fromEntries(gpus.map((r) => [r.dataset.gpu, r.dataset.health])),
                    nics: Object.fromEntries([...panel.querySelectorAll('tr[data-nic]')].map(
                      (r) => [r.dataset.nic, r.dataset.health]))};
        """, name)
        return dict(found) if found else None

    def node_in_room(self, name: str) -> bool:
        """The node's box in the drawing lies in the room the card leaves it."""
        return bool(self.run("""
            const el = document.querySelector(
              `#topology .node[data-node="${arguments[0]}"] .node-box`);
            if (!el) return false;
            const box = el.getBoundingClientRect();
            const pane = document.getElementById('canvas');
            const room = pane.getBoundingClientRect();
            const panel = document.getElementById('node-panel').getBoundingClientRect();
            return box.left >= room.left && box.top >= room.top &&
              box.right <= Math.min(room.left + pane.clientWidth, panel.left) &&
              box.bottom <= room.top + pane.clientHeight;
        """, name))


def check_first_screen(page: Page) -> None:
    """Every node a cell, the failed one red and the rack's rail 3 amber, in view at once."""
    page.wait(lambda: page.run("return document.body.dataset.loaded") == "true" and
              page.level()["blocks"] == ["sn00", "sn01"], "the overview of both supernodes")
    assert page.drawn_nodes() == []  # too many nodes for the detail: not read
    page.wait(lambda: (c := page.cell(FAILED)) and c["colour"] == RED and
              page.in_first_viewport(FAILED), f"{FAILED} red in the first viewport")
    rack = page.ctl.get("/api/v1/topology/overview")["nodes"]
    where = {row[0]: (row[1], row[2]) for row in rack}

    def rail_amber_the_others_green() -> bool:
        strip = page.run("return window.snTopology.strip(arguments[0], arguments[1])",
                         *where[PORT_DOWN])
        return bool(strip) and strip["colours"] == [
            AMBER if i == RAIL else GREEN for i in range(len(strip["colours"]))]
    page.wait(rail_amber_the_others_green, f"rail {RAIL} of {PORT_DOWN}'s rack amber")
    assert page.in_first_viewport(PORT_DOWN)
    summary = page.run("return document.getElementById('summary').textContent")
    assert "1 failed" in summary, summary
    assert "1 rail port down" in summary, summary


def check_failed_count(page: Page) -> None:
    """A click on "failed": the node's rack drawn, its card open, the node beside it."""
    page.chrome.find_element("css selector", '#summary button[data-filter="failed"]').click()
    rows = page.wait(lambda: page.card() == FAILED and page.card_rows(FAILED),
                     f"{FAILED}'s card with its GPUs")
    assert rows["gpus"]["5"] == "failed", rows
    level = page.level()
    assert level["level"] == "rack", level
    assert FAILED in page.drawn_nodes()
    assert len(page.drawn_nodes()) <= 8  # its rack, not the fleet
    page.wait(lambda: page.node_in_room(FAILED), f"{FAILED} beside its card")
    crumbs = page.run("return document.getElementById('crumbs').textContent")
    for crumb in (f"supernode {level['sn']}", f"rack {level['rack']}", FAILED):
        assert crumb in crumbs, crumbs


def check_search(page: Page) -> None:
    from selenium.webdriver.common.keys import Keys

    page.chrome.find_element("tag name", "body").send_keys(Keys.ESCAPE)
    page.wait(lambda: page.card() is None, "the card closed")
    search = page.chrome.find_element("id", "node-search")
    search.send_keys("sim-026")  # suggested: the names that hold what is typed, no more
    page.wait(lambda: page.run(
        "return [...document.querySelectorAll('#node-names option')].map((o) => o.value)")
        == [f"sim-026{i}" for i in range(10)], "the names suggested")
    search.clear()
    search.send_keys(PORT_DOWN, Keys.ENTER)
    rows = page.wait(lambda: page.card() == PORT_DOWN and page.card_rows(PORT_DOWN),
                     f"{PORT_DOWN}'s card with its NICs")
    assert rows["nics"][DEVICE] == "failed", rows
    page.wait(lambda: page.node_in_room(PORT_DOWN), f"{PORT_DOWN} beside its card")


def check_zoom(page: Page) -> None:
    """Back up to the fleet by the crumbs, down into a supernode and a rack by clicks."""
    page.chrome.find_element("css selector", '#crumbs button[data-level="fleet"]').click()
    page.wait(lambda: page.level()["level"] == "fleet" and page.card() is None and
              page.drawn_nodes() == [], "the fleet again, nothing selected")
    wheel_at(page, page.cell("sim-0280"), -120)  # the wheel turned up: into its supernode
    page.wait(lambda: (lv := page.level())["level"] == "supernode" and lv["sn"] == "sn01",
              "supernode sn01 by the wheel")
    # turned down: back to the fleet (again each time: the page takes a level a turn)
    def back_by_wheel() -> bool:
        if page.level()["level"] == "fleet":
            return True
        wheel_at(page, page.cell("sim-0280"), 120)
        return False
    page.wait(back_by_wheel, "the fleet by the wheel")
    click_at(page, page.cell("sim-0280"))
    page.wait(lambda: (lv := page.level())["level"] == "supernode" and lv["sn"] == "sn01",
              "supernode sn01 by a click")
    click_at(page, page.cell("sim-0280"))  # a node at the supernode level: its rack and card
    page.wait(lambda: page.card() == "sim-0280" and "sim-0280" in page.drawn_nodes(),
              "sim-0280's rack and card")


def wheel_at(page: Page, cell: dict[str, Any] | None, delta: int) -> None:
    """Turn the wheel over the middle of a cell (negative: up, zooming in)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.wheel_input import ScrollOrigin

    assert cell is not None
    canvas = page.chrome.find_element("id", "overview")
    x, y = offset_in(page, canvas, cell)
    ActionChains(page.chrome).scroll_from_origin(
        ScrollOrigin.from_element(canvas, x, y), 0, delta).perform()


def offset_in(page: Page, canvas: Any, cell: dict[str, Any]) -> tuple[int, int]:
    """The middle of a cell, from the middle of the canvas (as selenium's offsets are)."""
    box = page.run("const r = arguments[0].getBoundingClientRect(); "
                   "return [r.left, r.top, r.width, r.height]", canvas)
    return (int(cell["left"] + cell["size"] / 2 - (box[0] + box[2] / 2)),
            int(cell["top"] + cell["size"] / 2 - (box[1] + box[3] / 2)))


def click_at(page: Page, cell: dict[str, Any] | None) -> None:
    """Click the overview in the middle of a cell (where the page says it is)."""
    from selenium.webdriver.common.action_chains import ActionChains

    assert cell is not None
    canvas = page.chrome.find_element("id", "overview")
    x, y = offset_in(page, canvas, cell)
    ActionChains(page.chrome).move_to_element_with_offset(canvas, x, y).click().perform()


@pytest.mark.timeout(300)
def test_the_overview_shows_a_failed_node_and_a_degraded_rail_reachable_in_one_step(
        controller: Controller, browser: Any, tmp_path: Path) -> None:
    ctl, chrome = controller, browser
    page = Page(chrome, ctl)

    def fleet_shows_faults() -> bool:
        rows = {r[0]: r for r in ctl.get("/api/v1/topology/overview")["nodes"]}
        return (len(rows) == NODES and rows.get(FAILED, [""] * 8)[3] == "failed"
                and rows.get(PORT_DOWN, [""] * 8)[6][RAIL:RAIL + 1] == "f")

    with simulate(ctl, tmp_path, FIRST, NODES, SCENARIO):
        page.wait(fleet_shows_faults, "the fleet and its two faults in the overview API")
        chrome.get(f"{ctl.url}/ui/topology#token={ctl.admin}")
        check_first_screen(page)
        ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
        assert chrome.save_screenshot(str(ARTIFACT))
        check_failed_count(page)
        check_search(page)
        check_zoom(page)

        # Eight nodes join: an update by difference, their rows only, their cells drawn.
        updates = page.run("return window.snTopology.updates")
        with simulate(ctl, tmp_path, FIRST + NODES, 8):
            page.wait(lambda: page.cell("sim-0295"), "the nodes that joined drawn")
            last = page.run("return window.snTopology.lastUpdate")
            assert page.run("return window.snTopology.updates") > updates
            assert 0 < last["rows"] < NODES, last  # what changed, not the whole fleet
    assert console_errors(chrome) == []
