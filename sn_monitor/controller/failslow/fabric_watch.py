"""The fleet's fabric as the controller holds it: the finder, its meter and book, the watch.

Reports bring each node's wiring (the book) and link counters (the meter); the sweep
gives the jobs' paces to the fail-slow watch; the API reads it all as the topology. One
lock is held around the finder, its meter and its book, which every report takes: under
it only copies are made. The rates are worked in under the meter's readings lock, which
no report takes, and documents are built with no lock held. Otherwise the event loop
would wait on the fabric lock, every report behind it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sn_monitor.controller.fabric.meter import NodeValues
from sn_monitor.controller.fabric.view import FabricScope, FleetFabric, JobOnFabric
from sn_monitor.controller.failslow.finder import BottleneckFinder
from sn_monitor.controller.failslow.watch import FailSlowWatch, JobPace
from sn_monitor.model import Report
from sn_monitor.rules.base import Finding
from sn_monitor.rules.view import NodeView


class FabricWatch:
    """The finder and the fail-slow watch behind the fabric lock (module docstring)."""

    def __init__(self, finder: BottleneckFinder, failslow: FailSlowWatch) -> None:
        self.finder = finder
        self.failslow = failslow
        self._lock = threading.Lock()

    def take_report(self, report: Report) -> bool:
        """A report's wiring and counters (rates over the agent's own sampling intervals).

        True: the controller wants the node's topology (the agent sends it next time).
        """
        with self._lock:
            wanted = self.finder.book.take(report)
            self.finder.meter.observe(report, report.sample_time_seconds)
        return wanted

    def firing(self) -> set[tuple[str, str, str]]:
        """(rule, node, subject) of each standing bottleneck's incident."""
        with self._lock:
            return self.failslow.firing()

    def due(self, now: float) -> bool:
        return self.failslow.due(now)

    def tick(self, paces: Sequence[JobPace], now: float) -> list[Finding]:
        """The jobs' paces to the finder, its bottlenecks as findings."""
        # the meter's readings lock first: waiting for it (a topology being read) while
        # holding the fabric lock would hold every report
        with self.finder.meter.reading(), self._lock:
            return self.failslow.tick(paces, now)

    def paces(self, now: float) -> dict[str, Any]:
        """The finder's view of the jobs, for the metrics."""
        with self._lock:
            paces: dict[str, tuple[float | None, float | None, float]] = {}
            for job in self.finder.jobs():
                trend = self.finder.trend(job)
                slow = self.finder.slowdown(job, now)
                if trend is not None:
                    paces[job] = (trend.latest(), trend.baseline(), slow.ratio if slow else 0.0)
            named = tuple((b.job, b.node, b.link, b.kind)
                          for b in self.failslow.standing.values())
        return {"job_paces": paces, "fail_slow": named}

    def fabric(self, *, now: float, views: Mapping[str, NodeView], states: Mapping[str, str],
               incidents: Sequence[Mapping[str, Any]], jobs: Sequence[JobOnFabric],
               health: bool = False, scope: FabricScope | None = None) -> FleetFabric:
        """What the fleet graph shows (fabric.view): ``jobs`` with their paces, and more.

        The wirings, rates and standing bottlenecks join what the caller gathered. With
        ``health``, each node's readings are what the health rules read of them
        (:meth:`~.meter.FabricMeter.health`, no rates): all the overview shows. With
        ``scope``, so are those of the nodes out of it (a document of one rack reads
        the others' link rates only, for its rails' best).
        """
        paced: list[JobOnFabric] = []
        with self._lock:
            for j in jobs:
                trend = self.finder.trend(j.name)
                slow = self.finder.slowdown(j.name, now)
                paced.append(replace(
                    j, baseline_step_time_seconds=trend.baseline() if trend else None,
                    slowdown_ratio=slow.ratio if slow else 0.0 if trend else None))
            fail_slow = [{"job": b.job, "node": b.node, "link": b.link, "kind": b.kind,
                          "rail": b.rail, "gpu": b.gpu, "since": b.since,
                          "detected": b.detected, "slowdown_ratio": round(b.slowdown_ratio, 4),
                          "message": b.message} for b in self.failslow.standing.values()]
            wirings = self.finder.book.wirings()
        meter = self.finder.meter

        def read(name: str, view: NodeView) -> NodeValues | None:
            whole = not health and (scope is None or scope.holds(view))
            return meter.values(name) if whole else meter.health(name)

        readings = {name: values for name, view in views.items()
                    if (values := read(name, view)) is not None}
        return FleetFabric(now=now, views=views, states=states, incidents=incidents,
                           wirings=wirings, readings=readings, jobs=paced, fail_slow=fail_slow)
