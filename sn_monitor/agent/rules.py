"""The node-local rules this agent evaluates on its own samples (see sn_monitor.rules.edge).

The controller sends them in the reply to a report (:class:`~sn_monitor.model.EdgeRules`);
from then on each report carries the findings firing after the sample and only the
values the controller's own rules read. The evaluators are the controller's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from sn_monitor.clock import Clock
from sn_monitor.model import MEASURE_MAX, EdgeFinding, EdgeRules, Report
from sn_monitor.rules.edge import parse_edge_rules
from sn_monitor.rules.engine import RuleEngine
from sn_monitor.rules.series import Trim
from sn_monitor.rules.view import NodeView


class NodeRules:
    """One node's node-local rules, run on its own samples."""

    def __init__(self, edge: EdgeRules, node: str, labels: Mapping[str, str],
                 clock: Clock) -> None:
        """ConfigError if a rule of ``edge`` is unsound (a controller newer than this agent)."""
        self.version = edge.version
        self._trim = Trim(edge.keep)
        self._bare = Trim(())
        self._keep_every = edge.keep_every
        self._clock = clock
        self._kept_at = -math.inf
        self._engine = RuleEngine(parse_edge_rules(edge), clock)
        self._view = NodeView(name=node, labels=dict(labels))
        self._views = {node: self._view}

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
