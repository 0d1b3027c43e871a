"""``sn-monitor goodput``: replay a failure trace and print the policies side by side."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sn_monitor.config import ConfigError, Duration, parse_duration_text
from sn_monitor.goodput.intervals import parse_policy
from sn_monitor.goodput.noise import NOISE, draw_noise
from sn_monitor.goodput.results import DEFAULT_POLICIES, POLICIES, table, to_json
from sn_monitor.goodput.trace import CATALOGUE, Trace, draw, load_catalogue, load_trace
from sn_monitor.goodput.world import WorldSettings

EXIT_CONFIG = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=Path, metavar="FILE",
                        help="replay this trace (.yaml/.csv of time, node, kind; or .json: "
                             "the incidents GET /api/v1/incidents returned) instead of "
                             "drawing one from the catalogue")
    parser.add_argument("--catalogue", type=Path, default=CATALOGUE, metavar="FILE",
                        help="root-cause counts to draw the trace from (default: the "
                             "Llama 3 paper's, sn_monitor/goodput/llama3.yaml)")
    parser.add_argument("--days", type=float, default=54.0,
                        help="length of the drawn trace (default 54, the paper's)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--nodes", type=int, default=2048,
                        help="the job's nodes of 8 GPUs (default 2048: 16,384 GPUs)")
    parser.add_argument("--spares", type=int, default=32,
                        help="spare nodes held for the job under sn-monitor (default 32)")
    parser.add_argument("--step", default="10s", help="training step time (default 10s)")
    parser.add_argument("--save-blocking", default="2s",
                        help="how long training pauses per checkpoint (default 2s)")
    parser.add_argument("--save-persist", default="20s",
                        help="then until the checkpoint is complete on storage (default 20s)")
    parser.add_argument("--relaunch", default="60s",
                        help="starting every rank again (default 60s)")
    parser.add_argument("--warm-relaunch", metavar="DURATION",
                        help="the relaunch of a restore that keeps the running ranks and "
                             "takes only pre-warmed spares (sn-monitor's restores; every "
                             "other restart takes --relaunch) (default 15s, assumed: the "
                             "new NCCL communicators and the spares' join; the real "
                             "torchrun job's figures are printed under the table)")
    parser.add_argument("--load", default="30s", help="loading a checkpoint (default 30s)")
    parser.add_argument("--operator-response", default="30m",
                        help="until a person takes out a node whose fault no tool sees, or "
                             "gives back a healthy node a tool took out: the same for "
                             "every policy (default 30m)")
    parser.add_argument("--replacement", default="30s",
                        help="until the cluster gives a node to a policy without spares "
                             "(default 30s)")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                        help=f"comma-separated NAME[@INTERVAL], NAME of {', '.join(POLICIES)}; "
                             "INTERVAL a duration, 'daly' (Daly's, from the policy's own "
                             "MTBF) or 'auto' (sn-monitor's advisor; a baseline's best "
                             f"replayed) (default: {','.join(DEFAULT_POLICIES)})")
    parser.add_argument("--noise", choices=("on", "off"), default="on",
                        help="healthy nodes' reports show correctable ECC errors, "
                             "temperature excursions, symbol errors, link flaps and "
                             "application XIDs at the rates printed (default on), so false "
                             "evictions and checkpoints are measured; off: none")
    parser.add_argument("--refine", action="store_true",
                        help="then replay the advisor's configuration with fixed intervals "
                             "around the one it chose (x0.5 to x2), and print each ETTR: "
                             "how close Young/Daly is to this trace's optimum (slow: one "
                             "replay each)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _duration(name: str, value: str) -> Duration:
    try:
        return Duration(parse_duration_text(value))
    except ValueError as err:
        raise ConfigError("command line", name, None, str(err)) from None


def run_goodput(args: argparse.Namespace) -> int:
    """Replay, print the table (or JSON) and the wall time; 2 on a bad file or option."""
    from sn_monitor.goodput.replay import (  # the controller: not at every CLI start
        ReplayOptions,
        job_nodes,
        refine,
        replay,
    )

    try:
        settings = _world_settings(args)
        policies = _policies(args.policies)
        trace, seed = _trace(args, settings)
    except ConfigError as err:
        print(f"sn-monitor goodput: {err}", file=sys.stderr)
        return EXIT_CONFIG
    started = time.perf_counter()
    kinds = NOISE if args.noise == "on" else ()
    noise = draw_noise(kinds, job_nodes(settings), trace.duration, args.seed)
    # the simulated controller logs only when asked: its faults are the trace's
    options = ReplayOptions(policies=policies, noise=noise,
                            controller_logs=args.log_level is not None)
    results = replay(trace, settings, options)
    advised = next((r.checkpoint_interval_seconds for r in results
                    if r.name == "sn-monitor-advisor"), None)
    refined = refine(trace, settings, advised, options=options) \
        if args.refine and advised else []
    wall = time.perf_counter() - started
    if args.json:
        doc = to_json(results, trace, settings, seed, wall, kinds)
        if refined:
            doc["refine"] = [{"interval_seconds": i, "ettr": e} for i, e in refined]
        print(json.dumps(doc, indent=2))
    else:
        print(table(results, trace, settings, seed, kinds))
        if refined:
            print(f"\nrefined by the replay (the advisor chose {advised:.0f} s):")
            for interval, ettr in refined:
                print(f"  every {interval:6.0f} s: ETTR {ettr * 100:.2f} %")
        print(f"\nreplayed in {wall:.0f} s of wall time")
    return 0


def _world_settings(args: argparse.Namespace) -> WorldSettings:
    """The simulated job and its timings, from the options (raises ConfigError)."""
    if args.nodes < 1 or args.spares < 0 or args.days <= 0:
        raise ConfigError("command line", "--nodes/--spares/--days", None,
                          "need at least one node, no negative spares, days above 0")
    return WorldSettings(
        nodes=args.nodes, spares=args.spares, step_seconds=_duration("--step", args.step),
        save_blocking=_duration("--save-blocking", args.save_blocking),
        save_persist=_duration("--save-persist", args.save_persist),
        load=_duration("--load", args.load),
        relaunch=_duration("--relaunch", args.relaunch),
        warm_relaunch=None if args.warm_relaunch is None
        else _duration("--warm-relaunch", args.warm_relaunch),
        operator_response=_duration("--operator-response", args.operator_response),
        replacement=_duration("--replacement", args.replacement))


def _policies(option: str) -> tuple[str, ...]:
    """``--policies``: known names with valid intervals, at least one (raises ConfigError)."""
    policies = tuple(p.strip() for p in option.split(",") if p.strip())
    try:
        unknown = [p for p in policies if parse_policy(p)[0] not in POLICIES]
    except ValueError as err:
        raise ConfigError("command line", "--policies", None, str(err)) from None
    if unknown or not policies:
        raise ConfigError("command line", "--policies", None,
                          f"unknown {', '.join(unknown) or 'empty'}; "
                          f"policies: {', '.join(POLICIES)}")
    return policies


def _trace(args: argparse.Namespace, settings: WorldSettings) -> tuple[Trace, int | None]:
    """The ``--trace`` file, or one drawn from the catalogue; and the seed it was drawn with."""
    from sn_monitor.goodput.replay import job_nodes

    if args.trace is not None:
        return load_trace(args.trace), None
    trace = draw(load_catalogue(args.catalogue), job_nodes(settings),
                 args.days * 86400.0, args.seed)
    return trace, args.seed

