"""Which node and link of a job stand out from their peers: the fail-slow suspects.

Each check compares one signal of a job's nodes with the same signal on their peers:
a port with the other ports of its rail (NIC *i* of every node of the job), a GPU with
the job's other GPUs. A slow collective waits on its slowest member, so the member
that differs is the one to name:

======================  ================================================================
``nic-degraded``        the port's link rate is below the rail's best (trained down)
``nvlink-slow``         the GPU's NVLink errors climb, or a link is down, or its NVLink
                        throughput is well below its peers'
``gpu-throttled``       the GPU's SM clock is well below its peers' with a throttle
                        reason active (power, thermal, hardware slowdown)
``noisy-neighbour``     the GPU runs more compute processes than its peers do
``congested-link``      the port's ``port_xmit_wait`` rate is many times its rail's
                        median (RoCE: ECN marks and CNPs too)
======================  ================================================================

Each suspect has a ``strength``: how far past its threshold it stands (1 at the
threshold). Facts come before statistics: a link that trained down or a GPU that
reports a throttle reason outranks a port that merely waits more (``PRIORITY``), and a
trained-down port, which waits too, is not named again as congested. A counter's rate
is its smoothed rate (one noisy interval does not make a suspect) and must hold over the
last interval too: a burst of waiting or an error storm that is over (its smoothed rate
still decaying) is not what holds the job back now.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sn_monitor.config import fraction, positive, setting
from sn_monitor.controller.fabric.book import TopologyBook
from sn_monitor.controller.fabric.meter import (
    SLOWING_REASONS,
    FabricMeter,
    GpuReading,
    PortReading,
)

#: Kinds in the order they are believed when several stand at once.
PRIORITY: dict[str, int] = {
    "nic-degraded": 0, "nvlink-slow": 1, "gpu-throttled": 2, "noisy-neighbour": 3,
    "congested-link": 4,
}
_ACTIVE = 4  # IB port state ACTIVE


@dataclass(frozen=True)
class SuspectSettings:
    """``fail_slow: {suspects: ...}`` in the controller's config."""

    #: congested-link: transmit_wait at least this many times the rail median ...
    wait_ratio: float = setting(default=6.0, check=positive)
    #: ... and at least this many ticks a second (an idle rail's median is ~0).
    wait_floor_per_second: float = setting(default=1e5, check=positive)
    #: congested-link on RoCE: ECN-marked packets at least ``wait_ratio`` times the rail
    #: median and at least this many a second.
    ecn_floor_per_second: float = setting(default=1e3, check=positive)
    #: nic-degraded: a rate below this share of the rail's best.
    rate_share: float = setting(default=0.9, check=fraction)
    #: gpu-throttled: an SM clock below this share of the job's median clock.
    clock_share: float = setting(default=0.9, check=fraction)
    #: nvlink-slow: NVLink errors a second that stand out (the healthy rate is ~0) ...
    nvlink_errors_per_second: float = setting(default=1.0, check=positive)
    #: ... or NVLink throughput below this share of the job's median GPU's.
    nvlink_share: float = setting(default=0.6, check=fraction)


@dataclass(frozen=True, slots=True)
class Suspect:
    """One member of a job that stands out, and why."""

    kind: str
    node: str
    link: str
    rail: int | None
    gpu: int | None
    strength: float
    evidence: str

    @property
    def key(self) -> tuple[str, str, str]:
        return self.kind, self.node, self.link


def _gbps(rate: float) -> str:
    return f"{rate * 8 / 1e9:.0f}"


def _per_second(value: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f}{unit}/s"
    return f"{value:.1f}/s"


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def find_suspects(nodes: Sequence[str], meter: FabricMeter, book: TopologyBook,
                  settings: SuspectSettings | None = None) -> list[Suspect]:
    """Every member of the job on ``nodes`` that stands out, strongest kinds first."""
    s = settings or SuspectSettings()
    rails: dict[str, list[tuple[str, PortReading, int | None]]] = {}
    gpus: list[tuple[str, GpuReading]] = []
    for node in nodes:
        readings = meter.node(node)
        if readings is None:
            continue
        for (device, _), port in readings.ports.items():
            role = book.role(node, device)
            if role not in (None, "rail"):
                continue  # storage and management NICs carry no collective
            rail = book.rail(node, device)
            key = f"rail {rail}" if rail is not None else device
            rails.setdefault(key, []).append((node, port, rail))
        gpus.extend((node, g) for g in readings.gpus.values() if not g.lost)
    out: list[Suspect] = []
    degraded: set[tuple[str, str]] = set()
    for members in rails.values():
        out.extend(_rail_suspects(members, s, degraded))
    out.extend(_gpu_suspects(gpus, s))
    out.sort(key=lambda x: (PRIORITY[x.kind], -x.strength))
    return out


def _rail_suspects(members: list[tuple[str, PortReading, int | None]], s: SuspectSettings,
                   degraded: set[tuple[str, str]]) -> list[Suspect]:
    active = [(n, p, r) for n, p, r in members if p.state in (None, _ACTIVE)]
    out = _degraded_ports(active, s, degraded)
    out.extend(_congested_ports(active, s, degraded))
    return out


def _degraded_ports(active: list[tuple[str, PortReading, int | None]], s: SuspectSettings,
                    degraded: set[tuple[str, str]]) -> list[Suspect]:
    """nic-degraded: the rail's ports that trained below its best; added to ``degraded``."""
    out: list[Suspect] = []
    best = max((p.rate_bytes_per_second or 0.0 for _, p, _ in active), default=0.0)
    for node, port, rail in active:
        rate = port.rate_bytes_per_second
        if best and rate is not None and 0 < rate < s.rate_share * best:
            degraded.add((node, port.device))
            where = _where(node, port, rail)
            out.append(Suspect("nic-degraded", node, port.device, rail, None,
                               strength=(best / rate) / (1 / s.rate_share),
                               evidence=f"{where}: rate {_gbps(rate)} Gb/s of {_gbps(best)}"))
    return out


def _congested_ports(active: list[tuple[str, PortReading, int | None]], s: SuspectSettings,
                     degraded: set[tuple[str, str]]) -> list[Suspect]:
    """congested-link: the rail's ports (not ``degraded``) that wait or are marked most."""
    waits = [p.transmit_wait.value for _, p, _ in active if p.transmit_wait.value is not None]
    ecns = [p.ecn.value for _, p, _ in active if p.has_ecn and p.ecn.value is not None]
    if len(waits) < 2 and len(ecns) < 2:
        return []
    wait_line = _line(waits, s.wait_ratio, s.wait_floor_per_second)
    ecn_line = _line(ecns, s.wait_ratio, s.ecn_floor_per_second)
    out: list[Suspect] = []
    for node, port, rail in active:
        if (node, port.device) in degraded:
            continue
        wait = _standing(port.transmit_wait.value, port.transmit_wait.latest, wait_line)
        ecn = _standing(port.ecn.value, port.ecn.latest, ecn_line) if port.has_ecn else None
        if wait is None and ecn is None:
            continue  # a burst that is over is not what holds the job back now
        out.append(_congested(node, port, rail, wait, wait_line, ecn, ecn_line, s))
    return out


def _congested(node: str, port: PortReading, rail: int | None, wait: float | None,
               wait_line: float | None, ecn: float | None, ecn_line: float | None,
               s: SuspectSettings) -> Suspect:
    """The congested-link suspect of a port whose ``wait`` or ``ecn`` stands over its line."""
    parts = []
    strength = 0.0
    if wait is not None and wait_line is not None:
        parts.append(f"xmit_wait {wait / (wait_line / s.wait_ratio):.0f}x the rail median")
        strength = wait / wait_line
    if port.has_ecn and port.ecn.value:
        text = f"ECN marks {_per_second(port.ecn.value)}"
        if ecn is not None and ecn_line is not None:
            text += f" ({ecn / (ecn_line / s.wait_ratio):.0f}x the rail median)"
            strength = max(strength, ecn / ecn_line)
        parts.append(text)
    util = port.utilization()
    if util is not None and port.rate_bytes_per_second:
        parts.append(f"{_gbps(util * port.rate_bytes_per_second)} of "
                     f"{_gbps(port.rate_bytes_per_second)} Gb/s")
    return Suspect("congested-link", node, port.device, rail, None, strength=strength,
                   evidence=f"{_where(node, port, rail)}: {', '.join(parts)}")


def _line(values: list[float], ratio: float, floor: float) -> float | None:
    """What stands out of ``values``: ``ratio`` times their median, at least ``floor``."""
    median = _median(values) if len(values) >= 2 else None
    return None if median is None else max(median * ratio, floor)


def _standing(smoothed: float | None, latest: float | None, line: float | None) -> float | None:
    """The smoothed rate when it and the last interval's are both over ``line``."""
    if line is None or smoothed is None or smoothed < line or (latest or 0.0) < line:
        return None
    return smoothed


def _where(node: str, port: PortReading, rail: int | None) -> str:
    return (f"rail {rail} on {node} ({port.device})" if rail is not None
            else f"{node} {port.device}")


def _gpu_suspects(gpus: list[tuple[str, GpuReading]], s: SuspectSettings) -> list[Suspect]:
    out: list[Suspect] = []
    if len(gpus) < 2:
        return out
    clocks = _median([g.sm_clock_hertz for _, g in gpus if g.sm_clock_hertz])
    links = _median([g.nvlink_transmit.value for _, g in gpus
                     if g.nvlink_transmit.value is not None])
    processes = _median([float(g.processes) for _, g in gpus if g.processes is not None])
    for node, g in gpus:
        where = f"GPU {g.index} on {node}"
        link = f"gpu{g.index}"
        reasons = [r for r in g.throttle_reasons if r in SLOWING_REASONS]
        if clocks and g.sm_clock_hertz and reasons and g.sm_clock_hertz < s.clock_share * clocks:
            top = g.sm_max_clock_hertz or clocks
            out.append(Suspect(
                "gpu-throttled", node, link, None, g.index,
                strength=(clocks / g.sm_clock_hertz) * s.clock_share,
                evidence=(f"{where}: SM clock {g.sm_clock_hertz / 1e9:.2f} GHz of "
                          f"{top / 1e9:.2f} ({g.sm_clock_hertz / top:.0%}), {', '.join(reasons)}")))
        nvlink = _nvlink_suspect(node, g, links, s)
        if nvlink is not None:
            out.append(nvlink)
        if processes is not None and g.processes is not None and g.processes > processes:
            out.append(Suspect(
                "noisy-neighbour", node, link, None, g.index,
                strength=1.0 + (g.processes - processes),
                evidence=(f"{where}: {g.processes} compute processes where its peers run "
                          f"{processes:g}")))
    return out


def _nvlink_suspect(node: str, g: GpuReading, median_tx: float | None,
                    s: SuspectSettings) -> Suspect | None:
    parts: list[str] = []
    strength = 0.0
    errors = g.nvlink_errors.value
    if (errors is not None and errors >= s.nvlink_errors_per_second
            and (g.nvlink_errors.latest or 0.0) >= s.nvlink_errors_per_second):
        parts.append(f"NVLink errors {_per_second(errors)}")
        strength = max(strength, errors / s.nvlink_errors_per_second)
    if g.nvlinks_down:
        parts.append(f"{g.nvlinks_down} NVLink{'s' if g.nvlinks_down > 1 else ''} down")
        strength = max(strength, 1.0 + g.nvlinks_down)
    tx = g.nvlink_transmit.value
    if median_tx and tx is not None and tx < s.nvlink_share * median_tx:
        parts.append(f"NVLink throughput {tx / median_tx:.0%} of its peers'")
        strength = max(strength, (median_tx / max(tx, 1.0)) * s.nvlink_share)
    if not parts:
        return None
    return Suspect("nvlink-slow", node, f"gpu{g.index}/nvlink", None, g.index,
                   strength=strength, evidence=f"GPU {g.index} on {node}: {', '.join(parts)}")
