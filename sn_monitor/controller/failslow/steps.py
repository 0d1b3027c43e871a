"""Whether a job runs slower than it did, by how much and since when: its step time.

A synchronous job's step time is set by its slowest rank, so the step time alone says
*that* the job is slow, not where. :class:`StepTrend` keeps a job's step times (the
median over its ranks, sampled every few seconds) and compares the recent ones with
the job's healthy pace:

- **recent**: the median of the samples of the last ``recent_seconds``;
- **baseline**: a low quantile (``baseline_quantile``) of the samples of the last
  ``baseline_seconds``: the pace the job keeps when nothing holds it back (its
  ordinary jitter lies above it, a slow stretch well above it). A slowdown that lasts
  longer than the window becomes the new pace (a smaller model shard, a new input
  pipeline is not a fault forever);
- **slow** when ``recent >= baseline x (1 + min_slowdown)``, judged only once the
  window holds ``min_samples``, until the last two samples are both back under that
  line (the recent median would keep a job that recovered "slow" for half a window).
  ``since`` is the first sample of the slow stretch.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from sn_monitor.config import fraction, positive, setting


@dataclass(frozen=True)
class TrendSettings:
    """``fail_slow: {trend: ...}`` in the controller's config."""

    recent_seconds: float = setting(default=20.0, check=positive)
    baseline_seconds: float = setting(default=1800.0, check=positive)
    baseline_quantile: float = setting(default=0.2, check=fraction)
    #: A job this much slower than its baseline is slow (0.06: 6 %).
    min_slowdown: float = setting(default=0.06, check=positive)
    min_samples: int = setting(default=12, check=positive)
    #: Most samples kept (bounds memory whatever the sampling rate).
    max_samples: int = setting(default=2048, check=positive)


@dataclass(frozen=True, slots=True)
class Slowdown:
    """A job that runs slower than its baseline."""

    ratio: float
    """``recent / baseline - 1`` (0.18: 18 % slower)."""
    since: float
    step_time: float
    baseline: float


class StepTrend:
    """One job's step-time samples and its slowdown (see the module docstring)."""

    def __init__(self, settings: TrendSettings | None = None) -> None:
        self.settings = settings or TrendSettings()
        self._samples: deque[tuple[float, float]] = deque(maxlen=self.settings.max_samples)
        self._slow_since: float | None = None

    def add(self, step_time: float, now: float) -> None:
        """One sample of the job's step time (seconds) at controller time ``now``."""
        if not step_time > 0:
            return
        samples = self._samples
        if samples and now < samples[-1][0]:
            return  # out of order: the clock stepped back
        samples.append((now, step_time))
        horizon = now - self.settings.baseline_seconds
        while samples and samples[0][0] < horizon:
            samples.popleft()
        slow = self._judge(now)
        if slow is None:
            self._slow_since = None
        elif self._slow_since is None:
            self._slow_since = now

    def _judge(self, now: float) -> tuple[float, float, float] | None:
        s = self.settings
        samples = self._samples
        if len(samples) < s.min_samples:
            return None
        recent = [v for t, v in samples if t >= now - s.recent_seconds]
        baseline = self.baseline()
        if not recent or baseline is None:
            return None
        current = statistics.median(recent)
        line = baseline * (1.0 + s.min_slowdown)
        if current < line or (len(samples) >= 2 and samples[-1][1] < line
                              and samples[-2][1] < line):
            return None
        return current / baseline - 1.0, current, baseline

    def slowdown(self, now: float) -> Slowdown | None:
        """The job's slowdown now; None when it keeps its pace (or too few samples)."""
        if self._slow_since is None:
            return None
        judged = self._judge(now)
        if judged is None:
            return None
        ratio, current, baseline = judged
        return Slowdown(ratio=ratio, since=self._slow_since, step_time=current,
                        baseline=baseline)

    def latest(self) -> float | None:
        """The last sample's step time."""
        return self._samples[-1][1] if self._samples else None

    def baseline(self) -> float | None:
        """The baseline now, as far as the samples go.

        Judging waits for ``min_samples``; this shows the pace from the first sample on.
        """
        if not self._samples:
            return None
        ordered = sorted(v for _, v in self._samples)
        return ordered[min(len(ordered) - 1, int(self.settings.baseline_quantile * len(ordered)))]
