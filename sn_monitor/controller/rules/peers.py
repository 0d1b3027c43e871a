"""Peer rules: a node compared with the median of its group (its job, its supernode).

A node's value is the mean of the metric over its subjects (its GPUs) in its latest
report; the group is the nodes sharing the value of one node label. A group is judged
only when at least ``min_group`` of its nodes have data and are not lost; a node that can
no longer be compared (it left the group, the group shrank) resolves, since a straggler
needs peers to straggle behind. ``below_median_by: 0.3`` fires at or below 70 % of the
median; ``above_median_by: 0.3`` at or above 130 %.

Comparing every node with its group costs a pass over the fleet (80 ms at 8,192 nodes), so
it runs every :data:`PEERS_EVERY` seconds at most, or a tenth of the rule's ``for`` if
that is shorter; sweeps in between only complete ``for`` timers. A straggler with
``for: 2m`` fires within 2 minutes + 5 s, and resolves within 5 s of catching up.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Final

from sn_monitor.controller.rules.base import (
    Finding,
    Held,
    HoldingEvaluator,
    Now,
    format_duration,
    format_number,
)
from sn_monitor.controller.rules.series import NODE, compile_accessor, describe
from sn_monitor.controller.rules.spec import PeersRule
from sn_monitor.controller.state import NodeView
from sn_monitor.model import Report

PEERS_EVERY: Final = 5.0
"""Seconds between two comparisons of the fleet at most (see the module docstring)."""


class _Node(Held):
    __slots__ = ("group", "median", "size")

    def __init__(self) -> None:
        super().__init__(NODE)
        self.median = 0.0
        self.group = ""
        self.size = 0


class PeersEvaluator(HoldingEvaluator[PeersRule, _Node]):
    """Evaluates one :class:`PeersRule` on every sweep."""

    def __init__(self, rule: PeersRule) -> None:
        super().__init__(rule, float(rule.hold))
        self._read = compile_accessor(rule.metric, rule.labels)
        spec = rule.peers
        self._label = spec.group
        self._min_group = spec.min_group
        if spec.below_median_by is not None:
            self._factor, self._sign = 1.0 - spec.below_median_by, -1.0
        elif spec.above_median_by is not None:
            self._factor, self._sign = 1.0 + spec.above_median_by, 1.0
        else:
            raise ValueError(f"rule {rule.name}: peers needs below_median_by or above_median_by")
        self._what, self._unit = describe(rule.metric)
        self._means: dict[str, tuple[Report, float | None]] = {}
        self._every = min(PEERS_EVERY, float(rule.hold) / 10)
        self._compared_at: float | None = None

    def _mean(self, node: str, report: Report) -> float | None:
        cached = self._means.get(node)
        if cached is not None and cached[0] is report:
            return cached[1]
        values = self._read(report)
        mean = sum(v for _, v in values) / len(values) if values else None
        self._means[node] = (report, mean)
        return mean

    def sweep(self, views: Mapping[str, NodeView], now: Now, out: list[Finding]) -> None:
        last = self._compared_at
        if last is not None and 0 <= now.monotonic - last < self._every:
            super().sweep(views, now, out)  # only the ``for`` timers time has completed
            return
        self._compared_at = now.monotonic
        groups: dict[str, list[tuple[str, float, float]]] = {}
        for name, view in views.items():
            report = view.report
            if report is None or view.state == "lost" or not self.applies(view):
                continue
            group = view.labels.get(self._label)
            if group is None:
                continue
            mean = self._mean(name, report)
            if mean is not None:
                groups.setdefault(group, []).append((name, mean, report.sample_time_seconds))
        judged: set[str] = set()
        for group, members in groups.items():
            if len(members) < self._min_group:
                continue
            median = statistics.median(v for _, v, _ in members)
            if median <= 0:
                continue  # an idle group (a job between steps): nobody is behind anybody
            bound = self._sign * median * self._factor
            for name, value, observed in members:
                outlier = self._sign * value >= bound
                states = self._states.get(name)
                state = states.get("") if states else None
                if state is None:
                    if not outlier:
                        continue  # the common case: in line with its peers, nothing held
                    state = self._states.setdefault(name, {})[""] = _Node()
                judged.add(name)
                state.median, state.group, state.size = median, group, len(members)
                self.step(name, state, outlier, not outlier, value, observed, now, out)
                if not state.firing and state.since is None:
                    del self._states[name]  # idle again: a fresh state next time is the same
        for name, states in self._states.items():
            if name in judged:
                continue
            state = states.get("")
            if state is None:
                continue
            if state.since is not None:
                state.since = None
                self._pending.pop((name, ""), None)
            if state.firing:
                state.firing = False
                self.resolve(name, "", None, f"no longer compared with its {self._label} "
                             f"(fewer than {self._min_group} peers with data)", now, out)
        for name in [n for n in self._means if n not in views]:
            del self._means[name]

    def _side(self) -> str:
        return "below" if self._sign < 0 else "above"

    def firing_message(self, state: _Node) -> str:
        unit = f" {self._unit}" if self._unit else ""
        share = abs(1.0 - state.value / state.median) * 100 if state.median else 0.0
        hold = f" for {format_duration(self._hold)}" if self._hold else ""
        return (f"node {self._what} {format_number(state.value)}{unit} is "
                f"{share:.0f}% {self._side()} the median {format_number(state.median)}{unit} "
                f"of {state.size} nodes ({self._label}={state.group}){hold}")

    def clear_message(self, state: _Node, value: float) -> str:
        unit = f" {self._unit}" if self._unit else ""
        return (f"node {self._what} {format_number(value)}{unit} is back near the median "
                f"{format_number(state.median)}{unit} ({self._label}={state.group})")

    def forget_node(self, node: str) -> None:
        super().forget_node(node)
        self._means.pop(node, None)
