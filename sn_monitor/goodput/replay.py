"""``sn-monitor goodput``: one trace, one seed, every policy side by side."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sn_monitor.goodput.baselines import (
    BASELINES,
    DEFAULT_INTERVAL,
    KUBERNETES,
    TORCHRUN,
    BaselineReplay,
)
from sn_monitor.goodput.controlled import (
    Cadence,
    ControlledReplay,
    WarningCheckpoints,
    warning_checkpoints,
)
from sn_monitor.goodput.intervals import IntervalChoice, at_interval, parse_policy
from sn_monitor.goodput.noise import Noise
from sn_monitor.goodput.results import (
    BASELINE_POLICIES,
    DEFAULT_POLICIES,
    POLICIES,
    PolicyResult,
    result_of,
)
from sn_monitor.goodput.trace import Trace, retarget
from sn_monitor.goodput.world import WorldSettings
from sn_monitor.logs import muted
from sn_monitor.rules.spec import Rule, load_rules, packaged_rules

log = logging.getLogger(__name__)

#: ``--refine``: the advisor's interval times these, each replayed.
REFINE_FACTORS = (0.5, 0.75, 1.5, 2.0)

SN_ASSUMES = ("the controller itself (default rules, safety policy, breaker, recovery "
              "engine) on a virtual clock, swept every second after a fault",
              "node death: no report for 10 s (its packaged node-heartbeat rule); "
              "evictions settle 3 s; a spare replaces the node",
              "the operator gives repaired nodes back to the pool, and a healthy node "
              "taken out after --operator-response",
              "a restore whose every rank was running (kept alive across it: after a "
              "fatal XID) or is a pre-warmed spare (the job's at the start, then the pool "
              "each restore leaves) relaunches in the warm relaunch; any other start (after "
              "a lost host, a link down or a hang, which leave every rank waiting; onto a "
              "node given back since the last restore; the launcher's restart after a "
              "process exit) in the relaunch")
#: The interval each policy runs at unless named with one (``NAME@INTERVAL``).
DEFAULT_INTERVALS: dict[str, IntervalChoice] = {
    "kubernetes": DEFAULT_INTERVAL, "torchrun": DEFAULT_INTERVAL,
    "sn-monitor": DEFAULT_INTERVAL, "sn-monitor-advisor": "auto"}
TITLES = {"kubernetes": KUBERNETES.title, "torchrun": TORCHRUN.title,
          "sn-monitor": "sn-monitor", "sn-monitor-advisor": "sn-monitor + advisor"}


@dataclass(frozen=True)
class ReplayOptions:
    #: ``NAME[@INTERVAL]`` each (intervals.py).
    policies: tuple[str, ...] = DEFAULT_POLICIES
    rules: tuple[Path, ...] = ()
    cadence: Cadence = field(default_factory=Cadence)
    #: What healthy nodes' reports show (noise.py); none: ``--noise off``.
    noise: tuple[Noise, ...] = ()
    #: Let the simulated controller log (``--log-level``): off, its expected faults (a
    #: node "needs a person", CRITICAL) would bury the replay's result.
    controller_logs: bool = False


def job_nodes(settings: WorldSettings) -> list[str]:
    return [f"node-{i:04d}" for i in range(settings.nodes)]


def _prepare(trace: Trace, settings: WorldSettings,
             options: ReplayOptions) -> tuple[list[str], Trace, list[Rule]]:
    """The job's nodes, the trace on them, the rules sn-monitor runs with."""
    nodes = job_nodes(settings)
    trace, mapped = retarget(trace, nodes)
    if mapped:
        log.info("%d node names of the trace mapped onto the job's nodes", mapped)
    return nodes, trace, load_rules(list(options.rules) or [packaged_rules()])


def replay(trace: Trace, settings: WorldSettings,
           options: ReplayOptions | None = None) -> list[PolicyResult]:
    """Every policy of ``options`` on ``trace``, in order."""
    options = options or ReplayOptions()
    nodes, trace, rules = _prepare(trace, settings, options)
    return [_policy(policy, trace, settings, nodes, rules, options)
            for policy in options.policies]


def _policy(policy: str, trace: Trace, settings: WorldSettings, nodes: list[str],
            rules: Sequence[Rule], options: ReplayOptions) -> PolicyResult:
    """One ``NAME[@INTERVAL]`` on the trace, its row named and titled after both."""
    name, named = parse_policy(policy)
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r} (policies: {', '.join(POLICIES)})")
    choice = DEFAULT_INTERVALS[name] if named is None else named

    def replay_at(interval: float | str) -> PolicyResult:
        started = time.process_time()
        if name in BASELINE_POLICIES:
            baseline = next(b for b in BASELINES if b.name == name)
            world = BaselineReplay(baseline, trace, settings, nodes,
                                   float(interval)).run()
            return result_of(world, trace.duration, name=name, title=baseline.title,
                             assumes=baseline.assumptions(settings),
                             interval=float(interval),
                             replay_seconds=time.process_time() - started)
        return _controlled(name, trace, settings, nodes, rules, options, started,
                           interval=interval, warnings=name == "sn-monitor-advisor")

    result = at_interval(replay_at, choice, default=DEFAULT_INTERVAL,
                         save_seconds=float(settings.save_blocking),
                         duration=trace.duration, search=name in BASELINE_POLICIES)
    return dataclasses.replace(result, name=policy, title=_title(name, named))


def _title(name: str, named: IntervalChoice | None) -> str:
    """The row's title: the policy's; with the interval it was named with, if any."""
    if named is None:
        return TITLES[name]
    short = TITLES[name].removesuffix(" default")
    if named == "auto":
        return short + (", best interval" if name in BASELINE_POLICIES else ", auto interval")
    return short + (", Daly interval" if named == "daly" else f" every {named:g} s")


def refine(trace: Trace, settings: WorldSettings, advised: float,
           factors: Sequence[float] = REFINE_FACTORS,
           options: ReplayOptions | None = None) -> list[tuple[float, float]]:
    """The advisor's configuration again with fixed intervals around ``advised``.

    Young/Daly is a first-order optimum; the replay measures the ETTR of each candidate
    (the advised one included, as a fixed interval) on the same trace. Returns
    (interval, ETTR) pairs, best first.
    """
    options = options or ReplayOptions()
    nodes, trace, rules = _prepare(trace, settings, options)
    out = []
    for factor in sorted({1.0, *factors}):
        interval = max(1.0, advised * factor)
        result = _controlled(f"fixed-{interval:.0f}", trace, settings, nodes, rules, options,
                             time.process_time(), interval=interval, warnings=True)
        out.append((interval, result.ettr))
    return sorted(out, key=lambda pair: -pair[1])


def _controlled(name: str, trace: Trace, settings: WorldSettings, nodes: list[str],
                rules: Sequence[Rule], options: ReplayOptions, started: float, *,
                interval: float | str, warnings: bool) -> PolicyResult:
    notes = []
    used = list(rules)
    if warnings:
        added = warning_checkpoints(rules)
        used = added.rules
        notes.append(_warnings_note(interval, added))
    with tempfile.TemporaryDirectory(prefix="sn-goodput-",
                                     dir=_fast_tmp()) as tmp:
        run = ControlledReplay(trace, settings, nodes, used, state_dir=Path(tmp),
                               interval=interval, cadence=options.cadence,
                               noise=options.noise)
        quiet = muted() if options.controller_logs else muted("sn_monitor.controller")
        with quiet:
            try:
                world = run.run()
                used_interval = run.interval()
                controller_ettr = run.controller_ettr()
            finally:
                run.close()
    actions = ", ".join(f"{k} {v}" for k, v in sorted(run.counts.items()))
    notes.append(f"controller actions: {actions}")
    return result_of(world, trace.duration, name=name, title=TITLES.get(name, name),
                     assumes=SN_ASSUMES,
                     interval=used_interval, replay_seconds=time.process_time() - started,
                     controller_ettr=controller_ettr, notes=notes)


def _warnings_note(interval: float | str, added: WarningCheckpoints) -> str:
    """The advisor row's note: its interval, and which warnings got a checkpoint."""
    skipped = (f" (none on the application's XIDs: {', '.join(added.skipped)})"
               if added.skipped else "")
    return (f"checkpointInterval: {interval}"
            + (" (the advisor's interval)" if interval == "auto" else "")
            + f"; a checkpoint on every warning: {', '.join(added.changed) or 'none added'}"
            + skipped)


def _fast_tmp() -> str | None:
    """Memory-backed /dev/shm when there is one: the store's syncs cost nothing there."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None
