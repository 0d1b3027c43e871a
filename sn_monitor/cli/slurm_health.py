"""``sn-monitor slurm-health``: the HealthCheckProgram (logic: :mod:`sn_monitor.slurm_health`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from sn_monitor.agent.settings import load_agent_settings
from sn_monitor.cli.exit_status import refuse
from sn_monitor.cli.options import (
    Commands,
    add_log_options,
    agent_url_arg,
    configure_command_logging,
    positive_int_arg,
)
from sn_monitor.cli.verify import verify_once, verify_simulated
from sn_monitor.config import ConfigError
from sn_monitor.model import CheckResult

#: slurm-health's agent (sn_monitor.slurm_health.DEFAULT_AGENT; imported only when it runs).
DEFAULT_AGENT_URL = "http://127.0.0.1:9847"


def add_parser(commands: Commands) -> None:
    """``slurm-health`` and its options."""
    health = commands.add_parser(
        "slurm-health", help="Slurm HealthCheckProgram: drain this node when its GPUs fail",
        description="For slurm.conf's HealthCheckProgram (as LBNL NHC): asks the local agent "
                    "(/healthz, then /metrics) or, when none answers, checks the GPUs here "
                    "through NVML (the snapshot checks of sn-monitor verify); on a failure "
                    "drains the node with Reason=\"sn-monitor slurm-health: <why>\", on "
                    "success resumes only a drain with that prefix. Exit 0 healthy, 1 "
                    "unhealthy (drained), 2 the check or scontrol could not run.")
    health.add_argument("--node", help="the Slurm node name (default: $SLURMD_NODENAME, "
                                       "which slurmd sets, else the short host name)")
    health.add_argument("--agent", default=DEFAULT_AGENT_URL, type=agent_url_arg, metavar="URL",
                        help=f"the local agent (default {DEFAULT_AGENT_URL}); '' to skip it")
    health.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="for the agent's answers and for scontrol (default 5)")
    health.add_argument("--scontrol", default="scontrol", help="the scontrol to run")
    health.add_argument("--expected-gpus", type=positive_int_arg, metavar="N",
                        help="GPUs the node must have")
    health.add_argument("--config", type=Path,
                        help="agent config file (for the checks without an agent)")
    health.add_argument("--simulate", type=positive_int_arg, metavar="GPUS",
                        help="without an agent: check a simulated node (no GPU needed)")
    health.add_argument("--fault", action="append", default=[], metavar="NAME[@GPU]",
                        help="with --simulate: inject this fault first; repeatable")
    health.add_argument("--dry-run", action="store_true",
                        help="say what would be drained or resumed, change nothing")
    add_log_options(health, default_level="warning")
    health.set_defaults(func=run_slurm_health)


def run_slurm_health(args: argparse.Namespace) -> int:
    """``sn-monitor slurm-health``: see :mod:`sn_monitor.slurm_health`."""
    configure_command_logging(args)
    import os

    from sn_monitor.config import Duration
    from sn_monitor.controller.actions.drivers.slurm import SlurmDriver, SlurmSettings
    from sn_monitor.slurm_health import node_name, run

    if args.timeout <= 0:
        return refuse("sn-monitor slurm-health: --timeout must be positive")
    if args.fault and args.simulate is None:
        return refuse("sn-monitor slurm-health: --fault needs --simulate")
    try:
        settings = load_agent_settings(args.config)
    except ConfigError as err:
        return refuse(err)
    # Every HealthCheckInterval: the snapshot checks only, no minutes-long diagnostics.
    verify = replace(settings.remediation.verify, dcgm_level=0, command=None,
                     expected_gpus=args.expected_gpus or settings.remediation.verify.expected_gpus)
    settings = replace(settings, remediation=replace(settings.remediation, verify=verify))

    def local_checks() -> list[CheckResult]:
        if args.simulate is not None:
            return verify_simulated(settings, args.simulate, args.fault)
        from sn_monitor.agent.nvml import load_pynvml

        return verify_once(settings, load_pynvml())

    driver = SlurmDriver(SlurmSettings(scontrol=args.scontrol, timeout=Duration(args.timeout)))
    return run(node=node_name(args.node, dict(os.environ)), agent=args.agent or None,
               timeout=args.timeout, expected_gpus=args.expected_gpus,
               local_checks=local_checks, driver=driver, dry_run=args.dry_run,
               out=sys.stdout, err=sys.stderr)
