"""What the commands' parsers share: argument types and the ``--log-*`` options.

Imports only what every command needs to build its parser (no command's modules).
"""

from __future__ import annotations

import argparse
from typing import TypeAlias

from sn_monitor.config import listen_address, parse_duration
from sn_monitor.logs import configure_logging
from sn_monitor.transport import check_http_url

#: What ``add_subparsers`` returns: each command module adds its parser to it.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def listen_arg(value: str) -> str:
    """``--listen``: HOST:PORT with a port 1-65535 and a host that is an address or a name."""
    try:
        listen_address(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def http_url_arg(value: str) -> str:
    """``--controller``: an http:// or https:// URL with a host (``ctl:9848`` is refused)."""
    try:
        check_http_url(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def agent_url_arg(value: str) -> str:
    """``slurm-health --agent``: an http(s) URL, or '' for no agent."""
    return http_url_arg(value) if value else value


def positive_int_arg(value: str) -> int:
    """A whole number of at least 1 (nodes, GPUs, connections)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def duration_arg(value: str) -> float:
    """Seconds above 0: a number (``2``, ``0.5``) or a duration (``500ms``, ``1m``)."""
    try:
        seconds = float(value) if value.replace(".", "", 1).isdigit() else parse_duration(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value!r}")
    return seconds


def add_log_options(parser: argparse.ArgumentParser, default_level: str = "info") -> None:
    """``--log-format`` and ``--log-level``; ``default_level`` when neither flag nor config says."""
    parser.add_argument("--log-format", choices=["text", "json"], default=None,
                        help="one line per event as text (default) or JSON for journald")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                        default=None)
    parser.set_defaults(default_log_level=default_level)


def configure_command_logging(args: argparse.Namespace) -> None:
    """Logging for a command without a config of its own: the flags, else its defaults."""
    configure_logging(args.log_format or "text", args.log_level or args.default_log_level)
