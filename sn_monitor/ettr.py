"""Effective training time ratio (ETTR): the one definition, and the ledger it is read from.

The definition of the Llama 3 paper and Meta's reliability studies::

    ETTR = productive training time / wall time since the job started

*Productive training time* is the wall time of the steps the job still has (a restore
from an older checkpoint takes back the steps after it: they are redone, and only their
last run counts), minus the time training stood still for the checkpoint saves the job
reported (``save_seconds``). The job *started* at its first step. The controller's
gauge (``sn_job_effective_training_ratio``), the API's ``effective_training_ratio``
(and so the demo's summary) and the goodput replay all divide with
:func:`effective_training_ratio`; the controller's productive seconds are the
:class:`TrainingLedger` of the steps, saves and restores its ranks report.

How the ledger credits time: the job's *frontier* is the highest step it has reached
and still has. When it advances from step ``F`` (reached at ``t_F``) to ``S`` at ``t``,
the gap ``t - t_F``, less the blocking saves reported in it, is productive when it is at
most ``SLACK x (S - F) x the median step time`` (ordinary jitter); a longer gap means
the job stalled (hung, recovering, loading a checkpoint) and only ``(S - F) x median``
of it counts: the time the new steps took. While no step time is known, a gap counts
whole up to ``unknown_gap`` seconds. The first step gives no credit (its start is not
known). A save reported after the frontier passed it is taken off the advance that
passed it (unless that advance was already cut to ``steps x median``). A restart at
step ``R`` below the frontier (:meth:`TrainingLedger.resumed`) puts the productive time
back to what it was when step ``R`` was first reached: the steps after ``R`` count
again as they are redone.

Pure arithmetic on the reported facts: no clock, no I/O, so a test (or anyone with the
same history) computes the same number.
"""

from __future__ import annotations

from collections import deque

#: A frontier gap up to this many median step times per step counts whole (jitter).
SLACK = 2.0
#: The frontier's advances a restore can go back over (older restores are estimated).
CREDITS_KEPT = 4096
#: The steps of the latest saves, so that a save reported twice is taken off once.
SAVES_KEPT = 64


def effective_training_ratio(productive: float, wall: float) -> float | None:
    """Productive seconds over wall seconds since the start, within [0, 1]; None at 0 wall."""
    if wall <= 0:
        return None
    return min(1.0, max(0.0, productive / wall))


class TrainingLedger:
    """A job's frontier and its productive seconds, from its steps, saves and restarts."""

    def __init__(self, unknown_gap: float = 60.0, kept: int = CREDITS_KEPT) -> None:
        self.unknown_gap = unknown_gap
        #: The highest step the job has reached and still has, and when (its wall time).
        self.frontier: int | None = None
        self.frontier_time: float | None = None
        #: When the job started: the time of its first step.
        self.started: float | None = None
        self.productive = 0.0
        #: (step, productive seconds once it was reached, whether its gap counted whole).
        self._credits: deque[tuple[int, float, bool]] = deque(maxlen=kept)
        #: Saves of steps at or past the frontier: taken off the gap that passes them.
        self._pending: list[tuple[int, float]] = []
        self._saved: deque[int] = deque(maxlen=SAVES_KEPT)

    def reached(self, step: int, when: float, median: float | None) -> bool:
        """Step ``step`` was done at ``when``; True when it moved the frontier."""
        if self.frontier is None or self.frontier_time is None:
            self.frontier, self.frontier_time = step, when
            if self.started is None:
                self.started = when
            self._credits.append((step, self.productive, True))
            return True
        if step <= self.frontier:
            return False
        steps = step - self.frontier
        gap = when - self.frontier_time - self._blocking_before(step)
        credit, whole = 0.0, True
        if gap > 0:
            if median is None:
                whole = gap <= self.unknown_gap
                credit = gap if whole else 0.0
            elif gap <= SLACK * steps * median:
                credit = gap
            else:
                credit, whole = steps * median, False
        self.productive += credit
        self.frontier = step
        self.frontier_time = max(when, self.frontier_time)
        self._credits.append((step, self.productive, whole))
        return True

    def saved(self, step: int, blocking: float) -> None:
        """The checkpoint of ``step`` stood training still for ``blocking`` seconds."""
        if blocking <= 0 or self.frontier is None or step in self._saved:
            return
        self._saved.append(step)
        if step >= self.frontier:
            self._pending.append((step, blocking))
            return
        credits = self._credits
        index = next((i for i in range(len(credits) - 1, -1, -1)
                      if credits[i][0] <= step), -1) + 1
        if index < len(credits):
            _, after, whole = credits[index]
            if not whole:
                return  # that gap was cut to its steps' time: the save is not in it
            before = credits[index - 1][1] if index > 0 else 0.0
            blocking = min(blocking, after - before)
        self.productive -= blocking
        for i in range(index, len(credits)):
            s, p, w = credits[i]
            credits[i] = (s, p - blocking, w)

    def resumed(self, step: int, when: float, median: float | None) -> bool:
        """The job restarted: ``step`` done at ``when``; True when below the frontier.

        The steps after ``step`` are redone: the productive seconds go back to when
        ``step`` was first reached.
        """
        if self.frontier is None or step >= self.frontier:
            return False
        kept = self._credit_at(step, median)
        credits = self._credits
        while credits and credits[-1][0] >= step:
            credits.pop()
        credits.append((step, kept, True))
        self._pending.clear()
        self.productive = kept
        self.frontier, self.frontier_time = step, when
        return True

    def _credit_at(self, step: int, median: float | None) -> float:
        """The productive seconds when ``step`` was first reached (interpolated)."""
        later: tuple[int, float, bool] | None = None
        for entry in reversed(self._credits):
            if entry[0] <= step:
                if later is None or entry[0] == step:
                    return entry[1]
                share = (step - entry[0]) / (later[0] - entry[0])
                return entry[1] + share * (later[1] - entry[1])
            later = entry
        # Older than the advances kept: back by the redone steps' time.
        oldest_step, oldest = ((later[0], later[1]) if later is not None
                               else (self.frontier or 0, self.productive))
        return max(0.0, oldest - (oldest_step - step) * (median or 0.0))

    def _blocking_before(self, step: int) -> float:
        """The pending saves of steps before ``step`` (the gap to it holds them), taken."""
        inside = sum(b for s, b in self._pending if s < step)
        self._pending = [(s, b) for s, b in self._pending if s >= step]
        return inside


__all__ = ["CREDITS_KEPT", "SLACK", "TrainingLedger", "effective_training_ratio"]
