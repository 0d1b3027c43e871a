"""The topology page's fail-slow banner and filter, in headless Chromium, on a real bottleneck.

A controller in process (its clock a test's), served by uvicorn on loopback as the daemon
serves it, runs the job ``llm`` on eight nodes (``tests.support.failslow``): five healthy
minutes, then a congested rail port on ``n3`` slows every step, and the bottleneck finder
names the node and the port, as ``test_topology_api`` checks through the API. The page,
read with a token of role ``read``, must show that bottleneck in its banner, count it
among the header's filters, and select the node (and only it) with the fail-slow filter,
from the header's count and from the filter picker, the port marked on the node's card.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.api import READ, Api, make_api
from tests.support.browser import console_errors, wait_page
from tests.support.failslow import SlowJob
from tests.support.tls import Server

pytestmark = pytest.mark.integration

NODE, LINK = "n3", "mlx5_3"


class Served:
    """The controller's app on uvicorn; what :func:`wait_page` reports when a wait fails."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.server = Server(api.client.app)  # type: ignore[arg-type]
        self.url = self.server.url

    def logs(self) -> str:
        return "(the controller runs in this process: its log is pytest's)"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    api, h = make_api(tmp_path)
    job = SlowJob(h, tmp_path / "ckpt")
    job.play(300, 2.0)
    job.fleet.wait[(NODE, LINK)] = 4e6  # the port congested: every step slower
    job.play(60, 2.5)
    standing = api.get("/api/v1/topology/overview").json()["fail_slow"]
    assert [(b["node"], b["link"]) for b in standing] == [(NODE, LINK)], standing
    s = Served(api)
    try:
        yield s
    finally:
        s.server.stop()
        h.controller.close()
        h.store.close()


def matched(chrome: Any) -> list[str]:
    """The nodes the page draws as matching its filter."""
    return sorted(chrome.execute_script(
        "return [...document.querySelectorAll('#topology .node.match')]"
        ".map((n) => n.dataset.node)"))


def card(chrome: Any) -> str | None:
    return chrome.execute_script(  # type: ignore[no-any-return]
        "const p = document.getElementById('node-panel'); "
        "return p.hidden ? null : p.dataset.node")


def slow_rows(chrome: Any) -> list[str]:
    """The card's rows marked fail-slow (``NIC/port`` or ``GPU``)."""
    return sorted(chrome.execute_script(
        "return [...document.querySelectorAll('#node-panel tr.failslow')]"
        ".map((r) => r.dataset.nic || r.dataset.gpu)"))


@pytest.mark.timeout(180)
def test_the_banner_names_the_bottleneck_and_the_filter_selects_its_node(
        served: Served, browser: Any) -> None:
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    chrome = browser
    chrome.get(f"{served.url}/ui/topology#token={READ}")
    banner = wait_page(chrome, served, lambda: chrome.execute_script(
        "const b = document.getElementById('failslow-banner'); "
        "return b.hidden ? null : [...b.querySelectorAll('li[data-failslow-node]')].map("
        "(li) => [li.dataset.failslowNode, li.dataset.failslowLink, li.dataset.job, "
        "li.textContent])"), "the fail-slow banner")
    assert [(n, link, job) for n, link, job, _ in banner] == [(NODE, LINK, "llm")], banner
    assert "rail 3" in banner[0][3], banner

    count = wait_page(chrome, served, lambda: chrome.find_elements(
        "css selector", '#summary button[data-filter="fail-slow"]'), "the fail-slow count")
    assert count[0].text == "1 fail-slow"
    count[0].click()
    wait_page(chrome, served, lambda: card(chrome) == NODE, f"{NODE}'s card, from the count")
    assert matched(chrome) == [NODE]
    wait_page(chrome, served, lambda: slow_rows(chrome), "the slow port on the card")
    assert any(row.startswith(LINK) for row in slow_rows(chrome)), slow_rows(chrome)

    chrome.find_element("tag name", "body").send_keys(Keys.ESCAPE)
    wait_page(chrome, served, lambda: card(chrome) is None and not matched(chrome),
              "the card closed and the filter cleared")
    Select(chrome.find_element("id", "filter-select")).select_by_value("fail-slow")
    wait_page(chrome, served, lambda: matched(chrome) == [NODE],
              f"{NODE} alone matched, from the filter picker")
    assert console_errors(chrome) == []
