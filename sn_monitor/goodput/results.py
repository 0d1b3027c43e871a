"""A replay's outcome per policy, and the table and JSON that show them side by side."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sn_monitor.ettr import effective_training_ratio
from sn_monitor.goodput.noise import NoiseKind
from sn_monitor.goodput.trace import Trace
from sn_monitor.goodput.world import CAUSES, TORCHRUN_RELAUNCH, JobWorld, WorldSettings

DALY_2006 = ('J. T. Daly, "A higher order estimate of the optimum checkpoint interval for '
             'restart dumps", Future Generation Computer Systems 22(3), 2006')
SPLIT = ("detection", "eviction", "relaunch", "load")
#: The policies a replay knows; each may be named with an interval (``NAME@INTERVAL``,
#: intervals.py).
BASELINE_POLICIES = ("kubernetes", "torchrun")
POLICIES = (*BASELINE_POLICIES, "sn-monitor", "sn-monitor-advisor")
#: What a replay compares unless told otherwise, in the table's order: each baseline
#: at its default interval and at its best.
DEFAULT_POLICIES = ("kubernetes", "kubernetes@auto", "torchrun", "torchrun@auto",
                    "sn-monitor", "sn-monitor-advisor")


@dataclass(frozen=True)
class PolicyResult:
    """What one policy made of the trace."""

    name: str
    title: str
    #: Every timing behind the row, each with its source.
    assumes: list[str]
    ettr: float
    #: Training seconds done and then thrown away by restores (recomputed).
    lost_work_seconds: float
    lost_steps: int
    downtime_seconds: dict[str, float]
    #: Every stop of the running job, and by cause (world.Cause): the trace's faults,
    #: the policy's own restarts, its restarts for a healthy node.
    interruptions: int
    interruptions_by_cause: dict[str, int]
    lost_work_by_cause_seconds: dict[str, float]
    false_evictions: int
    false_checkpoints: int
    checkpoints: int
    checkpoint_interval_seconds: float | None
    replay_seconds: float
    #: The controller's own ETTR gauge at the end (sn-monitor policies only): the same
    #: :func:`~sn_monitor.ettr.effective_training_ratio` of what the job reported to it.
    controller_ettr: float | None = None
    notes: list[str] = field(default_factory=list)


def result_of(world: JobWorld, end: float, *, name: str, title: str, assumes: Sequence[str],
              interval: float | None, replay_seconds: float,
              controller_ettr: float | None = None,
              notes: Sequence[str] = ()) -> PolicyResult:
    """Read the world's accounting at the end of the run."""
    split = dict.fromkeys(SPLIT, 0.0)
    for record in world.interruptions:
        for key, value in record.split(end).items():
            split[key] += value
    lost = sum(r.lost_work for r in world.interruptions)
    stops = {cause: [r for r in world.interruptions if r.cause == cause] for cause in CAUSES}
    kept = world.kept_work(end)
    step = float(world.settings.step_seconds)
    return PolicyResult(
        name=name, title=title, assumes=list(assumes),
        ettr=effective_training_ratio(kept, end) or 0.0,
        lost_work_seconds=round(lost, 3), lost_steps=int(lost // step),
        downtime_seconds={k: round(v, 3) for k, v in split.items()},
        interruptions=len(world.interruptions),
        interruptions_by_cause={cause: len(records) for cause, records in stops.items()},
        lost_work_by_cause_seconds={cause: round(sum(r.lost_work for r in records), 3)
                                    for cause, records in stops.items()},
        false_evictions=world.false_evictions, false_checkpoints=world.false_checkpoints,
        checkpoints=len(world.checkpoints),
        checkpoint_interval_seconds=interval, replay_seconds=round(replay_seconds, 2),
        controller_ettr=controller_ettr, notes=list(notes))


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def _by_cause(values: dict[str, float] | dict[str, int], form: str) -> str:
    return " / ".join(format(values[cause], form) for cause in CAUSES)


def table(results: Sequence[PolicyResult], trace: Trace, settings: WorldSettings,
          seed: int | None, noise: Sequence[NoiseKind] = ()) -> str:
    """The side-by-side table, then the trace, the noise and every assumption behind it."""
    head = ("policy", "ETTR", "lost work", "detection", "eviction", "relaunch", "load",
            "interruptions", "fault / own / false", "lost to fault / own / false",
            "false evictions", "false checkpoints", "checkpoint every")
    rows = [head]
    for r in results:
        d = r.downtime_seconds
        lost_hours = {k: v / 3600 for k, v in r.lost_work_by_cause_seconds.items()}
        rows.append((r.title, f"{r.ettr * 100:.2f} %", _hours(r.lost_work_seconds),
                     _hours(d["detection"]), _hours(d["eviction"]), _hours(d["relaunch"]),
                     _hours(d["load"]), str(r.interruptions),
                     _by_cause(r.interruptions_by_cause, "d"),
                     _by_cause(lost_hours, ".1f") + " h",
                     str(r.false_evictions), str(r.false_checkpoints),
                     f"{r.checkpoint_interval_seconds:.0f} s"
                     if r.checkpoint_interval_seconds else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += _headline(results, trace)
    lines += ["", f"trace: {trace.source}",
              f"  {len(trace.faults)} interruptions in {trace.duration / 86400:.1f} days"
              f"{f', seed {seed}' if seed is not None else ''}: "
              + ", ".join(f"{k} {v}" for k, v in trace.by_kind().items())
              + f"; {trace.warned()} preceded by a warning signal",
              f"job: {settings.nodes} nodes x {settings.gpus_per_node} GPUs, "
              f"{settings.spares} spares (sn-monitor), step {settings.step_seconds:g} s; "
              f"checkpoint: training pauses {settings.save_blocking:g} s, complete "
              f"{settings.save_persist:g} s later; restart: relaunch "
              f"{settings.relaunch:g} s ({settings.relaunch_seconds(warm=True):g} s warm) "
              f"+ load {settings.load:g} s; a person acts on what "
              f"no tool does after {settings.operator_response:g} s (--operator-response), "
              f"a replacement node comes in {settings.replacement:g} s (--replacement)",
              f"warm relaunch: {warm_relaunch_source(settings)}",
              *_noise_lines(noise),
              "assumptions:"]
    said: list[list[str]] = []
    for r in results:
        lines.append(f"  {r.title}:")
        shown = ["as above"] if r.assumes in said else r.assumes
        said.append(r.assumes)
        lines += [f"    {line}" for line in [*shown, *r.notes]]
    if any("Daly 2006" in note for r in results for note in r.notes):
        lines.append(f"Daly 2006: {DALY_2006}")
    return "\n".join(lines)


def warm_relaunch_source(settings: WorldSettings) -> str:
    """The warm relaunch, what makes a restart warm, and where the figure comes from."""
    what = (f"{settings.relaunch_seconds(warm=True):g} s, a restore that keeps the running "
            "ranks and starts none cold (sn-monitor's; the baselines' restarts are cold)")
    if settings.warm_relaunch is not None:
        return f"{what} (--warm-relaunch)"
    bench = TORCHRUN_RELAUNCH
    return (f"{what}: assumed, what a warm restore cannot skip at this scale (the new "
            f"NCCL communicators, the spares' join); on a real torchrun job the relaunch "
            f"went from {bench.cold_seconds:g} s cold to {bench.warm_seconds:g} s warm "
            f"({bench.source}; no NCCL there: x{bench.ratio:.3f} is not carried over)")


def _noise_lines(noise: Sequence[NoiseKind]) -> list[str]:
    if not noise:
        return ["noise on healthy nodes: off (--noise off)"]
    return ["noise on healthy nodes (the baselines act on no report):",
            *(f"  {kind.line()}" for kind in noise)]


def _headline(results: Sequence[PolicyResult], trace: Trace) -> list[str]:
    """The best sn-monitor row's margin over the best baseline row (each at its best)."""
    baselines = [r for r in results if r.name.partition("@")[0] in BASELINE_POLICIES]
    ours = [r for r in results if r not in baselines]
    if not baselines or not ours:
        return []
    best, rival = max(ours, key=lambda r: r.ettr), max(baselines, key=lambda r: r.ettr)
    gap = (best.ettr - rival.ettr) * 100
    return ["", f"{best.title}: {gap:+.2f} points of ETTR over the best baseline "
                f"({rival.title}: {rival.checkpoint_interval_seconds or 0:.0f} s), "
                f"{gap / 100 * trace.duration / 3600:.1f} h of the job's "
                f"{trace.duration / 3600:.0f} h"]


def to_json(results: Sequence[PolicyResult], trace: Trace, settings: WorldSettings,
            seed: int | None, wall_seconds: float,
            noise: Sequence[NoiseKind] = ()) -> dict[str, Any]:
    return {
        "trace": {"source": trace.source, "days": trace.duration / 86400,
                  "interruptions": len(trace.faults), "by_kind": trace.by_kind(),
                  "warned": trace.warned(), "seed": seed},
        "noise": [asdict(kind) for kind in noise],
        "job": {**asdict(settings),
                "warm_relaunch": settings.relaunch_seconds(warm=True),
                "warm_relaunch_source": warm_relaunch_source(settings)},
        "policies": [asdict(r) for r in results],
        "wall_seconds": round(wall_seconds, 2),
    }
