"""The one entry point: ``sn-monitor agent|controller|demo|simulate|breaker|verify|...``.

One module per command: each adds its parser to the subcommands and sets
``func`` (``set_defaults(func=...)``), which :func:`main` calls with the parsed
arguments. :mod:`~sn_monitor.cli.options` holds the argument types and logging
options the commands share, :mod:`~sn_monitor.cli.exit_status` their exit statuses.
A command imports its heavy modules (the controller, the simulator, requests) when it
runs, never at import: ``sn-monitor --help`` builds every parser.

The top layer: it may import any part of ``sn_monitor``; nothing imports it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from sn_monitor.cli import (
    agent,
    breaker,
    check_config,
    controller,
    demo,
    fleet,
    goodput,
    logs,
    simulate,
    slurm_health,
    topology,
    verify,
    version,
)

#: ``sn-monitor --help``: plain text (argparse prints it as is; no RST markup).
DESCRIPTION = (
    "Watch GPU supernodes and repair them. An agent on every GPU node samples its GPUs, "
    "network and kernel log and serves /metrics; a controller receives every node's "
    "reports, applies the rules and acts: throttle, alert, cordon, evict, fail over to a "
    "spare, restart the job from its latest checkpoint. 'sn-monitor demo' shows it on a "
    "simulated supernode; 'sn-monitor COMMAND --help' describes each command.")

#: The commands, in the order ``sn-monitor --help`` lists them.
COMMANDS = (agent, controller, demo, simulate, breaker, topology, goodput, fleet, verify,
            slurm_health, logs, check_config, version)


def build_parser() -> argparse.ArgumentParser:
    """The command line of DESIGN.md (subcommands grow with the product)."""
    parser = argparse.ArgumentParser(prog="sn-monitor", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    # No abbreviations: "--token SECRET" must be refused, not taken for --token-file (and
    # the secret then printed in "cannot read token file SECRET").
    parser.allow_abbrev = False
    for subparser in sub.choices.values():
        subparser.allow_abbrev = False
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand; return the exit status."""
    args = build_parser().parse_args(argv)
    status: int = args.func(args)
    return status
