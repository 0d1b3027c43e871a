"""The checkpoint interval that maximises a job's effective training time.

A job that checkpoints every ``tau`` seconds, pausing ``delta`` seconds each time, and
fails on average every ``M`` seconds, loses ``delta / tau`` of its time to saving and
about ``tau / 2M`` to recomputing what the last failure threw away. Young (1974) found the
minimum at ``tau = sqrt(2 delta M)``; Daly (2006, "A higher order estimate of the optimum
checkpoint interval for restart dumps") refined it to

    tau = sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + delta / 18M) - delta   (delta < 2M)

which is what is recommended here. The inputs come from the job's own history:

- ``delta``: the median of the blocking save times the training client reports with its
  checkpoints (``save_seconds``);
- ``M``: the job's failures over its age, blended with the fleet's rate of node faults
  (every fault that takes a node out, on any node the controller watches, per node-second,
  times the job's nodes) over ``PRIOR_SECONDS``: a young job with no failure yet is not
  told to never checkpoint.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

#: How much the fleet's rate weighs, as seconds of the job's own history.
PRIOR_SECONDS = 7 * 86400.0
#: Save times kept per job.
SAVES_KEPT = 32
#: The recommendation stays within these bounds (a minute; a day).
MIN_INTERVAL = 60.0
MAX_INTERVAL = 86400.0


def young(save_seconds: float, mtbf_seconds: float) -> float:
    """Young's first-order optimum, ``sqrt(2 delta M)``."""
    return math.sqrt(2.0 * save_seconds * mtbf_seconds)


def daly(save_seconds: float, mtbf_seconds: float) -> float:
    """Daly's higher-order optimum (``M`` when saving takes as long as ``2M``)."""
    delta, m = save_seconds, mtbf_seconds
    if delta >= 2.0 * m:
        return m
    return young(delta, m) * (1.0 + math.sqrt(delta / (2.0 * m)) / 3.0
                              + delta / (18.0 * m)) - delta


def expected_waste(interval: float, save_seconds: float, mtbf_seconds: float,
                   restart_seconds: float = 0.0) -> float:
    """The first-order share of time lost: saving, recomputing, restarting."""
    return (save_seconds / interval + (interval + save_seconds) / (2.0 * mtbf_seconds)
            + restart_seconds / mtbf_seconds)


class FleetFaults:
    """Faults that took nodes out, over the node-seconds the controller watched."""

    def __init__(self) -> None:
        self.faults = 0
        self.node_seconds = 0.0
        self._last: float | None = None

    def observe(self, nodes: int, now: float) -> None:
        """``nodes`` were watched since the last call (every sweep)."""
        if self._last is not None and now > self._last:
            self.node_seconds += nodes * (now - self._last)
        self._last = now

    def note_fault(self) -> None:
        self.faults += 1

    def rate_per_node_second(self) -> float | None:
        if self.node_seconds <= 0:
            return None
        return self.faults / self.node_seconds


@dataclass(frozen=True)
class Advice:
    """The recommended interval and what it was computed from."""

    interval_seconds: float
    save_seconds: float
    mtbf_seconds: float
    young_seconds: float


class SaveTimes:
    """A job's recent blocking save times."""

    def __init__(self) -> None:
        self._seconds: deque[float] = deque(maxlen=SAVES_KEPT)

    def add(self, seconds: float) -> None:
        if seconds >= 0 and math.isfinite(seconds):
            self._seconds.append(seconds)

    def median(self) -> float | None:
        return statistics.median(self._seconds) if self._seconds else None


def advise(save_seconds: float | None, failures: int, age_seconds: float, nodes: int,
           fleet_rate: float | None) -> Advice | None:
    """The interval for a job, or None while its save time or failure rate is unknown."""
    if save_seconds is None or save_seconds <= 0:
        return None
    fleet = (fleet_rate or 0.0) * nodes
    weight = PRIOR_SECONDS if fleet > 0 else 0.0
    seconds = max(0.0, age_seconds) + weight
    events = failures + fleet * weight
    if events <= 0 or seconds <= 0:
        return None
    mtbf = seconds / events
    interval = min(MAX_INTERVAL, max(MIN_INTERVAL, daly(save_seconds, mtbf)))
    return Advice(interval_seconds=interval, save_seconds=save_seconds, mtbf_seconds=mtbf,
                  young_seconds=young(save_seconds, mtbf))
