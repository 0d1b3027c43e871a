"""``sn-monitor version``."""

from __future__ import annotations

import argparse

from sn_monitor import __version__
from sn_monitor.cli.options import Commands


def add_parser(commands: Commands) -> None:
    """``version``: no options."""
    commands.add_parser("version", help="print the version").set_defaults(func=run_version)


def run_version(args: argparse.Namespace) -> int:
    """Print ``sn-monitor VERSION``."""
    print(f"sn-monitor {__version__}")
    return 0
