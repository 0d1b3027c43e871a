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
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import attrgetter, contains, gt, lt, sub, truediv
from typing import Any, Final, TypeGuard

from sn_monitor.model import GpuReport
from sn_monitor.rules.base import (
    Finding,
    Held,
    HoldingEvaluator,
    Now,
    format_duration,
    format_number,
)
from sn_monitor.rules.series import (
    DERIVED_GPU_METRICS,
    DERIVED_GPU_PARTS,
    Frame,
    Subject,
    compile_column,
    compile_reader,
    describe,
    frame_of,
    metric_family,
)
from sn_monitor.rules.spec import ThresholdRule
from sn_monitor.rules.view import NodeView

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


class _Quiet:
    """A node's report that found every rate / increase series flat, nothing pending.

    The same values in the same bucket can be passed over; in a new bucket, the series'
    ``samples`` (None where no value) are slid on.
    """

    __slots__ = ("bucket", "samples", "subjects", "values")

    def __init__(self, bucket: float, subjects: tuple[Subject, ...],
                 values: tuple[float | None, ...], samples: list[array[float] | None]) -> None:
        self.bucket = bucket
        self.subjects = subjects
        self.values = values
        self.samples = samples


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
        # Rate / increase: per node, the last report if it found every series flat.
        self._quiet: dict[str, _Quiet] = {}
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
            self._observe_counters(view.name, subjects, values, report.sample_time_seconds,
                                   now, out)
        else:
            self._observe_levels(view.name, subjects, values, report.sample_time_seconds,
                                 now, out)

    def _observe_levels(self, node: str, subjects: tuple[Subject, ...],
                        values: tuple[float | None, ...], observed: float, now: Now,
                        out: list[Finding]) -> None:
        """A plain threshold: each value against the bound; a state only where one is met."""
        states = self._states.get(node)
        if not states and self._whole and _short_of(values, self._sign, self._bound):
            return  # the common case: nothing remembered and every value short of the bound
        if states is None:
            states = self._states[node] = {}
        sign, fire_at, clear_at = self._sign, self._fire_at, self._clear_at
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

    def _observe_counters(self, node: str, subjects: tuple[Subject, ...],
                          values: tuple[float | None, ...], observed: float, now: Now,
                          out: list[Finding]) -> None:
        """A rate or an increase: each value slid into its series, the derived value judged."""
        t = now.monotonic
        width = self._width
        bucket = t // width
        quiet = self._quiet.get(node)
        states = self._states.get(node)
        if (quiet is not None and states is not None and quiet.values == values
                and quiet.subjects == subjects):
            self._keep_anchors(quiet, t, bucket)
            return
        if states is None:
            states = self._states[node] = {}
        sign, fire_at, clear_at = self._sign, self._fire_at, self._clear_at
        window = self._window
        increase = self._mode == "increase"
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
                flat = False  # a first sample, or the first after a counter reset
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
        self._remember_quiet(node, flat, bucket, subjects, values, states)

    def _keep_anchors(self, quiet: _Quiet, t: float, bucket: float) -> None:
        """The same values as a report that found every series flat: nothing can fire.

        Nothing moved since that report, which found every series flat over its window (a
        rate and increase of 0, short of the bound), nothing firing or pending. In the
        same bucket a full pass would only move the latest samples' times within it, which
        no result depends on. In a new bucket the samples must still be kept (the anchors
        of a later change), but a counter is monotonic: a series whose anchor equals its
        latest value is equal all through, so every rate and increase stays 0 and nothing
        can fire.
        """
        if quiet.bucket == bucket:
            return
        window, width = self._window, self._width
        for samples, raw in zip(quiet.samples, quiet.values, strict=True):
            if samples is not None and raw is not None:
                slide(samples, t, float(raw), window, width)
        quiet.bucket = bucket

    def _remember_quiet(self, node: str, flat: bool, bucket: float,
                        subjects: tuple[Subject, ...], values: tuple[float | None, ...],
                        states: dict[str, _Series]) -> None:
        """Keep (or drop) what lets the next report with the same values be passed over."""
        if flat:
            self._quiet[node] = _Quiet(bucket, subjects, values, [
                None if raw is None else states[subject.text].samples
                for subject, raw in zip(subjects, values, strict=True)])
        else:
            self._quiet.pop(node, None)

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


class ThresholdScreen:
    """Tells, in one pass over a report, which plain threshold rules it leaves untouched.

    A plain threshold rule (no rate, no increase) with nothing pending or firing on a
    node, whose bound is within the exact integers of a float, does nothing with a report
    in which every value of its metric falls short of the bound:
    :meth:`ThresholdEvaluator.observe` returns at once, changing nothing. That is the
    common case, for every such rule on every report, and the screen finds it for all of
    them together: the GPU fields they read come out of the report in one pass, and each
    rule's column (a margin or a ratio computed from two of them) is compared with its
    bound by ``max`` or ``min``, as the rule itself would. The engine passes over the
    rules found quiet. Any other case (a value at the bound, a state kept, a missing
    value, a NaN first in a column) is judged rule by rule, and a rule not found quiet
    reads the report itself: the screen changes what is computed, never what is found
    (tests/unit/test_rules_screen.py runs the engine with and without it).
    """

    def __init__(self, members: Sequence[ThresholdEvaluator]) -> None:
        self.members = tuple(members)
        fields: dict[str, int] = {}  # the GPU fields read, by their column in a frame
        self._checks = [_check_of(member, fields) for member in self.members]
        self._fields = tuple(fields)
        self._get: Callable[[GpuReport], Any] = attrgetter(*fields) if fields else _nothing
        self._states = tuple(check[0] for check in self._checks)
        self._all_quiet = [True] * len(self._checks)
        # The same checks grouped for the common case (all quiet), in as few calls as can be:
        # plain GPU fields above (up) or below (down) a bound, margins and ratios of two
        # fields, and the other families' columns.
        self._up: list[int] = []
        self._up_bounds: list[float] = []
        self._down: list[int] = []
        self._down_bounds: list[float] = []
        self._pairs: list[tuple[int, int, float, float, Callable[[Any, Any], Any]]] = []
        self._others: list[tuple[str, Callable[..., object], float, float]] = []
        for _, sign, bound, kind, i, j, extra in self._checks:
            if kind == "field":
                (self._up if sign > 0 else self._down).append(i)
                (self._up_bounds if sign > 0 else self._down_bounds).append(bound)
            elif kind in ("margin", "ratio"):
                self._pairs.append((i, j, sign, bound, sub if kind == "margin" else truediv))
            else:
                self._others.append((kind, extra, sign, bound))

    @staticmethod
    def screens(evaluator: object) -> TypeGuard[ThresholdEvaluator]:
        """Whether ``evaluator`` is a rule the screen can judge."""
        return (isinstance(evaluator, ThresholdEvaluator) and not evaluator._mode
                and evaluator._whole)

    def quiet(self, node: str, frame: Frame) -> Sequence[bool]:
        """Per member, whether the report of ``frame`` leaves it as it is on ``node``."""
        if not any(map(contains, self._states, repeat(node))):
            try:
                if self._all_short(frame):
                    return self._all_quiet
            except (TypeError, ValueError, ZeroDivisionError):
                pass  # a None (a missing value), an empty column, a zero denominator
        return self.judge(node, frame)

    def _all_short(self, frame: Frame) -> bool:
        """Whether every member's column is short of its bound; raises where one cannot tell.

        The comparisons are the members' own: ``max(column) < bound`` (``min`` and ``>``
        for ``below``), on the same values.
        """
        columns = frame.gpu_columns(self._fields, self._get) if self._fields else []
        if self._up and not all(map(lt, map(max, [columns[i] for i in self._up]),
                                    self._up_bounds)):
            return False
        if self._down and not all(map(gt, map(min, [columns[i] for i in self._down]),
                                      self._down_bounds)):
            return False
        for i, j, sign, bound, op in self._pairs:
            if sign > 0:
                if not max(map(op, columns[i], columns[j])) < bound:
                    return False
            elif not min(map(op, columns[i], columns[j])) > bound:
                return False
        for metric, compute, sign, bound in self._others:
            values = frame.column(metric, compute)  # type: ignore[arg-type]
            if not (max(values) < bound if sign > 0  # type: ignore[operator,type-var]
                    else min(values) > bound):  # type: ignore[operator,type-var]
                return False
        return True

    def judge(self, node: str, frame: Frame) -> list[bool]:
        """Per member, whether the report leaves it as it is: each member on its own."""
        columns = frame.gpu_columns(self._fields, self._get) if self._fields else []
        out: list[bool] = []
        for states, sign, bound, kind, i, j, extra in self._checks:
            if states.get(node):
                out.append(False)  # something pending or firing: the rule looks itself
                continue
            values: Sequence[object]
            if kind == "field":
                values = columns[i]
            elif kind == "margin":
                top, now = columns[i], columns[j]
                values = (tuple(map(extra, frame.gpus())) if None in top or None in now
                          else tuple(map(sub, top, now)))
            elif kind == "ratio":
                num, den = columns[i], columns[j]
                values = (tuple(map(extra, frame.gpus()))
                          if None in num or None in den or not all(den)
                          else tuple(map(truediv, num, den)))
            else:  # kind is the metric
                values = frame.column(kind, extra)  # type: ignore[arg-type]
            out.append(_short_of(values, sign, bound))
        return out


_Check = tuple[dict[str, dict[str, _Series]], float, float, str, int, int,
               Callable[..., object]]
"""What the screen checks of a member: (its states by node, sign, bound, kind, i, j, extra),
kind one of "field" (GPU column i), "margin" / "ratio" (from GPU columns i and j; ``extra``
the metric's own per-GPU function, for columns with a None or a zero), or the metric itself
for other families (``extra`` computes its column)."""


def _check_of(member: ThresholdEvaluator, fields: dict[str, int]) -> _Check:
    """What the screen checks of ``member``; the GPU fields it reads are added to ``fields``.

    The member's own attributes: the screen is its fast path (one module).
    """
    metric = member.rule.metric
    name = metric[4:]
    head = (member._states, member._sign, member._bound)
    if metric_family(metric) != "gpu":
        return (*head, metric, 0, 0, compile_column(metric))
    if name in DERIVED_GPU_PARTS:
        kind, a, b = DERIVED_GPU_PARTS[name]
        return (*head, kind, fields.setdefault(a, len(fields)),
                fields.setdefault(b, len(fields)), DERIVED_GPU_METRICS[name])
    return (*head, "field", fields.setdefault(name, len(fields)), 0, _nothing)


def _nothing(*_: object) -> None:
    return None


def _short_of(values: Sequence[object], sign: float, bound: float) -> bool:
    """Whether every value (None: missing) is short of ``bound`` (above it when sign < 0)."""
    present = ([v for v in values if v is not None] if None in values
               else values)
    if not present:
        return True
    # A NaN first makes max/min NaN, which is neither < nor >: not short, then.
    if sign > 0:
        return max(present) < bound  # type: ignore[type-var,operator]
    return min(present) > bound  # type: ignore[type-var,operator]
