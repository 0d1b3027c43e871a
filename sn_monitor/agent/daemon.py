"""The agent process: a sampling loop on its own clock, the guard, the reporter, HTTP.

Each cycle (:class:`SamplingLoop`: never overlapping, missed slots skipped) samples, lets the
:class:`ThermalGuard` act on the fresh snapshot, spools the cycle's events and hands the
snapshot to the report thread. The collectors are called on a runner thread, each with a
deadline (:mod:`sn_monitor.agent.watchdog`), so a driver call that hangs costs one cycle
its deadline once, never the loop: the cycle goes on without that collector. Reporting runs
on its own thread so a slow or hanging controller never delays sampling or the guard;
events are spooled on the sampling thread first, so a report skipped in between loses
none. With a controller, the node's topology is collected after the first sample and
every minute on a thread of its own (:mod:`sn_monitor.agent.topology_loop`) and handed to
the reporter; with ``labels_from_node`` on (the Kubernetes DaemonSet), the node's Node is
read at start and every few minutes on another (:mod:`sn_monitor.agent.node_labels`) and
its supernode and rack go into the reports. With a controller and ``events.fast`` on,
the fast path's threads (:mod:`sn_monitor.agent.fastpath`) take XIDs from NVML's event
wait and the kernel log between cycles, join them with the sampler's ledger, spool them
and wake the report thread, which sends them at once in an event-only report (or in the
sampled report already waiting). SIGTERM or SIGINT starts an orderly stop with a hard
deadline well below systemd's default ``TimeoutStopSec``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from sn_monitor.agent.collectors.base import Collector
from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.collectors.kmsg import KmsgCollector
from sn_monitor.agent.commands import CommandExecutor, Remedies
from sn_monitor.agent.counter_memory import CounterMemory
from sn_monitor.agent.exporter import AgentStatus, SnapshotCollector
from sn_monitor.agent.exposition import ExpositionCache
from sn_monitor.agent.exposition_dcgm import DcgmCollector, served_families
from sn_monitor.agent.fastpath.handoff import EventHandoff
from sn_monitor.agent.fastpath.threads import FastEventPath
from sn_monitor.agent.guard import ThermalGuard
from sn_monitor.agent.node_labels import NodeLabelLoop, NodeReader, build_node_label_loop
from sn_monitor.agent.nvml import NvmlError, NvmlLibrary
from sn_monitor.agent.registry import build_collectors
from sn_monitor.agent.remedy import Actuator, ProgramActuator, RebootLedger
from sn_monitor.agent.reporter import Reporter
from sn_monitor.agent.sampler import Sampler
from sn_monitor.agent.server import AgentHttpServer
from sn_monitor.agent.settings import AgentSettings
from sn_monitor.agent.snapshot import NodeSnapshot
from sn_monitor.agent.spool import EventSpool
from sn_monitor.agent.topology_loop import TOPOLOGY_INTERVAL_SECONDS, TopologyLoop, read_topology
from sn_monitor.agent.verify import GpuCountMemory
from sn_monitor.clock import Clock
from sn_monitor.config import parse_listen
from sn_monitor.model import Event
from sn_monitor.notify import SystemdNotifier
from sn_monitor.transport import read_token, redact_url

log = logging.getLogger(__name__)

#: Called before each sample with the seconds since the previous one (the simulator
#: advances its GPUs and counters here; a real node has none).
BeforeSample = Callable[[float], None]
#: Called after each sample with the new snapshot (the terminal view).
AfterSample = Callable[[NodeSnapshot], None]

STOP_DEADLINE_SECONDS = 20.0


def next_slot(due: float, now: float, period: float) -> float:
    """The first slot after ``now`` of the series ``due + k * period`` (k >= 1)."""
    due += period
    if now >= due:
        due += ((now - due) // period + 1) * period
    return due


class SamplingLoop:
    """Calls ``cycle`` every ``period`` seconds on its own thread, at a fixed rate.

    The slots are ``start + k * period``; a cycle that overruns skips the slots it
    missed (it never runs twice in a row to catch up). It sleeps on real time
    (``time.monotonic``): the agent's injected clock dates samples, it does not pace them.
    """

    def __init__(self, cycle: Callable[[], None], period: float) -> None:
        if period <= 0:
            raise ValueError("the sampling period must be positive")
        self._cycle = cycle
        self._period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-sample", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        period = self._period
        due = time.monotonic() + period
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            self._cycle()
            due = next_slot(due, time.monotonic(), period)

    def stop(self, timeout: float) -> None:
        """Stop after the cycle running now, if any (waits at most ``timeout``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)


class ReportLoop:
    """Sends the latest snapshot to the controller on its own thread.

    Only the newest snapshot waits: when the controller is slower than the sampling
    interval, older ones are skipped (their events are already in the spool).
    :meth:`send_events_now` (the fast path, events already spooled) wakes it to send them:
    in the snapshot's report when one is waiting, else in an event-only report.
    """

    def __init__(self, reporter: Reporter, executor: CommandExecutor) -> None:
        self._reporter = reporter
        self._executor = executor
        self._cond = threading.Condition()
        self._pending: tuple[NodeSnapshot, frozenset[int]] | None = None
        self._events_due = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="agent-report", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def offer(self, snapshot: NodeSnapshot, throttled: frozenset[int]) -> None:
        """Replace whatever is waiting with this snapshot."""
        with self._cond:
            self._pending = (snapshot, throttled)
            self._cond.notify()

    def send_events_now(self) -> None:
        """Send the spooled events at once (with the waiting snapshot, if any)."""
        with self._cond:
            self._events_due = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._events_due and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                pending, self._pending, self._events_due = self._pending, None, False
            try:
                if pending is not None:  # its report carries every spooled event
                    commands = self._reporter.send(*pending)
                else:
                    commands = self._reporter.send_events()
                results = self._executor.execute(commands) if commands else []
                results += self._executor.finished()  # slow commands done since the last
                if results:
                    self._reporter.add_command_results(results)
            except Exception:  # reporting must go on after a bad cycle; it is logged
                log.exception("report failed")

    def stop(self, timeout: float) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)


@dataclass
class Protection:
    """The parts that act: the guard always, the reporter when a controller is set."""

    guard: ThermalGuard
    executor: CommandExecutor
    reporter: Reporter | None = None


class Agent:
    """Wires the collectors, sampler, guard, reporter, exporter and HTTP server together."""

    def __init__(
        self,
        settings: AgentSettings,
        collectors: Sequence[Collector],
        clock: Clock,
        before_sample: BeforeSample | None = None,
        after_sample: Sequence[AfterSample] = (),
        protection: Protection | None = None,
        time_scale: float = 1.0,
    ) -> None:
        self.settings = settings
        #: Simulated seconds per real second (demos): the loop sleeps interval / time_scale.
        self.time_scale = time_scale
        self._clock = clock
        self.sampler = Sampler(settings.node, collectors, clock,
                               deadlines=settings.collectors.deadlines(), time_scale=time_scale)
        self.protection = protection
        self.exporter = SnapshotCollector(lambda: self.sampler.latest, self.status)
        self.dcgm = DcgmCollector(lambda: self.sampler.latest, settings.node)
        self.exposition = ExpositionCache(
            served_families(settings.exposition, self.exporter.families, self.dcgm.families),
            lambda: self.sampler.latest)
        self._before = before_sample
        self._after = list(after_sample)
        self._last_tick: float | None = None
        self._recovered = False
        self._sampling = SamplingLoop(self._tick_logged, settings.interval / time_scale)
        self._stopped = threading.Event()
        self._report_loop: ReportLoop | None = None
        self._topology_loop: TopologyLoop | None = None
        self._label_loop: tuple[NodeLabelLoop, NodeReader] | None = None
        self._fast_path: FastEventPath | None = None
        self.notifier = SystemdNotifier(clock)
        if protection is not None and protection.reporter is not None:
            if settings.labels_from_node.enabled:
                self._label_loop = build_node_label_loop(
                    settings.labels_from_node, settings.node, settings.labels,
                    protection.reporter.set_labels)
            self._report_loop = ReportLoop(protection.reporter, protection.executor)
            self._topology_loop = TopologyLoop(
                partial(read_topology, _nvml_library(collectors), Path(settings.paths.sysfs)),
                protection.reporter.set_topology,
                TOPOLOGY_INTERVAL_SECONDS / time_scale,
                node=settings.node,
            )
            if settings.events.fast:
                self._fast_path = _fast_path(collectors, EventHandoff(
                    self.sampler.admit, protection.reporter.spool_events,
                    self._report_loop.send_events_now, node=settings.node), settings.node)
        elif settings.labels_from_node.enabled:
            log.info("labels_from_node is on but no controller is set: labels go only in "
                     "reports, so the Node is not read", extra={"node": settings.node})
        host, port = parse_listen(settings.listen)
        self.http = AgentHttpServer(
            host, port, self.exposition, lambda: self.sampler.latest, clock,
            max_age=max(3 * settings.interval, 5.0),
        )

    def status(self) -> AgentStatus:
        """Guard and reporter figures for /metrics."""
        if self.protection is None:
            return AgentStatus()
        reporter = self.protection.reporter
        return AgentStatus(
            guard_throttled=frozenset(self.protection.guard.throttled()),
            guard_gpus=tuple(self.protection.guard.known_gpus()),
            controller_configured=reporter is not None,
            reports_total=reporter.reports_total if reporter else 0,
            report_failures_total=reporter.failures_total if reporter else 0,
            spool_pending=reporter.spool.pending_count if reporter else 0,
            spool_dropped_total=reporter.spool.dropped_total if reporter else 0,
            controllers=tuple(map(redact_url, reporter.urls)) if reporter else (),
            controller_in_use=(redact_url(reporter.in_use)
                               if reporter and reporter.in_use else None),
            controller_switches_total=reporter.switches_total if reporter else 0,
            report_stream=reporter.streaming if reporter else False,
        )

    def tick(self) -> NodeSnapshot:
        """One cycle: advance the simulation if any, sample, guard, report, hand on."""
        now = self._clock.monotonic()
        elapsed = self.settings.interval if self._last_tick is None else now - self._last_tick
        self._last_tick = now
        if self._before is not None:
            self._before(elapsed)
        snapshot = self.sampler.sample()
        if self.protection is not None:
            self._protect(snapshot)
        for hook in self._after:
            hook(snapshot)
        return snapshot

    def _protect(self, snapshot: NodeSnapshot) -> None:
        assert self.protection is not None
        guard = self.protection.guard
        self.protection.executor.observe(snapshot)
        events: list[Event] = []
        if not self._recovered and NvmlCollector.name not in self.sampler.stuck():
            # NVML is initialised by the first sample: now the guard can put back limits
            # that an earlier run (crashed, killed) left capped. Not while NVML hangs: the
            # setter would hang this thread too; the first cycle it answers does it.
            events += guard.recover()
            self._recovered = True
        events += guard.observe(snapshot)
        reporter = self.protection.reporter
        if reporter is not None and self._report_loop is not None:
            reporter.spool_events([*snapshot.events, *events])
            self._report_loop.offer(snapshot, frozenset(guard.throttled()))

    def _tick_logged(self) -> None:
        try:
            self.tick()
        except Exception:  # the loop must survive a bad cycle; it is logged
            log.exception("sampling cycle failed", extra={"node": self.settings.node})
            return
        # Only a loop that completes cycles pets the watchdog: a hung one gets restarted.
        self.notifier.watchdog()

    def start(self) -> None:
        """Take the first sample, then serve and sample every ``interval``."""
        if self._label_loop is not None:
            self._label_loop[0].start()  # its first read goes on while NVML starts
        if self._report_loop is not None:
            self._report_loop.start()
        self.tick()
        if self._topology_loop is not None:
            self._topology_loop.start()  # after the first sample: NVML is initialised
        if self._fast_path is not None:
            self._fast_path.start()  # after the first sample: the event set, the log open
        self.http.start()
        self._sampling.start()
        self.notifier.ready(f"sampling every {self.settings.interval}s")
        self.notifier.watchdog()
        log.info("agent serving on %s, sampling every %ss", self.settings.listen,
                 self.settings.interval, extra={"node": self.settings.node})

    def stop(self) -> None:
        """Stop sampling, put back the operator's power limits, stop serving (idempotent)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.notifier.stopping()
        self._sampling.stop(timeout=STOP_DEADLINE_SECONDS / 2)
        if self._fast_path is not None:
            self._fast_path.stop(timeout=2.0)
        if self._topology_loop is not None:
            self._topology_loop.stop(timeout=2.0)
        if self._label_loop is not None:
            loop, reader = self._label_loop
            loop.stop(timeout=2.0)
            reader.close()
        if self._report_loop is not None:
            self._report_loop.stop(timeout=5.0)
        if self.protection is not None:
            self.protection.executor.close(timeout=2.0)
            events = self.protection.guard.restore_all()
            if self.protection.reporter is not None:
                self.protection.reporter.spool_events(events)
                self.protection.reporter.close()
        self.http.stop()
        self.sampler.close()
        log.info("agent stopped", extra={"node": self.settings.node})

    def run_until_signalled(self, duration: float | None = None) -> None:
        """Run until SIGTERM/SIGINT (or ``duration`` seconds), then stop in order."""
        done = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            del frame
            log.info("received %s, stopping", signal.Signals(signum).name)
            done.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            done.wait(timeout=duration)
        finally:
            stopper = threading.Thread(target=self.stop, name="agent-stop", daemon=True)
            stopper.start()
            stopper.join(timeout=STOP_DEADLINE_SECONDS)
            if stopper.is_alive():
                log.error("agent did not stop within %ss", STOP_DEADLINE_SECONDS)
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _nvml_library(collectors: Sequence[Collector]) -> NvmlLibrary | None:
    for collector in collectors:
        if isinstance(collector, NvmlCollector):
            return collector.library
    return None


def _fast_path(collectors: Sequence[Collector], handoff: EventHandoff,
               node: str) -> FastEventPath:
    """The fast path's threads on the enabled sources: NVML's event set, the kernel log."""
    kernel_log = next((c for c in collectors if isinstance(c, KmsgCollector)), None)
    return FastEventPath(handoff, xids=_nvml_library(collectors), kernel_log=kernel_log,
                         node=node)


def _power_setter(collectors: Sequence[Collector]) -> Callable[[int, float], None]:
    for collector in collectors:
        if isinstance(collector, NvmlCollector):
            return collector.library.set_power_limit_watts

    def no_nvml(gpu: int, watts: float) -> None:
        raise RuntimeError(f"cannot cap GPU {gpu}: the nvml collector is disabled")

    return no_nvml


def _running_pids(collectors: Sequence[Collector]) -> Callable[[int], tuple[int, ...]]:
    for collector in collectors:
        if isinstance(collector, NvmlCollector):
            return collector.library.running_pids

    def no_nvml(gpu: int) -> tuple[int, ...]:
        raise NvmlError(f"cannot tell who uses GPU {gpu}: the nvml collector is disabled")

    return no_nvml


def build_agent(
    settings: AgentSettings,
    nvml: Any,
    clock: Clock,
    before_sample: BeforeSample | None = None,
    after_sample: Sequence[AfterSample] = (),
    time_scale: float = 1.0,
    actuator: Actuator | None = None,
) -> Agent:
    """The agent for ``settings``: collectors from the registry, the guard, the reporter.

    ``time_scale`` > 1 runs a simulation faster than the wall (``clock`` must run as
    fast). ``actuator`` resets GPUs and reboots the node (default: the configured
    programs; the simulator passes its own).
    """
    collectors = build_collectors(settings, nvml, clock)
    state = Path(settings.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    guard = ThermalGuard(settings.guard, _power_setter(collectors), state, clock)
    remedies = Remedies(
        settings.remediation, actuator or ProgramActuator(settings.remediation),
        _running_pids(collectors), RebootLedger(state, Path(settings.paths.procfs)),
        GpuCountMemory(state))
    # The guard's dry-run mode makes its own caps dry runs; remediation has its own mode.
    executor = CommandExecutor(guard, clock, remedies=remedies)
    reporter = None
    if settings.controller.controller_urls:
        token_file = settings.controller.token_file
        _, port = parse_listen(settings.listen)
        reporter = Reporter(
            settings.controller.controller_urls, read_token(token_file) if token_file else None,
            settings.node, settings.labels, clock,
            EventSpool(state / "spool", settings.controller.spool_max_bytes, clock),
            timeout=settings.controller.timeout, interval=settings.interval,
            metrics_port=port or None, verify=settings.controller.ca_file or True,
            cert=settings.controller.client_cert,
            counter_memory=CounterMemory(state / "rule-counters.json"),
        )
    return Agent(settings, collectors, clock, before_sample, after_sample,
                 Protection(guard, executor, reporter), time_scale=time_scale)
