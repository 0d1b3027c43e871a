"""The topology page in headless Chromium at supernode scale: first render, an update, the
JS heap, the bytes of an update and the overview's latency, beside ``sn-monitor simulate``.

Run with ``python -m bench.topology_page_bench`` (``make bench``); ``--quick`` for a
smoke run (256 nodes).

Per level (4,096 and 8,192 nodes): a fresh ``sn-monitor controller`` (``controller_bench``'s
config, pinned to core 0 with ``taskset -c 0`` where there are two cores) and
``sn-monitor simulate --nodes N --interval 2s`` (256 nodes a supernode, 8 a rack, as the
simulator labels them), whose scenario fails a GPU on one node, takes a rail port down on
another, and sends an XID every half second on a third (``simulate_bench``'s), so that
the overview changes between builds. Once every node is in the overview, Chromium
(Debian's ``chromium`` and ``chromium-driver``, driven by selenium) opens ``/ui/topology``
and the figures are read through the DevTools protocol and from the page itself:

- **first render**: ``performance.now()`` (ms from the navigation's start) when the page
  had drawn its first overview (``window.snTopology.firstRenderMs``);
- **an update**: for each update the page applied (``since`` the version it held), the
  time from the request to the cells redrawn, and from the answer to the cells redrawn
  (``window.snTopology.lastUpdate``), over ``--updates`` updates;
- **JS heap**: ``Performance.getMetrics``' ``JSHeapUsedSize`` and
  ``Runtime.getHeapUsage`` after the updates;
- **bytes per update and the overview's GET**: the Resource Timing entries of the page's
  overview reads (encoded body bytes, request to end of answer), the first (whole) one
  apart;
- **the first screen**: how many of the nodes the API calls failed are red inside the
  window, and whether the rail of the port down is amber on its rack's strip there, as
  the page lays them out (``cell``, ``strip``);
- **a node's card**: seconds from a click on the "failed" count to the first failed
  node's card with its GPUs (its rack's wiring read and drawn), a screenshot of it beside
  the first screen's (``-rack``).

A screenshot of the first screen (taken after the updates) is kept (``--screenshot``, default
``build/bench/topology-page-N.png``). The goals (the issue's): first render <= 3 s, an
update <= 500 ms, JS heap <= 200 MB, <= 1 MB an update, the overview's GET p50 <= 500 ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    add_output_args,
    finish,
    fmt,
    machine,
    pct,
    results_path,
    sn_monitor_command,
    stop_on_sigterm,
)
from bench.controller_bench import ControllerProcess, pick_cores
from bench.simulate_bench import scenario_text
from bench.topology_poll_bench import INTERVAL_S, OVERVIEW, wait_for_fleet
from sn_monitor.sim.fleet import node_labels

ROOT = Path(__file__).resolve().parents[1]
#: The issue's goals.
FIRST_RENDER_GOAL_MS = 3000.0
UPDATE_GOAL_MS = 500.0
HEAP_GOAL_BYTES = 200e6
UPDATE_BYTES_GOAL = 1_000_000
GET_GOAL_MS = 500.0
#: The node whose GPU falls off the bus, and the one whose rail port goes down (indexes).
FAILED_INDEX, PORT_DOWN_INDEX = 3, 5
#: The rail of that port (``mlx5_3``), and the page's colours of failed and degraded.
DOWN_RAIL = 3
RED, AMBER = "#e5484d", "#e5a50a"

_PAGE_STATE = """
const m = window.snTopology;
if (!m) return null;
const reads = performance.getEntriesByType('resource')
  .filter((e) => e.name.includes('/api/v1/topology/overview'))
  .map((e) => ({name: e.name, bytes: e.encodedBodySize, wire: e.transferSize,
                ms: e.responseEnd - e.startTime}));
return {renders: m.renders, updates: m.updates, firstRenderMs: m.firstRenderMs,
        lastUpdate: m.lastUpdate, polls: m.polls, loaded: document.body.dataset.loaded,
        reads};
"""


def scenario(nodes: int, run_for: float) -> str:
    """``simulate_bench``'s XIDs, a GPU off the bus on one node and a rail port down on another."""
    text, _ = scenario_text(nodes, run_for)
    return text + (f"  - {{at: 2s, node: {FAILED_INDEX}, gpu: 5, fault: fall-off-bus}}\n"
                   f"  - {{at: 2s, node: {PORT_DOWN_INDEX}, fault: ib-port-down, "
                   f"device: mlx5_3}}\n")


def page_state(chrome: Any) -> dict[str, Any] | None:
    found = chrome.execute_script(_PAGE_STATE)
    return dict(found) if found else None


def wait_for(probe: Any, what: str, deadline_s: float) -> Any:
    """Poll ``probe`` until it answers something truthy; RuntimeError past ``deadline_s``."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    raise RuntimeError(f"no {what} within {deadline_s:g} s")


def heap(chrome: Any) -> dict[str, float]:
    """The page's JS heap through the DevTools protocol, bytes."""
    metrics = {m["name"]: m["value"] for m in
               chrome.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]}
    usage = chrome.execute_cdp_cmd("Runtime.getHeapUsage", {})
    return {"js_heap_used_bytes": metrics.get("JSHeapUsedSize", float("nan")),
            "js_heap_total_bytes": metrics.get("JSHeapTotalSize", float("nan")),
            "runtime_heap_used_bytes": usage["usedSize"], "dom_nodes": metrics.get("Nodes", 0)}


def measure_page(chrome: Any, url: str, failed_now: Callable[[], list[str]], updates: int,
                 deadline_s: float, screenshot: Path) -> dict[str, Any]:
    """Open the page and read its figures (module docstring)."""
    chrome.execute_cdp_cmd("Performance.enable", {})
    chrome.get(url)
    first = wait_for(lambda: (s := page_state(chrome)) and s["renders"] > 0 and s,
                     "first render", 120.0)
    seen: dict[int, dict[str, Any]] = {}
    started = time.monotonic()
    last: dict[str, Any] = first
    while len(seen) < updates and time.monotonic() - started < deadline_s:
        last = page_state(chrome) or last
        update = last.get("lastUpdate")
        if update and update["rows"] + update["removed"] > 0:
            seen[update["version"]] = update
        time.sleep(0.25)
    # the first screen once its panels are read too (what a person sees on opening it)
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    chrome.save_screenshot(str(screenshot))
    figures: dict[str, Any] = {**heap(chrome),  # before the zoom below reads a rack's wiring
                               "first_screen": first_screen(chrome, failed_now)}
    reads = last["reads"]
    after_first = [r for r in reads[1:] if r["bytes"] > 0]
    figures["card_s"] = open_failed_card(chrome, screenshot.with_name(
        screenshot.stem + "-rack" + screenshot.suffix))
    return {
        "first_render_ms": first["firstRenderMs"],
        "updates": list(seen.values()),
        "update_total_ms": [u["totalMs"] for u in seen.values()],
        "update_apply_ms": [u["applyMs"] for u in seen.values()],
        "polls": last["polls"],
        "first_read": reads[0] if reads else None,
        "update_bytes": [r["bytes"] for r in after_first],
        "update_wire_bytes": [r["wire"] for r in after_first],
        "get_ms": [r["ms"] for r in reads],
        "not_modified": sum(1 for r in reads[1:] if r["bytes"] == 0),
        **figures,
        "screenshot": str(screenshot),
    }


def first_screen(chrome: Any, failed_now: Callable[[], list[str]]) -> dict[str, Any]:
    """What the first screen shows of the faults, read from the page's own layout.

    The nodes the API calls failed (the scenario's XIDs fail one after another, and the
    simulated agents repair them) each red and wholly inside the window, no scroll and
    no click; tried a few times, for the page shows what it read up to a poll ago. The
    rail of the port down amber on its rack's strip, inside the window.
    """
    width, height = chrome.execute_script("return [window.innerWidth, window.innerHeight]")

    def shown(name: str) -> bool:
        c = chrome.execute_script("return window.snTopology.cell(arguments[0])", name)
        return c is not None and c["colour"] == RED and min(c["left"], c["top"]) >= 0 \
            and c["left"] + c["size"] <= width and c["top"] + c["size"] <= height

    failed: list[str] = []
    red: list[str] = []
    for _ in range(10):
        failed = failed_now()
        red = [name for name in failed if shown(name)]
        if failed and len(red) == len(failed):
            break
        time.sleep(1.0)
    labels = node_labels(PORT_DOWN_INDEX)
    strip = chrome.execute_script("return window.snTopology.strip(arguments[0], arguments[1])",
                                  labels["supernode"], labels["rack"])
    colours = strip["colours"] if strip else []
    in_view = strip is not None and min(strip["left"], strip["top"]) >= 0 and \
        strip["left"] + strip["width"] <= width and strip["top"] <= height
    return {"failed": len(failed), "failed_red_in_view": len(red),
            "rail_amber_in_view": in_view and len(colours) > DOWN_RAIL
            and colours[DOWN_RAIL] == AMBER}


def open_failed_card(chrome: Any, screenshot: Path) -> float:
    """Click the "failed" count: seconds until the first failed node's card shows its GPUs
    (its rack's wiring read and drawn); a screenshot of it."""
    started = time.monotonic()
    chrome.find_element("css selector", '#summary button[data-filter="failed"]').click()
    wait_for(lambda: chrome.execute_script(
        "const p = document.getElementById('node-panel'); "
        "return !p.hidden && p.querySelector('tr[data-gpu]') !== null"), "the failed node's card",
        120.0)
    took = time.monotonic() - started
    chrome.save_screenshot(str(screenshot))
    return took


def browser_errors() -> tuple[type[Exception], ...]:
    """What the browser's driver raises (a crash, a timeout), when selenium is installed."""
    try:
        from selenium.common.exceptions import WebDriverException
    except ImportError:
        return ()
    return (WebDriverException,)


def run_level(tmp: Path, nodes: int, core: int | None, updates: int, deadline_s: float,
              screenshot: Path) -> dict[str, Any]:
    from tests.support.browser import headless_chromium

    program = sn_monitor_command()
    controller = ControllerProcess(tmp, f"n{nodes}", core, program)
    run_for = 900.0
    path = tmp / f"n{nodes}-scenario.yaml"
    path.write_text(scenario(nodes, run_for))
    out: dict[str, Any] = {"nodes": nodes}
    sim: subprocess.Popen[bytes] | None = None
    try:
        controller.start()
        others = sorted(os.sched_getaffinity(0) - {core})
        pin = ["taskset", "-c", ",".join(map(str, others))] if core is not None else []
        sim = subprocess.Popen(
            [*pin, *program, "simulate", "--controller", f"http://127.0.0.1:{controller.port}",
             "--nodes", str(nodes), "--interval", f"{INTERVAL_S:g}s", "--scenario", str(path),
             "--duration", f"{run_for:g}s", "--log-level", "warning", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        out["fleet_in_s"] = round(wait_for_fleet(controller, nodes, 300.0), 1)
        profile = tmp / f"n{nodes}-chromium"
        profile.mkdir()
        with headless_chromium(profile) as chrome:
            out.update(measure_page(
                chrome, f"http://127.0.0.1:{controller.port}/ui/topology",
                lambda: [row[0] for row in controller.get_json(OVERVIEW)["nodes"]
                         if row[3] == "failed"], updates, deadline_s, screenshot))
        if not out["updates"]:
            out["error"] = f"the page applied no update within {deadline_s:g} s"
    finally:
        if sim is not None and sim.poll() is None:
            sim.terminate()
            try:
                sim.wait(timeout=20)
            except subprocess.TimeoutExpired:
                sim.kill()
                sim.wait(timeout=10)
        out["controller_exit"] = controller.stop()
    return out


def render(results: dict[str, Any]) -> str:
    lines = [f"controller {results['meta']['pinning']}",
             "| nodes | first render ms | update ms p50 / max (apply p50) | updates | "
             "JS heap MB | update bytes p50 / max | first read KB | overview GET p50 / max ms "
             "| 304 of polls | failed count to card s | first screen: failed nodes red, "
             "rail amber |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for level in results["levels"]:
        if "first_render_ms" not in level:
            lines.append(f"| {level['nodes']} | not measured: {level.get('error', '')[:200]} |")
            continue
        total, apply = level["update_total_ms"], level["update_apply_ms"]
        screen = level["first_screen"]
        sizes, gets = level["update_bytes"], level["get_ms"]
        first = level["first_read"] or {"bytes": 0}
        lines.append(
            f"| {level['nodes']} | {fmt(level['first_render_ms'], 0)} | "
            f"{fmt(pct(total, 50), 0)} / {fmt(max(total, default=None), 0)} "
            f"({fmt(pct(apply, 50), 1)}) | {len(total)} | "
            f"{fmt(level['js_heap_used_bytes'] / 1e6, 1)} | "
            f"{fmt(pct([float(b) for b in sizes], 50), 0)} / {max(sizes, default=0)} | "
            f"{first['bytes'] / 1e3:.0f} | {fmt(pct(gets, 50), 0)} / "
            f"{fmt(max(gets, default=None), 0)} | {level['not_modified']} of "
            f"{max(len(gets) - 1, 0)} | {fmt(level['card_s'], 1)} | "
            f"{screen['failed_red_in_view']} of {screen['failed']}, "
            f"{'yes' if screen['rail_amber_in_view'] else 'NO'} |")
    lines.append(f"goals: first render <= {FIRST_RENDER_GOAL_MS:g} ms, an update <= "
                 f"{UPDATE_GOAL_MS:g} ms, JS heap <= {HEAP_GOAL_BYTES / 1e6:g} MB, <= "
                 f"{UPDATE_BYTES_GOAL / 1e6:g} MB an update, GET p50 <= {GET_GOAL_MS:g} ms "
                 "(bytes: encoded, gzip when the controller sent it)")
    return "\n".join(lines)


def problems(results: dict[str, Any]) -> list[str]:
    """What could not be measured (a missed goal is a result, not a failure)."""
    return [f"{level['nodes']} nodes: {level['error']}"
            for level in results["levels"] if "error" in level]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.topology_page_bench",
                                     description=__doc__.split("\n\n")[0])
    add_output_args(parser, "a smoke run: 256 nodes, one update")
    parser.add_argument("--nodes", type=int, nargs="*", default=None,
                        help="fleet sizes (default 4096 8192, quick 256)")
    parser.add_argument("--updates", type=int, default=None,
                        help="updates to time (default 3, quick 1)")
    parser.add_argument("--screenshot", type=Path, default=None,
                        help="where the largest level's first screen goes "
                             "(default build/bench/topology-page-N.png)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin with taskset")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    out_path = results_path(args, "topology_page.json")
    levels = args.nodes or ([256] if args.quick else [4096, 8192])
    updates = args.updates or (1 if args.quick else 3)
    deadline = 60.0 if args.quick else 180.0
    core, _, pinning = pick_cores(not args.no_pin)
    results: dict[str, Any] = {"meta": {"quick": args.quick, "machine": machine(),
                                        "pinning": pinning}, "levels": []}
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    errors: tuple[type[Exception], ...] = (RuntimeError, OSError, *browser_errors())
    with tempfile.TemporaryDirectory(prefix="sn-topology-page-") as tmp:
        for nodes in levels:
            if missing:
                results["levels"].append({"nodes": nodes, "error": f"no {', '.join(missing)}"})
                continue
            shot = (args.screenshot if args.screenshot and nodes == max(levels)
                    else ROOT / "build" / "bench" / f"topology-page-{nodes}.png")
            print(f"topology page bench: {nodes} nodes", flush=True)
            try:
                results["levels"].append(run_level(Path(tmp), nodes, core, updates, deadline,
                                                   shot))
            except errors as err:
                results["levels"].append({"nodes": nodes,
                                          "error": f"{type(err).__name__}: {err}"})
    return finish(results, out_path, problems(results), render)


if __name__ == "__main__":
    sys.exit(main())
