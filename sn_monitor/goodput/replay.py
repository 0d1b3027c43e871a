"""``sn-monitor goodput``: one trace, one seed, every policy side by side."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sn_monitor.goodput.baselines import BASELINES, BaselineReplay
from sn_monitor.goodput.controlled import Cadence, ControlledReplay, warning_checkpoints
from sn_monitor.goodput.results import POLICIES, PolicyResult, result_of
from sn_monitor.goodput.trace import Trace, retarget
from sn_monitor.goodput.world import WorldSettings
from sn_monitor.logs import muted
from sn_monitor.rules.spec import Rule, load_rules, packaged_rules

log = logging.getLogger(__name__)

#: ``--refine``: the advisor's interval times these, each replayed.
REFINE_FACTORS = (0.5, 0.75, 1.5, 2.0)

SN_ASSUMES = ("the controller itself (default rules, safety policy, breaker, recovery "
              "engine) on a virtual clock, swept every second after a fault; node death: "
              "no report for 10 s; evictions settle 3 s; a spare replaces the node; the "
              "operator gives repaired nodes back to the pool")


@dataclass(frozen=True)
class ReplayOptions:
    policies: tuple[str, ...] = POLICIES
    rules: tuple[Path, ...] = ()
    cadence: Cadence = field(default_factory=Cadence)
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
    results = []
    for name in options.policies:
        started = time.process_time()
        if name in ("kubernetes", "torchrun"):
            baseline = next(b for b in BASELINES if b.name == name)
            world = BaselineReplay(baseline, trace, settings, nodes).run()
            results.append(result_of(world, trace.duration, name=name, title=baseline.title,
                                     assumes=baseline.assumes,
                                     interval=baseline.checkpoint_interval,
                                     replay_seconds=time.process_time() - started))
        elif name in ("sn-monitor", "sn-monitor-advisor"):
            advisor = name == "sn-monitor-advisor"
            results.append(_controlled(name, trace, settings, nodes, rules, options,
                                       started, interval="auto" if advisor else 900.0,
                                       warnings=advisor))
        else:
            raise ValueError(f"unknown policy {name!r} (policies: {', '.join(POLICIES)})")
    return results


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
    advisor = interval == "auto"
    notes = []
    used = list(rules)
    if warnings:
        used, changed = warning_checkpoints(rules)
        notes.append(f"checkpointInterval: {interval}"
                     + (" (the advisor's interval)" if advisor else "")
                     + f"; a checkpoint on every warning: {', '.join(changed) or 'none added'}")
    with tempfile.TemporaryDirectory(prefix="sn-goodput-",
                                     dir=_fast_tmp()) as tmp:
        run = ControlledReplay(trace, settings, nodes, used, state_dir=Path(tmp),
                               interval=interval, cadence=options.cadence)
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
    title = "sn-monitor + advisor" if advisor else "sn-monitor"
    assumes = SN_ASSUMES + ("" if advisor else "; checkpoints every 15 min")
    return result_of(world, trace.duration, name=name, title=title, assumes=assumes,
                     interval=used_interval, replay_seconds=time.process_time() - started,
                     controller_ettr=controller_ettr, notes=notes)


def _fast_tmp() -> str | None:
    """Memory-backed /dev/shm when there is one: the store's syncs cost nothing there."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None
