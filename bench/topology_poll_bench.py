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

#: A page's poll period, and the simulated nodes' report interval (the issue's), seconds.
POLL_S = 2.0
INTERVAL_S = 2.0
#: The issue's goals: the pages' polling at most this share of a core, an update at most
#: this many bytes and this p50.
CPU_GOAL = 0.10
UPDATE_BYTES_GOAL = 1_000_000
LATENCY_GOAL_S = 0.5
OVERVIEW = "/api/v1/topology/overview"


class Poller:
    """One page: the overview every ``POLL_S``, since the version it holds."""

    def __init__(self, port: int, name: str) -> None:
        self.port = port
        self.name = name
        self.version: int | None = None
        self.etag: str | None = None
        self.polls: list[tuple[float, int, int]] = []  # (seconds, status, bytes on the wire)
        self.versions: set[int] = set()
        self.stop = threading.Event()
        self.errors: list[str] = []

    def poll_once(self) -> None:
        headers = {"Accept-Encoding": "gzip"}
        if self.etag:
            headers["If-None-Match"] = self.etag
        path = OVERVIEW + (f"?since={self.version}" if self.version is not None else "")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
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

    def run(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.is_set() and time.monotonic() < deadline:
            begun = time.monotonic()
            try:
                self.poll_once()
            except (OSError, http.client.HTTPException, ValueError) as err:
                self.errors.append(f"{type(err).__name__}: {err}")
            self.stop.wait(max(0.0, POLL_S - (time.monotonic() - begun)))


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
        others = sorted(os.sched_getaffinity(0) - {core})
        pin = ["taskset", "-c", ",".join(map(str, others))] if core is not None else []
        sim = subprocess.Popen(
            [*pin, *program, "simulate", "--controller", f"http://127.0.0.1:{controller.port}",
             "--nodes", str(nodes), "--interval", f"{INTERVAL_S:g}s", "--scenario",
             str(scenario), "--duration", f"{run_for:g}s", "--log-level", "warning",
             "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL)
        out["fleet_in_s"] = round(wait_for_fleet(controller, nodes, 300.0), 1)
        time.sleep(INTERVAL_S * 3)  # the counters of every node: rates on every port
        out["overview_whole"] = read_whole(controller.port, OVERVIEW)
        out["document_whole"] = read_whole(controller.port, "/api/v1/topology")
        time.sleep(INTERVAL_S * 2)
        out["cpu_alone_percent"] = cpu_over(controller, window)
        pollers = [Poller(controller.port, f"page-{i}") for i in range(2)]
        threads = [threading.Thread(target=p.run, args=(window + 60.0,), name=p.name)
                   for p in pollers]
        for i, thread in enumerate(threads):
            thread.start()
            if i == 0:
                time.sleep(POLL_S / 2)  # the two pages out of step, as two people are
        time.sleep(POLL_S * 2)  # each page holds a version: what follows are updates
        out["cpu_polled_percent"] = cpu_over(controller, window)
        for p in pollers:
            p.stop.set()
        for thread in threads:
            thread.join(180)
        polls = [poll for p in pollers for poll in p.polls[1:]]  # after each first
        seconds = [s for s, _, _ in polls]
        out["polls"] = {"n": len(polls), "not_modified": sum(st == 304 for _, st, _ in polls),
                        "p50_seconds": pct(seconds, 50), "max_seconds": max(seconds),
                        "p50_bytes": pct([float(b) for _, _, b in polls], 50),
                        "max_bytes": max(b for _, _, b in polls),
                        "versions": len(set().union(*(p.versions for p in pollers))),
                        "errors": [e for p in pollers for e in p.errors][:5]}
        out["polling_cpu_percent"] = out["cpu_polled_percent"] - out["cpu_alone_percent"]
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
             "| nodes | overview plain / gzip | document plain / gzip, read s | CPU alone % | "
             "CPU polled % | polling % | poll p50 ms | max ms | update p50 / max bytes | "
             "304 | versions |", "|---|---|---|---|---|---|---|---|---|---|---|"]
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
            f"{p['not_modified']} of {p['n']} | {p.get('versions', 0)} |")
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.topology_poll_bench",
                                     description=__doc__.split("\n\n")[0])
    add_output_args(parser, "a smoke run: 256 nodes, 6 s windows")
    parser.add_argument("--nodes", type=int, nargs="*", default=None,
                        help="fleet sizes (default 4096 8192, quick 256)")
    parser.add_argument("--window", type=float, default=None,
                        help="seconds of each CPU window (default 30, quick 6)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin with taskset")
    args = parser.parse_args(argv)
    stop_on_sigterm()
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


if __name__ == "__main__":
    sys.exit(main())
