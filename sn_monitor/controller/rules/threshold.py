"""Threshold rules: a fixed bound on a metric, or on its per-second rate or its increase.

Rates and increases are computed per series from a small ring of (controller monotonic
time, counter value) pairs covering the window, anchored at the newest sample at or
before the window's start. A counter that goes down was reset (the agent or the driver
restarted): the ring starts over and no rate is reported until two samples exist, so a
reset never looks like a burst.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from sn_monitor.controller.rules.base import (
    Finding,
    Held,
    HoldingEvaluator,
    Now,
    format_duration,
    format_number,
)
from sn_monitor.controller.rules.series import Subject, compile_accessor, describe
from sn_monitor.controller.rules.spec import ThresholdRule
from sn_monitor.controller.state import NodeView

RING_LIMIT: Final = 1024
"""Most samples kept per series: a window longer than this many reports loses its oldest."""


class _Series(Held):
    __slots__ = ("ring",)

    def __init__(self, subject: Subject) -> None:
        super().__init__(subject)
        self.ring: deque[tuple[float, float]] = deque(maxlen=RING_LIMIT)


class ThresholdEvaluator(HoldingEvaluator[ThresholdRule, _Series]):
    """Evaluates one :class:`ThresholdRule` on every report."""

    observes = True

    def __init__(self, rule: ThresholdRule) -> None:
        super().__init__(rule, float(rule.hold))
        self._read = compile_accessor(rule.metric, rule.labels)
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
        self._mode = "rate" if rule.rate else "increase" if rule.increase else ""
        self._what, self._unit = describe(rule.metric)

    @property
    def kind(self) -> str:
        """``threshold``, ``rate`` or ``increase``."""
        return self._mode or "threshold"

    def observe(self, view: NodeView, now: Now, out: list[Finding]) -> None:
        report = view.report
        if report is None:
            return
        node = view.name
        states = self._states.get(node)
        if states is None:
            states = self._states[node] = {}
        sign, fire_at, clear_at = self._sign, self._fire_at, self._clear_at
        observed = report.sample_time_seconds
        for subject, raw in self._read(report):
            state = states.get(subject.text)
            if self._mode:
                if state is None:
                    state = states[subject.text] = _Series(subject)
                derived = self._derive(state.ring, now.monotonic, raw)
                if derived is None:
                    continue
                value = derived
            else:
                value = raw
            signed = sign * value
            if state is None:
                if signed < fire_at:
                    continue  # the common case: nothing to remember
                state = states[subject.text] = _Series(subject)
            self.step(node, state, signed >= fire_at, signed < clear_at, value, observed,
                      now, out)

    def _derive(self, ring: deque[tuple[float, float]], t: float, value: float) -> float | None:
        if ring and value < ring[-1][1]:
            ring.clear()  # counter reset: start over rather than report a negative burst
        ring.append((t, value))
        cutoff = t - self._window
        while len(ring) > 2 and ring[1][0] <= cutoff:
            ring.popleft()
        if len(ring) < 2:
            return None
        t0, v0 = ring[0]
        if self._mode == "increase":
            return value - v0
        span = t - t0
        return (value - v0) / span if span > 0 else None

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
