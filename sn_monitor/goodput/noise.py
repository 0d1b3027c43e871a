"""Healthy nodes' noise in a replay: what a healthy fleet's reports show with no fault.

Each kind is a rate per node and day, what the node's report shows and for how long,
and where the rate comes from (a paper, a vendor's document, or "assumed"). The
controlled replay (controlled.py) shows each draw on the job's node in that slot while
it is healthy; nothing here stops the job, so a node a rule takes out for it is a false
eviction, and a checkpoint a rule asks for on it a false checkpoint. The baselines act
on no report: noise costs them nothing.
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


@dataclass(frozen=True)
class NoiseKind:
    signal: NoiseSignal
    #: Draws per node and day.
    per_node_day: float
    #: Seconds the report shows it (0: one event or one step of a counter).
    lasts: float
    what: str
    source: str

    def line(self) -> str:
        return (f"{self.signal}: {self.per_node_day:g} per node and day, {self.what} "
                f"({self.source})")


#: What the default replay shows on healthy nodes. The rates are kept low enough that the
#: 54-day replay of 2,048 nodes stays minutes long; what a rule does with one is what counts.
NOISE: tuple[NoiseKind, ...] = (
    NoiseKind("ecc-corrected", 0.005, 0.0, "one correctable ECC error on a GPU",
              "assumed; corrected by ECC, nothing to do"),
    NoiseKind("temperature", 0.005, 60.0,
              f"a GPU at {EXCURSION_CELSIUS:g} °C for 60 s (a fan, the inlet air)",
              "assumed; below the 85 °C of gpu-overheat"),
    NoiseKind("ib-symbols", 0.005, 0.0,
              f"a burst of {SYMBOL_BURST} InfiniBand symbol errors",
              "assumed; the link survives on retries"),
    NoiseKind("link-flap", 0.002, 3.0, "an InfiniBand port down for 3 s",
              "assumed; shorter than ib-port-down's 10 s"),
    NoiseKind("app-xid", 0.003, 0.0,
              f"XID {APP_XID} from a process that is not the job's (a health check)",
              "assumed; NVIDIA's catalogue: RESTART_APP, the GPU needs nothing"),
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
