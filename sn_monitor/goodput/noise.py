"""Healthy nodes' noise in a replay: what a healthy fleet's reports show with no fault.

Each kind is a rate per node (8 GPUs) and day, the rate a published source gives (``None``
where none was found, and the rate is assumed), what the node's report shows and for
how long, and the source: the document, its figure, and how it becomes a rate per node
and day. The controlled replay (controlled.py) shows each draw on the job's node in that
slot while it is healthy, on its first GPU and port (a rule that counts repeats on one
GPU sees the node's whole rate: the worst case); nothing here stops the job, so a node a
rule takes out for it is a false eviction, and a checkpoint a rule asks for on it a
false checkpoint. The baselines act on no report: noise costs them nothing.

Every draw costs the replay time (the controller sweeps every second for a while after a
report that shows something), so the rates together stay at or below NOISE_BUDGET.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

NoiseSignal = Literal["ecc-corrected", "temperature", "ib-symbols", "link-flap", "app-xid"]

#: The GPU temperature of an excursion: above a busy GPU's 60 °C, below the 85 °C at
#: which the packaged gpu-overheat rule throttles.
EXCURSION_CELSIUS = 80.0
#: Symbol errors in one burst: a few bits corrected on retry, the link survives.
SYMBOL_BURST = 5
#: An application XID: 13, graphics engine exception (NVIDIA's catalogue: RESTART_APP).
APP_XID = 13
#: The most noise, per node and day over all kinds, that keeps the default replay
#: (2,048 nodes, 54 days) minutes long.
NOISE_BUDGET = 0.1


@dataclass(frozen=True)
class NoiseKind:
    signal: NoiseSignal
    #: Draws per node and day in the replay.
    per_node_day: float
    #: What the source gives, per node of 8 GPUs and day; None: no published rate found.
    published_per_node_day: float | None
    #: Seconds the report shows it (0: one event or one step of a counter).
    lasts: float
    what: str
    source: str

    def line(self) -> str:
        return f"{self.signal}: {self._rate()}, {self.what} ({self.source})"

    def _rate(self) -> str:
        if self.published_per_node_day is None:
            return f"{self.per_node_day:g} per node and day, assumed (no published rate)"
        if self.published_per_node_day == self.per_node_day:
            return f"{self.per_node_day:g} per node and day, as published"
        return (f"published {self.published_per_node_day:g} per node and day, "
                f"replayed {self.per_node_day:g}")


#: What the default replay shows on healthy nodes: each rate from its source where one
#: was found (the figures quoted as found), else assumed and said so.
NOISE: tuple[NoiseKind, ...] = (
    NoiseKind("ecc-corrected", 0.077, 0.077, 0.0, "one correctable ECC error on a GPU",
              "Titan, 18,688 K20X GPUs: about 6 million single-bit ECC errors from 2012 to "
              "August 2014, 98 % of them on 10 GPUs, 899 GPUs with any (J. Rogers, ORNL, "
              "'GPU Errors on HPC Systems: Characterization, Quantification, and "
              "Implications for Architects and Operations', GTC 2015 S5566, as reported by "
              "H. Ando, Mynavi 2015); the other 2 % (~120,000) over the talk's ~300M "
              "node-hours (22 months; one GPU a node) is 4e-4 per GPU-hour, x 24 h x 8 "
              "GPUs = 0.077. 6 GB of GDDR5 a GPU: an H100's 80 GB of HBM3 may see more; no "
              "H100 figure found. No packaged rule reads corrected ECC errors"),
    NoiseKind("temperature", 0.005, None, 60.0,
              f"a GPU at {EXCURSION_CELSIUS:g} °C for 60 s (a fan, the inlet air)",
              "no published rate of such excursions found; Llama 3 (arXiv:2407.21783, "
              "3.3.4) reports 'a diurnal 1-2% throughput variation' from 'higher mid-day "
              "temperatures': a daily warm spell, its size not given. Below gpu-overheat's 85 °C, "
              "shorter than gpu-temperature-anomaly's 2-minute hold"),
    NoiseKind("ib-symbols", 0.005, None, 0.0,
              f"a burst of {SYMBOL_BURST} InfiniBand symbol errors",
              "no published rate for healthy links found, only bounds: the InfiniBand "
              "specification 'requires less than one-bit error per 10^12 bits', NVIDIA "
              "tests its cables to 'less than one-bit error per 10^15' (DGX SuperPOD "
              "cabling guide); on HDR/NDR symbol errors are what is left after error "
              "correction (ibdiagnet manual). At 400 Gb/s 10^-15 is at most 35 a port and "
              "day (276 a node of 8 ports), 10^-12 at most 0.4 a second; ib-symbol-errors "
              "acts on more than 1 a second over 5 minutes, which neither bound reaches"),
    NoiseKind("link-flap", 0.002, None, 3.0, "an InfiniBand port down for 3 s",
              "no published rate of short flaps found; Llama 3 (arXiv:2407.21783, Table 5) "
              "counts 35 interruptions from network switches and cables in 54 days on "
              "2,048 nodes, 3.2e-4 per node and day, which the trace replays as faults. "
              "Shorter than ib-port-down's 10 s and than the 30 s from which NVIDIA's "
              "rdma_linkflap_fatal check counts an outage (NVIDIA Health Validation, "
              "GB200/GB300)"),
    NoiseKind("app-xid", 0.003, None, 0.0,
              f"XID {APP_XID} from a process that is not the job's (a health check)",
              "no published rate found: the fleet studies found count interrupted jobs, "
              "not XIDs of other processes. NVIDIA's catalogue: RESTART_APP, the GPU needs "
              "nothing; app-xid alerts, and escalates on 3 from one GPU in an hour, which "
              "this rate makes vanishingly rare (a much higher one would not)"),
)


@dataclass(frozen=True)
class Noise:
    """One draw: ``signal`` on the job's node in ``slot`` at ``time``, for ``lasts`` s."""

    time: float
    slot: str
    signal: NoiseSignal
    lasts: float = 0.0


def draw_noise(kinds: Sequence[NoiseKind], slots: Sequence[str], duration: float,
               seed: int) -> tuple[Noise, ...]:
    """Each kind as a Poisson process over the fleet, on a random slot; in time order."""
    rng = random.Random(f"noise-{seed}")
    out: list[Noise] = []
    for kind in kinds:
        per_second = kind.per_node_day * len(slots) / 86400.0
        if per_second <= 0:
            continue
        t = rng.expovariate(per_second)
        while t < duration:
            out.append(Noise(time=t, slot=rng.choice(slots), signal=kind.signal,
                             lasts=kind.lasts))
            t += rng.expovariate(per_second)
    return tuple(sorted(out, key=lambda n: (n.time, n.slot)))
