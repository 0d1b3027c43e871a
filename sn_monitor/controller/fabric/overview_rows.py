"""The overview kept between builds: a build costs what changed, not the fleet.

:func:`~.overview.fleet_overview` judges every node of the fleet, every GPU and port of
it, on every build: half a second at 8,192 nodes, nearly all of it spent on nodes whose
row did not change. :class:`OverviewRows` keeps each node's row (encoded) with the inputs
it was judged from, reduced to what the health rules read: its labels, state, open
incidents (severity and GPU), standing bottlenecks, first job and wiring; of its readings
which GPUs and ports there are, per GPU whether it is lost or slowed, per port its state,
link rate and whether it counts errors (:func:`read_parts`); of its report which GPUs and
NICs it names (:func:`reported_parts`).

A build looks only at the nodes whose inputs may have changed, and judges again (with
:func:`~.overview.judged_node`, the same rules) those whose inputs differ from the kept
ones:

- the dense inputs, that every node has, are compared by identity, for they are
  replaced, never changed: the view's labels, the meter's frozen readings, the wiring;
  and the parts the report names (the registry keeps one ``NodeView.named`` tuple while
  they stay the same: every node reports every few seconds, and reading 8,192 reports
  costs more than judging them), and the state;
- the sparse ones (incidents, bottlenecks, jobs) are compared by value with the last
  build's.

Every node is judged again when a rail's best link rate moves (a port is judged against
its rail's best). Each rail's health is kept as a count of its ports by health, moved
as nodes are judged again.

What it answers is :func:`~.overview.fleet_overview`'s answer for the same fabric (the
tests compare the two through a fleet's changes). Thread-safe: one build at a time.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from sn_monitor.controller.fabric.book import NodeWiring
from sn_monitor.controller.fabric.health import (
    incidents_by_node,
    marked_links,
    rail_health,
)
from sn_monitor.controller.fabric.meter import SLOWING_REASONS, NodeValues
from sn_monitor.controller.fabric.overview import HEALTHS, FleetOverview, judged_node
from sn_monitor.controller.fabric.view import FleetFabric
from sn_monitor.rules.view import NodeView, named_parts

_encoder = msgspec.json.Encoder()
_UNMARKED: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class _Read:
    """What the rules read of a node's readings (:func:`read_parts`), and from what."""

    readings: NodeValues | None
    wiring: NodeWiring | None
    parts: tuple[Any, ...]
    #: The node's best link rate on each rail (what :func:`~.health.rail_best` takes of it).
    rates: Mapping[int, float]


@dataclass(frozen=True, slots=True)
class _Reported:
    """Which GPUs and ports a node's report names (:func:`reported_parts`), and from what.

    ``source``: the view's ``named`` where the registry keeps it, else its report.
    """

    source: object
    parts: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class _Kept:
    """A node's row as last judged, with the inputs it was judged from."""

    inputs: tuple[Any, ...]
    row: bytes
    health: str
    on_rails: tuple[tuple[int, str], ...]
    #: The view's labels and the node's state it was judged with (what a build compares
    #: first, to find the nodes to look at).
    labels: Mapping[str, str]
    state: str


def read_parts(readings: NodeValues | None) -> tuple[Any, ...]:
    """What the health rules read of a node's readings.

    Which GPUs and ports there are; per GPU whether it is lost or slowed; per port its
    state, link rate and whether it counts errors.
    """
    if readings is None:
        return ()
    return (tuple((index, g.lost, not SLOWING_REASONS.isdisjoint(g.throttle_reasons))
                  for index, g in readings.gpus.items()),
            tuple((key, p.state, p.rate_bytes_per_second, (p.errors_per_second or 0) > 0)
                  for key, p in readings.ports.items()))


def reported_parts(view: NodeView) -> tuple[Any, ...]:
    """What the health rules read of a node's report: which GPUs and NICs it names."""
    if view.named is not None:
        return view.named
    return () if view.report is None else named_parts(view.report)


def _source(view: NodeView) -> object:
    """What a node's reported parts are made from (:class:`_Reported`)."""
    return view.named if view.named is not None else view.report


def _rates(readings: NodeValues | None, wiring: NodeWiring | None) -> dict[int, float]:
    """The node's best link rate on each rail its ports report one for."""
    rates: dict[int, float] = {}
    if readings is None or wiring is None:
        return rates
    for (device, _), port in readings.ports.items():
        rail = wiring.rail(device)
        if rail is not None and port.rate_bytes_per_second:
            rates[rail] = max(rates.get(rail, 0.0), port.rate_bytes_per_second)
    return rates


def _differing(old: Mapping[str, Any], new: Mapping[str, Any]) -> set[str]:
    """The names whose value differs between ``old`` and ``new`` (one of them may lack it)."""
    if old == new:
        return set()
    return {name for name in old.keys() | new.keys() if old.get(name) != new.get(name)}


def _move(counts: dict[int, Counter[Any]], rail: int, value: Any, by: int) -> None:
    """Count ``value`` on ``rail`` ``by`` more (or fewer); a count of 0 is dropped."""
    held = counts.setdefault(rail, Counter())
    held[value] += by
    if held[value] <= 0:
        del held[value]
        if not held:
            del counts[rail]


class OverviewRows:
    """Each node's overview row, judged again only when its inputs change (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: dict[str, _Read] = {}
        self._reported: dict[str, _Reported] = {}
        self._kept: dict[str, _Kept] = {}
        #: The sparse inputs as the last build found them, per node: its open incidents
        #: (severity and GPU), its links marked by a bottleneck, its first job.
        self._incidents: dict[str, tuple[Any, ...]] = {}
        self._marks: dict[str, frozenset[str]] = {}
        self._firsts: dict[str, str] = {}
        #: Per rail: the nodes' best link rates on it, counted (its best is the largest).
        self._rail_rates: dict[int, Counter[float]] = {}
        #: Per rail: its ports' healths, counted.
        self._rail_ports: dict[int, Counter[str]] = {}
        self._best: dict[int, float] = {}
        #: How many nodes were judged (again), and how many looked at, for tests and benches.
        self.judged = 0
        self.looked_at = 0

    def overview(self, fabric: FleetFabric, job: str | None = None) -> FleetOverview:
        """:func:`~.overview.fleet_overview` of ``fabric`` (``job``), judging what changed."""
        with self._lock:
            views = fabric.views
            for name in self._read.keys() - views.keys():
                self._forget(name)
            by_node = incidents_by_node(fabric.incidents)
            marks: dict[str, frozenset[str]] = {}
            marked = marked_links(fabric.fail_slow)
            for node, link in marked:
                marks[node] = marks.get(node, _UNMARKED) | {link}
            jobs_of = fabric.jobs_of()
            incidents = {node: tuple((i.get("severity"), i.get("gpu")) for i in found)
                         for node, found in by_node.items()}
            firsts = {node: names[0] for node, names in jobs_of.items() if names}
            looked = self._replaced(fabric)
            for old, new in ((self._incidents, incidents), (self._marks, marks),
                             (self._firsts, firsts)):
                looked |= _differing(old, new)
            self._incidents, self._marks, self._firsts = incidents, marks, firsts
            looked &= views.keys()
            for name in looked:
                self._read_of(name, fabric)
            best = {rail: max(rates) for rail, rates in self._rail_rates.items()}
            if best != self._best:  # every port on a rail is judged against its best
                self._best = best
                for name in list(self._kept):
                    self._keep(name, None)
                looked = set(views)
            self.looked_at += len(looked)
            for name in looked:
                self._judge(name, fabric, by_node.get(name, []), marked)
            return self._rows(fabric, jobs_of, job)

    def _replaced(self, fabric: FleetFabric) -> set[str]:
        """The nodes whose dense inputs were replaced since the last build, or are new.

        Its view's labels, its readings and wiring (objects replaced, never changed), its
        state; and its report, where it names other GPUs or NICs than the last (every
        node reports every few seconds, and its report rarely names others).
        """
        readings, wirings, states = fabric.readings, fabric.wirings, fabric.states
        kept, read, reported = self._kept, self._read, self._reported
        replaced = set()
        for name, view in fabric.views.items():
            row, source, named = kept.get(name), read.get(name), reported.get(name)
            if (row is None or source is None or named is None
                    or row.labels is not view.labels
                    or source.readings is not readings.get(name)
                    or source.wiring is not wirings.get(name)
                    or row.state != states.get(name, view.state)
                    or (named.source is not _source(view)
                        and self._reported_of(name, view).parts != named.parts)):
                replaced.add(name)
        return replaced

    def _read_of(self, name: str, fabric: FleetFabric) -> _Read:
        """What the rules read of the node's readings, made again only when they are new."""
        readings, wiring = fabric.readings.get(name), fabric.wirings.get(name)
        held = self._read.get(name)
        if held is not None and held.readings is readings and held.wiring is wiring:
            return held
        rates: Mapping[int, float] = _rates(readings, wiring)
        if held is not None and held.rates == rates:
            rates = held.rates
        else:
            for rail, rate in (held.rates if held is not None else {}).items():
                _move(self._rail_rates, rail, rate, -1)
            for rail, rate in rates.items():
                _move(self._rail_rates, rail, rate, 1)
        made = self._read[name] = _Read(readings, wiring, read_parts(readings), rates)
        return made

    def _reported_of(self, name: str, view: NodeView) -> _Reported:
        """Which GPUs and NICs the node's report names, worked out only for a new source."""
        source = _source(view)
        held = self._reported.get(name)
        if held is not None and held.source is source:
            return held
        made = self._reported[name] = _Reported(source, reported_parts(view))
        return made

    def _judge(self, name: str, fabric: FleetFabric, incidents: list[Mapping[str, Any]],
               marked: set[tuple[str, str]]) -> None:
        """The node's row judged again, where its inputs differ from those it was judged on."""
        view, source = fabric.views[name], self._read[name]
        state = fabric.states.get(name, view.state)
        first = self._firsts.get(name)
        inputs = (view.labels.get("supernode", ""), view.labels.get("rack", ""),
                  view.report is None, state, self._incidents.get(name, ()),
                  source.wiring, source.parts, self._reported_of(name, view).parts,
                  self._marks.get(name, _UNMARKED), first)
        kept = self._kept.get(name)
        if kept is not None and kept.inputs == inputs:
            if kept.labels is not view.labels:
                self._kept[name] = replace(kept, labels=view.labels)
            return
        judged = judged_node(view, state, incidents, source.wiring, source.readings,
                             self._best, marked, first)
        self._keep(name, _Kept(inputs, _encoder.encode(judged.row), judged.row[3],
                               tuple(judged.on_rails), view.labels, state))
        self.judged += 1

    def _rows(self, fabric: FleetFabric, jobs_of: Mapping[str, list[str]],
              job: str | None) -> FleetOverview:
        kept = self._kept
        names = sorted(fabric.views)
        if job is not None:
            names = [name for name in names if job in jobs_of.get(name, ())]
        rows = {name: kept[name].row for name in names}
        counts = dict.fromkeys(HEALTHS, 0)
        counts.update(Counter(kept[name].health for name in names))
        return FleetOverview(rows, counts, {
            str(rail): rail_health(list(healths))
            for rail, healths in sorted(self._rail_ports.items())},
            [dict(b) for b in fabric.fail_slow])

    def _keep(self, name: str, kept: _Kept | None) -> None:
        """``kept`` as the node's row (None: none), its ports moved on the rails' counts."""
        held = self._kept.pop(name, None)
        for rail, health in held.on_rails if held is not None else ():
            _move(self._rail_ports, rail, health, -1)
        if kept is not None:
            self._kept[name] = kept
            for rail, health in kept.on_rails:
                _move(self._rail_ports, rail, health, 1)

    def _forget(self, name: str) -> None:
        """A node no longer in the fleet: its row, and its rates on the rails."""
        self._keep(name, None)
        self._reported.pop(name, None)
        held = self._read.pop(name)
        for rail, rate in held.rates.items():
            _move(self._rail_rates, rail, rate, -1)
