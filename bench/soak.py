"""Soak: ``sn-monitor simulate`` against one controller for a long time, faults all along.

Run with ``make soak`` (30 minutes, 4,096 nodes every 2 s) or
``python -m bench.soak --minutes 3 --nodes 1024`` for a short one.

One ``sn-monitor controller`` (default rules, no drivers: alerts to its log, the other
actions fail and are retried as they would be without a driver; the rate limit lifted as
in ``controller_bench``) and one ``sn-monitor simulate`` process, each pinned to a core
where there are two. A scenario file plays a fault every ``--fault-every`` seconds on a
different node, cycling through kinds that each have their own rule: fatal XIDs
(``fatal-xid``), application XIDs (``app-xid``), an uncorrectable ECC error
(``ecc-uncorrectable``), a pending row remap (``pending-row-remap``), an InfiniBand port
going down (``ib-port-down``, put back up a minute later).

Every 10 s the controller's RSS and open file descriptors are sampled. At the end:

- **RSS flat**: the growth from the end of the warm-up (a fifth of the run) to the end,
  as a share of the warm-up RSS; goal <= 5 %.
- **fds flat**: most minus fewest open descriptors after the warm-up; goal <= 8 (a few
  for keep-alive connections coming and going).
- **events once**: events sent (every sending counted, a resent one again),
  acknowledged and stored (the rise of the controller's ``sn_controller_events_total``)
  are the same number: none lost, none sent twice (the answer that carries a report's
  events acknowledges them).
- **every fault detected**: an incident of the expected rule on each faulted node.

Nothing here fails ``make test``: the exit status is 1 when a goal is missed, and the
figures go to ``bench/results/soak.json``.
"""

from __future__ import annotations

import argparse
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

from bench.common import sn_monitor_command, write_results
from bench.controller_bench import ControllerProcess, pick_cores
from sn_monitor import __version__
from sn_monitor.sim.fleet import node_name

#: (scenario fault line parameters, the rule that must catch it), played in turn.
KINDS: tuple[tuple[str, str], ...] = (
    ("fault: xid, code: 79", "fatal-xid"),
    ("fault: xid, code: 13", "app-xid"),
    ("fault: ecc-uncorrectable, count: 1", "ecc-uncorrectable"),
    ("fault: xid, code: 48", "fatal-xid"),
    ("fault: row-remap-pending", "pending-row-remap"),
    ("fault: xid, code: 31", "app-xid"),
    ("fault: ib-port-down, device: mlx5_3", "ib-port-down"),
)
RSS_GROWTH_GOAL = 0.05
FD_SPREAD_GOAL = 8
SAMPLE_EVERY_S = 10.0


def scenario(nodes: int, seconds: float, every: float) -> tuple[str, list[dict[str, Any]]]:
    """The scenario text and the faults it plays (node index, expected rule)."""
    lines = ["kind: Scenario", "name: soak", "description: a fault every few seconds",
             "faults:"]
    faults: list[dict[str, Any]] = []
    at, k = 5.0, 0
    stride = 7919  # a prime: consecutive faults land far apart, each node at most once
    while at < seconds - 60:  # the last faults have a minute to be detected
        params, rule = KINDS[k % len(KINDS)]
        node = (13 + k * stride) % nodes
        gpu = "" if "ib-port" in params else f", gpu: {k % 8}"
        lines.append(f"  - {{at: {at:g}s, node: {node}{gpu}, {params}}}")
        if "ib-port-down" in params:
            lines.append(f"  - {{at: {at + 60:g}s, node: {node}, fault: ib-port-up, "
                         "device: mlx5_3}")
        faults.append({"at": at, "node": node, "rule": rule})
        at += every
        k += 1
        if k >= nodes:
            break
    return "\n".join(lines) + "\n", faults


def _read_all(stream: Any, sink: list[bytes]) -> None:
    sink.append(stream.read())


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    seconds = args.minutes * 60.0
    controller_core, other_cores, pinning = pick_cores(not args.no_pin)
    sim_core = min(other_cores) if other_cores and controller_core is not None else None
    out: dict[str, Any] = {"version": __version__, "nodes": args.nodes,
                           "interval_s": args.interval, "minutes": args.minutes,
                           "fault_every_s": args.fault_every, "pinning": pinning,
                           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with tempfile.TemporaryDirectory(prefix="sn-soak-") as tmp:
        controller = ControllerProcess(Path(tmp), "soak", controller_core)
        text, faults = scenario(args.nodes, seconds, args.fault_every)
        scenario_path = Path(tmp) / "soak.yaml"
        scenario_path.write_text(text)
        out["faults"] = len(faults)
        sim: subprocess.Popen[bytes] | None = None
        try:
            controller.start()
            before = controller.metrics()
            pin = ["taskset", "-c", str(sim_core)] if sim_core is not None else []
            command = [*pin, *sn_monitor_command(), "simulate", "--controller",
                       f"http://127.0.0.1:{controller.port}", "--nodes", str(args.nodes),
                       "--interval", f"{args.interval:g}s", "--scenario", str(scenario_path),
                       "--speed", "1", "--duration", f"{seconds:g}s", "--jitter", "0",
                       "--json", "--log-level", "warning"]
            out["simulate_command"] = " ".join(command)
            sim = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL)
            stdout: list[bytes] = []
            reader = threading.Thread(target=_read_all, args=(sim.stdout, stdout), daemon=True)
            reader.start()
            samples: list[dict[str, float]] = []
            started = time.monotonic()
            deadline = started + seconds + 180.0
            next_sample = started
            while sim.poll() is None and time.monotonic() < deadline:
                now = time.monotonic()
                if now >= next_sample:
                    samples.append({"t": round(now - started, 1),
                                    "rss_mb": (controller.rss_kb() or 0) / 1024,
                                    "fds": open_fds(controller.pid) or 0,
                                    "cpu_s": controller.cpu_seconds() or 0.0})
                    next_sample += SAMPLE_EVERY_S
                    if args.progress:
                        print(f"t={samples[-1]['t']:6.0f}s rss {samples[-1]['rss_mb']:.0f} MB "
                              f"fds {samples[-1]['fds']:.0f}", file=sys.stderr, flush=True)
                time.sleep(0.5)
            if sim.poll() is None:
                raise RuntimeError("simulate did not finish in time")
            reader.join(timeout=10)
            summary = json.loads(b"".join(stdout) or b"{}")
            time.sleep(2.0)  # the last answers
            after = controller.metrics()
            out["simulate"] = {k: summary.get(k) for k in (
                "seconds", "sent", "accepted", "refused", "failed", "not_sent",
                "accepted_per_second", "target_per_second", "latency_ms", "events")}
            out["samples"] = samples
            warm = [s for s in samples if s["t"] >= seconds / 5]
            if warm:
                out["rss_mb_after_warmup"] = round(warm[0]["rss_mb"], 1)
                out["rss_mb_end"] = round(warm[-1]["rss_mb"], 1)
                out["rss_growth"] = round(warm[-1]["rss_mb"] / warm[0]["rss_mb"] - 1, 4)
                out["fd_spread"] = max(s["fds"] for s in warm) - min(s["fds"] for s in warm)
            span = samples[-1]["t"] - samples[0]["t"] if len(samples) > 1 else 0.0
            out["controller_cpu_percent"] = round(
                100 * (samples[-1]["cpu_s"] - samples[0]["cpu_s"]) / span, 1) if span else None
            stored = sum(v for k, v in after.items() if k.startswith("sn_controller_events_total")
                         ) - sum(v for k, v in before.items()
                                 if k.startswith("sn_controller_events_total"))
            events = summary.get("events", {})
            out["events"] = {"sent": events.get("sent"), "acknowledged":
                             events.get("acknowledged"), "stored_by_controller": int(stored)}
            incidents = controller.get_json("/api/v1/incidents?limit=1000")["incidents"]
            seen = {(i["rule"], i["node"]) for i in incidents}
            missed = []
            for f in faults:
                name = node_name(f["node"], args.nodes)
                if (f["rule"], name) in seen:
                    continue
                # more than a page of incidents: ask for the node's own
                own = controller.get_json(f"/api/v1/incidents?node={name}&limit=1000")
                if f["rule"] not in {i["rule"] for i in own["incidents"]}:
                    missed.append(f)
            out["undetected"] = [{"node": node_name(f["node"], args.nodes), **f}
                                 for f in missed]
            out["controller_log_tail"] = controller.log_tail(3)
        finally:
            if sim is not None and sim.poll() is None:
                sim.kill()
                sim.wait(timeout=10)
            out["controller_exit"] = controller.stop()
    return out


def verdict(r: dict[str, Any]) -> dict[str, bool]:
    ev = r.get("events", {})
    return {
        "rss flat": r.get("rss_growth", 1.0) <= RSS_GROWTH_GOAL,
        "fds flat": r.get("fd_spread", 1 << 30) <= FD_SPREAD_GOAL,
        "events once": (ev.get("sent") is not None and ev.get("sent") == ev.get(
            "acknowledged") and ev.get("sent") == ev.get("stored_by_controller")),
        "every fault detected": not r.get("undetected", [None]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--nodes", type=int, default=4096)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--fault-every", type=float, default=3.0)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--progress", action="store_true", help="a line every 10 s")
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    args = parser.parse_args(argv)
    result = run(args)
    checks = verdict(result)
    result["verdict"] = checks
    s = result.get("simulate", {})
    print(f"sn-monitor {__version__} soak: {args.nodes} nodes every {args.interval:g} s for "
          f"{args.minutes:g} min, a fault every {args.fault_every:g} s "
          f"({result.get('faults')} faults); {result['pinning']}")
    print(f"reports: {s.get('accepted')} accepted of {s.get('sent')} sent "
          f"({s.get('accepted_per_second')}/s of {s.get('target_per_second')}/s due), "
          f"not sent {s.get('not_sent')}, failed {s.get('failed')}")
    print(f"controller RSS {result.get('rss_mb_after_warmup')} MB after warm-up -> "
          f"{result.get('rss_mb_end')} MB at the end (growth "
          f"{100 * result.get('rss_growth', float('nan')):.1f} %, goal <= "
          f"{100 * RSS_GROWTH_GOAL:.0f} %); open fds spread {result.get('fd_spread')} "
          f"(goal <= {FD_SPREAD_GOAL}); CPU {result.get('controller_cpu_percent')} %")
    ev = result["events"]
    print(f"events: {ev['sent']} sent, {ev['acknowledged']} acknowledged, "
          f"{ev['stored_by_controller']} stored (each must be the same); "
          f"undetected faults: {len(result['undetected'])}")
    for name, ok in checks.items():
        print(f"  {name}: {'yes' if ok else 'NO'}")
    write_results(args.out, result)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
