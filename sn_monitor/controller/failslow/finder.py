"""The bottleneck finder: a job that runs slower, and the node and link to blame.

Two questions, answered from two sources:

1. **Is the job slow, and since when?** Its step time against its own healthy pace
   (:mod:`.steps`): the ranks' progress reports.
2. **Who holds it back?** Its nodes' links and GPUs against their peers
   (:mod:`.suspects`): the agents' reports, turned into rates by the
   :class:`~sn_monitor.controller.fabric.meter.FabricMeter`.

Only a slow job is searched: a port that waits more than its rail while the job keeps
its pace is not what holds the job back (and naming it would page someone for
nothing). A suspect is named once it stands ``confirm`` evaluations in a row (one
noisy interval names nobody); the strongest kind is named (facts before statistics,
:data:`~.suspects.PRIORITY`), and with it any other suspect at least ``also_strength``
strong (two faults at once). A named bottleneck stands while its job is slow and it
stands out; then it is gone from :meth:`BottleneckFinder.find`'s answer.

Times are passed in, never read: the controller passes its clock, the benchmark its
simulated time.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sn_monitor.config import positive, setting
from sn_monitor.controller.fabric.book import TopologyBook
from sn_monitor.controller.fabric.meter import FabricMeter
from sn_monitor.controller.failslow.steps import Slowdown, StepTrend, TrendSettings
from sn_monitor.controller.failslow.suspects import Suspect, SuspectSettings, find_suspects
from sn_monitor.model import NodeTopology, Report

FAIL_SLOW_KINDS = ("congested-link", "nic-degraded", "nvlink-slow", "gpu-throttled",
                   "noisy-neighbour")


@dataclass(frozen=True)
class FailSlowSettings:
    """How the finder judges (the controller's ``fail_slow:`` setting)."""

    #: Off: no fail-slow incidents (the topology page still shows rates).
    enabled: bool = True
    trend: TrendSettings = field(default_factory=TrendSettings)
    suspects: SuspectSettings = field(default_factory=SuspectSettings)
    #: Evaluations in a row a suspect must stand before it is named.
    confirm: int = setting(default=2, check=positive)
    #: Besides the strongest, suspects at least this strong are named too.
    also_strength: float = setting(default=3.0, check=positive)


@dataclass(frozen=True, slots=True)
class Bottleneck:
    """A node and link that slow a job down, and the evidence."""

    job: str
    node: str
    link: str
    kind: str
    rail: int | None
    gpu: int | None
    slowdown_ratio: float
    since: float
    detected: float
    evidence: str
    message: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.job, self.kind, self.node, self.link


def _clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(seconds))


class BottleneckFinder:
    """Per job, its slowdown and the bottleneck that causes it (module docstring)."""

    def __init__(self, settings: FailSlowSettings | None = None,
                 meter: FabricMeter | None = None, book: TopologyBook | None = None) -> None:
        self.settings = settings or FailSlowSettings()
        self.meter = meter if meter is not None else FabricMeter()
        self.book = book if book is not None else TopologyBook()
        self._trends: dict[str, StepTrend] = {}
        #: job -> suspects seen at the last evaluation, with how many evaluations in a row
        self._streaks: dict[str, dict[tuple[str, str, str], int]] = {}
        #: job -> the bottlenecks named, by key, with when first named
        self._named: dict[str, dict[tuple[str, str, str, str], float]] = {}

    # ----- inputs -----

    def observe(self, report: Report, now: float) -> None:
        """A node's report: its counters and, when it carries one, its topology."""
        if report.topology is not None:
            self.book.put(report.node, report.topology, report.topology_digest)
        self.meter.observe(report, now)

    def observe_topology(self, node: str, topology: NodeTopology) -> None:
        self.book.put(node, topology)

    def observe_step_time(self, job: str, step_time_seconds: float, now: float) -> None:
        """The job's current step time (the median over its ranks), every few seconds."""
        trend = self._trends.get(job)
        if trend is None:
            trend = self._trends[job] = StepTrend(self.settings.trend)
        trend.add(step_time_seconds, now)

    def forget_job(self, job: str) -> None:
        for table in (self._trends, self._streaks, self._named):
            table.pop(job, None)

    # ----- answers -----

    def slowdown(self, job: str, now: float) -> Slowdown | None:
        trend = self._trends.get(job)
        return trend.slowdown(now) if trend is not None else None

    def jobs(self) -> list[str]:
        """The jobs whose pace the finder follows."""
        return list(self._trends)

    def trend(self, job: str) -> StepTrend | None:
        return self._trends.get(job)

    def find(self, jobs: Mapping[str, Sequence[str]], now: float) -> list[Bottleneck]:
        """The bottlenecks standing now, of the jobs ``jobs`` (job -> its nodes)."""
        out: list[Bottleneck] = []
        for job in [j for j in self._named if j not in jobs]:
            self._named.pop(job, None)
            self._streaks.pop(job, None)
        for job, nodes in jobs.items():
            slow = self.slowdown(job, now)
            if slow is None:
                self._streaks.pop(job, None)
                self._named.pop(job, None)
                continue
            suspects = find_suspects(nodes, self.meter, self.book, self.settings.suspects)
            out.extend(self._name(job, slow, suspects, now))
        return out

    def _name(self, job: str, slow: Slowdown, suspects: list[Suspect],
              now: float) -> list[Bottleneck]:
        before = self._streaks.get(job, {})
        streaks = {s.key: before.get(s.key, 0) + 1 for s in suspects}
        self._streaks[job] = streaks
        confirmed = [s for s in suspects if streaks[s.key] >= self.settings.confirm]
        named = self._named.get(job, {})
        chosen = confirmed[:1] + [s for s in confirmed[1:]
                                  if s.strength >= self.settings.also_strength]
        # a bottleneck already named stays named while it stands out at all
        chosen += [s for s in confirmed if s not in chosen
                   and (job, *s.key) in named]
        kept: dict[tuple[str, str, str, str], float] = {}
        out = []
        for s in chosen:
            key = (job, *s.key)
            detected = named.get(key, now)
            kept[key] = detected
            pct = slow.ratio * 100
            out.append(Bottleneck(
                job=job, node=s.node, link=s.link, kind=s.kind, rail=s.rail, gpu=s.gpu,
                slowdown_ratio=slow.ratio, since=slow.since, detected=detected,
                evidence=s.evidence,
                message=f"job {job}: step time +{pct:.0f} % since {_clock(slow.since)}; "
                        f"{s.evidence}"))
        self._named[job] = kept
        return out
