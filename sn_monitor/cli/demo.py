"""``sn-monitor demo``: a simulated supernode, a scenario of faults, a live view, a summary."""

from __future__ import annotations

import argparse
from pathlib import Path

from sn_monitor.cli.exit_status import refuse
from sn_monitor.cli.options import (
    Commands,
    add_log_options,
    configure_command_logging,
    duration_arg,
    listen_arg,
    positive_int_arg,
)
from sn_monitor.config import ConfigError


def add_parser(commands: Commands) -> None:
    """``demo`` and its options."""
    demo = commands.add_parser(
        "demo", help="watch a simulated supernode break and recover",
        description="Start a controller, N simulated agents (real agent processes) and a "
                    "training job over all but 2 of them (the spares), play a scenario of "
                    "faults, show it live, and end with a summary: each fault, when it was "
                    "detected, what was done, how long recovery took, the job's effective "
                    "training ratio.")
    demo.add_argument("--nodes", type=positive_int_arg, default=16,
                      help="simulated nodes, the last 2 of them spares (default 16)")
    demo.add_argument("--gpus-per-node", type=positive_int_arg, default=8, dest="gpus",
                      help="GPUs per node (default 8)")
    demo.add_argument("--scenario", metavar="F", default="default",
                      help="a scenario file, or a packaged one by name (default: default)")
    demo.add_argument("--speed", type=float, default=10.0, metavar="X",
                      help="simulated seconds per wall second: scenario time, GPU physics "
                           "and rule holds (default 10)")
    demo.add_argument("--duration", type=duration_arg, default=None, metavar="S",
                      help="stop after S wall seconds (default: the scenario's end)")
    demo.add_argument("--listen", type=listen_arg, default="127.0.0.1:9848", metavar="HOST:PORT",
                      help="the controller's address (default 127.0.0.1:9848); agents take "
                           "the free ports after it")
    demo.add_argument("--state-dir", type=Path, default=None, metavar="DIR",
                      help="keep the store, configs and logs here (default: a temporary "
                           "directory, removed at exit)")
    demo.add_argument("--rules", action="append", type=Path, metavar="DIR",
                      help="rule files or directories (repeatable; default: the rules "
                           "packaged with sn-monitor), their holds scaled by --speed")
    demo.add_argument("--headless", action="store_true",
                      help="no live view: print the summary as JSON; exit 1 if a fault "
                           "went undetected, a healthy node was taken for faulty, or the "
                           "job is not training at the end")
    demo.add_argument("--keep-running", action="store_true",
                      help="after the scenario, leave everything up (/metrics, /api/v1/sd "
                           "for Prometheus) until Ctrl-C")
    add_log_options(demo, default_level="warning")
    demo.set_defaults(func=run_demo_command)


def run_demo_command(args: argparse.Namespace) -> int:
    """``sn-monitor demo``: a simulated supernode, a scenario, a live view, a summary."""
    configure_command_logging(args)
    from sn_monitor.rules.spec import load_rules
    from sn_monitor.sim.demo import DemoOptions, run_demo
    from sn_monitor.sim.scenario import find_scenario

    try:
        if args.rules:
            load_rules(args.rules)
        scenario = find_scenario(args.scenario)
        scenario.check_gpus(args.gpus)
        scenario.resolve(args.nodes, [_demo_node(i, args.nodes) for i in range(args.nodes)])
    except ConfigError as err:
        return refuse(err)
    if args.speed <= 0:
        return refuse("sn-monitor demo: --speed must be above 0")
    if args.nodes < 3:
        return refuse("sn-monitor demo: --nodes must be at least 3 (a job and 2 spares)")
    return run_demo(DemoOptions(
        scenario=scenario, nodes=args.nodes, gpus=args.gpus, speed=args.speed,
        duration=args.duration, headless=args.headless, keep_running=args.keep_running,
        listen=args.listen, state_dir=args.state_dir, rules=tuple(args.rules or ())))


def _demo_node(index: int, nodes: int) -> str:
    from sn_monitor.sim.fleet import node_name

    return node_name(index, nodes)
