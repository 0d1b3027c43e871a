"""The operator's context on the topology page, in headless Chromium against a real
controller and simulated agents: the open incidents, the actions waiting for approval,
the circuit breaker and the jobs, each as the API shows it, read with a token of role
``read``.

A GPU off the bus on one node opens an incident (shown with its node; a click opens the node's
card with the node in view, even where the card leaves the drawing little room) and an
eviction that waits for approval; one on a second node trips the breaker, and the page's
banner names both nodes; the breaker opened by hand says so, and closed it goes away. A
panel whose read fails says so while the drawing goes on. The header's counts select
their nodes, and a search selects a node in one step. A screenshot is kept in
``build/test-artifacts/topology-context.png``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.integration.cluster import ROOT, Cluster
from tests.support.browser import console_errors, wait_page

pytestmark = pytest.mark.integration

ARTIFACT = ROOT / "build" / "test-artifacts" / "topology-context.png"
RACKS = {"sim-0": "r0", "sim-1": "r0", "sim-2": "r1", "sim-3": "r1"}
#: The nodes whose GPU falls off the bus: the first opens the incident, the second trips
#: the breaker.
FIRST, SECOND = "sim-2", "sim-3"
GPU = 5
JSON = "application/json"
#: The seed job file (pending: no rank reports) and a job whose rank reports (running).
SEED = ROOT / "deploy" / "jobs" / "minimal.yaml"
SEED_JOB, RUNNING_JOB = "trillion-model", "llm"
#: Evictions wait for a person; two nodes of four broken trip the breaker, and the window
#: is long enough that the second fault always falls in it.
CONFIG = {"policy": {"approval": ["evict"],
                     "breaker": {"window": "1h", "max_faulted": "40%", "min_faulted": 2,
                                 "hold": "1h"}}}


#: The agents' remediation (a reboot would repair the node and close its incident) is a
#: dry run, as on real hardware: the broken nodes stay broken while the page is read.
DRY_REMEDIES = {"remediation": {"mode": "dry-run"}}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path / "cluster", nodes=len(RACKS), config=CONFIG,
                agent_labels={"supernode": "sn0"})
    for name, agent in c.agents.items():
        config = c.root / f"{name}-labels.yaml"
        config.write_text(yaml.safe_dump({"labels": {"supernode": "sn0", "rack": RACKS[name]},
                                          **DRY_REMEDIES}))
        agent.argv[agent.argv.index("--config") + 1] = str(config)
    add_read_token(c)
    try:
        yield c.start()
    finally:
        c.close()


def add_read_token(c: Cluster) -> None:
    """A token of role ``read`` (the page's) in the controller's token file, before it starts."""
    (c.root / "read.token").write_text(secrets.token_hex(16) + "\n")
    tokens = yaml.safe_load((c.root / "tokens.yaml").read_text())
    tokens.append({"name": "page", "role": "read", "token_file": str(c.root / "read.token")})
    (c.root / "tokens.yaml").write_text(yaml.safe_dump(tokens))


def read_token(c: Cluster) -> str:
    return (c.root / "read.token").read_text().strip()


def post(c: Cluster, path: str, body: bytes, media: str, token: str) -> dict[str, Any]:
    reply = requests.post(f"{c.url}{path}", data=body, timeout=10, headers={
        "Authorization": f"Bearer {token}", "Content-Type": media})
    assert reply.status_code < 300, f"POST {path}: {reply.status_code} {reply.text}"
    return dict(reply.json())


def operate(c: Cluster) -> str:
    return c.operate_token_file.read_text().strip()


def panels(chrome: Any) -> dict[str, Any]:
    """What the context panels and the breaker banner show, from their data attributes."""
    return dict(chrome.execute_script("""
        const rows = (sel) => [...document.querySelectorAll(sel)];
        const banner = document.getElementById('breaker-banner');
        const cells = (r) => [...r.cells].map((c) => c.textContent);
        return {
          states: Object.fromEntries(rows('#context > section').map(
            (s) => [s.id, s.dataset.state])),
          incidents: rows('#incidents-panel tr[data-incident]').map((r) => ({
            id: Number(r.dataset.incident), node: r.dataset.gotoNode, cells: cells(r)})),
          approvals: rows('#approvals-panel tr[data-action]').map((r) => ({
            id: r.dataset.action, node: r.dataset.gotoNode, action: r.cells[0].textContent})),
          jobs: Object.fromEntries(rows('#jobs-panel tr[data-job]').map(
            (r) => [r.dataset.job, r.dataset.jobState])),
          breaker: (document.querySelector('#breaker-panel [data-breaker]') || {}).dataset,
          banner: {shown: !banner.hidden, text: banner.textContent,
                   waitsFor: banner.dataset.waitsFor || ''},
          error: rows('#context .fetch-error').map((e) => e.textContent).join(' | '),
        };
    """))


def card(chrome: Any) -> str | None:
    """The node whose card is open (None: none)."""
    return chrome.execute_script(  # type: ignore[no-any-return]
        "const p = document.getElementById('node-panel'); return p.hidden ? null : p.dataset.node")


def in_view(chrome: Any, node: str) -> dict[str, Any]:
    """Where the node's box is against the room the drawing has beside the open card."""
    return dict(chrome.execute_script("""
        const box = document.querySelector(
          `#topology .node[data-node="${arguments[0]}"] .node-box`).getBoundingClientRect();
        const canvas = document.getElementById('canvas');
        const room = canvas.getBoundingClientRect();
        const right = room.left + canvas.clientWidth, bottom = room.top + canvas.clientHeight;
        return {box: [box.left, box.top, box.right, box.bottom],
                room: [room.left, room.top, right, bottom],
                scrolled: canvas.scrollLeft > 0 || canvas.scrollTop > 0,
                inside: box.left >= room.left && box.right <= right &&
                        box.top >= room.top && box.bottom <= bottom};
    """, node))


def click(chrome: Any, css: str, attempts: int = 5) -> None:
    """Click what ``css`` finds; the page redraws every poll, so a found element may be
    replaced before the click lands: find it again, a few times."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    for attempt in range(attempts):
        try:
            chrome.find_element(By.CSS_SELECTOR, css).click()
            return
        except StaleElementReferenceException:
            if attempt == attempts - 1:
                raise


def post_jobs(c: Cluster) -> None:
    """The seed job file as users post it, and a job of one rank that reports a step."""
    post(c, "/api/v1/jobs", SEED.read_bytes(), "application/yaml", operate(c))
    post(c, "/api/v1/jobs", yaml.safe_dump({
        "apiVersion": "sn-monitor/v1", "kind": "DistributedJob",
        "metadata": {"name": RUNNING_JOB},
        "spec": {"replicas": 1, "nodes": ["sim-0"], "checkpointInterval": "1h",
                 "hangTimeout": "1h"}}).encode(), "application/yaml", operate(c))
    post(c, f"/api/v1/jobs/{RUNNING_JOB}/progress", json.dumps({
        "rank": 0, "node": "sim-0", "world_size": 1,
        "updates": [{"step": 1, "time": time.time()}], "step_time_seconds": 1.0}).encode(),
        JSON, c.agent_token)


def check_jobs(c: Cluster, chrome: Any) -> None:
    def job_states() -> dict[str, str] | None:
        states = {j["name"]: j["state"] for j in c.get("/api/v1/jobs")["jobs"]}
        return states if states.get(RUNNING_JOB) == "running" else None
    api = c.wait_for(job_states, 60, "the job running")
    assert api == {SEED_JOB: "pending", RUNNING_JOB: "running"}
    wait_page(chrome, c, lambda: panels(chrome)["jobs"] == api, "the jobs panel as the API")
    # a job in the panel highlights it on the drawing, as the job picker does
    click(chrome, f'#jobs-panel tr[data-job="{RUNNING_JOB}"]')
    wait_page(chrome, c, lambda: chrome.execute_script(
        "return document.getElementById('job-select').value === arguments[0] && "
        "document.querySelector('#topology .node.in-job[data-node=\"sim-0\"]') !== null",
        RUNNING_JOB), "the job highlighted")


def check_incident(c: Cluster, chrome: Any) -> dict[str, Any]:
    """A GPU off the bus: its incident in the panel, its eviction waiting for approval.

    Which rule names it first (fatal-xid from its XID 79, gpu-lost from a sample) depends
    on what the agent read first: any incident of the node's GPU will do.
    """
    c.agents[FIRST].fault("fall-off-bus", GPU)
    incident = c.wait_for(lambda: [i for i in c.incidents(status="open", node=FIRST)
                                   if i["gpu"] == GPU], 60, "the incident")[0]
    shown = wait_page(chrome, c, lambda: [i for i in panels(chrome)["incidents"]
                                          if i["id"] == incident["id"]], "the incident shown")[0]
    assert shown["node"] == FIRST
    assert {incident["rule"], FIRST, f"GPU {GPU}", incident["severity"]} <= set(shown["cells"])
    def approvals_shown() -> set[tuple[str, str, str]]:
        api = {(a["id"], a["node"], a["action"])
               for a in c.actions(state="awaiting_approval", node=FIRST)}
        page = {(a["id"], a["node"], a["action"]) for a in panels(chrome)["approvals"]}
        return {a for a in api & page if a[2] == "evict"}
    wait_page(chrome, c, approvals_shown, "the eviction waiting for approval, on the page")
    return incident


def check_search_and_filters(c: Cluster, chrome: Any) -> None:
    from selenium.webdriver.common.keys import Keys

    search = chrome.find_element("id", "node-search")
    search.send_keys("sim-1", Keys.ENTER)
    wait_page(chrome, c, lambda: card(chrome) == "sim-1", "the searched node's card")
    def failed_and_matched() -> dict[str, list[str]]:
        return dict(chrome.execute_script("""
            const names = (sel) => [...document.querySelectorAll(sel)].map(
              (n) => n.dataset.node).sort();
            return {failed: names('#topology .node[data-health="failed"]'),
                    matched: names('#topology .node.match')};"""))
    wait_page(chrome, c, lambda: FIRST in failed_and_matched()["failed"], f"{FIRST} failed")
    click(chrome, '#summary button[data-filter="failed"]')
    wait_page(chrome, c, lambda: card(chrome) in failed_and_matched()["failed"],
              "a failed node selected")
    seen = failed_and_matched()
    assert seen["matched"] == seen["failed"], seen
    chrome.find_element("tag name", "body").send_keys(Keys.ESCAPE)
    wait_page(chrome, c, lambda: card(chrome) is None, "the card closed")


def check_card_in_view(c: Cluster, chrome: Any, incident: dict[str, Any]) -> None:
    """A narrow window at full size: the opened card must not leave the node under it."""
    chrome.set_window_size(1100, 900)
    click(chrome, "#zoom")  # full size: the drawing no longer fits beside the card
    click(chrome, f'#incidents-panel tr[data-incident="{incident["id"]}"]')
    wait_page(chrome, c, lambda: card(chrome) == FIRST, "the incident's node card")
    where = in_view(chrome, FIRST)
    assert where["inside"], where
    assert where["scrolled"], where  # it was out of the room: the card's opening moved it
    click(chrome, "#zoom")
    chrome.set_window_size(1600, 1000)


def check_breaker(c: Cluster, chrome: Any) -> None:
    c.agents[SECOND].fault("fall-off-bus", GPU)
    state = c.wait_for(lambda: (b := c.get("/api/v1/breaker"))["open"] and b, 60,
                       "the breaker tripped")
    assert {FIRST, SECOND} <= set(state["nodes"])
    shown = wait_page(chrome, c, lambda: (p := panels(chrome))["banner"]["shown"] and p,
                      "the breaker's banner")
    assert set(shown["banner"]["waitsFor"].split()) == set(state["nodes"])
    assert "OPEN" in shown["banner"]["text"]
    assert state["reason"] in shown["banner"]["text"]
    assert shown["breaker"]["breaker"] == "open"
    click(chrome, f'#incidents-panel tr[data-goto-node="{FIRST}"]')
    wait_page(chrome, c, lambda: card(chrome) == FIRST, "the card for the screenshot")
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    assert chrome.save_screenshot(str(ARTIFACT))
    print(f"screenshot: {ARTIFACT}")

    reason = "switch maintenance in rack r1"
    post(c, "/api/v1/breaker", json.dumps({"open": True, "reason": reason}).encode(), JSON,
         operate(c))
    wait_page(chrome, c, lambda: reason in (b := panels(chrome)["banner"])["text"] and
              "opened by hand" in b["text"], "the banner: opened by hand")
    post(c, "/api/v1/breaker", json.dumps({"open": False, "reason": "done"}).encode(), JSON,
         operate(c))
    closed = wait_page(chrome, c, lambda: (p := panels(chrome))["breaker"].get(
        "breaker") == "closed" and p, "the breaker shown closed")
    assert not closed["banner"]["shown"]


def check_failed_read(c: Cluster, chrome: Any) -> None:
    """The breaker's read fails: its panel says so, the drawing goes on updating."""
    chrome.execute_script("""
        const real = window.fetch;
        window.fetch = (url, init) => String(url).includes('/api/v1/breaker') ?
          Promise.reject(new TypeError('injected failure')) : real(url, init);
    """)
    wait_page(chrome, c, lambda: panels(chrome)["states"]["breaker-panel"] == "error",
              "the breaker panel in error")
    assert "injected failure" in panels(chrome)["error"]
    seen = int(chrome.execute_script("return document.body.dataset.generation"))
    wait_page(chrome, c, lambda: int(chrome.execute_script(
        "return document.body.dataset.generation")) > seen + 1, "the drawing updated")
    assert {s for k, s in panels(chrome)["states"].items() if k != "breaker-panel"} == {"ok"}


@pytest.mark.timeout(400)
def test_the_page_shows_incidents_approvals_the_breaker_and_jobs_as_the_api(
        cluster: Cluster, browser: Any) -> None:
    c, chrome = cluster, browser
    chrome.get(f"{c.url}/ui/topology#token={read_token(c)}")
    ready = wait_page(chrome, c, lambda: (p := panels(chrome))["states"] == {
        "incidents-panel": "ok", "approvals-panel": "ok", "jobs-panel": "ok",
        "breaker-panel": "ok"} and p["breaker"].get("breaker") and p, "every panel read")
    assert ready["incidents"] == []
    assert ready["approvals"] == []
    assert ready["jobs"] == {}
    assert ready["breaker"]["breaker"] == "closed"
    assert not ready["banner"]["shown"]

    post_jobs(c)
    check_jobs(c, chrome)
    incident = check_incident(c, chrome)
    check_search_and_filters(c, chrome)
    check_card_in_view(c, chrome, incident)
    check_breaker(c, chrome)
    check_failed_read(c, chrome)
    assert console_errors(chrome) == []
