"""``sn-monitor verify``: the return-to-service checks of this node, or of a simulated one.

:func:`verify_once` and :func:`verify_simulated` are also the checks ``slurm-health``
runs when no agent answers.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sn_monitor.agent.settings import AgentSettings, load_agent_settings
from sn_monitor.cli.exit_status import refuse
from sn_monitor.cli.options import (
    Commands,
    add_log_options,
    configure_command_logging,
    positive_int_arg,
)
from sn_monitor.config import ConfigError
from sn_monitor.errors import SnMonitorError
from sn_monitor.model import CheckResult


def add_parser(commands: Commands) -> None:
    """``verify`` and its options."""
    verify = commands.add_parser(
        "verify", help="check that this node is fit to go back into service",
        description="The return-to-service checks the controller asks an agent for before "
                    "it uncordons a repaired node: every expected GPU present and reachable, "
                    "no row remap pending or failed, PCIe links at full width (and full "
                    "generation unless idle), every NVLink up, temperatures below slowdown "
                    "minus a margin, no uncorrectable ECC error since the last reset; then "
                    "dcgmi diag when dcgmi is installed and the configured user command. "
                    "Exit 0 when every check passes, 1 when one fails, 2 when the checks "
                    "cannot run (bad config, no NVML).")
    verify.add_argument("--config", type=Path,
                        help="agent config file: its remediation.verify settings")
    verify.add_argument("--simulate", type=positive_int_arg, metavar="GPUS",
                        help="verify a simulated node with this many GPUs (no GPU needed)")
    verify.add_argument("--fault", action="append", default=[], metavar="NAME[@GPU]",
                        help="with --simulate: inject this fault first (pcie-downgrade@3, "
                             "nvlink-down@0, fall-off-bus@1, row-remap-pending@2); repeatable")
    verify.add_argument("--expected-gpus", type=positive_int_arg, metavar="N",
                        help="GPUs the node must have (default: config, then the most the "
                             "agent has seen here, then what NVML shows now)")
    verify.add_argument("--dcgm-level", type=int, choices=[0, 1, 2, 3, 4], default=None,
                        help="dcgmi diag level (default: config, 1; 0: no DCGM diagnostic)")
    verify.add_argument("--json", action="store_true", help="print the checks as JSON")
    add_log_options(verify, default_level="warning")
    verify.set_defaults(func=run_verify)


class VerifyError(SnMonitorError):
    """The verification could not run (no NVML, a bad simulated fault)."""


def run_verify(args: argparse.Namespace) -> int:
    """``sn-monitor verify``: one sample of this node's GPUs, the checks, exit 0 / 1 / 2."""
    configure_command_logging(args)
    import json

    import msgspec

    from sn_monitor.agent.verify import summary

    try:
        settings = load_agent_settings(args.config)
    except ConfigError as err:
        return refuse(err)
    verify = settings.remediation.verify
    if args.expected_gpus is not None:
        verify = replace(verify, expected_gpus=args.expected_gpus)
    if args.dcgm_level is not None:
        verify = replace(verify, dcgm_level=args.dcgm_level)
    settings = replace(settings, remediation=replace(settings.remediation, verify=verify))
    if args.fault and args.simulate is None:
        return refuse("sn-monitor verify: --fault needs --simulate")
    try:
        if args.simulate is None:
            from sn_monitor.agent.nvml import load_pynvml

            checks = verify_once(settings, load_pynvml())
        else:
            checks = verify_simulated(settings, args.simulate, args.fault)
    except VerifyError as err:
        return refuse(f"sn-monitor verify: {err}")
    ok = all(check.ok for check in checks)
    if args.json:
        print(json.dumps({"ok": ok, "summary": summary(checks),
                          "checks": msgspec.to_builtins(checks)}, indent=2, ensure_ascii=False))
    else:
        for check in checks:
            verdict = "SKIP" if check.skipped else "PASS" if check.ok else "FAIL"
            print(f"{verdict}  {check.name:<18} {check.detail}")
        print(summary(checks))
    return 0 if ok else 1


def verify_simulated(settings: AgentSettings, gpus: int,
                     faults: Sequence[str]) -> list[CheckResult]:
    """The checks on a simulated node of ``gpus`` GPUs, each of ``faults`` injected first."""
    from sn_monitor.sim.node import FaultError, SimulatedNode

    with tempfile.TemporaryDirectory(prefix="sn-verify-") as root:
        node = SimulatedNode(Path(root), gpus=gpus)
        for fault in faults:
            name, _, gpu = fault.partition("@")
            try:
                node.inject(name, int(gpu) if gpu else None)
            except (FaultError, ValueError) as err:  # or a GPU that is not a number
                raise VerifyError(f"--fault {fault}: {err}") from None
        return verify_once(node.agent_settings(settings), node.nvml)


def verify_once(settings: AgentSettings, nvml: object) -> list[CheckResult]:
    """Sample the GPUs once through the agent's own collector, then run every check."""
    from sn_monitor.agent.collectors.gpu import NvmlCollector
    from sn_monitor.agent.sampler import Sampler
    from sn_monitor.agent.verify import GpuCountMemory, verify_node
    from sn_monitor.clock import SystemClock

    clock = SystemClock()
    collector = NvmlCollector(nvml, clock)
    sampler = Sampler(settings.node, [collector], clock)
    try:
        snapshot = sampler.sample()
        if not all(status.success for status in snapshot.collectors):
            raise VerifyError("cannot read the GPUs through NVML (see the log above)")
        state = Path(settings.state_dir)
        memory = GpuCountMemory(state if state.is_dir() else None)
        return verify_node(snapshot, settings.remediation.verify, memory)
    finally:
        sampler.close()
