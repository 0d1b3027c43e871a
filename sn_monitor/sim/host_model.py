"""A simulated node's host: CPU time, load, memory and memory bandwidth moving with load.

:class:`SimulatedHost` keeps the counters the agent's host collector reads and says them
as the kernel does: ``/proc/stat`` (per-CPU ticks in ``USER_HZ``), ``/proc/meminfo``,
``/proc/loadavg`` (exponentially damped over 1, 5 and 15 minutes) and resctrl's
``mbm_total_bytes`` per L3 domain. :class:`~sn_monitor.sim.node_tree.SimulatedNodeTree`
advances it with the node's load and writes its text into the tree.
"""

from __future__ import annotations

import math
import random

#: 2 TiB class host.
MEM_TOTAL_KB = 2_113_389_000
#: Two sockets: resctrl's memory bandwidth monitoring domains.
L3_DOMAINS = ("L3_00", "L3_01")
USER_HZ = 100


class SimulatedHost:
    """The host counters of one node with ``cpus`` CPUs, after about 30 days up.

    ``rng``: the node's random source (shared with the tree, so that a seed makes the
    whole node reproducible).
    """

    def __init__(self, rng: random.Random, cpus: int) -> None:
        self._rng = rng
        self.cpus = cpus
        # user nice system idle iowait irq softirq steal, after about 30 days up
        uptime_ticks = 30 * 86400 * USER_HZ * cpus
        self._cpu_ticks = [
            uptime_ticks * share for share in (0.34, 0.0, 0.05, 0.6, 0.002, 0.0, 0.008, 0.0)
        ]
        self._load1 = 0.0
        self._load5 = 0.0
        self._load15 = 0.0
        self._mem_available_kb = int(MEM_TOTAL_KB * 0.95)
        #: Bytes moved to and from memory, per L3 domain (resctrl's ``mbm_total_bytes``).
        self.mbm_bytes = {domain: self._rng.randrange(10**12, 10**13) for domain in L3_DOMAINS}

    def advance(self, dt: float, load: float) -> None:
        """``dt`` seconds at ``load`` (0..1): CPU time spent, load, memory in use, traffic."""
        total = dt * USER_HZ * self.cpus
        busy = min(0.02 + 0.9 * load, 1.0)
        shares = (0.85, 0.001, 0.12, 0.0, 0.0, 0.0, 0.029, 0.0)
        for mode, share in enumerate(shares):
            self._cpu_ticks[mode] += total * busy * share
        self._cpu_ticks[3] += total * (1 - busy) * 0.995  # idle
        self._cpu_ticks[4] += total * (1 - busy) * 0.005  # iowait
        running = busy * self.cpus
        for attr, period in (("_load1", 60.0), ("_load5", 300.0), ("_load15", 900.0)):
            decay = math.exp(-dt / period)
            setattr(self, attr, getattr(self, attr) * decay + running * (1 - decay))
        target_kb = MEM_TOTAL_KB * (0.95 - 0.35 * load)
        decay = math.exp(-dt / 30.0)
        self._mem_available_kb = int(self._mem_available_kb * decay + target_kb * (1 - decay))
        for domain in self.mbm_bytes:
            self.mbm_bytes[domain] += int((5e9 + 150e9 * load) * dt * self._rng.uniform(0.9, 1.1))

    def stat_text(self) -> str:
        """``/proc/stat``: the total, each CPU's ticks, boot time, processes."""
        ticks = [int(t) for t in self._cpu_ticks]
        per_cpu = [t // self.cpus for t in ticks]
        first = [t - p * (self.cpus - 1) for t, p in zip(ticks, per_cpu, strict=True)]
        lines = ["cpu  " + " ".join(map(str, ticks)) + " 0 0"]
        lines.append("cpu0 " + " ".join(map(str, first)) + " 0 0")
        rest = " ".join(map(str, per_cpu)) + " 0 0"
        lines.extend(f"cpu{i} {rest}" for i in range(1, self.cpus))
        lines.append("btime 1732900000")
        lines.append(f"procs_running {max(1, round(self._load1))}")
        lines.append("procs_blocked 0")
        return "\n".join(lines) + "\n"

    def meminfo_text(self) -> str:
        """``/proc/meminfo``: what is free, available and cached."""
        mem_free_kb = int(self._mem_available_kb * 0.75)
        return (
            f"MemTotal:       {MEM_TOTAL_KB} kB\n"
            f"MemFree:        {mem_free_kb} kB\n"
            f"MemAvailable:   {self._mem_available_kb} kB\n"
            f"Buffers:        {12_345_678} kB\n"
            f"Cached:         {self._mem_available_kb - mem_free_kb} kB\n"
            "SwapTotal:              0 kB\n"
            "SwapFree:               0 kB\n"
            "HugePages_Total:       0\n"
            "Hugepagesize:       2048 kB\n"
        )

    def loadavg_text(self) -> str:
        """``/proc/loadavg``: the three averages, running / all processes, the last pid."""
        running = max(1, round(self._load1))
        return f"{self._load1:.2f} {self._load5:.2f} {self._load15:.2f} {running}/3456 98765\n"
