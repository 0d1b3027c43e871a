"""The node-local rules this agent evaluates on its own samples (see sn_monitor.rules.edge).

The controller sends them in the reply to a report (:class:`~sn_monitor.model.EdgeRules`);
from then on each report carries the findings firing after the sample and only the
values the controller's own rules read. The evaluators are the controller's.

The rate and increase rules begin from the counters the agent's last run kept
(:mod:`sn_monitor.agent.counter_memory`), so a counter that rose while the agent restarted
is judged, not taken as the start of a new series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from sn_monitor.agent.counter_memory import CounterMemory
from sn_monitor.clock import Clock
from sn_monitor.model import MEASURE_MAX, EdgeFinding, EdgeRules, Report
from sn_monitor.rules.base import Now
from sn_monitor.rules.edge import parse_edge_rules
from sn_monitor.rules.engine import RuleEngine
from sn_monitor.rules.series import Trim
from sn_monitor.rules.spec import ThresholdRule
from sn_monitor.rules.view import NodeView


class NodeRules:
    """One node's node-local rules, run on its own samples."""

    def __init__(self, edge: EdgeRules, node: str, labels: Mapping[str, str],
                 clock: Clock, memory: CounterMemory | None = None) -> None:
        """ConfigError if a rule of ``edge`` is unsound (a controller newer than this agent).

        ``memory``: where the counters of the rate and increase rules are kept across
        restarts (None: they start afresh with each start).
        """
        self.version = edge.version
        self._trim = Trim(edge.keep)
        self._bare = Trim(())
        self._keep_every = edge.keep_every
        self._clock = clock
        self._kept_at = -math.inf
        rules = parse_edge_rules(edge)
        self._engine = RuleEngine(rules, clock)
        self._view = NodeView(name=node, labels=dict(labels))
        self._views = {node: self._view}
        counted = [r.metric for r in rules if isinstance(r, ThresholdRule)
                   and (r.rate is not None or r.increase is not None)]
        self._memory = memory if counted else None
        self._counters = Trim(counted)
        if self._memory is not None:
            self._begin_from(self._memory.recall())

    def _begin_from(self, kept: Report | None) -> None:
        """Give the rules the counters kept before a restart, as a sample of their time."""
        if kept is None:
            return
        clock = self._clock
        age = max(0.0, clock.time() - kept.sample_time_seconds)
        view = self._view
        view.report = msgspec.structs.replace(kept, node=view.name, rules_version="",
                                              takes_rules=False)
        # a sample that old on the monotonic clock; nothing fires on one sample
        self._engine.observe(view, Now(clock.monotonic() - age, kept.sample_time_seconds))

    def set_labels(self, labels: Mapping[str, str]) -> None:
        """The node's labels as the rules see them from the next evaluation on."""
        self._view.labels = dict(labels)

    def evaluate(self, report: Report) -> Report:
        """``report`` trimmed, with this version and every finding firing after it."""
        if report.takes_rules:  # as the controller judges a full report: every rule
            report = msgspec.structs.replace(report, takes_rules=False)
        view = self._view
        view.report = report
        engine = self._engine
        engine.observe(view)
        engine.sweep(self._views)
        if self._memory is not None:
            self._memory.keep(self._counters(report))
        findings = [EdgeFinding(rule=f.rule, observed_seconds=f.observed_wall,
                                subject=f.subject, gpu=f.gpu, value=_measure(f.value),
                                message=f.message[:1024])
                    for f in engine.firing()]
        trim = self._trim
        if self._keep_every > 0:
            now = self._clock.monotonic()
            if now - self._kept_at < self._keep_every:
                trim = self._bare  # the controller keeps the values sent last
            else:
                self._kept_at = now
        return msgspec.structs.replace(trim(report), rules_version=self.version,
                                       findings=findings, takes_rules=True)


def _measure(value: float | None) -> float | None:
    """``value`` if the wire can carry it (a finite measure), else None."""
    if value is None or not math.isfinite(value) or abs(value) > MEASURE_MAX:
        return None
    return value
