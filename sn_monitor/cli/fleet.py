"""``sn-monitor fleet``: the parser's text; the command is :mod:`sn_monitor.fleet.command`."""

from __future__ import annotations

from sn_monitor.cli.options import Commands, add_log_options
from sn_monitor.fleet.command import add_arguments, run_fleet


def add_parser(commands: Commands) -> None:
    """``fleet`` and its options (it configures its logging from its fleet file)."""
    fleet = commands.add_parser(
        "fleet", help="serve one view over several supernodes' controllers",
        description="Ask every supernode's controller at once and serve the merged nodes "
                    "and incidents (each tagged with its supernode) on one API; a "
                    "supernode that does not answer makes the view partial, not empty.")
    add_arguments(fleet)
    add_log_options(fleet)
    fleet.set_defaults(func=run_fleet)
