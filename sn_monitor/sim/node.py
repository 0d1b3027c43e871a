"""One simulated GPU node: GPUs behind the fake NVML, a /proc and /sys tree, a kernel log.

The agent runs on it unchanged: the nvml collector is handed :mod:`fake_nvml`, the net,
infiniband and host collectors read :attr:`SimulatedNode.tree`, and the kmsg collector
follows :attr:`SimulatedNode.kmsg_path`, where faults write the lines the NVIDIA driver
would. The fake NVML holds its GPUs in module state, so one process holds one node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from sn_monitor.agent.remedy import ActOutcome
from sn_monitor.agent.settings import AgentSettings, PathSettings
from sn_monitor.errors import SnMonitorError
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_fail_slow import (
    add_noisy_neighbour,
    clear_noisy_neighbour,
    clear_nvlink_slow,
    clear_throttle,
    slow_nvlinks,
    throttle,
)
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
        self.tree = SimulatedNodeTree(self.root, seed=seed,
                                      gpu_bus_ids=[gpu.pci_bus_id for gpu in self.gpus])
        self.kmsg_path = self.root / "dev" / "kmsg.log"
        self.kmsg_path.parent.mkdir(parents=True, exist_ok=True)
        self.kmsg_path.write_text("")
        self.uptime_seconds = 3600.0
        self._hang: fake_nvml.Hang | None = None

    @property
    def nvml(self) -> ModuleType:
        """The NVML module the agent's nvml collector should call."""
        return fake_nvml

    def agent_settings(self, base: AgentSettings) -> AgentSettings:
        """``base`` with its /proc, /sys and kernel-log paths pointed into this node.

        The state directory (spool, saved power limits) moves into the node too, unless
        ``base`` names one of its own. Remediation left without a mode enforces: a
        simulated reset or reboot touches only the simulated GPUs (:meth:`actuator`).
        """
        paths = PathSettings(procfs=str(self.tree.procfs), sysfs=str(self.tree.sysfs),
                             kmsg=str(self.kmsg_path))
        state_dir = base.state_dir
        if state_dir == AgentSettings().state_dir:
            state_dir = str(self.root / "state")
        remediation = base.remediation
        if remediation.mode is None:
            remediation = replace(remediation, mode="enforce")
        return replace(base, paths=paths, state_dir=state_dir, remediation=remediation)

    def actuator(self) -> SimulatedActuator:
        """What the simulated agent resets GPUs and reboots with (no nvidia-smi here)."""
        return SimulatedActuator(self)

    def reset_gpu(self, gpu: int) -> None:
        """``nvidia-smi --gpu-reset`` on the simulated GPU (refused while in use)."""
        fake_nvml.reset_gpu(gpu)
        self.kernel_log(f"NVRM: GPU at {self._nvrm_bus(gpu)}: GPU reset")

    def reboot(self) -> None:
        """The node reboots: every GPU power-cycled.

        The agent process goes on (it is the simulator's), and so do the counters of
        /proc and /sys.
        """
        fake_nvml.reboot()
        self.kernel_log("NVRM: loading NVIDIA UNIX x86_64 Kernel Module (simulated reboot)")

    def step(self, dt_seconds: float, traffic_seconds: float | None = None) -> None:
        """Advance every GPU and every counter by ``dt_seconds`` of simulated time.

        ``traffic_seconds``: the wall time the traffic counters move by, when the
        simulation runs faster than the wall clock (``--sim-speed``): a sped-up thermal
        model, but a link's throughput as it is measured, per second of the wall clock.
        """
        scale = 1.0 if traffic_seconds is None or dt_seconds <= 0 else traffic_seconds / dt_seconds
        for gpu in self.gpus:
            gpu.traffic_scale = scale
            gpu.step(dt_seconds)
        load = sum(g.utilization for g in self.gpus) / max(1, len(self.gpus))
        self.tree.advance(dt_seconds if traffic_seconds is None else traffic_seconds, load)
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

    def inject(self, fault: str, gpu: int | None = None, **params: Any) -> str:
        """Inject a fault by name (scenario files and the simulated agent's /sim/fault).

        Raises FaultError naming the problem when the fault, GPU or a parameter is bad.
        """
        handler = FAULTS.get(fault)
        if handler is None:
            raise FaultError(f"unknown fault {fault!r} (known: {', '.join(sorted(FAULTS))})")
        if handler.needs_gpu and (gpu is None or not 0 <= gpu < len(self.gpus)):
            raise FaultError(f"{fault} needs a gpu from 0 to {len(self.gpus) - 1}")
        try:
            handler.apply(self, gpu, params)
        except (TypeError, ValueError, KeyError) as err:
            raise FaultError(f"{fault}: bad parameters {params}: {err}") from None
        return f"{fault} injected" + (f" on GPU {gpu}" if gpu is not None else "")

    def hang_nvml(self) -> None:
        """The driver wedges: every NVML call blocks until :meth:`release_nvml`."""
        if self._hang is None or self._hang.released:
            self._hang = fake_nvml.inject_hang()

    def release_nvml(self) -> None:
        """The driver answers again: the hung calls return."""
        if self._hang is not None:
            self._hang.release()
            self._hang = None

    def fall_off_bus(self, gpu: int) -> None:
        """The GPU vanishes: NVML answers GpuIsLost, the driver logs Xid 79."""
        self.gpus[gpu].fall_off_bus()
        self.kernel_log(f"NVRM: Xid ({self._nvrm_bus(gpu)}): 79, pid='<unknown>', "
                        "name=<unknown>, GPU has fallen off the bus.")


class SimulatedActuator:
    """The remediation actuator of a simulated node: resets and reboots its fake GPUs."""

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node

    def describe_reset(self, gpu: int) -> str:
        return f"a simulated reset of GPU {gpu}"

    def reset_gpu(self, gpu: int) -> ActOutcome:
        try:
            self._node.reset_gpu(gpu)
        except fake_nvml.NVMLError as err:
            return ActOutcome(False, f"reset GPU {gpu}: simulated reset refused: {err}")
        return ActOutcome(True, f"reset GPU {gpu}: simulated reset done")

    def describe_reboot(self) -> str:
        return "a simulated reboot"

    def reboot(self) -> ActOutcome:
        self._node.reboot()
        return ActOutcome(True, "reboot: simulated reboot done (every GPU power-cycled)")


class FaultError(ValueError, SnMonitorError):
    """A fault that cannot be injected as asked."""


@dataclass(frozen=True)
class FaultKind:
    """How to inject one kind of fault into a simulated node."""

    apply: Callable[[SimulatedNode, int | None, dict[str, Any]], None]
    needs_gpu: bool = True


def _index(gpu: int | None) -> int:
    if gpu is None:
        raise ValueError("a gpu is needed")
    return gpu


def _gpu(node: SimulatedNode, gpu: int | None) -> SimulatedGpu:
    return node.gpus[_index(gpu)]


FAULTS: dict[str, FaultKind] = {
    "overheat": FaultKind(lambda n, g, p: _gpu(n, g).inject_cooling_failure(
        float(p.get("factor", 1.7)))),
    "cooling-repaired": FaultKind(lambda n, g, p: _gpu(n, g).clear_cooling_failure()),
    # A repair by hand (nvidia-smi --gpu-reset): pending row remaps take effect.
    "gpu-reset": FaultKind(lambda n, g, p: n.reset_gpu(_index(g))),
    "xid": FaultKind(lambda n, g, p: n.inject_xid(_index(g), int(p["code"]),
                                                  str(p.get("message", "Simulated fault")))),
    "ecc-uncorrectable": FaultKind(lambda n, g, p: _gpu(n, g).inject_ecc_uncorrectable(
        int(p.get("count", 1)))),
    "row-remap-pending": FaultKind(lambda n, g, p: _gpu(n, g).inject_row_remap_pending()),
    "row-remap-failure": FaultKind(lambda n, g, p: _gpu(n, g).inject_row_remap_failure()),
    "nvlink-errors": FaultKind(lambda n, g, p: _gpu(n, g).inject_nvlink_errors(
        int(p.get("link", 0)), crc=int(p.get("crc", 100)), replay=int(p.get("replay", 0)),
        recovery=int(p.get("recovery", 0)))),
    "nvlink-down": FaultKind(lambda n, g, p: _gpu(n, g).set_nvlink_down(int(p.get("link", 0)))),
    "pcie-downgrade": FaultKind(lambda n, g, p: _gpu(n, g).inject_pcie_downgrade(
        int(p.get("generation", 4)), int(p.get("width", 8)))),
    "fall-off-bus": FaultKind(lambda n, g, p: n.fall_off_bus(_index(g))),
    "load": FaultKind(lambda n, g, p: _gpu(n, g).set_load(
        None if p.get("utilization") is None else float(p["utilization"]))),
    "ib-port-down": FaultKind(lambda n, g, p: n.tree.set_ib_port_down(str(p["device"])),
                              needs_gpu=False),
    "ib-port-up": FaultKind(lambda n, g, p: n.tree.set_ib_port_up(str(p["device"])),
                            needs_gpu=False),
    "ib-flap": FaultKind(lambda n, g, p: n.tree.flap_ib_port(str(p["device"])),
                         needs_gpu=False),
    "ib-symbol-errors": FaultKind(lambda n, g, p: n.tree.add_ib_symbol_errors(
        str(p["device"]), int(p.get("count", 100))), needs_gpu=False),
    "carrier-flap": FaultKind(lambda n, g, p: n.tree.flap_carrier(str(p["device"])),
                              needs_gpu=False),
    "nvml-hang": FaultKind(lambda n, g, p: n.hang_nvml(), needs_gpu=False),
    "nvml-release": FaultKind(lambda n, g, p: n.release_nvml(), needs_gpu=False),
    "fabric-not-ready": FaultKind(lambda n, g, p: _gpu(n, g).inject_fabric_not_ready(
        int(p.get("state", 1)), int(p.get("status", 0)))),
    "fabric-ready": FaultKind(lambda n, g, p: _gpu(n, g).clear_fabric()),
    "stuck-process": FaultKind(lambda n, g, p: n.tree.add_stuck_process(
        str(p.get("name", "python")), int(p.get("count", 1))), needs_gpu=False),
    "stuck-process-gone": FaultKind(lambda n, g, p: n.tree.clear_stuck_processes(),
                                    needs_gpu=False),
    **{
        # Fail-slow: the node keeps working, slower (sn_monitor.sim.failslow models the job).
        "congested-link": FaultKind(lambda n, g, p: n.tree.congest_ib_port(
            str(p["device"]), float(p.get("factor", 20.0))), needs_gpu=False),
        "congested-link-cleared": FaultKind(lambda n, g, p: n.tree.clear_ib_port_fail_slow(
            str(p["device"])), needs_gpu=False),
        "nic-degraded": FaultKind(lambda n, g, p: n.tree.degrade_ib_port(
            str(p["device"]), float(p.get("rate_gbps", 200.0))), needs_gpu=False),
        "nic-degraded-cleared": FaultKind(lambda n, g, p: n.tree.clear_ib_port_fail_slow(
            str(p["device"])), needs_gpu=False),
        "nvlink-slow": FaultKind(lambda n, g, p: slow_nvlinks(
            _gpu(n, g), int(p.get("links_down", 1)), float(p.get("errors_per_second", 100.0)),
            float(p.get("bandwidth_ratio", 0.6)))),
        "nvlink-slow-cleared": FaultKind(lambda n, g, p: clear_nvlink_slow(_gpu(n, g))),
        "gpu-throttled": FaultKind(lambda n, g, p: throttle(
            _gpu(n, g), _reasons(p.get("reason", "hw_slowdown")), float(p.get("ratio", 0.7)))),
        "gpu-throttled-cleared": FaultKind(lambda n, g, p: clear_throttle(_gpu(n, g))),
        "noisy-neighbour": FaultKind(lambda n, g, p: add_noisy_neighbour(
            _gpu(n, g), float(p.get("share", 0.3)))),
        "noisy-neighbour-cleared": FaultKind(
            lambda n, g, p: clear_noisy_neighbour(_gpu(n, g))),
        "fail-slow-clear": FaultKind(lambda n, g, p: clear_fail_slow(n), needs_gpu=False),
    },
}


def _reasons(value: object) -> list[str]:
    """``"hw_slowdown"``, ``"hw_slowdown,hw_power_brake_slowdown"`` or a list of names."""
    if isinstance(value, str):
        return [r.strip() for r in value.split(",") if r.strip()]
    if isinstance(value, list) and all(isinstance(r, str) for r in value):
        return list(value)
    raise ValueError(f"reason must be a name or a list of names, got {value!r}")


def clear_fail_slow(node: SimulatedNode) -> None:
    """Every fail-slow fault on the node cleared: ports, clocks, NVLinks, neighbours."""
    for device in node.tree.ib_devices:
        node.tree.clear_ib_port_fail_slow(device)
    for gpu in node.gpus:
        clear_throttle(gpu)
        clear_nvlink_slow(gpu)
        clear_noisy_neighbour(gpu)


def fault_endpoint(node: SimulatedNode) -> Callable[[bytes], tuple[int, dict[str, Any]]]:
    """``POST /sim/fault`` on a simulated agent: ``{"fault": "overheat", "gpu": 3, ...}``.

    The answer says what was injected and when (``injected_at``, wall clock seconds, read
    just before): what a benchmark measures a detection from.
    """

    def handle(body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            doc = json.loads(body or b"{}")
        except json.JSONDecodeError as err:
            return 400, {"error": f"malformed JSON: {err}"}
        if not isinstance(doc, dict) or not isinstance(doc.get("fault"), str):
            return 422, {"error": 'expected {"fault": NAME, "gpu": N, ...parameters}'}
        gpu = doc.pop("gpu", None)
        if gpu is not None and not isinstance(gpu, int):
            return 422, {"error": "gpu must be a whole number"}
        fault = doc.pop("fault")
        try:
            injected_at = time.time()  # the wall clock a controller dates incidents on
            return 200, {"result": node.inject(fault, gpu, **doc), "injected_at": injected_at}
        except FaultError as err:
            return 422, {"error": str(err)}

    return handle
