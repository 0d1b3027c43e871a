"""``sn-monitor breaker``: show, close or open the controller's circuit breaker."""

from __future__ import annotations

import argparse
from typing import Any

from sn_monitor.cli.active_controller import ask_active_controller
from sn_monitor.cli.exit_status import refuse
from sn_monitor.cli.options import Commands, http_url_arg


def add_parser(commands: Commands) -> None:
    """``breaker [status|close|open]`` and its options."""
    breaker = commands.add_parser(
        "breaker", help="show, close or open the controller's circuit breaker",
        description="The circuit breaker freezes evictions when many nodes fail together. "
                    "'status' shows it; 'close' lets held evictions and recoveries go on "
                    "(a person looked: it was not a partition); 'open' freezes them for the "
                    "breaker's hold. Closing and opening need an operate token and are "
                    "recorded in the audit trail. Exit 1 when the controller refuses or "
                    "cannot be reached.")
    breaker.add_argument("what", choices=["status", "close", "open"], nargs="?",
                         default="status")
    breaker.add_argument("--controller", action="append", required=True, type=http_url_arg,
                         metavar="URL",
                         help="the controller (http[s]://host:9848); give it again for "
                              "each controller of a high-availability pair")
    breaker.add_argument("--token-file", metavar="F",
                         help="file holding a bearer token (read role for status, operate "
                              "to close or open)")
    breaker.add_argument("--ca-file", metavar="F",
                         help="CA bundle the controller's certificate must chain to")
    breaker.add_argument("--reason", help="why (required to close or open; recorded)")
    breaker.set_defaults(func=run_breaker)


def run_breaker(args: argparse.Namespace) -> int:
    """``sn-monitor breaker``: the controller's circuit breaker, through its API."""
    import requests

    if args.what != "status" and not (args.reason or "").strip():
        return refuse(f"sn-monitor breaker: {args.what} needs --reason "
                      "(it goes in the audit trail)")

    def send(url: str, headers: dict[str, str]) -> Any:
        if args.what == "status":
            return requests.get(f"{url}/api/v1/breaker", headers=headers, timeout=10,
                                verify=args.ca_file or True)
        return requests.post(f"{url}/api/v1/breaker", headers=headers, timeout=30,
                             verify=args.ca_file or True,
                             json={"open": args.what == "open", "reason": args.reason.strip()})

    reply = ask_active_controller("breaker", args, send)
    if isinstance(reply, int):
        return reply
    _print_breaker(reply.json())
    return 0


def _print_breaker(doc: dict[str, object]) -> None:
    import time

    def when(value: object) -> str:
        if not isinstance(value, int | float):
            return "-"
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))

    if not doc.get("open"):
        print("circuit breaker: closed (evictions allowed)")
        return
    nodes = doc.get("nodes") or []
    print(f"circuit breaker: OPEN since {when(doc.get('since'))}, until "
          f"{when(doc.get('until'))}" + (" (opened by hand)" if doc.get("by_hand") else ""))
    print(f"  {doc.get('reason')}")
    if isinstance(nodes, list) and nodes:
        print(f"  closes once these are back and healthy: {', '.join(map(str, nodes))}")
