"""A remediation command that only records what it was asked to do, for the tests of the
command runner and of the remediation policy that drives it."""

from __future__ import annotations

from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.commands import CommandExecutor, Remedies
from sn_monitor.agent.guard import ThermalGuard
from sn_monitor.agent.remedy import ProgramActuator, RebootLedger
from sn_monitor.agent.sampler import Sampler
from sn_monitor.agent.settings import GuardSettings, RemediationSettings
from sn_monitor.agent.snapshot import NodeSnapshot
from sn_monitor.agent.verify import GpuCountMemory
from sn_monitor.clock import ManualClock
from sn_monitor.model import Command, CommandResult
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.node import SimulatedNode


class Remedied:
    """A simulated node and an executor with remedies, as build_agent wires them."""

    def __init__(self, tmp_path, remediation: RemediationSettings, *, actuator=None,
                 gpus: int = 4) -> None:
        self.clock = ManualClock()
        self.node = SimulatedNode(tmp_path / "node", gpus=gpus)
        self.collector = NvmlCollector(fake_nvml, self.clock)
        self.sampler = Sampler("n", [self.collector], self.clock)
        self.state = tmp_path / "state"
        self.state.mkdir(exist_ok=True)
        self.procfs = tmp_path / "proc"
        self.remediation = remediation
        self.actuator = actuator or ProgramActuator(remediation)
        self.guard = ThermalGuard(GuardSettings(), self.collector.library.set_power_limit_watts,
                                  self.state, self.clock)
        self.executor: CommandExecutor | None = None
        self.restart()

    def restart(self) -> CommandExecutor:
        """A new executor (an agent that started again) on the same node and state."""
        if self.executor is not None:
            self.executor.close(timeout=5)
        self.executor = CommandExecutor(self.guard, self.clock, remedies=Remedies(
            self.remediation, self.actuator, self.collector.library.running_pids,
            RebootLedger(self.state, self.procfs), GpuCountMemory(self.state)))
        self.sample()
        return self.executor

    def sample(self) -> NodeSnapshot:
        snapshot = self.sampler.sample()
        self.guard.observe(snapshot)
        self.executor.observe(snapshot)
        return snapshot

    def run(self, command: Command) -> CommandResult:
        """Execute a slow command and wait for its result (it comes from the worker)."""
        assert self.executor.execute([command]) == []
        assert self.executor.wait_idle(timeout=30)
        [result] = self.executor.finished()
        return result

    def close(self) -> None:
        self.executor.close(timeout=5)
        self.sampler.close()
        fake_nvml.reset()
