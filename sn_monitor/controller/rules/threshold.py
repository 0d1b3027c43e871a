"""Threshold rules: a fixed bound on a metric, or on its per-second rate or its increase.

Rates and increases are computed per series from (controller monotonic time, counter
value) samples covering the window, anchored at a sample at or before the window's
start: the rate is ``(value - anchor value) / (now - anchor time)``, the increase
``value - anchor value``. A counter that goes down was reset (the agent or the driver
restarted): the samples start over and no rate is reported until two samples exist, so a
reset never looks like a burst.

Bounded memory, whatever the report rate: the window is cut into :data:`BUCKETS` buckets
of ``window / BUCKETS`` seconds (on the monotonic clock) and a series keeps, per bucket,
its first sample and the newest sample at which the counter changed within it, plus the
latest sample: at most ``2 * BUCKETS + 4`` samples (see :func:`slide`), about 34 for a
counter that does not move. The price is the anchor. The exact one is the newest sample at
or before the window's start; the anchor used is a kept sample of that sample's bucket, so
at most one bucket (1/32 of the window: 1.9 s of 1m, 9.4 s of 5m) older, and its value is
exact unless the counter changed more than once within that bucket. Hence:

- an increase is never smaller than the exact one and at most larger by what the counter
  gained during one bucket just before the window (exact for counters that step at most
  once per bucket, such as error counts); a step leaves the window up to a bucket late;
- a rate is the average over a span between the window and the window plus one bucket
  (exact for a steady rate; otherwise within 1/32 of the difference between the rate over
  the window and the rate in that extra bucket).

Reports at most one per bucket (a 1 s interval with windows up to 32 s) keep every sample
and give the exact results.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Final, cast

from sn_monitor.controller.rules.base import (
    Finding,
    Held,
    HoldingEvaluator,
    Now,
    format_duration,
    format_number,
)
from sn_monitor.controller.rules.series import Subject, compile_reader, describe, frame_of
from sn_monitor.controller.rules.spec import ThresholdRule
from sn_monitor.controller.state import NodeView

BUCKETS: Final = 32
"""Buckets a rate / increase window is cut into: the resolution of its start."""

MAX_SAMPLES: Final = 2 * BUCKETS + 4
"""Most samples a rate / increase series keeps (the window's start can straddle one more
bucket; one sample before the window; the latest)."""

_EXACT_FLOATS: Final = 2.0 ** 53
"""Bounds below this compare the same with a report's integers and with their floats."""


def slide(samples: array[float], t: float, value: float, window: float, width: float) -> bool:
    """Add the sample (``t``, ``value``) to a series' ``samples``; whether a rate exists.

    ``samples`` holds (time, value) pairs flattened, oldest first; afterwards its first
    pair is the anchor (see the module docstring) and its last the new sample. A value
    below the latest is a counter reset: the series starts over. ``width`` is the bucket
    (``window / BUCKETS``). Per bucket, the first sample and the newest change point stay;
    other samples are dropped when the next one arrives, so the series holds at most
    :data:`MAX_SAMPLES` pairs at any report rate.
    """
    n = len(samples)
    if n:
        last = samples[-1]
        if value < last:
            del samples[:]  # counter reset: start over rather than report a negative burst
            n = 0
        elif value == last and n >= 4:
            # The common case, a counter that did not move: when the latest sample only
            # extends a flat run within its bucket, it moves forward (no allocation).
            bucket = t // width
            if (samples[-2] // width == bucket and samples[-4] // width == bucket
                    and samples[-3] == last):
                samples[-2] = t
                cutoff = t - window
                while len(samples) > 4 and samples[2] <= cutoff:
                    del samples[:2]
                return True
    samples.append(t)
    samples.append(value)
    if n == 0:
        return False
    bucket = t // width
    # The previous latest sample stays if it is the first of its bucket, or the bucket's
    # newest change point while nothing newer in the bucket has changed.
    while len(samples) >= 6:
        prev_bucket = samples[-4] // width
        if prev_bucket != samples[-6] // width:
            break  # first of its bucket
        prev = samples[-3]
        if prev == samples[-5] or (value != prev and bucket == prev_bucket):
            del samples[-4:-2]
        else:
            break
    cutoff = t - window
    while len(samples) > 4 and samples[2] <= cutoff:
        del samples[:2]
    return True


class _Series(Held):
    __slots__ = ("samples",)

    def __init__(self, subject: Subject) -> None:
        super().__init__(subject)
        self.samples = array("d")


class ThresholdEvaluator(HoldingEvaluator[ThresholdRule, _Series]):
    """Evaluates one :class:`ThresholdRule` on every report."""

    observes = True

    def __init__(self, rule: ThresholdRule) -> None:
        super().__init__(rule, float(rule.hold))
        self._read = compile_reader(rule.metric, rule.labels)
        if rule.above is not None:
            sign, bound = 1.0, rule.above
            clear = rule.clear_below if rule.clear_below is not None else bound
        elif rule.below is not None:
            sign, bound = -1.0, rule.below
            clear = rule.clear_above if rule.clear_above is not None else bound
        else:  # the loader never builds one; a hand-made rule must say which way
            raise ValueError(f"rule {rule.name}: a threshold needs above or below")
        # Comparisons on sign * value, so above and below share one code path.
        self._sign = sign
        self._fire_at = sign * bound
        self._clear_at = sign * clear
        self._bound = bound
        self._clear = clear
        self._op, self._clear_op = (">=", "<") if sign > 0 else ("<=", ">")
        spec = rule.rate or rule.increase
        self._window = float(spec.window) if spec is not None else 0.0
        self._width = self._window / BUCKETS
        self._mode = "rate" if rule.rate else "increase" if rule.increase else ""
        # A whole column may be passed over by its max (min) alone, unless the bound is so
        # large that comparing a report's integer with it differs from comparing its float.
        self._whole = abs(bound) < _EXACT_FLOATS
        # Rate / increase: per node, (bucket, subjects, values) of a report that found
        # every series flat, so that the same values in the same bucket can be passed over.
        self._quiet: dict[str, tuple[float, tuple[Subject, ...], tuple[float | None, ...]]] = {}
        self._what, self._unit = describe(rule.metric)

    @property
    def kind(self) -> str:
        """``threshold``, ``rate`` or ``increase``."""
        return self._mode or "threshold"

    def observe(self, view: NodeView, now: Now, out: list[Finding]) -> None:
        report = view.report
        if report is None:
            return
        subjects, values = self._read(frame_of(report))
        if not values:
            return
        if self._mode:
            self._observe_counters(view, subjects, values, now, out)
            return
        node = view.name
        states = self._states.get(node)
        if not states and self._whole:
            # The common case: nothing remembered and every value short of the bound.
            present: Sequence[float] = (cast("tuple[float, ...]", values) if None not in values
                                        else [v for v in values if v is not None])
            if not present:
                return
            # A NaN first makes max/min NaN, which is not < or >: the long way then.
            if self._sign > 0:
                if max(present) < self._bound:
                    return
            elif min(present) > self._bound:
                return
        if states is None:
            states = self._states[node] = {}
        sign, fire_at, clear_at = self._sign, self._fire_at, self._clear_at
        observed = report.sample_time_seconds
        for subject, raw in zip(subjects, values, strict=True):
            if raw is None:
                continue
            value = float(raw)
            signed = sign * value
            key = subject.text
            state = states.get(key)
            if state is None:
                if signed < fire_at:
                    continue  # nothing to remember
                state = states[key] = _Series(subject)
            self.step(node, state, signed >= fire_at, signed < clear_at, value, observed,
                      now, out)
            if not state.firing and state.since is None:
                del states[key]  # idle: a fresh state next time is the same
        if not states:
            del self._states[node]

    def _observe_counters(self, view: NodeView, subjects: tuple[Subject, ...],
                          values: tuple[float | None, ...], now: Now,
                          out: list[Finding]) -> None:
        node = view.name
        t = now.monotonic
        width = self._width
        bucket = t // width
        quiet = self._quiet.get(node)
        states = self._states.get(node)
        if (quiet is not None and states is not None and quiet[2] == values
                and quiet[1] == subjects):
            # Nothing moved since the last report, which found every series flat over its
            # window (a rate and increase of 0, short of the bound), nothing firing or
            # pending. In the same bucket a full pass would only move the latest samples'
            # times within it, which no result depends on. In a new bucket the samples
            # must still be kept (the anchors of a later change), but a counter is
            # monotonic: a series whose anchor equals its latest value is equal all
            # through, so every rate and increase stays 0 and nothing can fire.
            if quiet[0] != bucket:
                for subject, raw in zip(subjects, values, strict=True):
                    if raw is not None:
                        slide(states[subject.text].samples, t, float(raw), self._window,
                              width)
                self._quiet[node] = (bucket, subjects, values)
            return
        if states is None:
            states = self._states[node] = {}
        sign, fire_at, clear_at = self._sign, self._fire_at, self._clear_at
        window = self._window
        increase = self._mode == "increase"
        observed = view.report.sample_time_seconds if view.report is not None else 0.0
        flat = fire_at > 0
        for subject, raw in zip(subjects, values, strict=True):
            if raw is None:
                continue
            value = float(raw)
            state = states.get(subject.text)
            if state is None:
                state = states[subject.text] = _Series(subject)
            samples = state.samples
            if not slide(samples, t, value, window, width):
                flat = False
                continue
            if increase:
                derived = value - samples[1]
            else:
                span = t - samples[0]
                if span <= 0:
                    flat = False
                    continue
                derived = (value - samples[1]) / span
            signed = sign * derived
            if signed < fire_at and not state.firing and state.since is None:
                if derived != 0.0:
                    flat = False
                continue  # the common case: quiet, nothing pending
            flat = False
            self.step(node, state, signed >= fire_at, signed < clear_at, derived, observed,
                      now, out)
        if flat:
            self._quiet[node] = (bucket, subjects, values)
        elif quiet is not None:
            del self._quiet[node]

    def forget_node(self, node: str) -> None:
        super().forget_node(node)
        self._quiet.pop(node, None)

    def _describe(self, state: _Series, value: float) -> str:
        subject = state.subject.human
        unit = f" {self._unit}" if self._unit else ""
        if self._mode == "rate":
            return f"{subject} {self._what} rate {format_number(value)}{unit}/s"
        if self._mode == "increase":
            return f"{subject} {self._what} increased by {format_number(value)}{unit}"
        return f"{subject} {self._what} {format_number(value)}{unit}"

    def _suffix(self) -> str:
        parts = []
        if self._mode:
            parts.append(f"over {format_duration(self._window)}")
        if self._hold:
            parts.append(f"for {format_duration(self._hold)}")
        return (" " + " ".join(parts)) if parts else ""

    def firing_message(self, state: _Series) -> str:
        return (f"{self._describe(state, state.value)} {self._op} "
                f"{format_number(self._bound)}{self._suffix()}")

    def clear_message(self, state: _Series, value: float) -> str:
        return (f"{self._describe(state, value)} {self._clear_op} "
                f"{format_number(self._clear)}")
