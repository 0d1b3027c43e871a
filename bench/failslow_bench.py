"""Fail-slow: does the bottleneck finder name the node and link that slow a job, and how fast.

Run with ``python -m bench.failslow_bench`` (``make bench``); ``--quick`` for a smoke run
(32 nodes, 10 faults: seconds). Everything runs in simulated time, in this process: the
job is :class:`sn_monitor.sim.failslow.FailSlowJob` (256 HGX H100 nodes on a
rail-optimised fabric, a report per node every 5 s), the finder is the controller's
:class:`sn_monitor.controller.failslow.finder.BottleneckFinder`, fed every report (with
the topologies they carry) and the job's pace as the controller reads it (the steps the
ranks report, through the controller's own ``JobProgress.recent_step_time``: seconds per
step over the last 30 s), and asked every 5 s.

The run: a healthy warm-up, then ``--faults-per-kind`` faults of each of the five kinds
(congested-link, nic-degraded, nvlink-slow, gpu-throttled, noisy-neighbour) in a seeded
random order, one at a time, at random nodes and links with random severities, each
standing a random 2 to 6 minutes, with healthy stretches of 1 to 4 minutes between.
Distractors come on top, at random times, during faults and between them: a storage NIC
congested for minutes (not a rail: the job does not wait on it) and a GPU throttled on a
spare node (not in the job); the model's own noise adds one-report ``transmit_wait``
bursts, brief clock dips and stray NVLink CRC errors.

Scoring. A fault is *detected* when the finder names its (node, link) while it stands
(the kind need not match; the kind's accuracy is a column of its own); detection time =
the first such naming - the injection. A naming that matches no standing fault, nor one
that ended at most 60 s before, is a *false positive*. Precision counts episodes: a
(node, link) named at consecutive evaluations with the same verdict (the same fault, or
none) is one episode. Goal (issue 18): precision >= 0.95, recall >= 0.9, median detection
< 60 s; printed beside the figures, never a failure. The exit status is 1 only when
nothing could be measured (no fault injected, a crash).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.common import add_output_args, finish, machine, pct, results_path, stop_on_sigterm
from sn_monitor.controller.failslow.finder import BottleneckFinder
from sn_monitor.controller.jobs.progress import JobProgress
from sn_monitor.sim.failslow import (
    DISTRACTOR_KINDS,
    FAIL_SLOW_KINDS,
    Distractor,
    FailSlowFault,
    FailSlowJob,
    fault_slowdown,
)

#: A naming this long after its fault ended still counts for that fault.
GRACE_SECONDS = 60.0
GOAL = {"precision": 0.95, "recall": 0.9, "median_detection_seconds": 60.0}


@dataclass(frozen=True, slots=True)
class Plan:
    """What a run injects: its size, the faults and distractors, and how long it runs."""

    nodes: int
    seed: int
    interval: float
    warmup: float
    faults: list[FailSlowFault]
    distractors: list[Distractor]
    end: float


@dataclass(slots=True)
class _Episode:
    """A (node, link) named at consecutive evaluations with one verdict."""

    node: str
    link: str
    kind: str
    fault: int | None  # the fault's index in the plan, None: a false positive
    first: float
    last: float


@dataclass(slots=True)
class Score:
    """Namings against the plan, evaluation by evaluation."""

    faults: list[FailSlowFault]
    detected: dict[int, float] = field(default_factory=dict)
    kind_named: dict[int, str] = field(default_factory=dict)
    episodes: list[_Episode] = field(default_factory=list)
    namings: int = 0
    wrong_namings: int = 0
    _open: dict[tuple[str, str], _Episode] = field(default_factory=dict)

    def match(self, node: str, link: str, now: float) -> int | None:
        """The plan's fault this naming is right about, if any."""
        for index, fault in enumerate(self.faults):
            if (fault.node == node and fault.link == link
                    and fault.start <= now < fault.end + GRACE_SECONDS):
                return index
        return None

    def take(self, named: Sequence[tuple[str, str, str]], now: float) -> None:
        """One evaluation's namings: (node, link, kind)."""
        still: dict[tuple[str, str], _Episode] = {}
        for node, link, kind in named:
            self.namings += 1
            index = self.match(node, link, now)
            if index is None:
                self.wrong_namings += 1
            elif now < self.faults[index].end and index not in self.detected:
                self.detected[index] = now
                self.kind_named[index] = kind
            episode = self._open.get((node, link))
            if episode is None or episode.fault != index:
                episode = _Episode(node, link, kind, index, now, now)
                self.episodes.append(episode)
            episode.last = now
            still[(node, link)] = episode
        self._open = still


def make_plan(nodes: int, per_kind: int, seed: int, *, interval: float = 5.0,
              warmup: float = 600.0, storage_distractors: int = 0,
              spare_distractors: int = 0) -> tuple[FailSlowJob, Plan]:
    """The job and what to inject into it, all drawn from ``seed``."""
    rng = random.Random(seed)
    job = FailSlowJob(nodes, seed=seed, report_interval_seconds=interval)
    kinds = [kind for kind in FAIL_SLOW_KINDS for _ in range(per_kind)]
    rng.shuffle(kinds)
    t = job.now + warmup
    faults = []
    for kind in kinds:
        fault = job.random_fault(kind, rng, t, rng.uniform(120.0, 360.0))
        faults.append(fault)
        t = fault.end + rng.uniform(60.0, 240.0)
    end = t
    distractors: list[Distractor] = []
    for decoy, count in zip(DISTRACTOR_KINDS, (storage_distractors, spare_distractors),
                            strict=True):
        for _ in range(count):
            start = rng.uniform(job.now + warmup / 2, end - 300.0)
            distractors.append(job.random_distractor(decoy, rng, start,
                                                     rng.uniform(60.0, 300.0)))
    items: list[FailSlowFault | Distractor] = [*faults, *distractors]
    for item in items:
        job.schedule(item)
    return job, Plan(nodes, seed, interval, warmup, faults, distractors, end)


def run(job: FailSlowJob, plan: Plan, finder: BottleneckFinder) -> tuple[Score, dict[str, Any]]:
    """Feed the finder the whole run; its namings scored and what the run cost."""
    score = Score(plan.faults)
    jobs = {job.job: job.job_nodes}
    # The pace as the controller reads it: the frontier of the ranks' progress over its
    # last 30 s (JobProgress.recent_step_time), not the model's own step time.
    progress = JobProgress(max_ranks=1)
    step, step_at = 0, job.now
    wall, cpu = time.monotonic(), time.process_time()
    model_seconds = 0.0
    ticks = 0
    while job.now + plan.interval <= plan.end:
        started = time.process_time()
        tick = job.tick()
        model_seconds += time.process_time() - started
        now = tick.time
        for report in tick.reports:
            finder.observe(report, now)
            if report.topology is not None:
                finder.observe_topology(report.node, report.topology)
        updates = []
        while step_at + tick.step_time_seconds <= now:
            step_at += tick.step_time_seconds
            step += 1
            updates.append((step, step_at))
        if updates:
            progress.update(0, job.job_nodes[0], 1, updates, None, now)
        pace = progress.recent_step_time()
        if pace is not None:
            finder.observe_step_time(job.job, pace, now)
        score.take([(b.node, b.link, b.kind) for b in finder.find(jobs, now)], now)
        ticks += 1
    cost = {"ticks": ticks, "reports": ticks * (len(job.job_nodes) + len(job.spare_nodes)),
            "simulated_hours": round(ticks * plan.interval / 3600, 2),
            "wall_seconds": round(time.monotonic() - wall, 1),
            "cpu_seconds": round(time.process_time() - cpu, 1),
            "model_cpu_seconds": round(model_seconds, 1)}
    return score, cost


def _detection(values: Sequence[float], digits: int = 1) -> dict[str, float | None]:
    return {"median": round(statistics.median(values), digits) if values else None,
            "p90": round(pct(values, 90), digits) if values else None}


def tally(plan: Plan, score: Score) -> dict[str, Any]:
    """Precision, recall, detection times, overall and per kind."""
    faults = plan.faults
    right = [e for e in score.episodes if e.fault is not None]
    wrong = [e for e in score.episodes if e.fault is None]
    delays = [score.detected[i] - faults[i].start for i in score.detected]
    kind_ok = [i for i in score.detected if score.kind_named[i] == faults[i].kind]
    decoys = {(d.node, d.link) for d in plan.distractors}
    recall = round(len(score.detected) / len(faults), 3) if faults else None
    precision = round(len(right) / len(score.episodes), 3) if score.episodes else None
    detection = _detection(delays)
    median = detection["median"]
    summary: dict[str, Any] = {
        "faults": len(faults),
        "detected": len(score.detected),
        "recall": recall,
        "precision": precision,
        "episodes": len(score.episodes),
        "false_positive_episodes": len(wrong),
        "false_positives_on_distractors": sum((e.node, e.link) in decoys for e in wrong),
        "naming_precision": (round(1 - score.wrong_namings / score.namings, 3)
                             if score.namings else None),
        "detection_seconds": detection,
        "kind_accuracy": round(len(kind_ok) / len(score.detected), 3) if score.detected else None,
        "distractors": len(plan.distractors),
        "goal": GOAL,
        "goal_met": (precision is not None and precision >= GOAL["precision"]
                     and recall is not None and recall >= GOAL["recall"]
                     and median is not None and median < GOAL["median_detection_seconds"]),
    }
    per_kind = []
    for kind in FAIL_SLOW_KINDS:
        mine = [i for i, f in enumerate(faults) if f.kind == kind]
        found = [i for i in mine if i in score.detected]
        named_as = [e for e in wrong if e.kind == kind]
        per_kind.append({
            "kind": kind, "faults": len(mine), "detected": len(found),
            "recall": round(len(found) / len(mine), 3) if mine else None,
            "detection_seconds": _detection([score.detected[i] - faults[i].start
                                             for i in found]),
            "kind_accuracy": (round(sum(score.kind_named[i] == kind for i in found)
                                    / len(found), 3) if found else None),
            "false_positive_episodes_named_as": len(named_as),
            "slowdown_ratio": _detection([fault_slowdown([faults[i]]) for i in mine], 3),
        })
    return {"summary": summary, "per_kind": per_kind,
            "faults": [_fault_row(plan, score, i) for i in range(len(faults))],
            "false_positives": [{"node": e.node, "link": e.link, "kind": e.kind,
                                 "at": round(e.first - plan.faults[0].start + plan.warmup, 1),
                                 "seconds": round(e.last - e.first, 1),
                                 "distractor": (e.node, e.link) in decoys}
                                for e in wrong[:100]]}


def _fault_row(plan: Plan, score: Score, index: int) -> dict[str, Any]:
    fault = plan.faults[index]
    origin = plan.faults[0].start - plan.warmup
    found = score.detected.get(index)
    return {"kind": fault.kind, "node": fault.node, "link": fault.link,
            "start": round(fault.start - origin, 1), "seconds": round(fault.end - fault.start, 1),
            "severity": round(fault.severity, 3), "reasons": list(fault.reasons),
            "nvlinks_down": fault.nvlinks_down,
            "slowdown_ratio": round(fault_slowdown([fault]), 3),
            "detected_after": None if found is None else round(found - fault.start, 1),
            "kind_named": score.kind_named.get(index)}


def _f(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    """The figures as a markdown table (beside the JSON, and printed)."""
    s, meta = results["summary"], results["meta"]
    lines = [
        f"Fail-slow finder: {meta['nodes']}-node job, seed {meta['seed']}, {s['faults']} faults, "
        f"{s['distractors']} distractors, {meta['cost']['simulated_hours']} simulated hours "
        f"({meta['cost']['cpu_seconds']} s CPU)",
        "",
        "| kind | faults | detected | recall | median detection s | p90 detection s "
        "| kind right | FP named as | slowdown median |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["per_kind"]:
        d = row["detection_seconds"]
        lines.append(f"| {row['kind']} | {row['faults']} | {row['detected']} | "
                     f"{_f(row['recall'], 2)} | {_f(d['median'], 1)} | {_f(d['p90'], 1)} | "
                     f"{_f(row['kind_accuracy'], 2)} | "
                     f"{row['false_positive_episodes_named_as']} | "
                     f"{_f(row['slowdown_ratio']['median'], 2)} |")
    d = s["detection_seconds"]
    lines.append(f"| **all** | {s['faults']} | {s['detected']} | {_f(s['recall'], 2)} | "
                 f"{_f(d['median'], 1)} | {_f(d['p90'], 1)} | {_f(s['kind_accuracy'], 2)} | "
                 f"{s['false_positive_episodes']} | |")
    lines += [
        "",
        f"precision {_f(s['precision'])} (goal >= {GOAL['precision']}; "
        f"{s['false_positive_episodes']} false-positive episodes of {s['episodes']}, "
        f"{s['false_positives_on_distractors']} on distractors; per naming "
        f"{_f(s['naming_precision'])}), recall {_f(s['recall'])} (goal >= {GOAL['recall']}), "
        f"median detection {_f(d['median'], 1)} s (goal < "
        f"{GOAL['median_detection_seconds']:.0f} s): "
        f"{'goal met' if s['goal_met'] else 'goal NOT met'}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failslow_bench",
                                     description=__doc__.split("\n\n")[0])
    add_output_args(parser, "a smoke run: 32 nodes, 2 faults of each kind (seconds)")
    parser.add_argument("--seed", type=int, default=None,
                        help="what draws the places, severities and times (default: random, "
                             "printed)")
    parser.add_argument("--nodes", type=int, default=None, help="job size (default 256, quick 32)")
    parser.add_argument("--faults-per-kind", type=int, default=None,
                        help="faults of each of the 5 kinds (default 10, quick 2)")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    out_path = results_path(args, "failslow.json")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    nodes = args.nodes or (32 if args.quick else 256)
    per_kind = args.faults_per_kind or (2 if args.quick else 10)
    print(f"fail-slow bench: seed {seed} (--seed {seed} repeats it), {nodes} nodes, "
          f"{per_kind} faults per kind", flush=True)
    job, plan = make_plan(nodes, per_kind, seed, warmup=300.0 if args.quick else 600.0,
                          storage_distractors=max(2, per_kind * 2),
                          spare_distractors=max(1, per_kind))
    score, cost = run(job, plan, BottleneckFinder())
    results: dict[str, Any] = {"meta": {"seed": seed, "nodes": nodes, "quick": args.quick,
                                        "faults_per_kind": per_kind,
                                        "report_interval_seconds": plan.interval,
                                        "grace_seconds": GRACE_SECONDS, "cost": cost,
                                        "machine": machine()}}
    results.update(tally(plan, score))
    table = markdown(results)
    print(table)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.with_suffix(".md").write_text(table + "\n")
    failures = [] if plan.faults else ["no fault was injected"]
    return finish(results, out_path, failures)


if __name__ == "__main__":
    sys.exit(main())
