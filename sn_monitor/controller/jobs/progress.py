"""Training progress of one job, as its ranks report it: steps, step times, ETTR.

Kept in memory by the orchestrator (a progress report is the hot path: thousands of ranks
post every second, so nothing here touches the store); the few numbers that must
survive a controller restart (the frontier and the productive seconds) are saved by the
orchestrator every few seconds.

Effective training time ratio (ETTR)
------------------------------------
The job's frontier and productive seconds are a :class:`~sn_monitor.ettr.TrainingLedger`
(the definition, in :mod:`sn_monitor.ettr`): every rank's steps move it; a rank whose
step goes back (its job restarted in place from a checkpoint), or the first step of a
rank after a restore below the frontier, takes back the steps redone; the checkpoint
saves the job reports (:meth:`JobProgress.saved`) take their blocking time off. Before
the first step the job is ``pending`` and has no ETTR: the time its ranks wait to be
scheduled is not training lost to faults.

The ranks' times are taken on the controller's clock, as a report's events are
(:func:`on_controller_clock`): a rank whose clock is a day ahead or a year behind, or that
sends 1e308, neither dates its progress in the future nor makes a step last a year.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sn_monitor.controller.ingest.decode import MAX_EVENT_AGE_SECONDS
from sn_monitor.ettr import TrainingLedger

#: The frontier's advances kept for :meth:`JobProgress.recent_step_time`.
ADVANCES_KEPT = 256


def on_controller_clock(when: float, now: float) -> float:
    """A rank's wall time ``when`` as the controller keeps it, ``now`` its receive time.

    After ``now`` (the rank's clock is ahead) it is ``now``; more than
    :data:`~sn_monitor.controller.ingest.decode.MAX_EVENT_AGE_SECONDS` before it, that old: the
    bounds :func:`~sn_monitor.controller.ingest.controller_times` puts on events.
    """
    return min(now, max(now - MAX_EVENT_AGE_SECONDS, when))


@dataclass
class RankProgress:
    """The last progress of one rank."""

    node: str
    step: int
    #: The client's wall time of ``step``.
    time: float
    #: The controller's wall time when this rank's step last advanced.
    received: float
    step_time: float | None


class JobProgress:
    """Per-rank last step and time, median step time, and the ledger of productive time."""

    def __init__(self, max_ranks: int, unknown_gap: float = 60.0) -> None:
        self.max_ranks = max_ranks
        #: The frontier, when the job started and its productive seconds.
        self.ledger = TrainingLedger(unknown_gap)
        self.ranks: dict[int, RankProgress] = {}
        self.world_size = 0
        #: Controller wall time of the last advance of any rank (this generation).
        self.last_advance: float | None = None
        #: A restore started this generation: its ranks' first steps may go back.
        self.resuming = False
        #: Whether the current stall was already reported as a hang.
        self.hang_reported = False
        self.dirty = False
        self._median: float | None = None
        self._median_stale = True
        #: (step, time) of the frontier's latest advances: the job's pace right now.
        self._advances: deque[tuple[int, float]] = deque(maxlen=ADVANCES_KEPT)
        self._median_at = -1e18

    def reset_ranks(self) -> None:
        """A new generation starts: forget the ranks (the world may have changed)."""
        self.ranks.clear()
        self._advances.clear()
        self.world_size = 0
        self.last_advance = None
        self.hang_reported = False
        self.resuming = True
        self._median_stale = True

    @property
    def frontier(self) -> int | None:
        """The highest step the job reached and still has (None before its first)."""
        return self.ledger.frontier

    def saved(self, step: int, blocking: float) -> None:
        """The job's checkpoint of ``step`` stood training still for ``blocking`` seconds."""
        self.ledger.saved(step, blocking)
        self.dirty = True

    def update(self, rank: int, node: str, world_size: int,
               updates: Sequence[tuple[int, float]], step_time: float | None,
               now: float) -> bool:
        """Take one rank's batch; True when the rank advanced.

        ``now``: the controller's wall time; the batch's times are on its clock already
        (:func:`on_controller_clock`, applied where the batch comes in).
        """
        self._check_batch(rank, world_size)
        if step_time is not None and not step_time > 0:
            step_time = None
        self._fit_world(world_size)
        current, step_time, advanced = self._take_steps(rank, node, updates, step_time, now)
        if current is not None:
            self._note_rank(current, step_time, advanced, now)
        return advanced

    def _check_batch(self, rank: int, world_size: int) -> None:
        if world_size < 1 or world_size > self.max_ranks:
            raise ValueError(f"world_size must be between 1 and {self.max_ranks}, "
                             f"got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be between 0 and world_size - 1, got {rank}")

    def _fit_world(self, world_size: int) -> None:
        """The world is ``world_size`` ranks now: when it shrank, forget ranks beyond it."""
        if world_size < self.world_size:
            for old in [r for r in self.ranks if r >= world_size]:
                del self.ranks[old]
            self._median_stale = True
        self.world_size = world_size

    def _take_steps(self, rank: int, node: str, updates: Sequence[tuple[int, float]],
                    step_time: float | None, now: float
                    ) -> tuple[RankProgress | None, float | None, bool]:
        """The batch's steps in time order, onto the frontier and the rank.

        The rank as it stands after, its step time (worked out from two steps when the
        batch gave none) and whether it advanced.
        """
        current = self.ranks.get(rank)
        advanced = False
        for step, when in sorted(updates, key=lambda u: (u[1], u[0])):
            if step < 0:
                raise ValueError(f"a step is not negative, got {step}")
            # the rank's step went back, or a restored generation's rank starts: a restart
            restart = current.step > step if current is not None else self.resuming
            if restart and self.ledger.resumed(step, when, self.median_step_time(now)):
                self._advances.clear()
                self.dirty = True
            self._frontier(step, when, now)
            if current is None:
                current = RankProgress(node, step, when, now, step_time)
                self.ranks[rank] = current
                advanced = True
                if step_time is not None:
                    self._median_stale = True  # a new rank's step time counts at once
                continue
            if step != current.step or when > current.time:
                if step_time is None and step > current.step and when > current.time:
                    step_time = (when - current.time) / (step - current.step)
                if step != current.step:
                    advanced = True
                current.step, current.time, current.node = step, when, node
        return current, step_time, advanced

    def _note_rank(self, current: RankProgress, step_time: float | None, advanced: bool,
                   now: float) -> None:
        """The rank's new step time, and when it advanced (the job's too)."""
        if step_time is not None and step_time != current.step_time:
            current.step_time = step_time
            self._median_stale = True
        if advanced:
            current.received = now
            self.last_advance = now
            self.hang_reported = False
        if self.all_reported():
            self.resuming = False

    def _frontier(self, step: int, when: float, now: float) -> None:
        if self.ledger.reached(step, when, self.median_step_time(now)):
            reached = self.ledger.frontier_time
            self._advances.append((step, when if reached is None else reached))
            self.dirty = True

    def recent_step_time(self, window: float = 30.0) -> float | None:
        """Seconds per step of the frontier over its last ``window`` seconds.

        The pace of the slowest rank, as of its latest steps: the ranks' own step times
        (:meth:`median_step_time`) are medians over their last few dozen steps, and turn
        that many steps after the job slowed down. None before two advances in the window.
        """
        advances = self._advances
        if len(advances) < 2:
            return None
        last_step, last_time = advances[-1]
        first_step, first_time = last_step, last_time
        for step, when in reversed(advances):
            if when < last_time - window:
                break
            first_step, first_time = step, when
        if last_step <= first_step or last_time <= first_time:
            return None
        return (last_time - first_time) / (last_step - first_step)

    def median_step_time(self, now: float | None = None) -> float | None:
        """The median of the ranks' step times (None while no rank knows its own).

        With ``now`` (the progress hot path) it is recomputed at most once a second:
        every rank's post changes its step time a little, and the median costs O(ranks).
        """
        if self._median_stale and (now is None or self._median is None
                                   or now - self._median_at >= 1.0):
            times = [r.step_time for r in self.ranks.values() if r.step_time is not None]
            if times:
                self._median = statistics.median(times)
            self._median_stale = False
            if now is not None:
                self._median_at = now
        return self._median

    def all_reported(self) -> bool:
        """Every rank of the world has reported in this generation."""
        return self.world_size > 0 and len(self.ranks) >= self.world_size

    def first_stopped(self) -> list[tuple[int, RankProgress]]:
        """The ranks whose last progress is the oldest (within a fraction of a step)."""
        if not self.ranks:
            return []
        oldest = min(r.time for r in self.ranks.values())
        median = self.median_step_time()
        tolerance = 0.5 * median if median is not None else 1.0
        return sorted((rank, r) for rank, r in self.ranks.items()
                      if r.time <= oldest + tolerance)

    def last_step(self) -> int | None:
        """The highest step a rank of this generation reported."""
        return max((r.step for r in self.ranks.values()), default=None)


__all__ = ["JobProgress", "RankProgress", "on_controller_clock"]
