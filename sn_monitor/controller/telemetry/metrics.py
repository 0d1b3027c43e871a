"""The controller's own metrics: state gauges from a custom collector, latencies as histograms.

State (node states, firing rules, open incidents, action outcomes) is read from the
controller when Prometheus scrapes; latencies are observed as they happen.

Every counter and histogram whose label values are known in advance (each action and
outcome, each report outcome and event kind, each job's recoveries) is served at 0 before
its first event: Prometheus' ``increase()`` and ``rate()`` see a series' first event only
if the series was there before it ("avoid missing metrics").
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sn_monitor import __version__
from sn_monitor.controller.audit import ACTION_STATES
from sn_monitor.controller.jobs.views import JobMetrics
from sn_monitor.controller.workloads.accounting import WorkloadUsage
from sn_monitor.model import ActionName, EventKind

#: The one family written by hand (node_state_exposition).
NODE_STATE: Final = "sn_node_state"
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0)
INGEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
STALL_BUCKETS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: ``sn_actions_total``'s label values: every action a rule or a recovery may ask for, and
#: every state an action is counted in (all but the passing ``pending`` and ``running``).
ACTIONS: Final = get_args(ActionName)
ACTION_OUTCOMES: Final = tuple(sorted(ACTION_STATES - {"pending", "running"}))
#: ``sn_controller_reports_total``'s outcomes (:meth:`IngestTally.report`).
REPORT_OUTCOMES: Final = ("accepted", "stale", "invalid", "forbidden")


@dataclass(frozen=True)
class ControllerState:
    """What the state collector formats."""

    node_states: Mapping[str, str] = field(default_factory=dict)
    firing: tuple[tuple[str, str], ...] = ()
    open_incidents: int | None = None
    action_outcomes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    breaker_open: bool = False
    store_up: bool = True
    jobs: JobMetrics | None = None
    #: The daemon's workers: whether each runs now.
    workers: Mapping[str, bool] = field(default_factory=dict)
    #: Store writes queued for the writer and not yet done.
    store_queue: int = 0
    #: Node-taking actions waiting out their settle time.
    settling: int = 0
    #: Sweeps done since the controller started.
    sweeps: int = 0
    #: How late the event loop, which reads the reports, ran (None: not watched).
    ingest_lag: float | None = None
    #: Each job's pace as the bottleneck finder sees it: (step time, baseline, slowdown).
    job_paces: Mapping[str, tuple[float | None, float | None, float]] = field(
        default_factory=dict)
    #: The fail-slow bottlenecks standing: (job, node, link, kind).
    fail_slow: tuple[tuple[str, str, str, str], ...] = ()
    #: Each job's latest failure's root cause: (job, node, rank, category), "" unknown.
    job_root_causes: tuple[tuple[str, str, str, str], ...] = ()
    #: How many rules each source gave (a rules path as configured, ``packaged``, or
    #: ``config`` for ``rules: []``).
    rules: Mapping[str, int] = field(default_factory=dict)
    #: Every workload the agents attribute GPUs to (:mod:`sn_monitor.controller.workloads`).
    workloads: tuple[WorkloadUsage, ...] = ()


class ControllerStateCollector(Collector):
    """Formats a :class:`ControllerState` taken at scrape time."""

    def __init__(self, source: Callable[[], ControllerState]) -> None:
        self._source = source
        #: The node states of the last collect, for :func:`node_state_exposition`.
        self.node_states: Mapping[str, str] = {}

    def collect(self) -> Iterator[Metric]:
        state = self._source()
        self.node_states = state.node_states
        info = GaugeMetricFamily("sn_controller_info", "The controller's version.",
                                 labels=["version"])
        info.add_metric([__version__], 1.0)
        yield info
        yield GaugeMetricFamily("sn_controller_nodes", "Nodes the controller knows.",
                                value=len(state.node_states))
        rules = GaugeMetricFamily(
            "sn_controller_rules", "Rules the controller loaded, by source (a rules path as "
            "configured, packaged, or config for rules: []); 0 in all: it watches nothing.",
            labels=["source"])
        for source, count in sorted(state.rules.items()):
            rules.add_metric([source], float(count))
        yield rules
        firing = GaugeMetricFamily("sn_rule_firing",
                                   "1 while a rule fires on a node (any subject of it).",
                                   labels=["rule", "node"])
        for rule, node in sorted(set(state.firing)):
            firing.add_metric([rule, node], 1.0)
        yield firing
        if state.open_incidents is not None:
            yield GaugeMetricFamily("sn_incidents_open", "Incidents not yet resolved.",
                                    value=state.open_incidents)
        actions = CounterMetricFamily("sn_actions", "Actions by outcome.",
                                      labels=["action", "outcome"])
        counts = dict.fromkeys(((a, o) for a in ACTIONS for o in ACTION_OUTCOMES), 0)
        counts.update(state.action_outcomes)
        for (action, outcome), count in sorted(counts.items()):
            actions.add_metric([action, outcome], float(count))
        yield actions
        yield GaugeMetricFamily("sn_breaker_open",
                                "1 while the circuit breaker freezes evictions.",
                                value=1.0 if state.breaker_open else 0.0)
        if state.workers:
            up = GaugeMetricFamily("sn_controller_worker_up",
                                   "1 while the controller's worker runs, 0 while it is down "
                                   "(failed, waiting to start again).", labels=["worker"])
            for name, running in sorted(state.workers.items()):
                up.add_metric([name], 1.0 if running else 0.0)
            yield up
        yield GaugeMetricFamily("sn_controller_store_queue_writes",
                                "Store writes queued for the controller's writer.",
                                value=state.store_queue)
        yield GaugeMetricFamily("sn_controller_actions_settling",
                                "Node-taking actions waiting out their settle time (then "
                                "queued for the writer, or dropped if their rule cleared).",
                                value=state.settling)
        yield CounterMetricFamily("sn_controller_sweeps",
                                  "Sweeps (heartbeats, settled actions, node states) done "
                                  "since the controller started.", value=state.sweeps)
        if state.ingest_lag is not None:
            yield GaugeMetricFamily(
                "sn_controller_ingest_lag_seconds",
                "How far behind the event loop that reads the reports ran since the last "
                "scrape (a report waits this long before it is read; 0: keeping up).",
                value=state.ingest_lag)
        if state.jobs is not None:
            yield from _job_families(state.jobs)
        yield from _pace_families(state)
        yield _root_cause_family(state)
        yield from _workload_families(state.workloads)
        yield GaugeMetricFamily("sn_controller_store_up",
                                "1 while the store takes writes (0: the controller refuses "
                                "to act without an audit record).",
                                value=1.0 if state.store_up else 0.0)
        # Only the active controller builds this collector; a standby serves 0 (ha/standby).
        yield GaugeMetricFamily("sn_controller_leader",
                                "1 on the active controller, 0 on a standby.", value=1.0)


def _pace_families(state: ControllerState) -> Iterator[Metric]:
    """The jobs' step times against their own pace, and the bottlenecks named."""
    step = GaugeMetricFamily("sn_job_step_time_seconds",
                             "The job's step time: the median of its ranks'.", labels=["job"])
    baseline = GaugeMetricFamily(
        "sn_job_step_time_baseline_seconds",
        "The job's healthy pace: a low quantile of its step times over the last 30 minutes.",
        labels=["job"])
    slowdown = GaugeMetricFamily(
        "sn_job_slowdown_ratio",
        "How much slower the job runs than its healthy pace (0.18: 18 %; 0 while it keeps "
        "its pace).", labels=["job"])
    for job, (current, base, ratio) in sorted(state.job_paces.items()):
        if current is not None:
            step.add_metric([job], current)
        if base is not None:
            baseline.add_metric([job], base)
        slowdown.add_metric([job], ratio)
    yield step
    yield baseline
    yield slowdown
    named = GaugeMetricFamily(
        "sn_fail_slow", "1 for each node and link the bottleneck finder names as holding "
        "a slow job back (a fail-slow incident).", labels=["job", "node", "link", "kind"])
    for job, node, link, kind in sorted(set(state.fail_slow)):
        named.add_metric([job, node, link, kind], 1.0)
    yield named


def _root_cause_family(state: ControllerState) -> Metric:
    info = GaugeMetricFamily(
        "sn_job_root_cause_info", "1 for each job's latest failure: the node and rank that "
        "failed first and why (category: from its logs, or the node's fault, e.g. xid-79).",
        labels=["job", "node", "rank", "category"])
    for labels in sorted(set(state.job_root_causes)):
        info.add_metric(list(labels), 1.0)
    return info


#: A workload's labels: its key (sn_monitor.controller.workloads.accounting), the names
#: outside it empty.
WORKLOAD_LABELS: Final = ("namespace", "pod", "slurm_job", "user")


def _workload_families(workloads: tuple[WorkloadUsage, ...]) -> Iterator[Metric]:
    """Per workload: GPUs held and idle, activity, memory, energy."""
    labels = list(WORKLOAD_LABELS)
    gpus = GaugeMetricFamily("sn_workload_gpus", "GPUs the workload holds (a GPU shared by "
                             "several workloads counts for each).", labels=labels)
    idle = GaugeMetricFamily(
        "sn_workload_idle_gpus", "GPUs the workload holds that have stayed below the idle "
        "utilization (workloads.idle_below) for workloads.idle_after.", labels=labels)
    utilization = GaugeMetricFamily(
        "sn_workload_sm_utilization_ratio", "Mean utilization of the workload's GPUs (absent "
        "where none reports one: MIG).", labels=labels)
    memory = GaugeMetricFamily("sn_workload_memory_used_bytes",
                               "Memory used on the workload's GPUs.", labels=labels)
    energy = CounterMetricFamily(
        "sn_workload_energy_joules", "Energy the workload's GPUs used while it held them "
        "(shared GPUs split evenly).", labels=labels)
    for usage in workloads:
        key = usage.key
        values = [key.namespace, key.pod, key.slurm_job, key.user]
        gpus.add_metric(values, float(len(usage.gpus)))
        idle.add_metric(values, float(usage.idle_gpus))
        if usage.sm_utilization_ratio is not None:
            utilization.add_metric(values, usage.sm_utilization_ratio)
        memory.add_metric(values, float(usage.memory_used_bytes))
        energy.add_metric(values, usage.energy_joules_total)
    yield from (gpus, idle, utilization, memory, energy)


RECOVERY_BUCKETS = (5.0, 10.0, 20.0, 30.0, 40.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
PHASES = ("detection", "eviction", "restart", "reload")


def _job_families(jobs: JobMetrics) -> Iterator[Metric]:
    """Per job state and ETTR; recoveries as a histogram rebuilt from the store's record."""
    state = GaugeMetricFamily("sn_job_state", "1 for each job's current state.",
                              labels=["job", "state"])
    generation = GaugeMetricFamily("sn_job_generation",
                                   "How many times the job was restored.", labels=["job"])
    failures = CounterMetricFamily("sn_job_failures", "Recoveries the job went through.",
                                   labels=["job"])
    ettr = GaugeMetricFamily(
        "sn_job_effective_training_ratio",
        "ETTR: productive training time (the steps not redone after a restore, less the "
        "blocking checkpoint saves the job reported) / wall time since its first step; "
        "absent while it is pending (no rank has reported a step yet).", labels=["job"])
    age = GaugeMetricFamily("sn_job_checkpoint_age_seconds",
                            "Age of the latest complete checkpoint.", labels=["job"])
    step = GaugeMetricFamily("sn_job_step", "The highest step the job reported.",
                             labels=["job"])
    interval = GaugeMetricFamily(
        "sn_job_checkpoint_interval_recommended_seconds",
        "The checkpoint interval that maximises the job's ETTR (Young/Daly, from its "
        "failures, its save time and the fleet's fault rate).", labels=["job"])
    for name, job in sorted(jobs.jobs.items()):
        state.add_metric([name, job.state], 1.0)
        generation.add_metric([name], float(job.generation))
        failures.add_metric([name], float(job.failures_total))
        if job.effective_training_ratio is not None:
            ettr.add_metric([name], job.effective_training_ratio)
        if job.checkpoint_age_seconds is not None:
            age.add_metric([name], job.checkpoint_age_seconds)
        if job.last_step is not None:
            step.add_metric([name], float(job.last_step))
        if job.checkpoint_interval_recommended_seconds is not None:
            interval.add_metric([name], job.checkpoint_interval_recommended_seconds)
    yield from (state, generation, failures, ettr, age, step, interval)
    histogram = HistogramMetricFamily(
        "sn_recovery_duration_seconds",
        "From the fault first seen to the job's progress resumed (MTTR).", labels=["job"])
    phases = GaugeMetricFamily("sn_recovery_last_phase_seconds",
                               "How the job's latest recovery split.", labels=["job", "phase"])
    # every job's histogram is there, empty, from the job's creation
    by_job: dict[str, list[float]] = {name: [] for name in jobs.jobs}
    latest: dict[str, tuple[float, tuple[float, ...]]] = {}
    for rec in jobs.recoveries:
        by_job.setdefault(rec.job, []).append(rec.total)
        split: tuple[float, ...] = (rec.detection, rec.eviction, rec.restart, rec.reload)
        if rec.job not in latest or rec.finished_at > latest[rec.job][0]:
            latest[rec.job] = (rec.finished_at, split)
    for name, totals in sorted(by_job.items()):
        buckets = [(str(b), float(sum(1 for t in totals if t <= b))) for b in RECOVERY_BUCKETS]
        buckets.append(("+Inf", float(len(totals))))
        histogram.add_metric([name], buckets, sum(totals))
    for name, (_, split) in sorted(latest.items()):
        for phase, seconds in zip(PHASES, split, strict=True):
            phases.add_metric([name, phase], seconds)
    yield histogram
    yield phases


def _label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def node_state_exposition(states: Mapping[str, str]) -> bytes:
    """``sn_node_state``, one line a node, in the text exposition format.

    Written here rather than by prometheus_client, whose general formatter costs ~5 µs a
    sample: 42 ms at 8,192 nodes, spent on the event loop at every scrape while reports
    wait; this costs ~3 ms.
    """
    name = NODE_STATE
    lines = [f"# HELP {name} 1 for each node's current state.", f"# TYPE {name} gauge"]
    lines.extend(f'{name}{{node="{_label_value(node)}",state="{_label_value(state)}"}} 1.0'
                 for node, state in sorted(states.items()))
    return ("\n".join(lines) + "\n").encode()


class IngestTally(Collector):
    """``sn_controller_reports_total{outcome}`` and ``sn_controller_ingest_seconds``.

    Counted on the event loop for every report, 8,192 times a second: a list of bucket
    counts and a dict of outcomes, without the lock each ``prometheus_client`` metric
    takes per update (three per report), read when Prometheus scrapes. Only the event
    loop's thread writes them (the reports' handlers run there); a scrape that reads
    one update behind is the next scrape's.
    """

    def __init__(self) -> None:
        self._outcomes: dict[str, int] = dict.fromkeys(REPORT_OUTCOMES, 0)
        self._buckets = [0] * (len(INGEST_BUCKETS) + 1)
        self._sum = 0.0

    def report(self, outcome: str) -> None:
        """One report with this outcome (accepted, stale, invalid, forbidden)."""
        self._outcomes[outcome] = self._outcomes.get(outcome, 0) + 1

    def observe(self, seconds: float) -> None:
        """One report's ingest took ``seconds``."""
        self._sum += seconds
        self._buckets[bisect_left(INGEST_BUCKETS, seconds)] += 1

    def count(self, outcome: str) -> int:
        return self._outcomes.get(outcome, 0)

    def collect(self) -> Iterator[Metric]:
        reports = CounterMetricFamily("sn_controller_reports", "Reports received, by outcome.",
                                      labels=["outcome"])
        for outcome, n in sorted(self._outcomes.items()):
            reports.add_metric([outcome], n)
        yield reports
        cumulative, total = [], 0
        for bound, n in zip((*INGEST_BUCKETS, math.inf), self._buckets, strict=True):
            total += n
            cumulative.append(("+Inf" if bound == math.inf else repr(bound), total))
        yield HistogramMetricFamily(
            "sn_controller_ingest_seconds", "Time to decode, check and evaluate one report.",
            buckets=cumulative, sum_value=self._sum)


class ControllerMetrics:
    """The controller's registry: the state collector plus event histograms."""

    def __init__(self, state: Callable[[], ControllerState]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._state = ControllerStateCollector(state)
        self.registry.register(self._state)
        self.detection_latency = Histogram(
            "sn_detection_latency_seconds",
            "From the fault first seen by the agent to the rule firing on the controller.",
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.ingest = IngestTally()
        self.registry.register(self.ingest)
        self.events = Counter(
            "sn_controller_events", "Agent events stored, by kind.", ["kind"],
            registry=self.registry,
        )
        for kind in get_args(EventKind):
            self.events.labels(kind)
        self.webhook_alerts = Counter(
            "sn_controller_alertmanager_alerts",
            "Alerts received on POST /api/v1/alertmanager, by outcome: accepted (an alert "
            "rule took it), unmatched (no rule in scope), skipped (no usable node, or the "
            "controller's own alert).", ["outcome"], registry=self.registry,
        )
        for outcome in ("accepted", "unmatched", "skipped"):
            self.webhook_alerts.labels(outcome)
        self.stalls = Histogram(
            "sn_controller_stall_seconds",
            "Times the controller itself stood still (paused, starved of CPU, a long "
            "collection) for a second or more, by where it was seen: the sweep or the "
            "event_loop. Left out of every node's silence.", ["where"],
            buckets=STALL_BUCKETS, registry=self.registry,
        )
        for where in ("sweep", "event_loop"):
            self.stalls.labels(where)

    def render(self) -> bytes:
        """The exposition: the registry, then the node states its collector just read."""
        body = generate_latest(self.registry)
        return body + node_state_exposition(self._state.node_states)
