"""Repeat offenders climb one rung: a rule's ``escalate:`` read against the incident history.

NVIDIA's catalogue says what one XID needs (restart the application, reset the GPU,
reboot). A GPU that throws the same recoverable XID again and again, or a node that has
been taken out of service again and again, needs more than the catalogue's answer for
one: the next rung of the ladder. A rule says which rule is its next rung
(``escalate.to``) and when to take it; this module decides, per new incident, from what
the store remembers (so a controller restart forgets nothing).

The incident keeps its own rule's name, so it is still found, counted and closed as
itself; it takes the next rung's actions and severity, and its message says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

from sn_monitor.rules.base import Finding, format_duration
from sn_monitor.rules.spec import Rule


class IncidentHistory(Protocol):
    """What escalation reads from the store."""

    def count_closed_incidents(self, rule: str, node: str, subject: str, since: float
                               ) -> int:
        """Closed incidents of (rule, node, subject) detected at or after ``since``."""
        ...

    def count_evictions(self, node: str, since: float) -> int:
        """Evictions of ``node`` that ran at or after ``since``."""
        ...


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class Escalation:
    """Takes a new incident's finding one rung up when its rule's ``escalate:`` says so.

    ``rule_of`` gives the rule of a name (None: no such rule now, after a reload).
    :meth:`escalate` runs where the incident is recorded (the store's writer), before it
    is written: ``repeats: 3`` means two closed incidents within ``within`` and this one.
    """

    def __init__(self, rule_of: Callable[[str], Rule | None], history: IncidentHistory
                 ) -> None:
        self._rule_of = rule_of
        self._history = history

    def escalate(self, finding: Finding) -> Finding:
        """``finding``, or the same incident with its next rung's actions and severity."""
        rule = self._rule_of(finding.rule)
        if rule is None or rule.escalate is None:
            return finding
        spec = rule.escalate
        target = self._rule_of(spec.to)
        if target is None:
            return finding
        why = self._why(finding, spec.repeats, float(spec.within), spec.node_recoveries,
                        float(spec.recoveries_within))
        if why is None:
            return finding
        return dataclasses.replace(
            finding, severity=target.severity or finding.severity,
            actions=tuple(target.actions), dry_run=finding.dry_run or target.dry_run,
            message=f"{finding.message} [escalated to {target.name}: {why}]")

    def _why(self, f: Finding, repeats: int | None, within: float,
             node_recoveries: int | None, recoveries_within: float) -> str | None:
        now = f.detected_wall
        if repeats is not None:
            seen = 1 + self._history.count_closed_incidents(f.rule, f.node, f.subject,
                                                             now - within)
            if seen >= repeats:
                where = f" on GPU {f.gpu}" if f.gpu is not None else ""
                return (f"the {_ordinal(seen)} {f.rule} incident{where} within "
                        f"{format_duration(within)}")
        if node_recoveries is not None:
            out = self._history.count_evictions(f.node, now - recoveries_within)
            if out >= node_recoveries:
                return (f"{f.node} was taken out of service {out} times within "
                        f"{format_duration(recoveries_within)}")
        return None
