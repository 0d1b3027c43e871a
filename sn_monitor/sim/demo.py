"""``sn-monitor demo``: one simulated 8-GPU node's agent, a fault timeline, a live view.

Until the controller exists the demo is one node: the real agent code samples a
simulated node whose clock runs ``speed`` times faster than the wall, while a timeline
breaks it (a cooling failure, XIDs, NVLink errors, an InfiniBand flap, a PCIe downgrade,
a GPU falling off the bus) and the terminal shows what the agent sees. /metrics is
served all along, so Prometheus can scrape it.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.logging import RichHandler
from rich.text import Text

from sn_monitor.agent.daemon import build_agent
from sn_monitor.agent.settings import AgentSettings
from sn_monitor.agent.snapshot import NodeSnapshot
from sn_monitor.agent.view import render_node, summary_line
from sn_monitor.clock import ScaledClock
from sn_monitor.config import Duration
from sn_monitor.sim.node import SimulatedNode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimedFault:
    """A fault injected when the simulated clock reaches ``at_seconds``."""

    at_seconds: float
    description: str
    inject: Callable[[SimulatedNode], None]


def default_timeline(gpus: int) -> list[TimedFault]:
    """Each kind of fault the agent reports, a few simulated minutes apart."""
    hot, app, link, pcie, lost = (min(i, gpus - 1) for i in (3, 5, 1, 6, 7))
    return [
        TimedFault(20, f"cooling failure on GPU {hot}",
                   lambda n: n.gpus[hot].inject_cooling_failure(1.7)),
        TimedFault(60, f"XID 13 (application fault) on GPU {app}",
                   lambda n: n.inject_xid(app, 13, "Graphics SM Warp Exception")),
        TimedFault(90, f"NVLink CRC errors on GPU {link} link 4",
                   lambda n: n.gpus[link].inject_nvlink_errors(4, crc=250)),
        TimedFault(120, "InfiniBand port mlx5_2 flaps",
                   lambda n: n.tree.flap_ib_port("mlx5_2")),
        TimedFault(150, f"PCIe link of GPU {pcie} trains at x8",
                   lambda n: n.gpus[pcie].inject_pcie_downgrade(5, 8)),
        TimedFault(200, f"cooling repaired on GPU {hot}",
                   lambda n: n.gpus[hot].clear_cooling_failure()),
        TimedFault(240, f"GPU {lost} falls off the bus (XID 79)",
                   lambda n: n.fall_off_bus(lost)),
    ]


class DemoDriver:
    """Advances the simulated node at ``speed`` and fires the timeline as time passes."""

    def __init__(self, node: SimulatedNode, speed: float, timeline: list[TimedFault]) -> None:
        self.node = node
        self.speed = speed
        self.simulated_seconds = 0.0
        self._pending = sorted(timeline, key=lambda f: f.at_seconds)
        self.fired: list[str] = []
        self._lock = threading.Lock()

    def advance(self, seconds: float) -> None:
        """Called by the agent before each sample with the simulated seconds since the last."""
        with self._lock:
            self.simulated_seconds += seconds
            self.node.step(seconds)
            while self._pending and self._pending[0].at_seconds <= self.simulated_seconds:
                fault = self._pending.pop(0)
                fault.inject(self.node)
                note = f"t={fault.at_seconds:>4.0f}s  {fault.description}"
                self.fired.append(note)
                log.warning("injected: %s", fault.description)


def run_demo(gpus: int, listen: str, speed: float, duration: float | None,
             headless: bool) -> int:
    """Run the demo until Ctrl-C or ``duration`` real seconds."""
    console = Console()
    with tempfile.TemporaryDirectory(prefix="sn-demo-") as tmp:
        node = SimulatedNode(Path(tmp), gpus=gpus)
        settings = node.agent_settings(
            AgentSettings(node="sim-node-01", listen=listen, interval=Duration(speed)))
        driver = DemoDriver(node, speed, default_timeline(gpus))
        clock = ScaledClock(speed)
        live: Live | None = None

        def show(snapshot: NodeSnapshot) -> None:
            header = Text(f"sn-monitor demo: simulated time {driver.simulated_seconds:.0f}s "
                          f"(x{speed:g}); metrics at http://{listen}/metrics", style="bold")
            faults = Text("\n".join(driver.fired) or "no fault injected yet", style="yellow")
            if live is not None:
                live.update(Group(header, render_node(snapshot), Text("faults:"), faults))
            else:
                console.print(f"t={driver.simulated_seconds:6.0f}s  {summary_line(snapshot)}")

        agent = build_agent(settings, node.nvml, clock, before_sample=driver.advance,
                            after_sample=[show], time_scale=speed)
        if headless or not console.is_terminal:
            agent.run_until_signalled(duration)
        else:
            # Log lines go through the console too, above the live table, not across it.
            root = logging.getLogger()
            handlers, root.handlers = root.handlers, [RichHandler(console=console,
                                                                  show_path=False)]
            try:
                with Live(console=console, refresh_per_second=4, screen=True) as live:
                    agent.run_until_signalled(duration)
            finally:
                root.handlers = handlers
        console.print("faults injected:\n  " + ("\n  ".join(driver.fired) or "none"))
        final = agent.sampler.latest
        if final is not None:
            console.print(summary_line(final))
    return 0
