"""``sn-monitor simulate``: many simulated agents in this process against one controller."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from sn_monitor.cli.exit_status import refuse
from sn_monitor.cli.options import (
    Commands,
    add_log_options,
    configure_command_logging,
    duration_arg,
    http_url_arg,
    positive_int_arg,
)
from sn_monitor.config import ConfigError

if TYPE_CHECKING:  # the simulator is imported when the command runs (a fast --help)
    from sn_monitor.sim.scenario import Scenario


def add_parser(commands: Commands) -> None:
    """``simulate`` and its options."""
    simulate = commands.add_parser(
        "simulate", help="run many simulated agents against a controller",
        description="Run N simulated 8-GPU nodes in this process, each reporting to the "
                    "controller every interval, optionally breaking them by a scenario "
                    "file; print what the controller answered (accepted, refused, "
                    "latencies).")
    simulate.add_argument("--controller", required=True, type=http_url_arg, metavar="URL",
                          help="the controller (http[s]://host:9848)")
    simulate.add_argument("--nodes", type=positive_int_arg, default=1000,
                          help="simulated nodes (default 1000), named sim-0000, sim-0001, ...")
    simulate.add_argument("--first", type=int, default=0, metavar="N",
                          help="index of the first node (default 0): --first 256 --nodes 256 "
                               "is sim-0256.. in supernode sn01, beside another simulate")
    simulate.add_argument("--full-reports", action="store_true",
                          help="send full reports throughout, as agents before node-local "
                               "rules do (default: evaluate the rules the controller sends and "
                               "send trimmed reports with the findings)")
    simulate.add_argument("--post-reports", action="store_true",
                          help="post every report, one request in flight per connection, as "
                               "agents before the reports' stream do (default: a stream per "
                               "connection, answered only when there is something to say)")
    simulate.add_argument("--events-at-next-report", action="store_true",
                          help="send a fault's events with the node's next report, as agents "
                               "before the fast event path do (default: at once, in an "
                               "events-only report)")
    simulate.add_argument("--interval", type=duration_arg, default=1.0, metavar="S",
                          help="report interval of each node: 1s, 500ms, 2 (default 1s)")
    simulate.add_argument("--scenario", metavar="F",
                          help="a scenario file, or a packaged one by name "
                               "(default, thermal, network, mass-failure)")
    simulate.add_argument("--token-file", metavar="F",
                          help="file holding the agents' bearer token")
    simulate.add_argument("--ca-file", metavar="F",
                          help="CA bundle the controller's certificate must chain to (https; "
                               "default: the system's)")
    simulate.add_argument("--duration", type=duration_arg, default=None, metavar="S",
                          help="stop after S wall seconds (default: the scenario's duration "
                               "divided by --speed; without a scenario, run until Ctrl-C)")
    simulate.add_argument("--speed", type=float, default=1.0, metavar="X",
                          help="simulated seconds per wall second: scenario time and GPU "
                               "physics (default 1)")
    simulate.add_argument("--gpus", type=positive_int_arg, default=8, help="GPUs per node")
    simulate.add_argument("--connections", type=positive_int_arg, default=16,
                          help="keep-alive connections to the controller (default 16)")
    simulate.add_argument("--jitter", type=float, default=0.1, metavar="F",
                          help="each interval varies by up to this fraction (default 0.1)")
    simulate.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    simulate.add_argument("--json", action="store_true",
                          help="print the summary as JSON instead of a table")
    simulate.add_argument("--quiet", action="store_true",
                          help="no progress line every 10 s on stderr")
    add_log_options(simulate, default_level="warning")
    simulate.set_defaults(func=run_simulate)


def _refusal(args: argparse.Namespace, scenario: Scenario | None) -> str | None:
    """Why these options and this scenario cannot run, or None."""
    from sn_monitor.sim.scenario import demo_job_faults

    if scenario is not None and (job_faults := demo_job_faults(scenario)):
        return (f"scenario {scenario.name!r} plays {', '.join(job_faults)}, a fault of the "
                "demo's training job, and simulate has no job (play the scenario with "
                "sn-monitor demo)")
    if args.speed <= 0 or not 0 <= args.jitter < 1:
        return "--speed must be above 0 and --jitter from 0 to 0.99"
    return None


def run_simulate(args: argparse.Namespace) -> int:
    """``sn-monitor simulate``: many simulated agents against one controller."""
    configure_command_logging(args)
    import json
    import signal
    import threading

    from sn_monitor.sim.fleet import Fleet, FleetOptions, render_summary
    from sn_monitor.sim.scenario import find_scenario
    from sn_monitor.transport import TokenError, read_token

    try:
        scenario = find_scenario(args.scenario) if args.scenario else None
        token = read_token(args.token_file) if args.token_file else None
    except ConfigError as err:
        return refuse(err)
    except TokenError as err:
        return refuse(f"sn-monitor simulate: {err}")
    if (why := _refusal(args, scenario)) is not None:
        return refuse(f"sn-monitor simulate: {why}")
    duration = args.duration
    if duration is None and scenario is not None and scenario.duration is not None:
        duration = scenario.duration / args.speed
    options = FleetOptions(controller=args.controller, nodes=args.nodes,
                           interval=args.interval, duration=duration, speed=args.speed,
                           gpus=args.gpus, connections=args.connections, jitter=args.jitter,
                           seed=args.seed, token=token, ca_file=args.ca_file,
                           first=args.first, full_reports=args.full_reports,
                           post_reports=args.post_reports,
                           fast_events=not args.events_at_next_report)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        fleet = Fleet(options, scenario, progress=None if args.quiet else progress)
    except ConfigError as err:
        return refuse(err)
    except ValueError as err:
        return refuse(f"sn-monitor simulate: {err}")
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if not args.quiet:
            until = f"for {duration:g} s" if duration is not None else "until Ctrl-C"
            progress(f"simulating {options.nodes} nodes against {options.controller} "
                     f"{until}" + (f", scenario {scenario.name}" if scenario else ""))
        fleet.run(stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = fleet.summary()
    print(json.dumps(summary, indent=2) if args.json else render_summary(summary))
    if not summary["accepted"]:
        print(f"sn-monitor simulate: the controller at {options.controller} accepted no "
              f"report ({summary['sent']} sent)", file=sys.stderr)
        return 1
    return 0
