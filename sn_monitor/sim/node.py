"""One simulated GPU node: GPUs behind the fake NVML, a /proc and /sys tree, a kernel log.

The agent runs on it unchanged: the nvml collector is handed :mod:`fake_nvml`, the net,
infiniband and host collectors read :attr:`SimulatedNode.tree`, and the kmsg collector
follows :attr:`SimulatedNode.kmsg_path`, where faults write the lines the NVIDIA driver
would. The fake NVML holds its GPUs in module state, so one process holds one node.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import ModuleType

from sn_monitor.agent.settings import AgentSettings, PathSettings
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import H100_SXM, GpuProfile, SimulatedGpu, make_gpus
from sn_monitor.sim.node_tree import SimulatedNodeTree


class SimulatedNode:
    """A simulated 8-GPU server; advance it with :meth:`step`, break it with the faults."""

    def __init__(
        self,
        root: Path,
        gpus: int = 8,
        profile: GpuProfile = H100_SXM,
        seed: int = 0,
    ) -> None:
        self.root = Path(root)
        self.gpus: list[SimulatedGpu] = make_gpus(gpus, profile, seed=seed)
        fake_nvml.configure(self.gpus)
        self.tree = SimulatedNodeTree(self.root, seed=seed)
        self.kmsg_path = self.root / "dev" / "kmsg.log"
        self.kmsg_path.parent.mkdir(parents=True, exist_ok=True)
        self.kmsg_path.write_text("")
        self.uptime_seconds = 3600.0

    @property
    def nvml(self) -> ModuleType:
        """The NVML module the agent's nvml collector should call."""
        return fake_nvml

    def agent_settings(self, base: AgentSettings) -> AgentSettings:
        """``base`` with its /proc, /sys and kernel-log paths pointed into this node.

        The state directory (spool, saved power limits) moves into the node too, unless
        ``base`` names one of its own.
        """
        paths = PathSettings(procfs=str(self.tree.procfs), sysfs=str(self.tree.sysfs),
                             kmsg=str(self.kmsg_path))
        state_dir = base.state_dir
        if state_dir == AgentSettings().state_dir:
            state_dir = str(self.root / "state")
        return replace(base, paths=paths, state_dir=state_dir)

    def step(self, dt_seconds: float) -> None:
        """Advance every GPU and every counter by ``dt_seconds`` of simulated time."""
        for gpu in self.gpus:
            gpu.step(dt_seconds)
        load = sum(g.utilization for g in self.gpus) / max(1, len(self.gpus))
        self.tree.advance(dt_seconds, load)
        self.uptime_seconds += dt_seconds

    def kernel_log(self, text: str) -> None:
        """Append one line to the kernel log, stamped with the node's uptime like dmesg."""
        with self.kmsg_path.open("a", encoding="utf-8") as log:
            log.write(f"[{self.uptime_seconds:12.6f}] {text}\n")

    def _nvrm_bus(self, gpu: int) -> str:
        domain, bus, rest = self.gpus[gpu].pci_bus_id.split(":")
        return f"PCI:{int(domain, 16):04x}:{bus.lower()}:{rest.split('.')[0]}"

    def inject_xid(self, gpu: int, code: int, message: str = "Simulated fault") -> None:
        """An XID as the driver reports it: an NVML event and an ``NVRM: Xid`` line."""
        self.gpus[gpu].inject_xid(code)
        self.kernel_log(f"NVRM: Xid ({self._nvrm_bus(gpu)}): {code}, pid=4242, "
                        f"name=python, {message}")

    def fall_off_bus(self, gpu: int) -> None:
        """The GPU vanishes: NVML answers GpuIsLost, the driver logs Xid 79."""
        self.gpus[gpu].fall_off_bus()
        self.kernel_log(f"NVRM: Xid ({self._nvrm_bus(gpu)}): 79, pid='<unknown>', "
                        "name=<unknown>, GPU has fallen off the bus.")
