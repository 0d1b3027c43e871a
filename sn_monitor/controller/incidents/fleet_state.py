"""What the controller holds in memory of each node: what fires on it, and its state.

The rules' findings come and go here first (before the writer records them): which
rules fire on each node, the ones among them that mean the node itself is broken (with
when each was detected), the lost nodes, the GPUs a healthy reading would bring back, the
nodes cordoned by the controller and those an eviction ran on. From these come a node's
state (healthy, degraded, lost, cordoned, evicted), whether it is healthy for the breaker
and the jobs, and the nodes the safety policy counts as out of service.

One lock guards it all: ingest (the event loop), the writer and the sweep each read and
change it. The states last recorded in the store (``_states``, ``_unhealthy``) are the
sweep's alone (:mod:`~sn_monitor.controller.incidents.node_states`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from sn_monitor.controller.actions.policy import ClusterSummary
from sn_monitor.controller.ingest.decode import NodeRegistry
from sn_monitor.rules.engine import Finding, RuleEngine
from sn_monitor.rules.spec import EventRule
from sn_monitor.rules.view import NodeState, NodeView

#: Actions whose firing means the node itself is broken: they count for the breaker.
NODE_FATAL_ACTIONS = frozenset({"failover", "evict", "cordon"})
#: Events a later healthy reading cancels: a GPU that was lost answers NVML again.
HEALED_BY_READING = frozenset({"gpu_lost", "gpu_fallen_off_bus"})


def means_broken(f: Finding) -> bool:
    """Whether ``f`` says its node itself is broken (it counts for the breaker)."""
    return f.kind == "heartbeat" or bool(NODE_FATAL_ACTIONS & set(f.actions))


def heals_by_reading(engine: RuleEngine, rule_name: str) -> bool:
    """Whether the GPU fault of rule ``rule_name`` closes on a healthy reading."""
    rule = engine.rule(rule_name)
    return isinstance(rule, EventRule) and rule.event in HEALED_BY_READING


class FleetState:
    """The per-node state in memory and its lock (module docstring)."""

    def __init__(self, registry: NodeRegistry, heals_by_reading: Callable[[str], bool]) -> None:
        """``heals_by_reading``: whether a rule's GPU fault closes on a healthy reading."""
        self._registry = registry
        self._heals_by_reading = heals_by_reading
        self._lock = threading.RLock()
        self._firing: dict[str, set[tuple[str, str]]] = {}
        #: The findings firing on each node that mean the node itself is broken, with
        #: when each was detected (wall).
        self._fatal: dict[str, dict[tuple[str, str], float]] = {}
        self._lost: set[str] = set()
        #: GPUs with a lost / fallen-off-bus incident open, by node, with when the agent
        #: first saw the loss (wall): a healthy reading sampled after that closes them
        #: (checked on the reports of these nodes only).
        self._gone_gpus: dict[str, dict[int, float]] = {}
        #: Nodes an eviction ran on, until they are uncordoned.
        self._evicted: set[str] = set()
        self._cordoned: set[str] = set()
        self._states: dict[str, NodeState] = {}
        #: The nodes whose recorded state is not healthy.
        self._unhealthy: set[str] = set()

    # ------------------------------------------------------------------ after a restart

    def restore_node(self, name: str, state: NodeState, cordoned_by_us: bool,
                     evicted: Callable[[str], bool]) -> None:
        """A node as the store remembers it; ``evicted`` asked only of a cordoned one."""
        self.set_state(name, state)
        if cordoned_by_us:
            self._cordoned.add(name)
            if evicted(name):
                self._evicted.add(name)

    def restore_firing(self, node: str, rule: str, subject: str,
                       broken_since: float | None) -> None:
        """An incident left open: its rule fires (and means the node broken since then)."""
        self._firing.setdefault(node, set()).add((rule, subject))
        if broken_since is not None:
            self._fatal.setdefault(node, {})[(rule, subject)] = broken_since

    # ------------------------------------------------------------------ findings

    def fired(self, f: Finding) -> None:
        with self._lock:
            self._firing.setdefault(f.node, set()).add((f.rule, f.subject))
            if f.gpu is not None and self._heals_by_reading(f.rule):
                gone = self._gone_gpus.setdefault(f.node, {})
                gone[f.gpu] = min(gone.get(f.gpu, f.observed_wall), f.observed_wall)
            if means_broken(f):
                self._fatal.setdefault(f.node, {})[(f.rule, f.subject)] = f.detected_wall
            if f.kind == "heartbeat":
                self._lost.add(f.node)

    def escalated(self, f: Finding) -> None:
        """An escalated finding that now means its node is broken."""
        if means_broken(f):
            with self._lock:
                self._fatal.setdefault(f.node, {})[(f.rule, f.subject)] = f.detected_wall

    def resolved(self, f: Finding) -> None:
        """``f`` no longer fires."""
        with self._lock:
            if f.gpu is not None and self._heals_by_reading(f.rule):
                gone = self._gone_gpus.get(f.node)
                if gone is not None:
                    gone.pop(f.gpu, None)
                    if not gone:
                        del self._gone_gpus[f.node]
            self._firing.get(f.node, set()).discard((f.rule, f.subject))
            self._fatal.get(f.node, {}).pop((f.rule, f.subject), None)
            if f.kind == "heartbeat":
                self._lost.discard(f.node)

    def is_firing(self, f: Finding) -> bool:
        with self._lock:
            return (f.rule, f.subject) in self._firing.get(f.node, set())

    def firing_pairs(self) -> tuple[tuple[str, str], ...]:
        """(rule, node) of every rule firing, for the metrics."""
        with self._lock:
            return tuple((rule, node) for node, pairs in self._firing.items()
                         for rule, _ in pairs)

    def firing_rules(self, node: str) -> list[str]:
        with self._lock:
            return sorted({rule for rule, _ in self._firing.get(node, ())})

    def critical_among(self, nodes: Iterable[str], critical: set[str]) -> tuple[str, ...]:
        """Those of ``nodes`` on which one of the ``critical`` rules fires."""
        with self._lock:
            return tuple(sorted(n for n in nodes
                                if any(rule in critical for rule, _ in self._firing.get(n, ()))))

    # ------------------------------------------------------------------ reports

    def gpus_gone(self, node: str) -> dict[int, float] | None:
        """The GPUs of ``node`` a healthy reading brings back, with when each loss was seen.

        None: none. A reading sampled before that time says nothing of the loss: the
        fault's event can arrive (on the fast path) before a sample taken just before it.
        """
        with self._lock:
            gone = self._gone_gpus.get(node)
            return dict(gone) if gone is not None else None

    def reporting(self, node: str) -> None:
        """``node`` reports again: it is no longer lost."""
        if node in self._lost:
            self._lost.discard(node)

    # ------------------------------------------------------------------ evictions

    def is_evicted(self, node: str) -> bool:
        with self._lock:
            return node in self._evicted

    def eviction(self, node: str, evicted: bool) -> None:
        """An eviction ran on ``node`` (``evicted``) or it was uncordoned."""
        with self._lock:
            if evicted:
                self._evicted.add(node)
            else:
                self._evicted.discard(node)

    def cordoned_by_us(self, node: str) -> bool:
        return node in self._cordoned

    def summary(self, cordoned: set[str] | None) -> ClusterSummary:
        """The numbers the safety policy needs; ``cordoned``: what the store says now.

        The sweep copies the store's cordons into memory only every few seconds, and a
        second cordon within those seconds must see the first one (max_unavailable):
        the caller reads them from the store. Set arithmetic only: this runs before
        every action, and a per-node walk of 8,192 nodes here was most of the
        controller's CPU in a burst.
        """
        known = self._registry.names()
        with self._lock:
            if cordoned is not None:
                self._cordoned = cordoned
            out = frozenset((self._lost | self._cordoned) & known)
        return ClusterSummary(total_nodes=max(1, len(known)), unavailable=out)

    # ------------------------------------------------------------------ states

    def node_healthy(self, node: str, since: float | None = None) -> bool:
        """The node reports, and nothing that means it is broken is firing on it.

        With ``since`` (wall time), faults detected before it do not count: the breaker
        asks whether a node is back from what it counted the node for, and a node that
        was broken before the burst (and stays so) is back from the burst.
        """
        with self._lock:
            fatal = self._fatal.get(node, {})
            return node not in self._lost and self._registry.get(node) is not None and \
                not [at for at in fatal.values() if since is None or at >= since]

    def state_of(self, node: str) -> NodeState:
        with self._lock:
            if node in self._lost:
                return "lost"
            if node in self._evicted and node in self._cordoned:
                return "evicted"
            if node in self._cordoned:
                return "cordoned"
            if self._firing.get(node):
                return "degraded"
        return "healthy"

    def changed_states(self, cordoned: set[str], views: Mapping[str, NodeView]
                       ) -> list[tuple[str, NodeState, str]]:
        """The nodes whose state differs from the one recorded: (node, state, reason).

        ``cordoned``: the nodes the store says the controller cordoned. Each view takes
        its node's state.
        """
        with self._lock:
            self._cordoned = cordoned
            # Only these can be anything but healthy, or have just become healthy: the
            # rest of a fleet of thousands is healthy and stays so (not walked each time).
            suspects = (self._lost | self._evicted | cordoned
                        | {n for n, pairs in self._firing.items() if pairs})
        suspects |= self._unhealthy
        suspects |= views.keys() - self._states.keys()
        changed: list[tuple[str, NodeState, str]] = []
        for name in suspects:
            view = views.get(name)
            if view is None:
                continue
            state = self.state_of(name)
            if self._states.get(name) != state:
                reason = ", ".join(sorted(r for r, _ in self._firing.get(name, ()))) or "clear"
                changed.append((name, state, reason))
            view.state = state
        return changed

    def recorded(self, changed: Sequence[tuple[str, NodeState, str]]) -> None:
        """The store took these states."""
        for name, state, _ in changed:
            self.set_state(name, state)

    def set_state(self, node: str, state: NodeState) -> None:
        """The state recorded for ``node``; the unhealthy ones are kept apart (refresh)."""
        self._states[node] = state
        if state == "healthy":
            self._unhealthy.discard(node)
        else:
            self._unhealthy.add(node)
