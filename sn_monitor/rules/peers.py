"""Peer rules: a node compared with the median of its group (its job, its supernode).

A node's value is the mean of the metric over its subjects (its GPUs) in its latest
report; the group is the nodes sharing the value of one node label. A group is judged
only when at least ``min_group`` of its nodes have data and are not lost; a node that can
no longer be compared (it left the group, the group shrank) resolves, since a straggler
needs peers to straggle behind. ``below_median_by: 0.3`` fires at or below 70 % of the
median; ``above_median_by: 0.3`` at or above 130 %.

Comparing every node with its group costs a pass over the fleet (50-130 ms at 8,192
nodes), so it runs every :data:`PEERS_EVERY` seconds at most, or a tenth of the rule's
``for`` if that is shorter; sweeps in between only complete ``for`` timers. And the pass
is cut into slices of :data:`PASS_SLICE` nodes, one slice a sweep: the sweep holds the
rule engine (and so the reports coming in) for a few milliseconds, not for the whole
fleet. Each node's value is taken from its latest report when its slice is read, the
groups are judged once the last slice is in. A fleet of at most PASS_SLICE nodes is read
and judged in one sweep; at 8,192 nodes with the 0.5 s sweep a comparison takes 4 s of
sweeps. A straggler with ``for: 2m`` fires within 2 minutes + 10 s, and resolves within
10 s of catching up.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Final

from sn_monitor.model import Report
from sn_monitor.rules.base import (
    Finding,
    Held,
    HoldingEvaluator,
    Now,
    format_duration,
    format_number,
)
from sn_monitor.rules.series import NODE, compile_accessor, describe
from sn_monitor.rules.spec import PeersRule
from sn_monitor.rules.view import NodeView

PEERS_EVERY: Final = 5.0
"""Seconds between two comparisons of the fleet at most (see the module docstring)."""
PASS_SLICE: Final = 1024
"""Nodes read per sweep while a comparison gathers its values (see the module docstring)."""

#: A member of a group: (node, its value, when that was observed).
_Member = tuple[str, float, float]


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
        # A comparison in progress: the nodes left to read, and the groups read so far.
        self._unread: list[tuple[str, NodeView]] = []
        self._groups: dict[str, list[_Member]] = {}

    def _mean(self, node: str, report: Report) -> float | None:
        cached = self._means.get(node)
        if cached is not None and cached[0] is report:
            return cached[1]
        values = self._read(report)
        mean = sum(v for _, v in values) / len(values) if values else None
        self._means[node] = (report, mean)
        return mean

    def sweep(self, views: Mapping[str, NodeView], now: Now, out: list[Finding]) -> None:
        if not self._unread:
            last = self._compared_at
            if last is not None and 0 <= now.monotonic - last < self._every:
                super().sweep(views, now, out)  # only the ``for`` timers time has completed
                return
            self._compared_at = now.monotonic
            self._unread = list(views.items())
            self._unread.reverse()  # read from the end: a slice is a cheap truncation
            self._groups = {}
        self._read_slice()
        if self._unread:
            super().sweep(views, now, out)
            return
        groups, self._groups = self._groups, {}
        self._judge({g: [m for m in members if m[0] in views]
                     for g, members in groups.items()}, views, now, out)

    def _read_slice(self) -> None:
        """Read the next PASS_SLICE nodes' values into the comparison's groups."""
        unread = self._unread
        cut = max(0, len(unread) - PASS_SLICE)
        groups = self._groups
        scoped, label, means = bool(self._scope), self._label, self._means
        for name, view in reversed(unread[cut:]):
            report = view.report
            if report is None or view.state == "lost" or (scoped and not self.applies(view)):
                continue
            group = view.labels.get(label)
            if group is None:
                continue
            cached = means.get(name)  # the node's mean, read once per report
            mean = cached[1] if cached is not None and cached[0] is report else \
                self._mean(name, report)
            if mean is not None:
                groups.setdefault(group, []).append((name, mean, report.sample_time_seconds))
        del unread[cut:]

    def _judge(self, groups: dict[str, list[_Member]], views: Mapping[str, NodeView],
               now: Now, out: list[Finding]) -> None:
        """Each group's members against its median; nodes no longer compared resolve."""
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
