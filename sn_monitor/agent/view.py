"""A live terminal table of one node's GPUs (what ``make demo`` shows)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot

HOT_CELSIUS = 85.0
WARM_CELSIUS = 80.0


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def _temperature(value: float | None) -> Text:
    if value is None:
        return Text("-")
    style = "bold red" if value >= HOT_CELSIUS else "yellow" if value >= WARM_CELSIUS else "green"
    return Text(f"{value:.0f}", style=style)


def _reasons(gpu: GpuSample) -> str:
    active = [name for name, on in gpu.throttle_reasons or () if on and name != "gpu_idle"]
    return ",".join(active) or "-"


def _faults(gpu: GpuSample, xids: dict[int, int]) -> Text:
    parts = []
    if gpu.lost:
        parts.append("LOST")
    if gpu.ecc_uncorrected_errors_total:
        parts.append(f"ECC-UE {gpu.ecc_uncorrected_errors_total}")
    if gpu.row_remap_pending:
        parts.append("remap-pending")
    width, widest = gpu.pcie_link_width, gpu.pcie_link_width_max
    if width and widest and width < widest:
        parts.append(f"pcie x{width}")
    down = sum(1 for link in gpu.nvlinks if link.up is False)
    if down:
        parts.append(f"nvlink-down {down}")
    if xids:
        parts.append("xid " + ",".join(f"{code}x{n}" for code, n in sorted(xids.items())))
    return Text(" ".join(parts) or "ok", style="bold red" if parts else "green")


def render_node(snapshot: NodeSnapshot, guard_note: str = "") -> Group:
    """One table row per GPU, plus a line for the node's ports and collectors."""
    table = Table(title=f"{snapshot.node}: {len(snapshot.gpus)} GPUs", expand=False)
    for column in ("GPU", "temp °C", "HBM °C", "power W", "limit W", "SM util", "mem bw",
                   "SM MHz", "throttle", "faults"):
        table.add_column(column, justify="right" if column != "throttle" else "left")
    per_gpu: dict[int | None, dict[int, int]] = {}
    for count in snapshot.xid_counts:
        if count.count:  # the watched codes are counted from 0: only the seen ones show
            per_gpu.setdefault(count.gpu, {})[count.xid] = count.count
    for gpu in snapshot.gpus:
        table.add_row(
            str(gpu.index),
            _temperature(gpu.temperature_celsius),
            _temperature(gpu.memory_temperature_celsius),
            _fmt(gpu.power_watts, ".0f"),
            _fmt(gpu.power_limit_watts, ".0f"),
            _fmt(gpu.utilization_ratio, ".0%"),
            _fmt(gpu.memory_bandwidth_utilization_ratio, ".0%"),
            _fmt(gpu.sm_clock_hertz, ".0f", 1e-6),
            _reasons(gpu),
            _faults(gpu, per_gpu.get(gpu.index, {})),
        )
    active = sum(1 for p in snapshot.infiniband if p.state == 4)
    failing = [c.name for c in snapshot.collectors if not c.success]
    footer = Text(
        f"IB ports active {active}/{len(snapshot.infiniband)}   "
        f"netdevs {len(snapshot.net)}   "
        f"collectors failing: {', '.join(failing) or 'none'}"
    )
    lines: list[Table | Text] = [table, footer]
    if guard_note:
        lines.append(Text(guard_note, style="bold yellow"))
    recent = [f"{e.kind} {e.code or ''} gpu {e.gpu}".strip() for e in snapshot.events]
    if recent:
        lines.append(Text("events: " + "; ".join(recent), style="bold red"))
    return Group(*lines)


def summary_line(snapshot: NodeSnapshot) -> str:
    """A one-line status for logs and non-interactive terminals."""
    temps = [g.temperature_celsius for g in snapshot.gpus if g.temperature_celsius is not None]
    hottest = max(temps) if temps else None
    lost = sum(1 for g in snapshot.gpus if g.lost)
    return (
        f"{snapshot.node}: {len(snapshot.gpus)} GPUs, hottest {_fmt(hottest, '.1f')} °C, "
        f"lost {lost}, xids {sum(c.count for c in snapshot.xid_counts)}, "
        f"IB active {sum(1 for p in snapshot.infiniband if p.state == 4)}/"
        f"{len(snapshot.infiniband)}"
    )
