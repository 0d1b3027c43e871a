"""``sn-monitor agent``: the node agent, on this node's GPUs or on a simulated node."""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

from sn_monitor.agent.settings import AgentSettings, load_agent_settings
from sn_monitor.cli.exit_status import refuse
from sn_monitor.cli.options import (
    Commands,
    add_log_options,
    http_url_arg,
    listen_arg,
    positive_int_arg,
)
from sn_monitor.config import ConfigError
from sn_monitor.logs import configure_logging
from sn_monitor.serving import ListenError


def add_parser(commands: Commands) -> None:
    """``agent`` and its options; a flag overrides the config file."""
    agent = commands.add_parser("agent", help="run the node agent",
                                description="Sample this node's GPUs, network and kernel log; "
                                            "serve /metrics and /healthz.")
    agent.add_argument("--config", type=Path, help="agent config file (deploy/agent.yaml)")
    agent.add_argument("--simulate", type=positive_int_arg, metavar="GPUS",
                       help="run on a simulated node with this many GPUs (no GPU needed)")
    agent.add_argument("--listen", type=listen_arg, metavar="HOST:PORT",
                       help="address for /metrics and /healthz (default 0.0.0.0:9847)")
    agent.add_argument("--node",
                       help="node name (default: config, then $NODE_NAME, then the hostname)")
    agent.add_argument("--controller", action="append", type=http_url_arg, metavar="URL",
                       help="report to this controller (http[s]://host:9848); give it "
                            "again for each controller of a high-availability pair")
    agent.add_argument("--token-file", metavar="F",
                       help="file holding the bearer token for the controller")
    agent.add_argument("--state-dir", metavar="DIR",
                       help="where the event spool and saved power limits live")
    agent.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    agent.add_argument("--sim-speed", type=float, default=1.0, metavar="X",
                       help="with --simulate: run the GPUs' physics X times faster")
    add_log_options(agent)
    agent.set_defaults(func=run_agent_command)


def run_agent_command(args: argparse.Namespace) -> int:
    """The config file with the flags over it, logging as it says, then the agent."""
    try:
        settings = agent_settings(args)
    except ConfigError as err:
        return refuse(err)
    configure_logging(args.log_format or settings.log_format,
                      args.log_level or settings.log_level)
    return run_agent(settings, simulate=args.simulate, duration=args.duration,
                     sim_speed=args.sim_speed)


def agent_settings(args: argparse.Namespace) -> AgentSettings:
    """The agent's config file, with what the command line says over it."""
    settings = load_agent_settings(args.config)
    if args.listen:
        settings = replace(settings, listen=args.listen)
    if args.node:
        settings = replace(settings, node=args.node)
    if args.controller or args.token_file:
        url, urls = settings.controller.url, settings.controller.urls
        if args.controller:  # one: url, as ever; several: urls
            url, urls = (args.controller[0], None) if len(args.controller) == 1 else (
                None, list(args.controller))
        try:
            controller = replace(settings.controller, url=url, urls=urls,
                                 token_file=args.token_file or settings.controller.token_file)
        except ValueError as err:
            raise ConfigError("command line", "--controller", None, str(err)) from None
        settings = replace(settings, controller=controller)
    if args.state_dir:
        settings = replace(settings, state_dir=args.state_dir)
    return settings


def run_agent(settings: AgentSettings, simulate: int | None, duration: float | None,
              sim_speed: float = 1.0) -> int:
    """The agent on this node's GPUs, or on a simulated node with ``simulate`` GPUs.

    A simulated node's physics run ``sim_speed`` times faster than the wall (the agent's
    clocks do not), and its agent takes faults on ``POST /sim/fault``.
    """
    from sn_monitor.agent.daemon import build_agent
    from sn_monitor.clock import SystemClock
    from sn_monitor.transport import TokenError

    clock = SystemClock()
    try:
        if simulate is None:
            from sn_monitor.agent.nvml import load_pynvml

            build_agent(settings, load_pynvml(), clock).run_until_signalled(duration)
            return 0
        from sn_monitor.sim.node import SimulatedNode, fault_endpoint

        with tempfile.TemporaryDirectory(prefix="sn-sim-") as root:
            node = SimulatedNode(Path(root), gpus=simulate)
            settings = node.agent_settings(settings)
            agent = build_agent(
                settings, node.nvml, clock,
                before_sample=lambda dt: node.step(dt * sim_speed, traffic_seconds=dt),
                actuator=node.actuator())
            agent.http.add_post_route("/sim/fault", fault_endpoint(node))
            agent.run_until_signalled(duration)
        return 0
    except (TokenError, ListenError, OSError) as err:
        return refuse(f"sn-monitor agent: {err}")
