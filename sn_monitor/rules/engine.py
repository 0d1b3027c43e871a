"""The rule engine: every rule's evaluator, fed with reports and with time.

The controller calls :meth:`RuleEngine.observe` after ingesting each report (threshold,
rate, baseline and event rules look at it) and :meth:`RuleEngine.sweep` about once a
second (heartbeats, peer comparisons, event incidents clearing, ``for`` timers that
complete with time alone). Both return transitions: a :class:`Finding` when a
(rule, node, subject) starts firing and one when it resolves, never repeats.

Alert rules see neither reports nor time: Alertmanager's alerts reach them through
:meth:`RuleEngine.receive_alerts`. The engine keeps them with the others so that a
reload treats every rule alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sn_monitor.clock import Clock
from sn_monitor.model import EdgeRules, Report
from sn_monitor.rules.alerts import (
    AlertEvaluator,
    AlertIntake,
    WebhookAlert,
    receive_alerts,
)
from sn_monitor.rules.base import Evaluator, Finding, Now
from sn_monitor.rules.baseline import BaselineEvaluator
from sn_monitor.rules.edge import AgentFindings, EdgeCatalog, is_node_local
from sn_monitor.rules.event import EventEvaluator
from sn_monitor.rules.heartbeat import HeartbeatEvaluator
from sn_monitor.rules.peers import PeersEvaluator
from sn_monitor.rules.series import frame_of
from sn_monitor.rules.spec import (
    AlertRule,
    BaselineRule,
    EventRule,
    HeartbeatRule,
    PeersRule,
    Rule,
    ThresholdRule,
)
from sn_monitor.rules.threshold import ThresholdEvaluator, ThresholdScreen
from sn_monitor.rules.view import NodeView
from sn_monitor.rules.xid_catalog import XidCatalog

__all__ = ["Finding", "RuleEngine", "evaluator_for"]

AnyEvaluator = Evaluator[Any]


def evaluator_for(rule: Rule, catalog: XidCatalog | None = None) -> AnyEvaluator:
    """A fresh evaluator (no state) for ``rule``; ``catalog`` for XID rules (None: packaged)."""
    if isinstance(rule, ThresholdRule):
        return ThresholdEvaluator(rule)
    if isinstance(rule, BaselineRule):
        return BaselineEvaluator(rule)
    if isinstance(rule, PeersRule):
        return PeersEvaluator(rule)
    if isinstance(rule, EventRule):
        return EventEvaluator(rule, catalog)
    if isinstance(rule, HeartbeatRule):
        return HeartbeatEvaluator(rule)
    if isinstance(rule, AlertRule):
        return AlertEvaluator(rule)
    raise TypeError(f"not a rule: {rule!r}")


class RuleEngine:
    """Applies rules to nodes and reports transitions. Not thread-safe: one caller at a time."""

    def __init__(self, rules: Sequence[Rule], clock: Clock, *, screen: bool = True,
                 catalog: XidCatalog | None = None, keep: Sequence[str] = ()) -> None:
        """``screen`` False: every rule reads every report (tests compare the two ways).

        ``catalog``: NVIDIA's Xid catalogue for XID rules' ``resolutions`` (None: the
        packaged one). ``keep``: metrics the controller reads besides its rules' (the
        link rates of the topology and the bottleneck finder), which agents that evaluate
        their node-local rules keep sending.
        """
        self._keep = tuple(keep)
        self._catalog_of_xids = catalog
        self._clock = clock
        self._screening = screen
        self._evaluators: dict[str, AnyEvaluator] = {}
        self._observers: list[AnyEvaluator] = []
        self._plan: list[tuple[AnyEvaluator, bool, bool, int]] = []
        self._screen: ThresholdScreen | None = None
        self._sweepers: list[AnyEvaluator] = []
        self._alerting: list[AlertEvaluator] = []
        #: For reports whose agent evaluated the node-local rules (sn_monitor.rules.edge).
        self._remote_plan: list[tuple[AnyEvaluator, bool, bool, int]] = []
        self._local: list[AnyEvaluator] = []
        self._agents = AgentFindings()
        self._install({rule.name: evaluator_for(rule, catalog) for rule in _unique(rules)})
        self._catalog = EdgeCatalog(self.rules, self._keep)

    @property
    def rules(self) -> list[Rule]:
        """The rules in force, in the order given."""
        return [e.rule for e in self._evaluators.values()]

    def rule(self, name: str) -> Rule | None:
        """The rule in force named ``name``, or None."""
        evaluator = self._evaluators.get(name)
        return evaluator.rule if evaluator is not None else None

    def _install(self, evaluators: dict[str, AnyEvaluator]) -> None:
        self._evaluators = evaluators
        self._observers = [e for e in evaluators.values() if e.observes]
        # The plain threshold rules are screened together (ThresholdScreen): the engine
        # passes over those a report leaves untouched. Per observer: (evaluator, whether
        # its scope needs checking, whether it reads events only, its screen slot or -1).
        screened = ([e for e in self._observers if ThresholdScreen.screens(e)]
                    if self._screening else [])
        self._screen = ThresholdScreen(screened) if screened else None
        slots = {id(e): i for i, e in enumerate(screened)}
        self._plan = [(e, e.scoped, e.events_only, slots.get(id(e), -1))
                      for e in self._observers]
        self._sweepers = [e for e in evaluators.values() if e.sweeps]
        self._local = [e for e in evaluators.values() if is_node_local(e.rule)]
        self._remote_plan = [p for p in self._plan if not is_node_local(p[0].rule)]
        self._alerting = [e for e in evaluators.values() if isinstance(e, AlertEvaluator)]

    def _now(self) -> Now:
        return Now(self._clock.monotonic(), self._clock.time())

    def observe(self, view: NodeView, now: Now | None = None) -> list[Finding]:
        """Apply report-driven rules to ``view``'s latest report.

        ``now``: the time of the report's receipt, if the caller has it (else the clock
        is read).

        A report whose agent evaluated the node-local rules (``rules_version`` set), or
        will from its next sample on (the first of an agent that ``takes_rules``: the
        reply carries the rules), gets the other rules here, and its findings become transitions
        (:class:`~sn_monitor.rules.edge.AgentFindings`). When a node turns to evaluating
        itself, what the controller's evaluators had firing for it is handed over, so a
        fault still firing on the agent opens nothing new and one gone resolves; when it
        turns back (an agent restarted, or an older one), the evaluators find again what
        is still there, without opening it twice.
        """
        out: list[Finding] = []
        report = view.report
        if report is None:
            return out
        if now is None:
            now = self._now()
        if report.rules_version:
            self._observe_remote(view, report, now, out)
            return out
        if report.takes_rules and report.sequence == 1:
            # A starting agent evaluates the node-local rules from its next sample on (the
            # reply carries them): the others only, and neither side's firing set moves.
            # A later report without rules (their reply was lost, or refused) is judged
            # on all of them.
            self._observe_plan(self._remote_plan, view, report, now, out)
            return out
        node = view.name
        self._observe_all(view, report, now, out)
        if self._agents.holds(node) or self._agents.evaluates(node):
            return self._agents.full_report(node, out, now)
        return out

    def observe_events(self, view: NodeView, now: Now | None = None) -> list[Finding]:
        """Apply the event rules only to ``view``'s latest events (an events-only report).

        No sample came with them, so the rules that read values have nothing new to judge
        (and must not take the last sample twice: a rate over no time, a ``for`` held by
        a stale value); the node-local rules are not involved, events are not theirs.
        """
        out: list[Finding] = []
        report = view.report
        if report is None or not report.events:
            return out
        if now is None:
            now = self._now()
        for evaluator, scoped, events_only, _ in self._plan:
            if events_only and (not scoped or evaluator.applies(view)):
                evaluator.observe(view, now, out)
        return out

    def _observe_remote(self, view: NodeView, report: Report, now: Now,
                        out: list[Finding]) -> None:
        node = view.name
        agents = self._agents
        if not agents.evaluates(node):
            handed: list[Finding] = []
            for evaluator in self._local:
                handed.extend(f for f in evaluator.firing() if f.node == node)
                evaluator.forget_node(node)
            agents.take(node, handed)
        self._observe_plan(self._remote_plan, view, report, now, out)
        if report.rules_version == self._catalog.for_node(view).version:
            agents.sync(node, report.findings, self._catalog.local, now, out)
        # else its agent judged by rules since changed (a reload, new labels): what it
        # found means nothing under the new ones, and what it had stays as it was until
        # its next report, judged by the rules this reply carries

    @staticmethod
    def _observe_plan(plan: list[tuple[AnyEvaluator, bool, bool, int]], view: NodeView,
                      report: Report, now: Now, out: list[Finding]) -> None:
        events = bool(report.events)
        for evaluator, scoped, events_only, _ in plan:
            if events_only and not events:
                continue
            if scoped and not evaluator.applies(view):
                continue
            evaluator.observe(view, now, out)

    def _observe_all(self, view: NodeView, report: Report, now: Now,
                     out: list[Finding]) -> None:
        screen = self._screen
        quiet = screen.quiet(view.name, frame_of(report)) if screen is not None else []
        events = bool(report.events)
        for evaluator, scoped, events_only, slot in self._plan:
            if slot >= 0 and quiet[slot]:
                continue  # a plain threshold rule the report leaves as it is
            if events_only and not events:
                continue
            if scoped and not evaluator.applies(view):
                continue
            evaluator.observe(view, now, out)

    def edge_rules(self, view: NodeView, version: str) -> EdgeRules | None:
        """The node-local rules to send ``view``'s agent, which has ``version``.

        None: it has them.
        """
        return self._catalog.offer(view, version)

    def cancel(self, node: str, gpu: int | None, message: str,
               events: frozenset[str] | None = None) -> list[Finding]:
        """A repair of ``node`` (``gpu``; None: the whole node) cleared its event faults.

        Only those of the ``events`` kinds; None: every kind.
        """
        out: list[Finding] = []
        now = self._now()
        for evaluator in self._evaluators.values():
            rule = evaluator.rule
            if events is None or (isinstance(rule, EventRule) and rule.event in events):
                evaluator.cancel(node, gpu, message, now, out)
        return out

    def sweep(self, views: Mapping[str, NodeView]) -> list[Finding]:
        """Apply time-driven rules to every node."""
        out: list[Finding] = []
        now = self._now()
        for evaluator in self._sweepers:
            evaluator.sweep(views, now, out)
        return out

    def receive_alerts(self, alerts: Sequence[WebhookAlert],
                       labels_of: Callable[[str], Mapping[str, str] | None],
                       source: str) -> AlertIntake:
        """Apply Alertmanager's alerts to the alert rules.

        ``labels_of`` gives a node's labels (None: a node the controller does not know),
        for the rules' ``scope``; ``source`` says who sent the alerts.
        """
        return receive_alerts(self._alerting, alerts, labels_of, self._now(), source)

    def restore(self, finding: Finding) -> bool:
        """Give ``finding`` (open before a restart) back to its rule, if its kind can.

        Alert rules can; False for the other kinds (they rediscover their faults from
        reports) and for a rule that is gone.
        """
        evaluator = self._evaluators.get(finding.rule)
        return evaluator is not None and evaluator.restore(finding)

    def reload(self, rules: Sequence[Rule]) -> list[Finding]:
        """Take a new rule set, keeping the state of rules that did not change.

        A rule with the same name and definition keeps everything (firing subjects,
        pending ``for`` timers, baselines). One whose change only touches what it does,
        not what it detects (severity, actions, dry_run, description), keeps its state
        and its firing findings take the new values. Any other change starts the rule
        afresh; what the old one had firing resolves, as does everything of removed rules.
        """
        now = self._now()
        out: list[Finding] = []
        new = {rule.name: rule for rule in rules}
        changed = {name for name, rule in self._catalog.local.items()
                   if name in new and new[name].detection() != rule.detection()}
        self._agents.reload({n: r for n, r in new.items() if is_node_local(r)}, changed,
                            now, out)
        self._catalog = EdgeCatalog(rules, self._keep)
        kept: dict[str, AnyEvaluator] = {}
        for rule in _unique(rules):
            old = self._evaluators.get(rule.name)
            if old is not None and old.rule == rule:
                kept[rule.name] = old
            elif (old is not None and type(old.rule) is type(rule)
                  and old.rule.detection() == rule.detection()):
                old.set_rule(rule)
                kept[rule.name] = old
            else:
                kept[rule.name] = evaluator_for(rule, self._catalog_of_xids)
        for name, old in self._evaluators.items():
            if kept.get(name) is not old:
                reason = "rule changed" if name in kept else "rule removed"
                old.resolve_all(f"{reason} on reload", now, out)
        self._install(kept)
        return out

    def firing(self) -> list[Finding]:
        """Every (rule, node, subject) firing now, as the finding that started it."""
        return [*(f for e in self._evaluators.values() for f in e.firing()),
                *self._agents.firing()]

    def forgive_silence(self) -> None:
        """The controller itself stood still: give silent nodes a restart's grace.

        Its agents' reports timed out meanwhile and they backed off; a node not heard from
        since now is timed as after a restart (:data:`~.heartbeat.UNREPORTED_GRACE_SECONDS`
        more), so a healthy one is never taken for lost for the controller's own stall.
        """
        now = self._now()
        for evaluator in self._evaluators.values():
            if isinstance(evaluator, HeartbeatEvaluator):
                evaluator.forgive(now.monotonic)

    def forget_node(self, node: str) -> None:
        """Drop all state about ``node`` (it was removed); emits nothing."""
        self._agents.forget_node(node)
        for evaluator in self._evaluators.values():
            evaluator.forget_node(node)


def _unique(rules: Sequence[Rule]) -> Sequence[Rule]:
    names: set[str] = set()
    for rule in rules:
        if rule.name in names:
            raise ValueError(f"two rules are named {rule.name!r}")
        names.add(rule.name)
    return rules
