"""The fail-slow faults of a simulated GPU: it keeps working, slower.

Clocks held low for a named reason (a power brake, a hardware slowdown), an NVLink error
storm that drops links and slows the rest, another tenant's process taking a share of
the GPU. Each sets the GPU's :class:`~sn_monitor.sim.gpu_model.FailSlowState` (which
:meth:`SimulatedGpu.step <sn_monitor.sim.gpu_model.SimulatedGpu.step>` reads) under the
GPU's lock, and each has its clearing twin. The ``POST /sim/fault`` kinds
(:data:`sn_monitor.sim.node.FAULTS`: ``gpu-throttled``, ``nvlink-slow``,
``noisy-neighbour``) call them; what the job sees of them is
:mod:`sn_monitor.sim.failslow`'s.

They change for the fail-slow scenarios, apart from the GPU's physics and its hard
faults (:mod:`sn_monitor.sim.gpu_model`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sn_monitor.sim.gpu_model import (
    REASON_HW_POWER_BRAKE_SLOWDOWN,
    REASON_HW_SLOWDOWN,
    REASON_HW_THERMAL_SLOWDOWN,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL_SLOWDOWN,
    SimulatedGpu,
)

#: The slowing reasons a ``gpu-throttled`` fault may name (agent.nvml.THROTTLE_REASONS).
THROTTLE_REASON_BITS = {
    "sw_power_cap": REASON_SW_POWER_CAP,
    "hw_slowdown": REASON_HW_SLOWDOWN,
    "sw_thermal_slowdown": REASON_SW_THERMAL_SLOWDOWN,
    "hw_thermal_slowdown": REASON_HW_THERMAL_SLOWDOWN,
    "hw_power_brake_slowdown": REASON_HW_POWER_BRAKE_SLOWDOWN,
}
#: The pid a noisy neighbour's process has on GPU i: NEIGHBOUR_PID + i.
NEIGHBOUR_PID = 70_000


def throttle(gpu: SimulatedGpu, reasons: Sequence[str], ratio: float) -> None:
    """The clocks held at ``ratio`` of what they would be, for ``reasons``.

    A power brake, a hardware slowdown signal, a power cap set low out of band.
    """
    if not 0.05 <= ratio <= 1.0:
        raise ValueError(f"clock ratio must be in 0.05..1, got {ratio}")
    unknown = [r for r in reasons if r not in THROTTLE_REASON_BITS]
    if unknown or not reasons:
        raise ValueError(f"throttle reasons must be some of {sorted(THROTTLE_REASON_BITS)}")
    with gpu.lock:
        gpu.fail_slow.clock_ratio = ratio
        gpu.fail_slow.reasons = 0
        for reason in reasons:
            gpu.fail_slow.reasons |= THROTTLE_REASON_BITS[reason]


def clear_throttle(gpu: SimulatedGpu) -> None:
    """The clocks free again."""
    with gpu.lock:
        gpu.fail_slow.clock_ratio = 1.0
        gpu.fail_slow.reasons = 0


def slow_nvlinks(gpu: SimulatedGpu, links_down: int, errors_per_second: float,
                 bandwidth_ratio: float) -> None:
    """An NVLink error storm: errors climb and ``links_down`` links drop.

    The GPU's NVLink data rate falls to ``bandwidth_ratio`` of its peers'.
    """
    if not 0 <= links_down < len(gpu.nvlinks) or errors_per_second < 0:
        raise ValueError("links_down must leave a link up; errors_per_second >= 0")
    if not 0.0 < bandwidth_ratio <= 1.0:
        raise ValueError(f"bandwidth ratio must be in (0, 1], got {bandwidth_ratio}")
    for link in range(links_down):
        gpu.set_nvlink_down(link)
    with gpu.lock:
        gpu.fail_slow.nvlink_errors_per_second = errors_per_second
        gpu.fail_slow.nvlink_bandwidth_ratio = bandwidth_ratio


def clear_nvlink_slow(gpu: SimulatedGpu) -> None:
    """The storm over: no more errors, every link up, the full data rate."""
    with gpu.lock:
        gpu.fail_slow.nvlink_errors_per_second = 0.0
        gpu.fail_slow.nvlink_bandwidth_ratio = 1.0
        for link in gpu.nvlinks:
            link.up = True


def add_noisy_neighbour(gpu: SimulatedGpu, share: float) -> None:
    """Another tenant's compute process on this GPU, taking ``share`` of it."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"share must be in (0, 1), got {share}")
    with gpu.lock:
        pid = NEIGHBOUR_PID + gpu.index
        used = int(share * 0.3 * gpu.profile.memory_total_bytes)
        gpu.processes = [p for p in gpu.processes if p[0] != pid] + [(pid, used)]
        gpu.fail_slow.neighbour_share = share


def clear_noisy_neighbour(gpu: SimulatedGpu) -> None:
    """The other tenant's process gone."""
    with gpu.lock:
        pid = NEIGHBOUR_PID + gpu.index
        gpu.processes = [p for p in gpu.processes if p[0] != pid]
        gpu.fail_slow.neighbour_share = 0.0
