"""Per-report CPU of the controller's ingest, in-process: no HTTP, no second process.

Run with ``python -m bench.ingest_bench``; ``--compare DIR`` runs the same measurement
alternately against another checkout (``git archive HEAD | tar -x -C DIR``) and this one
and prints the ratio of their medians, which is what a noisy shared machine can tell.

The reports are ``sn-monitor simulate``'s (:func:`sn_monitor.sim.fleet.base_reports`: an
8-GPU H100 node at working temperature, 8 InfiniBand ports of 30 counters, 3 interfaces,
about 14 KB of JSON), encoded per node with its own head and labels; node ``i`` steps
through the variants, so values move from one report to the next. The controller is
:class:`~sn_monitor.controller.service.Controller` with the default rules
(``rules/``), a SQLite store in a temporary directory and a manual clock that moves
``--interval`` seconds per round, as if every node reported every interval: the rules'
windows and buckets see the spacing that they see in production.

What is measured, per repetition, as CPU time (``time.process_time``) over a whole round
of ``--nodes`` reports, divided by the number of reports:

- ``ingest``: ``Controller.ingest`` (decode, registry, rules, reply);
- ``decode``: :func:`~sn_monitor.controller.ingest.decode_report` alone;
- ``rules``: ``RuleEngine.observe`` alone, on views whose report changes every round;
- ``trimmed``: ``Controller.ingest`` of the reports an agent sends once it evaluates the
  controller's node-local rules itself (``sn_monitor/rules/edge.py``): no values but the
  ones peers rules, the link rates and the workloads' accounting read, every fifth
  report, and no findings (a healthy fleet).

The figure of a repetition is the median of its rounds; the result is the median of the
repetitions. Nothing fails on a figure; the exit status is 1 when the measurement
raised (in either checkout, with ``--compare``). ``--quick``: a smoke run of a few
seconds.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parent.parent
PARTS = ("ingest", "decode", "rules", "trimmed")


def _bodies(nodes: int) -> list[list[bytes]]:
    """Per variant, per node: the body without its sequence and time (see _body)."""
    from sn_monitor.sim.fleet import base_reports, node_labels, node_name

    encoder = msgspec.json.Encoder()
    out = []
    for report in base_reports(8):
        per_node = []
        for i in range(nodes):
            name = node_name(i, nodes)
            full = encoder.encode(msgspec.structs.replace(
                report, node=name, instance="bench", sequence=0, sample_time_seconds=0.0,
                labels=node_labels(i)))
            head, tail = full.split(b'"sequence":0,"sample_time_seconds":0.0', 1)
            per_node.append(head + b'"sequence":%d,"sample_time_seconds":%r' + tail)
        out.append(per_node)
    return out


def _trimmed_bodies(nodes: int, rules: list[Any]) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """Per variant, per node: trimmed bodies with the values the controller reads, and without.

    The edge rules are the controller's own: its rules', the link rates' values
    (``FABRIC_METRICS``) that its topology and bottleneck finder read, and the workloads'
    accounting's (``WORKLOAD_METRICS``).
    """
    from sn_monitor.rules.edge import EdgeCatalog
    from sn_monitor.rules.series import Trim
    from sn_monitor.rules.view import NodeView
    from sn_monitor.sim.fleet import base_reports, node_labels, node_name

    try:
        from sn_monitor.controller.fabric.meter import FABRIC_METRICS
    except ImportError:  # --compare with a checkout from before the link rates
        edge = EdgeCatalog(rules).for_node(NodeView(name="x"))
    else:
        edge = EdgeCatalog(rules, (*FABRIC_METRICS, *_workload_metrics())).for_node(
            NodeView(name="x"))
    encoder = msgspec.json.Encoder()
    out: tuple[list[list[bytes]], list[list[bytes]]] = ([], [])
    for trim, sink in ((Trim(edge.keep), out[0]), (Trim(()), out[1])):
        for report in base_reports(8):
            per_node = []
            for i in range(nodes):
                full = encoder.encode(msgspec.structs.replace(
                    trim(report), node=node_name(i, nodes), instance="bench", sequence=0,
                    sample_time_seconds=0.0, labels=node_labels(i),
                    rules_version=edge.version, takes_rules=True))
                head, tail = full.split(b'"sequence":0,"sample_time_seconds":0.0', 1)
                per_node.append(head + b'"sequence":%d,"sample_time_seconds":%r' + tail)
            sink.append(per_node)
    return out


def _workload_metrics() -> tuple[str, ...]:
    """What the workloads' accounting keeps in trimmed reports (none before it)."""
    try:
        from sn_monitor.controller.workloads.accounting import WORKLOAD_METRICS
    except ImportError:  # --compare with a checkout from before the accounting
        return ()
    return WORKLOAD_METRICS


def _moved_parts() -> tuple[Any, Any, Any]:
    """The report decoder, the open identity and the store, where this checkout keeps them.

    Issue 30 moved them into the controller's folders; ``--compare`` against a checkout
    from before the move imports them from where they were.
    """
    try:
        from sn_monitor.controller.ingest.decode import decode_report
        from sn_monitor.controller.security.auth import OPEN_ACCESS
        from sn_monitor.controller.storage.store import Store
    except ImportError:  # a checkout from before the move
        return (importlib.import_module("sn_monitor.controller.ingest").decode_report,
                importlib.import_module("sn_monitor.controller.auth").OPEN_ACCESS,
                importlib.import_module("sn_monitor.controller.store").Store)
    return decode_report, OPEN_ACCESS, Store


def measure(nodes: int, rounds: int, interval: float) -> dict[str, float]:
    """One repetition: median per-report CPU microseconds of each part."""
    from sn_monitor.clock import ManualClock
    from sn_monitor.controller.actions.policy import PolicySettings, RateLimitSettings
    from sn_monitor.controller.actions.routing import build_drivers
    from sn_monitor.controller.service import Controller
    from sn_monitor.controller.settings import ControllerSettings
    from sn_monitor.rules.engine import RuleEngine
    from sn_monitor.rules.spec import load_rules
    from sn_monitor.rules.view import NodeView

    decode_report, OPEN_ACCESS, Store = _moved_parts()
    templates = _bodies(nodes)
    variants = len(templates)
    rules = load_rules([REPO / "sn_monitor" / "rules"])
    clock = ManualClock()
    sequence = 0

    def body(i: int, r: int) -> bytes:
        return templates[(i + r) % variants][i] % (sequence, clock.time())

    def timed(step: Callable[[bytes], object]) -> float:
        """Median per-report CPU microseconds of ``step(body)`` over the rounds."""
        nonlocal sequence
        per_round = []
        for r in range(rounds):
            sequence += 1
            clock.advance(interval)
            batch = [body(i, r) for i in range(nodes)]
            t0 = time.process_time_ns()
            for b in batch:
                step(b)
            per_round.append((time.process_time_ns() - t0) / 1e3 / nodes)
        return statistics.median(per_round)

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sn-ingest-bench-") as tmp:
        settings = ControllerSettings(policy=PolicySettings(
            rate_limit=RateLimitSettings(actions=100000)))
        store = Store(Path(tmp) / "bench.db")
        drivers = build_drivers(settings.drivers, settings.routes, clock)
        controller = Controller(settings, rules, clock, store, drivers)
        try:
            sequence += 1
            for i in range(nodes):  # register every node (a store write each): not timed
                controller.ingest(body(i, 0), OPEN_ACCESS, "127.0.0.1")
            out["ingest"] = timed(lambda b: controller.ingest(b, OPEN_ACCESS, "127.0.0.1"))
            with_values, bare = _trimmed_bodies(nodes, rules)
            per_round = []
            for r in range(1 + rounds):  # the first round hands each node over: not timed
                sequence += 1
                clock.advance(interval)
                batch = [(with_values if (i + r) % 5 == 0 else bare)[(i + r) % variants][i]
                         % (sequence, clock.time()) for i in range(nodes)]
                t0 = time.process_time_ns()
                for b in batch:
                    controller.ingest(b, OPEN_ACCESS, "127.0.0.1")
                if r:
                    per_round.append((time.process_time_ns() - t0) / 1e3 / nodes)
            out["trimmed"] = statistics.median(per_round)
        finally:
            controller.close()
            store.close()
    out["decode"] = timed(decode_report)
    engine = RuleEngine(rules, clock)
    views = [NodeView(name=f"n{i}") for i in range(nodes)]

    per_round = []
    for r in range(3 + rounds):  # the first 3 rounds warm every series up: not timed
        clock.advance(interval)
        sequence += 1
        for i, view in enumerate(views):
            view.report = decode_report(body(i, r))
            view.labels = view.report.labels
        t0 = time.process_time_ns()
        for view in views:
            engine.observe(view)
        if r >= 3:
            per_round.append((time.process_time_ns() - t0) / 1e3 / nodes)
    out["rules"] = statistics.median(per_round)
    return out


def _child(args: argparse.Namespace, pythonpath: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--repeat", "1",
           "--nodes", str(args.nodes), "--rounds", str(args.rounds),
           "--interval", str(args.interval)]
    done = subprocess.run(cmd, env=env, check=False, capture_output=True, text=True,
                          cwd=pythonpath)
    if done.returncode != 0:
        raise RuntimeError(f"{pythonpath}: exit {done.returncode}: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["runs"][0]  # type: ignore[no-any-return]


def _compare(args: argparse.Namespace, results: dict[str, Any]) -> None:
    base: list[dict[str, float]] = []
    new: list[dict[str, float]] = []
    results.update(base=base, new=new, ratio_new_over_base={})
    for k in range(args.repeat):
        base.append(_child(args, str(Path(args.compare).resolve())))
        new.append(_child(args, str(REPO)))
        print(f"rep {k + 1}: base " + " ".join(f"{p} {v:.1f}" for p, v in base[-1].items())
              + " | new " + " ".join(f"{p} {v:.1f}" for p, v in new[-1].items()), flush=True)
    print(f"\nper-report CPU us, median of {args.repeat} alternating runs "
          f"({args.nodes} nodes x {args.rounds} rounds each):")
    for p in [p for p in PARTS if p in base[0]]:  # an older checkout measures fewer
        b = statistics.median(r[p] for r in base)
        n = statistics.median(r[p] for r in new)
        ratios = sorted(y[p] / x[p] for x, y in zip(base, new, strict=True))
        results["ratio_new_over_base"][p] = n / b
        print(f"  {p:<7} base {b:7.1f}  new {n:7.1f}  ratio new/base {n / b:.3f} "
              f"(paired ratios {ratios[0]:.3f}..{ratios[-1]:.3f}, "
              f"median {statistics.median(ratios):.3f})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_bench",
                                     description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 128 nodes x 2 rounds, once")
    parser.add_argument("--out", type=Path, default=None,
                        help="the results' JSON file (default: bench/results/ingest.json; "
                             "with --quick a new temporary directory)")
    parser.add_argument("--nodes", type=int, default=None, help="default 1024 (quick 128)")
    parser.add_argument("--rounds", type=int, default=None, help="default 5 (quick 2)")
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=None, help="default 5 (quick 1)")
    parser.add_argument("--compare", metavar="DIR",
                        help="another checkout: alternate runs of it and of this one")
    parser.add_argument("--json", action="store_true",
                        help="one JSON line on stdout, no text and no results file")
    args = parser.parse_args(argv)
    args.nodes = args.nodes or (128 if args.quick else 1024)
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.repeat = args.repeat or (1 if args.quick else 5)
    if args.json:
        print(json.dumps({"runs": [measure(args.nodes, args.rounds, args.interval)
                                   for _ in range(args.repeat)]}))
        return 0
    # Imported only here: a --compare child (--json) runs this file on another checkout's
    # PYTHONPATH, whose bench/ may be older.
    from bench.common import finish, machine, results_path, stop_on_sigterm

    stop_on_sigterm()
    out_path = results_path(args, "ingest.json")
    results: dict[str, Any] = {"meta": {
        "mode": "quick" if args.quick else "full", "nodes": args.nodes,
        "rounds": args.rounds, "interval_s": args.interval, "repeat": args.repeat,
        "compare": args.compare, "machine": machine()}}
    failures: list[str] = []
    try:
        if args.compare:
            _compare(args, results)
        else:
            runs = results["runs"] = [measure(args.nodes, args.rounds, args.interval)
                                      for _ in range(args.repeat)]
            results["median_us"] = {p: statistics.median(r[p] for r in runs) for p in PARTS}
            print(f"per-report CPU us ({args.nodes} nodes x {args.rounds} rounds, "
                  f"median of {args.repeat}):")
            for p in PARTS:
                print(f"  {p:<7} {results['median_us'][p]:7.1f}")
    except Exception as err:  # noqa: BLE001 - said, written, exit 1
        failures.append(f"{type(err).__name__}: {err}")
    return finish(results, out_path, failures)


if __name__ == "__main__":
    sys.exit(main())
