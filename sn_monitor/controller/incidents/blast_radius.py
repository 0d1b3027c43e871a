"""Blast radius: a fault on many nodes at once belongs to what they share, not to each.

One job's crash makes every one of its GPUs throw the same application XID (13, 31,
43) within seconds: flagged node by node, that is dozens of "faulty" nodes and dozens of
evictions for one bug in the job. A rack that loses power or a leaf switch that reboots
takes all its nodes at once: one fault of the rack, not sixteen pages.

:class:`BlastRadius` sits between the rules and the incidents. For a rule with
``job_wide: {nodes, within}`` a node's finding in a job of at least ``nodes`` nodes is
held ``within`` seconds (in a smaller job it goes on at once); if the same
rule fires on ``nodes`` of the same job's nodes meanwhile, those findings become one
incident of the job (``job:<name>``: an alert with the job's labels, no node action) and
the node findings are dropped, as are any that follow while it lasts. A held finding that
no others join goes on when its time is up, as the node's own. For a rule with
``domain: {label, nodes, within}`` nothing waits (a lost rack's failover must not): once
``nodes`` nodes with the same label value fire within ``within``, one incident opens for
the domain (``rack:<value>``) and the nodes' own alerts (those that follow, and their
resolutions) are folded into it; their other actions go on through the safety policy,
whose breaker guards against taking too many nodes.

Grouped incidents close when the last of their node findings resolves. What is held
lives in memory only: a held finding lost with a controller restart is an event that
is gone (the job's own restart, not a node action, is what an application XID needs).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sn_monitor.clock import Clock
from sn_monitor.rules.base import Finding, format_duration
from sn_monitor.rules.spec import Rule

#: (node, subject): one node finding of one rule.
Member = tuple[str, str]


@dataclass
class _Group:
    """One job's or one domain's findings of one rule."""

    rule: str
    name: str  # job:<job> or <label>:<value>
    recent: dict[str, float] = field(default_factory=dict)  # node -> monotonic time fired
    held: dict[Member, tuple[float, Finding]] = field(default_factory=dict)
    members: set[Member] = field(default_factory=set)
    opened: Finding | None = None
    absorbed: int = 0


class BlastRadius:
    """Groups findings of ``job_wide`` and ``domain`` rules (see the module's docstring).

    ``rule_of`` names the current rules (reloads change them); ``job_of`` gives a node's
    job and how many nodes it runs on (None: in none); ``labels_of`` a node's labels.
    Thread-safe: findings come from ingest and from sweeps.
    """

    def __init__(self, rule_of: Callable[[str], Rule | None],
                 job_of: Callable[[str], tuple[str, int] | None],
                 labels_of: Callable[[str], dict[str, str] | None], clock: Clock) -> None:
        self._rule_of = rule_of
        self._job_of = job_of
        self._labels_of = labels_of
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str], _Group] = {}
        self._member_of: dict[tuple[str, str, str], _Group] = {}  # (rule, node, subject)
        self._folded: set[tuple[str, str, str]] = set()  # domain members whose alert folded

    def screen(self, findings: Iterable[Finding]) -> list[Finding]:
        """What goes on to incidents and actions now: node findings, group findings."""
        out: list[Finding] = []
        with self._lock:
            for f in findings:
                if f.status == "resolved":
                    self._resolved(f, out)
                    continue
                rule = self._rule_of(f.rule)
                if rule is None or ":" in f.node:
                    out.append(f)  # not a node's finding (a job's hang, a group's own)
                elif rule.job_wide is not None and (job := self._job_of(f.node)) and (
                        job[1] >= rule.job_wide.nodes):
                    self._job_firing(rule, job[0], f, out)
                elif rule.domain is not None:
                    self._domain_firing(rule, f, out)
                else:
                    out.append(f)
        return out

    def sweep(self) -> list[Finding]:
        """Held findings no others joined in time: they go on as their nodes' own."""
        now = self._clock.monotonic()
        out: list[Finding] = []
        with self._lock:
            for group in list(self._groups.values()):
                for member, (due, f) in list(group.held.items()):
                    if due <= now:
                        del group.held[member]
                        del self._member_of[(f.rule, *member)]
                        out.append(f)
                self._drop_if_idle(group, now)
        return out

    def held(self) -> int:
        """How many node findings wait to see whether they are part of a job-wide fault."""
        with self._lock:
            return sum(len(g.held) for g in self._groups.values())

    # ------------------------------------------------------------------ job-wide

    def _job_firing(self, rule: Rule, job: str, f: Finding, out: list[Finding]) -> None:
        assert rule.job_wide is not None
        group = self._group(rule.name, f"job:{job}")
        member = (f.node, f.subject)
        now = self._clock.monotonic()
        within = float(rule.job_wide.within)
        self._note(group, f.node, now, within)
        self._member_of[(f.rule, *member)] = group
        if group.opened is not None:
            group.members.add(member)
            group.absorbed += 1
            return
        group.held[member] = (now + within, f)
        if len(group.recent) < rule.job_wide.nodes:
            return
        held = [finding for _, finding in group.held.values()]
        group.members.update(group.held)
        group.held.clear()
        group.absorbed = len(held)
        group.opened = self._job_finding(rule, job, held, within)
        out.append(group.opened)

    def _job_finding(self, rule: Rule, job: str, held: list[Finding], within: float
                     ) -> Finding:
        nodes = sorted({f.node for f in held})
        first = min(held, key=lambda f: f.observed_wall)
        shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
        return dataclasses.replace(
            first, kind="job", node=f"job:{job}", subject=f"job:{job}", gpu=None,
            actions=tuple(a for a in rule.actions if a == "alert"), count=len(held),
            message=(f"{rule.name} on {len(nodes)} nodes of job {job} within "
                     f"{format_duration(within)} ({shown}): the job's own fault, not "
                     f"the nodes'; no node action. First: {first.message}"))

    # ------------------------------------------------------------------ domains

    def _domain_firing(self, rule: Rule, f: Finding, out: list[Finding]) -> None:
        assert rule.domain is not None
        labels = self._labels_of(f.node) or {}
        value = labels.get(rule.domain.label)
        if value is None:
            out.append(f)
            return
        group = self._group(rule.name, f"{rule.domain.label}:{value}")
        now = self._clock.monotonic()
        self._note(group, f.node, now, float(rule.domain.within))
        member = (f.node, f.subject)
        group.members.add(member)
        self._member_of[(f.rule, *member)] = group
        if group.opened is None and len(group.recent) >= rule.domain.nodes:
            nodes = sorted(group.recent)
            group.opened = dataclasses.replace(
                f, kind="domain", node=group.name, subject=group.name, gpu=None,
                actions=tuple(a for a in rule.actions if a == "alert"), count=len(nodes),
                message=(f"{rule.name} on {len(nodes)} nodes of {rule.domain.label} "
                         f"{value} within {format_duration(float(rule.domain.within))} "
                         f"({', '.join(nodes)}): one fault of the {rule.domain.label} "
                         f"(power, a switch, cooling), not {len(nodes)} node faults"))
            out.append(group.opened)
        if group.opened is not None:
            group.absorbed += 1
            self._folded.add((f.rule, *member))
            out.append(dataclasses.replace(f, actions=_without_alert(f.actions)))
        else:
            out.append(f)

    # ------------------------------------------------------------------ common

    def _resolved(self, f: Finding, out: list[Finding]) -> None:
        key = (f.rule, f.node, f.subject)
        group = self._member_of.pop(key, None)
        if group is None:
            out.append(f)
            return
        member = (f.node, f.subject)
        if member in group.held:
            del group.held[member]  # never surfaced: nothing to close
        elif group.name.startswith("job:"):
            group.members.discard(member)  # absorbed by the job's incident
        else:
            group.members.discard(member)
            folded = key in self._folded
            self._folded.discard(key)
            out.append(dataclasses.replace(f, actions=_without_alert(f.actions))
                       if folded else f)
        if group.opened is not None and not group.members:
            out.append(dataclasses.replace(
                group.opened, status="resolved", detected_wall=f.detected_wall,
                message=(f"every node of {group.name} cleared {f.rule} "
                         f"({group.absorbed} node findings in this incident)")))
            group.opened = None
            group.absorbed = 0
        self._drop_if_idle(group, self._clock.monotonic())

    def _group(self, rule: str, name: str) -> _Group:
        group = self._groups.get((rule, name))
        if group is None:
            group = self._groups[(rule, name)] = _Group(rule, name)
        return group

    @staticmethod
    def _note(group: _Group, node: str, now: float, within: float) -> None:
        group.recent[node] = now
        for old in [n for n, t in group.recent.items() if t < now - within]:
            del group.recent[old]

    def _drop_if_idle(self, group: _Group, now: float) -> None:
        rule = self._rule_of(group.rule)
        spec = (rule.job_wide if group.name.startswith("job:") else rule.domain) if rule else None
        within = float(spec.within) if spec is not None else 0.0
        for old in [n for n, t in group.recent.items() if t < now - within]:
            del group.recent[old]
        if not (group.recent or group.held or group.members or group.opened):
            del self._groups[(group.rule, group.name)]


def _without_alert(actions: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(a for a in actions if a != "alert")
