"""Baseline rules: a dynamic threshold learnt per series.

Each series keeps an exponentially weighted mean and variance. The weight of a new
sample is time-based, ``alpha = 1 - exp(-dt / window)``, so the baseline forgets at the
same speed whatever the report interval; while few samples have been seen it is at least
``1 / n``, which makes the early estimates the plain mean and variance instead of being
biased towards the first sample. A value is anomalous when
``|value - mean| > max(sigmas * std, min_delta)`` (one side only with ``direction``),
judged against the baseline *before* the value is folded in. Nothing fires during the
warm-up (``min_samples`` samples and ``warmup`` time); a series silent for longer than
the window starts over, warm-up included.
"""

from __future__ import annotations

import math
from math import expm1

from sn_monitor.rules.base import (
    Finding,
    Held,
    HoldingEvaluator,
    Now,
    format_duration,
    format_number,
)
from sn_monitor.rules.series import Subject, compile_reader, describe, frame_of
from sn_monitor.rules.spec import BaselineRule
from sn_monitor.rules.view import NodeView


class _Series(Held):
    __slots__ = ("first", "last", "limit", "mean", "n", "var")

    def __init__(self, subject: Subject) -> None:
        super().__init__(subject)
        self.n = 0
        self.mean = 0.0
        self.var = 0.0
        self.first = 0.0
        self.last = 0.0
        self.limit = 0.0

    def restart(self, t: float) -> None:
        self.n = 0
        self.mean = self.var = 0.0
        self.first = self.last = t


class BaselineEvaluator(HoldingEvaluator[BaselineRule, _Series]):
    """Evaluates one :class:`BaselineRule` on every report."""

    observes = True

    def __init__(self, rule: BaselineRule) -> None:
        super().__init__(rule, float(rule.hold))
        self._read = compile_reader(rule.metric, rule.labels)
        spec = rule.baseline
        self._window = float(spec.window)
        self._sigmas = spec.sigmas
        self._min_delta = spec.min_delta
        self._min_samples = spec.min_samples
        self._warmup = rule.warmup
        direction = rule.direction
        self._up = direction in ("above", "both")
        self._down = direction in ("below", "both")
        self._what, self._unit = describe(rule.metric)

    def observe(self, view: NodeView, now: Now, out: list[Finding]) -> None:
        report = view.report
        if report is None:
            return
        node = view.name
        states = self._states.get(node)
        if states is None:
            states = self._states[node] = {}
        t = now.monotonic
        window = self._window
        subjects, values = self._read(frame_of(report))
        for subject, raw in zip(subjects, values, strict=True):
            if raw is None:
                continue
            value = float(raw)
            if not math.isfinite(value):
                continue  # one bad sample must not poison a baseline for good
            state = states.get(subject.text)
            if state is None:
                state = states[subject.text] = _Series(subject)
                state.restart(t)
            elif t - state.last > window:
                self._start_over(node, state, value, now, out)
            if state.n >= self._min_samples and t - state.first >= self._warmup:
                deviation = value - state.mean
                limit = max(self._sigmas * math.sqrt(state.var), self._min_delta)
                anomalous = (self._up and deviation > limit) or (
                    self._down and -deviation > limit)
                if anomalous or state.firing or state.since is not None:
                    state.limit = limit
                    self.step(node, state, anomalous, not anomalous, value,
                              report.sample_time_seconds, now, out)
            # learn (inline: this runs for every GPU of every report); see the docstring
            alpha = max(-expm1(-(t - state.last) / window), 1.0 / (state.n + 1))
            diff = value - state.mean
            increment = alpha * diff
            state.mean += increment
            state.var = (1.0 - alpha) * (state.var + diff * increment)
            state.n += 1
            state.last = t

    def _start_over(self, node: str, state: _Series, value: float, now: Now,
                    out: list[Finding]) -> None:
        if state.since is not None:
            state.since = None
            self._pending.pop((node, state.subject.text), None)
        if state.firing:
            state.firing = False
            self.resolve(node, state.subject.text, value,
                         f"{state.subject.human} {self._what}: no data for longer than "
                         f"{format_duration(self._window)}; the baseline starts over",
                         now, out)
        state.restart(now.monotonic)

    def firing_message(self, state: _Series) -> str:
        unit = f" {self._unit}" if self._unit else ""
        deviation = state.value - state.mean
        side = "above" if deviation > 0 else "below"
        hold = f" for {format_duration(self._hold)}" if self._hold else ""
        return (f"{state.subject.human} {self._what} {format_number(state.value)}{unit} is "
                f"{format_number(abs(deviation))}{unit} {side} its baseline "
                f"{format_number(state.mean)}{unit} (limit {format_number(state.limit)}{unit}, "
                f"{format_number(self._sigmas)} sigma over "
                f"{format_duration(self._window)}){hold}")

    def clear_message(self, state: _Series, value: float) -> str:
        unit = f" {self._unit}" if self._unit else ""
        return (f"{state.subject.human} {self._what} {format_number(value)}{unit} is back "
                f"within {format_number(state.limit)}{unit} of its baseline "
                f"{format_number(state.mean)}{unit}")
