"""The controller's CPU while two topology pages poll it, beside ``sn-monitor simulate``.

Run with ``python -m bench.topology_poll_bench`` (``make bench``); ``--quick`` for a smoke
run (256 nodes, 6 s windows).

Per level (4,096 and 8,192 nodes): a fresh ``sn-monitor controller`` (``controller_bench``'s
config) pinned to core 0 with ``taskset -c 0``, and ``sn-monitor simulate --nodes N
--interval 2s`` (256 nodes a supernode, 8 a rack; ``simulate_bench``'s scenario: one XID
every half second on another node, so the overview changes between every two polls)
on the other cores. Once every node is in the overview, the controller's CPU
(/proc/PID/stat) is measured over ``--window`` seconds with no reader (the reports'
cost), then over as long with two pollers that read ``GET /api/v1/topology/overview``
every 2 s as a page does: ``since`` the version it holds, ``If-None-Match`` its tag,
``Accept-Encoding: gzip``. The difference is the pages' cost (the goal: at most 10 % of
a core). Also: each poll's latency (p50, max) and bytes on the wire, how many were 304,
how many versions the pages saw (the overview's freshness: a version per build that
found a change, and the scenario changes it between any two builds), and the whole
overview and the whole document read once each (bytes plain and gzip, latency).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
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
from sn_monitor.sim.fleet import node_name

#: A page's poll period, and the simulated nodes' report interval (the issue's), seconds.
POLL_S = 2.0
INTERVAL_S = 2.0
#: The issue's goals: the pages' polling at most this share of a core, an update at most
#: this many bytes and this p50.
CPU_GOAL = 0.10
UPDATE_BYTES_GOAL = 1_000_000
LATENCY_GOAL_S = 0.5
OVERVIEW = "/api/v1/topology/overview"
DOCUMENT = "/api/v1/topology"
#: The lost-node hold (``--hold-lost``): when the node stops reporting (scenario seconds),
#: how often it is checked, how often the third page reads the whole document (seconds).
LOST_AT_S = 60.0
CHECK_EVERY_S = 5.0
DOCUMENT_EVERY_S = 30.0


class Poller:
    """One page: the overview every ``POLL_S``, since the version it holds."""

    def __init__(self, port: int, name: str) -> None:
        self.port = port
        self.name = name
        self.version: int | None = None
        self.etag: str | None = None
        self.polls: list[tuple[float, int, int]] = []  # (seconds, status, bytes on the wire)
        self.versions: set[int] = set()
        #: The rows the page holds (name -> row), as it applies each answer.
        self.rows: dict[str, list[Any]] = {}
        #: When the first and the last poll began (time.monotonic), None before one.
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.stop = threading.Event()
        self.errors: list[str] = []

    def poll_once(self) -> None:
        headers = {"Accept-Encoding": "gzip"}
        if self.etag:
            headers["If-None-Match"] = self.etag
        path = OVERVIEW + (f"?since={self.version}" if self.version is not None else "")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        self.last_at = time.monotonic()
        if self.first_at is None:
            self.first_at = self.last_at
        started = time.perf_counter()
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            body = response.read()
            took = time.perf_counter() - started
            etag = response.getheader("ETag")
        finally:
            conn.close()
        self.polls.append((took, response.status, len(body)))
        if response.status == 200:
            doc = json.loads(gzip.decompress(body) if response.getheader(
                "Content-Encoding") == "gzip" else body)
            self.version, self.etag = doc["version"], etag
            self.versions.add(doc["version"])
            if doc["full"]:
                self.rows = {}
            self.rows.update((row[0], row) for row in doc["nodes"])
            for name in doc["removed"]:
                self.rows.pop(name, None)

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.is_set() and time.monotonic() < deadline:
            begun = time.monotonic()
            try:
                self.poll_once()
            except (OSError, http.client.HTTPException, ValueError) as err:
                self.errors.append(f"{type(err).__name__}: {err}")
            self.stop.wait(max(0.0, POLL_S - (time.monotonic() - begun)))


def versions_per_minute(pollers: Sequence[Poller]) -> float:
    """The overview's freshness: the versions the pages saw, per minute of polling."""
    began = min((p.first_at for p in pollers if p.first_at is not None), default=None)
    ended = max((p.last_at for p in pollers if p.last_at is not None), default=None)
    if began is None or ended is None or ended <= began:
        return 0.0
    seen = len(set().union(*(p.versions for p in pollers)))
    return 60.0 * seen / (ended - began)


def read_whole(port: int, path: str) -> dict[str, Any]:
    """``path`` read once plainly and once with gzip: bytes of each, seconds of each."""
    out: dict[str, Any] = {}
    for name, headers in (("plain", {}), ("gzip", {"Accept-Encoding": "gzip"})):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        started = time.perf_counter()
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        out[f"{name}_bytes"] = len(body)
        out[f"{name}_seconds"] = time.perf_counter() - started
    return out


def wait_for_fleet(controller: ControllerProcess, nodes: int, deadline_s: float) -> float:
    """Seconds until every node is in the overview; RuntimeError past ``deadline_s``."""
    started = time.monotonic()
    seen = 0
    while time.monotonic() - started < deadline_s:
        doc = controller.get_json(OVERVIEW)
        seen = sum(doc["counts"].values())
        if seen >= nodes:
            return time.monotonic() - started
        time.sleep(2.0)
    raise RuntimeError(f"{seen} of {nodes} nodes in the overview after {deadline_s:g} s")


def cpu_over(controller: ControllerProcess, seconds: float) -> float:
    """The controller's CPU over the next ``seconds``, percent of one core."""
    t0, c0 = time.monotonic(), controller.cpu_seconds()
    time.sleep(seconds)
    t1, c1 = time.monotonic(), controller.cpu_seconds()
    if c0 is None or c1 is None:
        raise RuntimeError("the controller's CPU could not be read")
    return 100 * (c1 - c0) / (t1 - t0)


def start_simulate(controller: ControllerProcess, program: Sequence[str], nodes: int,
                   scenario: Path, run_for: float, core: int | None
                   ) -> subprocess.Popen[bytes]:
    """``sn-monitor simulate`` of ``nodes`` nodes reporting to ``controller``, off its core."""
    others = sorted(os.sched_getaffinity(0) - {core})
    pin = ["taskset", "-c", ",".join(map(str, others))] if core is not None else []
    return subprocess.Popen(
        [*pin, *program, "simulate", "--controller", f"http://127.0.0.1:{controller.port}",
         "--nodes", str(nodes), "--interval", f"{INTERVAL_S:g}s", "--scenario",
         str(scenario), "--duration", f"{run_for:g}s", "--log-level", "warning",
         "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL)


def stop_simulate(sim: subprocess.Popen[bytes] | None) -> None:
    if sim is not None and sim.poll() is None:
        sim.terminate()
        try:
            sim.wait(timeout=20)
        except subprocess.TimeoutExpired:
            sim.kill()
            sim.wait(timeout=10)


def start_pollers(port: int, seconds: float) -> tuple[list[Poller], list[threading.Thread]]:
    """Two pages polling the overview for ``seconds``, out of step as two people are."""
    pollers = [Poller(port, f"page-{i}") for i in range(2)]
    threads = [threading.Thread(target=p.run, args=(seconds,), name=p.name) for p in pollers]
    for i, thread in enumerate(threads):
        thread.start()
        if i == 0:
            time.sleep(POLL_S / 2)
    return pollers, threads


def stop_pollers(pollers: Sequence[Poller], threads: Sequence[threading.Thread]
                 ) -> dict[str, Any]:
    """Stop the pages; what their polls took and saw (after each page's first)."""
    for p in pollers:
        p.stop.set()
    for thread in threads:
        thread.join(180)
    polls = [poll for p in pollers for poll in p.polls[1:]]
    seconds = [s for s, _, _ in polls]
    if not polls:
        return {"n": 0, "errors": [e for p in pollers for e in p.errors][:5]}
    return {"n": len(polls), "not_modified": sum(st == 304 for _, st, _ in polls),
            "p50_seconds": pct(seconds, 50), "max_seconds": max(seconds),
            "p50_bytes": pct([float(b) for _, _, b in polls], 50),
            "max_bytes": max(b for _, _, b in polls),
            "versions": len(set().union(*(p.versions for p in pollers))),
            "versions_per_minute": versions_per_minute(pollers),
            "errors": [e for p in pollers for e in p.errors][:5]}


def run_level(tmp: Path, nodes: int, window: float, core: int | None) -> dict[str, Any]:
    program = sn_monitor_command()
    controller = ControllerProcess(tmp, f"n{nodes}", core, program)
    run_for = 600.0 + 2 * window
    text, _ = scenario_text(nodes, run_for)
    scenario = tmp / f"n{nodes}-scenario.yaml"
    scenario.write_text(text)
    out: dict[str, Any] = {"nodes": nodes, "window_s": window}
    sim: subprocess.Popen[bytes] | None = None
    try:
        controller.start()
        sim = start_simulate(controller, program, nodes, scenario, run_for, core)
        out["fleet_in_s"] = round(wait_for_fleet(controller, nodes, 300.0), 1)
        time.sleep(INTERVAL_S * 3)  # the counters of every node: rates on every port
        out["overview_whole"] = read_whole(controller.port, OVERVIEW)
        out["document_whole"] = read_whole(controller.port, "/api/v1/topology")
        time.sleep(INTERVAL_S * 2)
        out["cpu_alone_percent"] = cpu_over(controller, window)
        pollers, threads = start_pollers(controller.port, window + 60.0)
        time.sleep(POLL_S * 2)  # each page holds a version: what follows are updates
        out["cpu_polled_percent"] = cpu_over(controller, window)
        out["polls"] = stop_pollers(pollers, threads)
        out["polling_cpu_percent"] = out["cpu_polled_percent"] - out["cpu_alone_percent"]
    finally:
        stop_simulate(sim)
        out["controller_exit"] = controller.stop()
    return out


def render(results: dict[str, Any]) -> str:
    lines = [f"controller {results['meta']['pinning']}",
             "| nodes | overview plain / gzip | document plain / gzip, read s | CPU alone % | "
             "CPU polled % | polling % | poll p50 ms | max ms | update p50 / max bytes | "
             "304 | versions (per min) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for level in results["levels"]:
        if "error" in level:
            lines.append(f"| {level['nodes']} | not measured: {level['error'][:200]} |")
            continue
        o, d, p = level["overview_whole"], level["document_whole"], level["polls"]
        lines.append(
            f"| {level['nodes']} | {o['plain_bytes'] / 1e3:.0f} KB / "
            f"{o['gzip_bytes'] / 1e3:.0f} KB | {d['plain_bytes'] / 1e6:.1f} MB / "
            f"{d['gzip_bytes'] / 1e6:.1f} MB, {fmt(d['plain_seconds'], 2)} | "
            f"{fmt(level['cpu_alone_percent'], 1)} | {fmt(level['cpu_polled_percent'], 1)} | "
            f"{fmt(level['polling_cpu_percent'], 1)} | {fmt(p['p50_seconds'] * 1e3, 1)} | "
            f"{fmt(p['max_seconds'] * 1e3, 0)} | {p['p50_bytes']:.0f} / {p['max_bytes']} | "
            f"{p['not_modified']} of {p['n']} | {p.get('versions', 0)} "
            f"({fmt(p.get('versions_per_minute', 0.0), 1)}) |")
    lines.append(f"goals: polling <= {CPU_GOAL:.0%} of a core, an update <= "
                 f"{UPDATE_BYTES_GOAL / 1e6:g} MB, poll p50 <= {LATENCY_GOAL_S * 1e3:g} ms")
    return "\n".join(lines)


def problems(results: dict[str, Any]) -> list[str]:
    """What could not be measured (a missed goal is a result, not a failure)."""
    out = []
    for level in results["levels"]:
        if "error" in level:
            out.append(f"{level['nodes']} nodes: {level['error']}")
        elif level["polls"]["errors"] or not level["polls"]["n"]:
            out.append(f"{level['nodes']} nodes: polls failed: {level['polls']['errors']}")
    return out


# ---------------------------------------------------------------- the lost-node hold


class DocumentReader:
    """A third page, the heavier read: the whole document every ``DOCUMENT_EVERY_S``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.etag: str | None = None
        self.reads: list[tuple[float, int, int]] = []  # (seconds, status, bytes on the wire)
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.is_set() and time.monotonic() < deadline:
            headers = {"Accept-Encoding": "gzip"}
            if self.etag:
                headers["If-None-Match"] = self.etag
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
            started = time.perf_counter()
            try:
                conn.request("GET", DOCUMENT, headers=headers)
                response = conn.getresponse()
                body = response.read()
                self.etag = response.getheader("ETag") or self.etag
                self.reads.append((time.perf_counter() - started, response.status, len(body)))
            except (OSError, http.client.HTTPException) as err:
                self.errors.append(f"{type(err).__name__}: {err}")
            finally:
                conn.close()
            self.stop.wait(DOCUMENT_EVERY_S)


#: The errors a check may meet (it is counted broken, and the next one tries again).
CHECK_ERRORS = (OSError, RuntimeError, http.client.HTTPException, ValueError)


def get_json(port: int, path: str, timeout: float = 120.0) -> Any:
    """``path`` read as JSON (RuntimeError unless 200), with a timeout a busy controller meets."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"GET {path}: {response.status} {body[:200]!r}")
    return json.loads(body)


def lost_node_state(controller: ControllerProcess, name: str, page: Poller
                    ) -> dict[str, Any]:
    """What the API and a polling page say of ``name`` now."""
    started = time.monotonic()
    node = get_json(controller.port, f"/api/v1/nodes/{name}")
    row = page.rows.get(name)
    return {"state": node["state"],
            "open": sorted(i["id"] for i in node["incidents"] if i["rule"] == "node-lost"),
            "page_state": row[4] if row is not None else None,
            "answered_s": round(time.monotonic() - started, 2)}


def wait_lost(controller: ControllerProcess, name: str, page: Poller, deadline_s: float
              ) -> tuple[int, float]:
    """(the node-lost incident's id, seconds) once the API and the page say lost."""
    started = time.monotonic()
    seen: dict[str, Any] = {}
    while time.monotonic() - started < deadline_s:
        try:
            seen = lost_node_state(controller, name, page)
        except CHECK_ERRORS as err:
            seen = {"error": f"{type(err).__name__}: {err}"}
        if (seen.get("state"), bool(seen.get("open")), seen.get("page_state")) == (
                "lost", True, "lost"):
            return seen["open"][0], time.monotonic() - started
        time.sleep(1.0)
    raise RuntimeError(f"{name} not seen lost within {deadline_s:g} s: {seen}")


def hold_lost(controller: ControllerProcess, name: str, page: Poller, incident: int,
              hold: float) -> dict[str, Any]:
    """Every ``CHECK_EVERY_S`` for ``hold`` seconds: the incident open, the node lost."""
    started = time.monotonic()
    checks, broken, slowest = 0, [], 0.0
    while time.monotonic() - started < hold:
        at = round(time.monotonic() - started, 1)
        try:
            seen = lost_node_state(controller, name, page)
            slowest = max(slowest, seen["answered_s"])
        except CHECK_ERRORS as err:
            seen = {"error": f"{type(err).__name__}: {err}"}
        checks += 1
        if (seen.get("state"), seen.get("open"), seen.get("page_state")) != (
                "lost", [incident], "lost"):
            broken.append({"at_s": at, **seen})
        time.sleep(CHECK_EVERY_S)
    closed = [i for i in get_json(controller.port, f"/api/v1/incidents?status=closed&node={name}")[
        "incidents"] if i["rule"] == "node-lost"]
    return {"held_s": round(time.monotonic() - started, 1), "checks": checks,
            "slowest_check_s": slowest,
            "broken": broken[:20], "broken_count": len(broken),
            "closed_node_lost": [{"id": i["id"], "message": i["message"]} for i in closed]}


def run_lost_hold(tmp: Path, nodes: int, hold: float, core: int | None) -> dict[str, Any]:
    """A node stops reporting at ``LOST_AT_S``; two pages poll the overview and a third
    reads the whole document every ``DOCUMENT_EVERY_S``; for ``hold`` seconds after it
    was seen lost, its node-lost incident stays open and it stays lost (no "reporting
    again" without a report)."""
    program = sn_monitor_command()
    controller = ControllerProcess(tmp, f"lost{nodes}", core, program)
    run_for = LOST_AT_S + hold + 300.0
    lost = nodes // 2 + 1
    text, _ = scenario_text(nodes, run_for)
    scenario = tmp / f"lost{nodes}-scenario.yaml"
    scenario.write_text(text + f"  - {{at: {LOST_AT_S:g}s, node: {lost}, fault: node-lost}}\n")
    name = node_name(lost, nodes)
    out: dict[str, Any] = {"nodes": nodes, "node": name, "hold_s": hold}
    sim: subprocess.Popen[bytes] | None = None
    try:
        controller.start()
        sim = start_simulate(controller, program, nodes, scenario, run_for, core)
        out["fleet_in_s"] = round(wait_for_fleet(controller, nodes, 300.0), 1)
        pollers, threads = start_pollers(controller.port, run_for)
        reader = DocumentReader(controller.port)
        reading = threading.Thread(target=reader.run, args=(run_for,), name="document")
        reading.start()
        try:
            incident, waited = wait_lost(controller, name, pollers[0], LOST_AT_S + 120.0)
            out.update(incident=incident, seen_lost_after_s=round(waited, 1))
            c0, t0 = controller.cpu_seconds(), time.monotonic()
            out["hold"] = hold_lost(controller, name, pollers[0], incident, hold)
            c1, t1 = controller.cpu_seconds(), time.monotonic()
            if c0 is not None and c1 is not None:
                out["cpu_percent"] = 100 * (c1 - c0) / (t1 - t0)
        finally:
            reader.stop.set()
            out["polls"] = stop_pollers(pollers, threads)
            reading.join(300)
            seconds = [r[0] for r in reader.reads]
            out["document_reads"] = {
                "n": len(seconds), "p50_seconds": pct(seconds, 50),
                "max_seconds": max(seconds, default=math.nan),
                "not_modified": sum(st == 304 for _, st, _ in reader.reads),
                "errors": reader.errors[:5]}
    finally:
        stop_simulate(sim)
        out["controller_exit"] = controller.stop()
    return out


def render_hold(results: dict[str, Any]) -> str:
    lines = [f"controller {results['meta']['pinning']}"]
    for level in results["levels"]:
        if "error" in level:
            lines.append(f"{level['nodes']} nodes: not measured: {level['error'][:300]}")
            continue
        h, p, d = level["hold"], level["polls"], level["document_reads"]
        verdict = ("HELD" if not h["broken_count"] and not h["closed_node_lost"]
                   else "NOT HELD")
        lines += [
            f"{level['nodes']} nodes, {level['node']} stopped reporting: node-lost incident "
            f"#{level['incident']} open and the node lost (API and page) "
            f"{level['seen_lost_after_s']} s after the check began; then for "
            f"{h['held_s']} s, {h['checks']} checks every {CHECK_EVERY_S:g} s: {verdict} "
            f"({h['broken_count']} checks broken, {len(h['closed_node_lost'])} node-lost "
            f"incidents of the node closed; slowest check answered in "
            f"{fmt(h['slowest_check_s'], 2)} s)",
            f"  meanwhile: controller {fmt(level.get('cpu_percent'), 1)} % of a core; two pages "
            f"polling the overview: {p['n']} polls, p50 {fmt(p.get('p50_seconds', 0) * 1e3, 1)} "
            f"ms, max {fmt(p.get('max_seconds', 0) * 1e3, 0)} ms, "
            f"{fmt(p.get('versions_per_minute', 0.0), 1)} versions a minute; the whole "
            f"document every {DOCUMENT_EVERY_S:g} s: {d['n']} reads, p50 "
            f"{fmt(d['p50_seconds'], 2)} s, max {fmt(d['max_seconds'], 2)} s"]
        lines += [f"  broken: {b}" for b in h["broken"][:5]]
    return "\n".join(lines)


def hold_problems(results: dict[str, Any]) -> list[str]:
    """What could not be measured, and a lost node not held (the check failed)."""
    out = []
    for level in results["levels"]:
        if "error" in level:
            out.append(f"{level['nodes']} nodes: {level['error']}")
        elif level["hold"]["broken_count"] or level["hold"]["closed_node_lost"]:
            out.append(f"{level['nodes']} nodes: {level['node']} was not held lost: "
                       f"{level['hold']['broken'][:3]} {level['hold']['closed_node_lost']}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.topology_poll_bench",
                                     description=__doc__.split("\n\n")[0])
    add_output_args(parser, "a smoke run: 256 nodes, 6 s windows")
    parser.add_argument("--nodes", type=int, nargs="*", default=None,
                        help="fleet sizes (default 4096 8192, quick 256)")
    parser.add_argument("--window", type=float, default=None,
                        help="seconds of each CPU window (default 30, quick 6)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin with taskset")
    parser.add_argument("--hold-lost", type=float, default=None, metavar="SECONDS",
                        help="instead: one node stops reporting while two pages poll and a "
                             "third reads the document; check for SECONDS that its "
                             "node-lost incident stays open and it stays lost (default "
                             "level 8192)")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    if args.hold_lost is not None:
        return main_hold(args)
    out_path = results_path(args, "topology_poll.json")
    levels = args.nodes or ([256] if args.quick else [4096, 8192])
    window = args.window or (6.0 if args.quick else 30.0)
    core, _, pinning = pick_cores(not args.no_pin)
    results: dict[str, Any] = {"meta": {"quick": args.quick, "machine": machine(),
                                        "pinning": pinning}, "levels": []}
    with tempfile.TemporaryDirectory(prefix="sn-topology-poll-") as tmp:
        for nodes in levels:
            print(f"topology poll bench: {nodes} nodes", flush=True)
            try:
                results["levels"].append(run_level(Path(tmp), nodes, window, core))
            except RuntimeError as err:
                results["levels"].append({"nodes": nodes, "error": str(err)})
    return finish(results, out_path, problems(results), render)


def main_hold(args: argparse.Namespace) -> int:
    out_path = results_path(args, "topology_lost_hold.json")
    core, _, pinning = pick_cores(not args.no_pin)
    results: dict[str, Any] = {"meta": {"quick": args.quick, "machine": machine(),
                                        "pinning": pinning}, "levels": []}
    with tempfile.TemporaryDirectory(prefix="sn-topology-lost-") as tmp:
        for nodes in args.nodes or [8192]:
            print(f"lost-node hold: {nodes} nodes, {args.hold_lost:g} s", flush=True)
            try:
                results["levels"].append(run_lost_hold(Path(tmp), nodes, args.hold_lost, core))
            except RuntimeError as err:
                results["levels"].append({"nodes": nodes, "error": str(err)})
    return finish(results, out_path, hold_problems(results), render_hold)


if __name__ == "__main__":
    sys.exit(main())
