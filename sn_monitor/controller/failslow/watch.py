"""The controller's side of the finder: jobs' paces in, fail-slow incidents out.

Every ``every`` seconds :meth:`FailSlowWatch.tick` gives the finder each running job's
step time and asks it for the bottlenecks standing; a bottleneck newly named is a
``fail-slow`` finding that fires (an incident: node, ``job:<job>/<link>``), one no
longer named resolves. A job that recovered onto other nodes (a new generation) starts
its pace again: the old one was measured on other hardware.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sn_monitor.controller.failslow.finder import Bottleneck, BottleneckFinder
from sn_monitor.rules.base import Finding

RULE = "fail-slow"
KIND = "fail-slow"
#: Seconds between evaluations: a report brings the finder's values every few seconds.
EVERY_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class JobPace:
    """What the watch needs of a job: who runs it and how fast."""

    name: str
    nodes: tuple[str, ...]
    generation: int
    running: bool
    step_time_seconds: float | None


def _subject(b: Bottleneck) -> str:
    return f"job:{b.job}/{b.link}"


def finding(b: Bottleneck, status: str, now: float) -> Finding:
    """The incident finding of a bottleneck (``firing`` or ``resolved``)."""
    return Finding(
        rule=RULE, kind=KIND, node=b.node, subject=_subject(b), gpu=b.gpu,
        status="firing" if status == "firing" else "resolved", severity="warning",
        actions=("alert",), dry_run=False, value=b.slowdown_ratio, message=b.message,
        observed_wall=b.since, detected_wall=now)


class FailSlowWatch:
    """Feeds the finder and turns what it names into findings (module docstring)."""

    def __init__(self, finder: BottleneckFinder, every_seconds: float = EVERY_SECONDS) -> None:
        self.finder = finder
        self.every = every_seconds
        self._last = -float("inf")
        self._generations: dict[str, int] = {}
        #: The bottlenecks standing, by key: what the incidents say.
        self.standing: dict[tuple[str, str, str, str], Bottleneck] = {}

    def firing(self) -> set[tuple[str, str, str]]:
        """(rule, node, subject) of each standing bottleneck's incident."""
        return {(RULE, b.node, _subject(b)) for b in self.standing.values()}

    def due(self, now: float) -> bool:
        """Whether :meth:`tick` would evaluate now."""
        return self.finder.settings.enabled and now - self._last >= self.every

    def tick(self, jobs: Sequence[JobPace], now: float) -> list[Finding]:
        """Evaluate when due; the findings to fire and resolve (none when not due)."""
        if not self.due(now):
            return []
        self._last = now
        finder = self.finder
        running: dict[str, Sequence[str]] = {}
        for job in jobs:
            if self._generations.get(job.name, job.generation) != job.generation:
                finder.forget_job(job.name)
            self._generations[job.name] = job.generation
            if job.running and job.nodes:
                running[job.name] = job.nodes
                if job.step_time_seconds:
                    finder.observe_step_time(job.name, job.step_time_seconds, now)
        for name in [n for n in self._generations if n not in {j.name for j in jobs}]:
            del self._generations[name]
            finder.forget_job(name)
        named = {b.key: b for b in finder.find(running, now)}
        out = [finding(b, "firing", now) for key, b in named.items()
               if key not in self.standing]
        out += [finding(b, "resolved", now) for key, b in self.standing.items()
                if key not in named]
        self.standing = named
        return out
