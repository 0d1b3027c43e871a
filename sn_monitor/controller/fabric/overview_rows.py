"""The overview kept between builds: a node is judged again only when its row may change.

:func:`~.overview.fleet_overview` judges every node of the fleet, every GPU and port of
it, on every build: half a second at 8,192 nodes, nearly all of it spent on nodes whose
row did not change. :class:`OverviewRows` keeps each node's row (encoded) with the inputs
it was judged from, reduced to what the health rules read: its labels, state, open
incidents (severity and GPU), standing bottlenecks, first job and wiring; of its readings
which GPUs and ports there are, per GPU whether it is lost or slowed, per port its state,
link rate and whether it counts errors (:func:`read_parts`); of its report which GPUs and
NICs it names (:func:`reported_parts`). A build works these inputs out for every node
and judges again (with :func:`~.overview.judged_node`, the same rules) only the nodes
whose inputs differ from the kept ones. The reductions are made again only for a new
object (the meter's frozen values and a report's lists are replaced, never changed).
Every node is judged again when a rail's best link rate moves (a port is judged against
its rail's best). Each rail's health is kept as a count of its ports by health, moved
as nodes are judged again.

What it answers is :func:`~.overview.fleet_overview`'s answer for the same fabric (the
tests compare the two through a fleet's changes). Thread-safe: one build at a time.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from sn_monitor.model import GpuReport, IbPortReport
from sn_monitor.rules.view import NodeView

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
    """Which GPUs and ports a node's report names (:func:`reported_parts`), and from what."""

    gpus: Sequence[GpuReport] | None
    ports: Sequence[IbPortReport] | None
    parts: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class _Kept:
    """A node's row as last judged, with the inputs it was judged from."""

    inputs: tuple[Any, ...]
    row: bytes
    health: str
    on_rails: tuple[tuple[int, str], ...]


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


def reported_parts(gpus: Sequence[GpuReport] | None,
                   ports: Sequence[IbPortReport] | None) -> tuple[Any, ...]:
    """What the health rules read of a node's report: which GPUs and NICs it names."""
    if gpus is None or ports is None:
        return ()
    return tuple([g.index for g in gpus]), tuple([p.device for p in ports])


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
        #: Per rail: the nodes' best link rates on it, counted (its best is the largest).
        self._rail_rates: dict[int, Counter[float]] = {}
        #: Per rail: its ports' healths, counted.
        self._rail_ports: dict[int, Counter[str]] = {}
        self._best: dict[int, float] = {}
        #: How many nodes were judged (again), for tests and benches.
        self.judged = 0

    def overview(self, fabric: FleetFabric, job: str | None = None) -> FleetOverview:
        """:func:`~.overview.fleet_overview` of ``fabric`` (``job``), judging what changed."""
        with self._lock:
            views = fabric.views
            for name in [n for n in self._read if n not in views]:
                self._forget(name)
            read = {name: self._read_of(name, fabric) for name in views}
            best = {rail: max(rates) for rail, rates in self._rail_rates.items()}
            if best != self._best:  # every port on a rail is judged against its best
                self._best = best
                for name in list(self._kept):
                    self._keep(name, None)
            return self._rows(fabric, read, job)

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
        """Which GPUs and NICs the node's report names, worked out only for a new list."""
        report = view.report
        gpus = report.gpus if report is not None else None
        ports = report.infiniband if report is not None else None
        held = self._reported.get(name)
        if held is not None and held.gpus is gpus and held.ports is ports:
            return held
        made = self._reported[name] = _Reported(gpus, ports, reported_parts(gpus, ports))
        return made

    def _rows(self, fabric: FleetFabric, read: Mapping[str, _Read],
              job: str | None) -> FleetOverview:
        views = fabric.views
        by_node = incidents_by_node(fabric.incidents)
        marked = marked_links(fabric.fail_slow)
        marks: dict[str, frozenset[str]] = {}
        for node, link in marked:
            marks[node] = marks.get(node, _UNMARKED) | {link}
        jobs_of = fabric.jobs_of()
        rows: dict[str, bytes] = {}
        counts = dict.fromkeys(HEALTHS, 0)
        for name in sorted(views):
            view, source = views[name], read[name]
            state = fabric.states.get(name, view.state)
            incidents = by_node.get(name, [])
            names = jobs_of.get(name, [])
            first = names[0] if names else None
            inputs = (view.labels.get("supernode", ""), view.labels.get("rack", ""),
                      view.report is None, state,
                      tuple((i.get("severity"), i.get("gpu")) for i in incidents)
                      if incidents else (),
                      source.wiring, source.parts, self._reported_of(name, view).parts,
                      marks.get(name, _UNMARKED), first)
            kept = self._kept.get(name)
            if kept is None or kept.inputs != inputs:
                judged = judged_node(view, state, incidents, source.wiring, source.readings,
                                     self._best, marked, first)
                kept = _Kept(inputs, _encoder.encode(judged.row), judged.row[3],
                             tuple(judged.on_rails))
                self._keep(name, kept)
                self.judged += 1
            if job is not None and job not in names:
                continue
            rows[name] = kept.row
            counts[kept.health] += 1
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
