"""``sn-monitor goodput``: the parser's text; the command is :mod:`sn_monitor.goodput.command`."""

from __future__ import annotations

import argparse

from sn_monitor.cli.options import Commands, add_log_options, configure_command_logging
from sn_monitor.goodput.command import add_arguments, run_goodput


def add_parser(commands: Commands) -> None:
    """``goodput`` and its options."""
    goodput = commands.add_parser(
        "goodput", help="replay a failure trace: ETTR of sn-monitor and of what users run today",
        description="Replays a failure trace (by default the Llama 3 paper's interruption "
                    "rates, drawn for a seed, on a 2,048-node job for 54 days) on a "
                    "simulated job, on a virtual clock: sn-monitor's own controller makes "
                    "its decisions; Kubernetes alone and torchrun elastic are their "
                    "documented timings. Prints ETTR, lost work, the downtime split, "
                    "interruptions and false evictions side by side, with every "
                    "assumption. Exit 2 on a bad trace file or option.")
    add_arguments(goodput)
    add_log_options(goodput, default_level="error")
    goodput.set_defaults(func=run_goodput_command)


def run_goodput_command(args: argparse.Namespace) -> int:
    """Logging at the command's level (errors only by default), then the replay."""
    configure_command_logging(args)
    return run_goodput(args)
