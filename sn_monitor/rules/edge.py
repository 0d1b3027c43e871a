"""Node-local rules evaluated where the data is: on the agent that sampled it.

A threshold or baseline rule reads one node's own values; evaluating it on the controller
means every node sends every value every second (8,192 reports a second of ~14 KB, most
of it read by no rule). Instead the controller hands each node the node-local rules that
apply to it (:class:`EdgeCatalog`, in the reply to a report), the agent runs them on its
own samples with the same evaluators (``sn_monitor.agent.rules.NodeRules``) and sends,
in a trimmed report, the findings firing now. The controller stays the one place that decides: it
turns changes in each node's set of firing findings into the same transitions its own
evaluators produce (:class:`AgentFindings`), with its own rule's severity, actions and
dry-run, and it keeps evaluating events, peers, heartbeats and alerts itself.

The firing *set* travels with every report, not the transitions, so nothing is lost or
repeated when a report is, and a restart of either side converges on the next report.
A node whose agent does not evaluate rules (an older agent, or a new one before its
first reply) sends full reports and is evaluated by the controller as before; see
:meth:`~sn_monitor.rules.engine.RuleEngine.observe` for the hand-over between the two.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import msgspec

from sn_monitor.config import Document
from sn_monitor.model import EdgeFinding, EdgeRules
from sn_monitor.rules.base import Evaluator, Finding, Now
from sn_monitor.rules.peers import PEERS_EVERY
from sn_monitor.rules.spec import BaselineRule, PeersRule, Rule, ThresholdRule, parse_rules
from sn_monitor.rules.view import NodeView

#: The kinds an agent evaluates: those that read one node's own report values.
NODE_LOCAL_KINDS: Final = (ThresholdRule, BaselineRule)
#: Seconds a node may send full reports before what its agent had firing, and the
#: controller has not found again, resolves (an agent replaced by an older version).
RETIRE_SECONDS: Final = 300.0
_ITEM_SKIPS: Final = frozenset({"severity", "actions", "dry_run", "description", "scope",
                                 "escalate", "job_wide", "domain"})


def is_node_local(rule: Rule) -> bool:
    """Whether an agent can evaluate ``rule`` on its own samples."""
    return isinstance(rule, NODE_LOCAL_KINDS)


def rule_item(rule: Rule) -> dict[str, Any]:
    """What ``rule`` detects, as a rule file item (``parse_rules`` reads it back).

    Severity, actions, dry-run and description stay on the controller, which decides;
    scope too: the controller picks the rules that apply to each node; and the context
    (escalation, job-wide and domain grouping), which needs the fleet.
    """
    return {"name": rule.name, **{k: v for k, v in _items(rule) if k not in _ITEM_SKIPS}}


def _items(value: Any) -> Iterator[tuple[str, Any]]:
    for f in dataclasses.fields(value):
        item = getattr(value, f.name)
        if item is None or f.name == "name" or item == {} or item == []:
            continue
        if dataclasses.is_dataclass(item):
            item = dict(_items(item))
        elif isinstance(item, float):
            item = float(item)  # a Duration is seconds
        yield f.metadata.get("key", f.name), item


#: Rules parsed, by their items as sent (JSON). Parsing costs ~10 ms, and a simulated
#: fleet builds the same rules for every node that faults (a thousand in a burst); the
#: rules are frozen, so one list serves every evaluator.
_PARSED: dict[bytes, tuple[Rule, ...]] = {}
_PARSED_KEPT: Final = 16


def parse_edge_rules(edge: EdgeRules) -> list[Rule]:
    """The rules in ``edge``; ConfigError (naming the rule and key) if one is unsound."""
    key = msgspec.json.encode(edge.rules)
    parsed = _PARSED.get(key)
    if parsed is None:
        parsed = tuple(parse_rules(Document(
            f"the controller's node-local rules {edge.version}", edge.rules, {})))
        if len(_PARSED) >= _PARSED_KEPT:
            _PARSED.clear()  # bounded: versions change only with the controller's rules
        _PARSED[key] = parsed
    return list(parsed)


class EdgeCatalog:
    """Which node-local rules each node evaluates, and the metrics the rest read.

    Nodes whose labels match the same scopes share one :class:`EdgeRules` (one for
    the whole fleet when no node-local rule has a scope).
    """

    def __init__(self, rules: Sequence[Rule], keep: Sequence[str] = ()) -> None:
        """``keep``: metrics kept besides those the rules left to the controller read."""
        self.local: dict[str, Rule] = {r.name: r for r in rules if is_node_local(r)}
        keep = sorted({r.metric for r in rules if isinstance(r, PeersRule)} | set(keep))
        self._keep = keep
        # a peers rule compares the fleet every PEERS_EVERY seconds at most: values
        # fresher than that would be decoded for nothing
        self._keep_every = PEERS_EVERY if keep else 0.0
        self._scoped = [r for r in self.local.values() if r.scope]
        self._labels = sorted({label for r in self._scoped for label in r.scope})
        self._everyone = self._build([r for r in self.local.values() if not r.scope])
        self._by_labels: dict[tuple[str | None, ...], EdgeRules] = {}

    def _build(self, rules: Sequence[Rule]) -> EdgeRules:
        items = [rule_item(r) for r in rules]
        digest = hashlib.sha256(msgspec.json.encode([items, self._keep], order="sorted"))
        return EdgeRules(version=digest.hexdigest()[:16], rules=items, keep=self._keep,
                         keep_every=self._keep_every)

    def for_node(self, view: NodeView) -> EdgeRules:
        """The rules ``view``'s node is to evaluate (by its labels, for scoped rules)."""
        if not self._scoped:
            return self._everyone
        key = tuple(view.labels.get(label) for label in self._labels)
        found = self._by_labels.get(key)
        if found is None:
            applies = [r for r in self._scoped if Evaluator(r).applies(view)]
            found = self._build([*(r for r in self.local.values() if not r.scope), *applies])
            if len(self._by_labels) >= 4096:  # bounded: labels come from the wire
                self._by_labels.clear()
            self._by_labels[key] = found
        return found

    def offer(self, view: NodeView, version: str) -> EdgeRules | None:
        """The rules to send with the reply to a report of ``version``; None: it has them."""
        edge = self.for_node(view)
        return None if edge.version == version else edge


class AgentFindings:
    """Per node, the node-local findings its agent reports firing, as transitions.

    ``sync`` compares a report's set with the one before it; a finding the controller's
    catalog does not know (a rule since removed, an agent still on older rules) is not
    taken. The controller's own rule gives severity, actions and dry-run.
    """

    def __init__(self) -> None:
        self._firing: dict[str, dict[tuple[str, str], Finding]] = {}
        #: Nodes whose latest report was evaluated by their agent (monotonic time then).
        self._edge: dict[str, float] = {}
        #: Nodes that went back to full reports with findings of their agent still open.
        self._edge_left: dict[str, float] = {}

    def evaluates(self, node: str) -> bool:
        """Whether ``node``'s agent evaluated its latest report."""
        return node in self._edge

    def holds(self, node: str) -> bool:
        """Whether anything of ``node``'s agent is firing."""
        return node in self._firing

    def take(self, node: str, handed: Iterable[Finding]) -> None:
        """``node`` turns to evaluating itself: what the controller had firing is the base."""
        for f in handed:
            self._firing.setdefault(node, {})[(f.rule, f.subject)] = f

    def sync(self, node: str, findings: Sequence[EdgeFinding], rules: Mapping[str, Rule],
             now: Now, out: list[Finding]) -> None:
        """The agent of ``node`` reports ``findings`` firing now; append the transitions."""
        self._edge[node] = now.monotonic
        before = self._firing.get(node)
        if not findings and before is None:
            return  # the common case: nothing firing before or now
        seen: dict[tuple[str, str], Finding] = {}
        for found in findings:
            rule = rules.get(found.rule)
            if rule is None:
                continue
            key = (found.rule, found.subject)
            kept = before.get(key) if before is not None else None
            if kept is None:
                kept = Finding(
                    rule=rule.name, kind=rule.kind, node=node, subject=found.subject,
                    gpu=found.gpu, status="firing", severity=rule.severity or "warning",
                    actions=tuple(rule.actions), dry_run=rule.dry_run, value=found.value,
                    message=found.message or f"{rule.name} fires on {node}",
                    observed_wall=min(now.wall, found.observed_seconds),
                    detected_wall=now.wall)
                out.append(kept)
            seen[key] = kept
        for key, started in (before or {}).items():
            if key not in seen:
                out.append(_resolved(started, "no longer fires on the node's agent", now))
        if seen:
            self._firing[node] = seen
        else:
            self._firing.pop(node, None)

    def full_report(self, node: str, found: list[Finding], now: Now) -> list[Finding]:
        """``node`` sent a full report and the controller's evaluators found ``found``.

        A finding its agent had firing is not started twice: the controller's evaluator
        owns it from now on. What the agent had firing and the controller has not found
        again after :data:`RETIRE_SECONDS` of full reports resolves.
        """
        since = self._edge.pop(node, None)
        held = self._firing.get(node)
        if held is None:
            return found
        if since is not None:
            self._edge_left[node] = since
        out: list[Finding] = []
        for f in found:
            if f.status == "firing" and held.pop((f.rule, f.subject), None) is not None:
                continue  # already open: the controller's evaluator takes it over
            out.append(f)
        left = self._edge_left.get(node, now.monotonic)
        if held and now.monotonic - left >= RETIRE_SECONDS:
            out.extend(_resolved(f, "not found again since the node's agent stopped "
                                    "evaluating rules", now) for f in held.values())
            held.clear()
        if not held:
            del self._firing[node]
            self._edge_left.pop(node, None)
        return out

    def reload(self, rules: Mapping[str, Rule], changed: set[str], now: Now,
               out: list[Finding]) -> None:
        """New rules: what fired for a rule removed or changed resolves.

        The rest takes the new severity, actions and dry-run.
        """
        for node, held in list(self._firing.items()):
            for key, f in list(held.items()):
                rule = rules.get(f.rule)
                if rule is None or f.rule in changed:
                    del held[key]
                    reason = "rule changed" if rule is not None else "rule removed"
                    out.append(_resolved(f, f"{reason} on reload", now))
                else:
                    held[key] = dataclasses.replace(
                        f, severity=rule.severity or "warning", actions=tuple(rule.actions),
                        dry_run=rule.dry_run)
            if not held:
                del self._firing[node]

    def firing(self) -> Iterator[Finding]:
        for held in self._firing.values():
            yield from held.values()

    def forget_node(self, node: str) -> None:
        self._firing.pop(node, None)
        self._edge.pop(node, None)
        self._edge_left.pop(node, None)


def _resolved(f: Finding, why: str, now: Now) -> Finding:
    """``f`` resolved now, saying ``why``."""
    where = f"{f.node} {f.subject}" if f.subject else f.node
    return dataclasses.replace(f, status="resolved", value=None,
                               message=f"{f.rule} on {where} resolved: {why}",
                               observed_wall=now.wall, detected_wall=now.wall)
