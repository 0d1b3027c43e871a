"""What rules produce (findings) and the bookkeeping every kind of rule shares.

A rule's evaluator keeps, per node, what it needs between reports, and reports
*transitions* only: one ``firing`` finding when a (rule, node, subject) starts firing, one
``resolved`` when it stops. :class:`Evaluator` owns the set of firing subjects so that no
kind can emit a transition twice.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Generic, Literal, NamedTuple, TypeVar

from sn_monitor.rules.series import Subject
from sn_monitor.rules.spec import Rule
from sn_monitor.rules.view import NodeView

Status = Literal["firing", "resolved"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One transition of one rule on one subject of one node.

    ``observed_wall`` is when the fault was first seen by the agent (the report's sample
    time, the event's time): the start of the detection latency. ``detected_wall`` is the
    controller's wall clock when the rule fired or resolved. ``count`` is how many matching
    events an event incident has absorbed (1 for other kinds). ``source`` says who told
    the controller when it was not a report (``alertmanager:<token name>``), for the
    audit trail.
    """

    rule: str
    kind: str
    node: str
    subject: str
    gpu: int | None
    status: Status
    severity: str
    actions: tuple[str, ...]
    dry_run: bool
    value: float | None
    message: str
    observed_wall: float
    detected_wall: float
    count: int = 1
    source: str = ""


class Now(NamedTuple):
    """The controller's clock read once per engine call, shared by every rule.

    A named tuple: one is made per report, and a frozen dataclass costs several times
    as much to build.
    """

    monotonic: float
    wall: float


R = TypeVar("R", bound=Rule)


class Evaluator(Generic[R]):
    """Base of one rule's evaluator: the firing set and the transitions.

    Subclasses implement :meth:`observe` (a node's new report) and/or :meth:`sweep` (time
    passing) and call :meth:`fire` / :meth:`resolve`, which ignore repeats.
    """

    observes: ClassVar[bool] = False
    """Whether :meth:`observe` does anything (the engine calls only those that do)."""
    sweeps: ClassVar[bool] = False
    """Whether :meth:`sweep` does anything."""
    events_only: ClassVar[bool] = False
    """Whether :meth:`observe` reads a report's events only (nothing to do without any)."""

    def __init__(self, rule: R) -> None:
        self.rule = rule
        self._actions = tuple(rule.actions)
        self._firing: dict[str, dict[str, Finding]] = {}
        self._scope = [(label, re.compile(expr)) for label, expr in rule.scope.items()]

    @property
    def scoped(self) -> bool:
        """Whether the rule applies to some nodes only (see :meth:`applies`)."""
        return bool(self._scope)

    def applies(self, view: NodeView) -> bool:
        """Whether ``view``'s node is in this rule's scope (its labels match)."""
        for label, pattern in self._scope:
            value = view.labels.get(label)
            if value is None or pattern.fullmatch(value) is None:
                return False
        return True

    def set_rule(self, rule: R) -> None:
        """Take a rule that detects the same thing but reads differently (reload)."""
        self.rule = rule
        self._actions = tuple(rule.actions)
        for subjects in self._firing.values():
            for key, finding in subjects.items():
                subjects[key] = dataclasses.replace(
                    finding, severity=rule.severity or "warning", actions=self._actions,
                    dry_run=rule.dry_run)

    @property
    def kind(self) -> str:
        """The kind reported in findings."""
        return self.rule.kind

    def observe(self, view: NodeView, now: Now, out: list[Finding]) -> None:
        """A new report from ``view``'s node arrived; append transitions to ``out``."""

    def sweep(self, views: Mapping[str, NodeView], now: Now, out: list[Finding]) -> None:
        """Time passed; append transitions that time alone causes to ``out``."""

    def is_firing(self, node: str, subject: str) -> bool:
        """Whether (node, subject) is firing now."""
        subjects = self._firing.get(node)
        return subjects is not None and subject in subjects

    def fire(self, node: str, subject: Subject, value: float | None, message: str,
             observed_wall: float, now: Now, out: list[Finding], count: int = 1) -> None:
        """Start firing (node, subject) unless it already is."""
        subjects = self._firing.setdefault(node, {})
        if subject.text in subjects:
            return
        rule = self.rule
        finding = Finding(
            rule=rule.name, kind=self.kind, node=node, subject=subject.text, gpu=subject.gpu,
            status="firing", severity=rule.severity or "warning", actions=self._actions,
            dry_run=rule.dry_run, value=value, message=message,
            observed_wall=observed_wall, detected_wall=now.wall, count=count,
        )
        subjects[subject.text] = finding
        out.append(finding)

    def resolve(self, node: str, subject: str, value: float | None, message: str,
                now: Now, out: list[Finding], observed_wall: float | None = None) -> None:
        """Stop firing (node, subject) if it is."""
        subjects = self._firing.get(node)
        if subjects is None:
            return
        started = subjects.pop(subject, None)
        if started is None:
            return
        if not subjects:
            del self._firing[node]
        out.append(dataclasses.replace(
            started, status="resolved", value=value, message=message,
            observed_wall=now.wall if observed_wall is None else observed_wall,
            detected_wall=now.wall))

    def cancel(self, node: str, gpu: int | None, message: str, now: Now,
               out: list[Finding]) -> None:
        """A repair cleared what fires on ``node`` (on ``gpu``; None: every subject).

        Only kinds whose faults do not clear by themselves (events) take it; the others
        see the repair in the next readings.
        """

    def update_count(self, node: str, subject: str, count: int) -> None:
        """Record more events absorbed by a firing incident (no new transition)."""
        subjects = self._firing.get(node)
        if subjects is not None and subject in subjects:
            subjects[subject] = dataclasses.replace(subjects[subject], count=count)

    def restore(self, finding: Finding) -> bool:
        """Take back a firing finding after a controller restart; whether this kind can.

        Kinds that see their fault again in the next reports cannot (they rediscover it,
        or the controller resolves the inherited incident after a grace period).
        """
        return False

    def firing(self) -> Iterator[Finding]:
        """Every firing finding of this rule."""
        for subjects in self._firing.values():
            yield from subjects.values()

    def resolve_all(self, message: str, now: Now, out: list[Finding]) -> None:
        """Resolve everything this rule has firing (the rule was removed or changed)."""
        for node, subjects in list(self._firing.items()):
            for subject in list(subjects):
                self.resolve(node, subject, None, message, now, out)

    def forget_node(self, node: str) -> None:
        """Drop everything about ``node`` without transitions (it left the controller)."""
        self._firing.pop(node, None)


def format_number(value: float) -> str:
    """``85`` for whole numbers, else up to 4 significant digits: for messages."""
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def format_duration(seconds: float) -> str:
    """``5s``, ``2m``, ``1h30m``, ``7d``: for messages."""
    if seconds < 60:
        return f"{format_number(seconds)}s"
    if seconds < 3600:
        minutes, rest = divmod(seconds, 60)
        return f"{int(minutes)}m" + (f"{format_number(rest)}s" if rest else "")
    if seconds < 2 * 86400:
        hours, rest = divmod(seconds, 3600)
        return f"{int(hours)}h" + (f"{int(rest // 60)}m" if rest >= 60 else "")
    days, rest = divmod(seconds, 86400)
    return f"{int(days)}d" + (f"{int(rest // 3600)}h" if rest >= 3600 else "")


class Held:
    """A series' state for rules that must hold a condition ``for`` a while."""

    __slots__ = ("firing", "observed", "since", "subject", "value")

    def __init__(self, subject: Subject) -> None:
        self.subject = subject
        self.since: float | None = None
        self.observed = 0.0
        self.value = 0.0
        self.firing = False


H = TypeVar("H", bound=Held)


class HoldingEvaluator(Evaluator[R], Generic[R, H]):
    """An evaluator whose condition must hold ``for`` a time before it fires.

    ``for`` runs on the controller's monotonic clock from the first report that met the
    condition; it completes at the first observe or sweep at or after that time, so a
    timer completes even when no new report arrives. Nodes in state ``lost`` complete no
    timers. A series that stops being reported keeps its state: a missing value is not
    evidence that a fault has cleared.
    """

    sweeps = True

    def __init__(self, rule: R, hold: float) -> None:
        super().__init__(rule)
        self._hold = hold
        self._states: dict[str, dict[str, H]] = {}
        self._pending: dict[tuple[str, str], H] = {}

    def firing_message(self, state: H) -> str:
        """The message of a firing finding for ``state`` (its latest value)."""
        raise NotImplementedError

    def clear_message(self, state: H, value: float) -> str:
        """The message of a resolved finding."""
        raise NotImplementedError

    def step(self, node: str, state: H, triggered: bool, cleared: bool, value: float,
             observed_wall: float, now: Now, out: list[Finding]) -> None:
        """Advance ``state`` with a new value: pending, firing, or resolved."""
        if state.firing:
            if cleared:
                state.firing = False
                self.resolve(node, state.subject.text, value, self.clear_message(state, value),
                             now, out, observed_wall)
            else:
                state.value = value
            return
        if triggered:
            state.value = value
            if state.since is None:
                state.since = now.monotonic
                state.observed = observed_wall
            if now.monotonic - state.since >= self._hold:
                self._start(node, state, now, out)
            else:
                self._pending[(node, state.subject.text)] = state
        elif state.since is not None:
            state.since = None
            self._pending.pop((node, state.subject.text), None)

    def _start(self, node: str, state: H, now: Now, out: list[Finding]) -> None:
        state.firing = True
        state.since = None
        self._pending.pop((node, state.subject.text), None)
        self.fire(node, state.subject, state.value, self.firing_message(state),
                  state.observed, now, out)

    def sweep(self, views: Mapping[str, NodeView], now: Now, out: list[Finding]) -> None:
        """Complete ``for`` timers that time alone has completed."""
        if not self._pending:
            return
        for (node, _), state in list(self._pending.items()):
            view = views.get(node)
            if view is None or view.state == "lost" or state.since is None:
                continue
            if now.monotonic - state.since >= self._hold:
                self._start(node, state, now, out)

    def forget_node(self, node: str) -> None:
        super().forget_node(node)
        self._states.pop(node, None)
        for key in [k for k in self._pending if k[0] == node]:
            del self._pending[key]
