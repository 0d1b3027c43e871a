"""``sn-monitor topology``: the controller's fabric view, as text."""

from __future__ import annotations

import argparse
from typing import Any

from sn_monitor.cli.active_controller import ask_active_controller
from sn_monitor.cli.options import Commands, http_url_arg


def add_parser(commands: Commands) -> None:
    """``topology`` and its options."""
    topology = commands.add_parser(
        "topology", help="print the fabric: supernodes, racks, nodes, rails, fail-slow links",
        description="Prints the controller's topology view (GET /api/v1/topology; the page "
                    "/ui/topology draws the same): fail-slow bottlenecks first, then each "
                    "rack's nodes with their health, then one line per rail naming its "
                    "unhealthy ports. Exit 1 when the controller refuses or cannot be "
                    "reached.")
    topology.add_argument("--controller", action="append", required=True, type=http_url_arg,
                          metavar="URL",
                          help="the controller (http[s]://host:9848); give it again for "
                               "each controller of a high-availability pair")
    topology.add_argument("--job", metavar="J", help="mark this job's nodes")
    topology.add_argument("--token-file", metavar="F",
                          help="file holding a bearer token (read role)")
    topology.add_argument("--ca-file", metavar="F",
                          help="CA bundle the controller's certificate must chain to")
    topology.add_argument("--json", action="store_true", help="print the API's JSON as is")
    topology.set_defaults(func=run_topology)


def run_topology(args: argparse.Namespace) -> int:
    """``sn-monitor topology``: the controller's topology view, as text."""
    import requests

    from sn_monitor.topology_text import render_topology

    params = {"job": args.job} if args.job else None

    def send(url: str, headers: dict[str, str]) -> Any:
        return requests.get(f"{url}/api/v1/topology", params=params, headers=headers,
                            timeout=30, verify=args.ca_file or True)

    reply = ask_active_controller("topology", args, send)
    if isinstance(reply, int):
        return reply
    print(reply.text if args.json else "\n".join(render_topology(reply.json(), args.job)))
    return 0
