"""``sn-monitor controller``: the controller daemon, its config file with the flags over it."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from sn_monitor.cli.exit_status import EXIT_STORE, refuse
from sn_monitor.cli.options import Commands, add_log_options, listen_arg
from sn_monitor.config import ConfigError
from sn_monitor.logs import configure_logging
from sn_monitor.serving import ListenError

#: The flags that override the controller config's key of the same name.
OVERRIDES = ("listen", "state_dir", "rules", "token_file", "jobs")


def add_parser(commands: Commands) -> None:
    """``controller`` and its options."""
    controller = commands.add_parser(
        "controller", help="run the controller",
        description="Receive every node's reports, apply the rules, act through the "
                    "safety policy, record everything.")
    controller.add_argument("--config", type=Path, help="controller config file")
    controller.add_argument("--listen", type=listen_arg, metavar="HOST:PORT",
                            help="API address (default 0.0.0.0:9848)")
    controller.add_argument("--state-dir", metavar="DIR", help="where the SQLite store lives")
    controller.add_argument("--rules", action="append", metavar="DIR",
                            help="rule files or directories (repeatable)")
    controller.add_argument("--token-file", metavar="F", help="the API token file (YAML)")
    controller.add_argument("--jobs", metavar="DIR", help="a directory of DistributedJob files")
    add_log_options(controller)
    controller.set_defaults(func=run_controller_command)


def run_controller_command(args: argparse.Namespace) -> int:
    """``sn-monitor controller``: flags override the config file."""
    from sn_monitor.clock import SystemClock
    from sn_monitor.controller.process.daemon import run_controller
    from sn_monitor.controller.settings import load_controller_settings
    from sn_monitor.controller.storage.database import StoreError

    try:
        settings = load_controller_settings(args.config)
        overrides: dict[str, object] = {name: getattr(args, name) for name in OVERRIDES
                                        if getattr(args, name)}
        if "rules" in overrides:
            overrides["rules"] = list(args.rules)
        settings = replace(settings, **overrides)  # type: ignore[arg-type]
        configure_logging(args.log_format or settings.log_format,
                          args.log_level or settings.log_level)
        return run_controller(settings, SystemClock())
    except ConfigError as err:
        return refuse(err)
    except OSError as err:
        return refuse(f"sn-monitor controller: {err}")
    except StoreError as err:  # names the store (never a password), not a traceback
        print(f"sn-monitor controller: {err}", file=sys.stderr)
        return EXIT_STORE
    except ListenError as err:  # the address in use, or not this machine's
        return refuse(f"sn-monitor controller: {err}")

