"""What users run today, as the replay models it: Kubernetes alone, and torchrun elastic.

Neither is sn-monitor, so neither runs its code: each is its documented timings, each
with its source (:class:`Assumption`). Both restart the whole job from its latest
complete checkpoint, taken on a fixed interval (the policy's ``interval``: see
:mod:`.intervals` for Daly's and the best one).

- *Kubernetes default*: a dead node is found by the node controller (``node-monitor-
  grace-period``) and its pods evicted after the ``not-ready`` toleration; the job's
  pods are then created again on free nodes and start from the checkpoint. A GPU fault
  kills the rank (the training process exits): the pod fails and the job is requeued
  whole; NVIDIA's device plugin marks the GPU unhealthy, so the new pods go elsewhere.
  A hang is ended by the NCCL watchdog.
- *torchrun elastic*: the rendezvous keep-alive finds a dead node and its monitor a dead
  process; every rank restarts from the checkpoint. It holds no spares: a node that is
  gone is replaced when the scheduler provides another.

What both share is the world's (:class:`~sn_monitor.goodput.world.WorldSettings`): the
time for the cluster to give a replacement node (``replacement``), and a person taking
out a node whose fault neither sees (``operator_response``: an InfiniBand link down, the
node is up, the job only hangs; until then the watchdog restarts it onto the same node).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from sn_monitor.goodput.trace import Fault, Trace
from sn_monitor.goodput.world import JobWorld, Timeline, WorldSettings

#: The interval a baseline checkpoints at unless told otherwise.
DEFAULT_INTERVAL = 900.0
ASSUMED = "assumed"


@dataclass(frozen=True)
class Assumption:
    """One timing a policy is held to, and where it comes from."""

    what: str
    seconds: float
    #: A documented default, a paper, or :data:`ASSUMED`.
    source: str

    def line(self) -> str:
        return f"{self.what}: {self.seconds:g} s ({self.source})"


@dataclass(frozen=True)
class Baseline:
    """One tool's timings."""

    name: str
    title: str
    node_lost_detection: Assumption
    crash_detection: Assumption
    hang_timeout: Assumption
    #: What it does with them, in a sentence.
    how: str

    def assumptions(self, settings: WorldSettings) -> list[str]:
        """Every timing behind its row, the world's shared ones included, with sources."""
        shared = (
            Assumption("a replacement node from the cluster's scheduler (every policy "
                       "without spares)", float(settings.replacement), ASSUMED),
            Assumption("a person takes out a node whose fault no tool sees (every "
                       "policy)", float(settings.operator_response), ASSUMED))
        own = (self.node_lost_detection, self.crash_detection, self.hang_timeout)
        return [self.how, *(a.line() for a in (*own, *shared))]


NCCL_WATCHDOG = Assumption(
    "a hang ended by the NCCL watchdog", 600.0,
    "PyTorch documented default: init_process_group's NCCL timeout, 10 min")
KUBERNETES = Baseline(
    name="kubernetes", title="Kubernetes default",
    node_lost_detection=Assumption(
        "node death: node-monitor-grace-period 40 s, then the not-ready toleration 300 s",
        340.0, "Kubernetes documented defaults: kube-controller-manager 40 s (50 s since "
        "1.32), DefaultTolerationSeconds 300 s"),
    crash_detection=Assumption(
        "a rank killed by a GPU fault or a process exit: the pod fails and the job is "
        "requeued", 10.0, ASSUMED),
    hang_timeout=NCCL_WATCHDOG,
    how=("the job's pods are evicted and the job requeued whole from its checkpoint; "
         "NVIDIA's device plugin keeps it off a failed GPU"))
TORCHRUN = Baseline(
    name="torchrun", title="torchrun elastic",
    node_lost_detection=Assumption(
        "node death: the rendezvous keep-alive", 15.0,
        "PyTorch documented defaults: c10d rendezvous keep-alive every 5 s, 3 missed"),
    crash_detection=Assumption(
        "a dead process: torchrun's monitor", 5.0,
        "PyTorch documented default of --monitor-interval, 5 s (0.1 s in recent releases)"),
    hang_timeout=NCCL_WATCHDOG,
    how="every rank restarts from the checkpoint; no spares")
BASELINES = (KUBERNETES, TORCHRUN)


class BaselineReplay:
    """One baseline on one trace."""

    def __init__(self, baseline: Baseline, trace: Trace, settings: WorldSettings,
                 nodes: list[str], interval: float = DEFAULT_INTERVAL) -> None:
        self.baseline = baseline
        self.interval = interval
        self.settings = settings
        self.trace = trace
        self.timeline = Timeline()
        self.world = JobWorld(settings, list(nodes), self.timeline)
        self.world.on_failed_start = self._failed_start
        self.world.on_running = self._running
        self._slots = {name: i for i, name in enumerate(nodes)}
        self._replacements = 0
        self._known_bad: set[str] = set()
        self._restart_at: float | None = None
        #: When the replacement nodes asked for last are there.
        self._replacements_ready = 0.0

    def run(self) -> JobWorld:
        for fault in self.trace.faults:
            self.timeline.at(fault.time, partial(self._fault, fault))
        self._running()
        self.timeline.run_until(self.trace.duration, lambda t: None)
        return self.world

    # ------------------------------------------------------------------ checkpoints

    def _running(self) -> None:
        self._schedule_checkpoint(self.world.timeline.now)

    def _schedule_checkpoint(self, since: float) -> None:
        generation = self.world.generation

        def save() -> None:
            if self.world.generation != generation:
                return
            if self.world.checkpoint() is not None:
                self._schedule_checkpoint(self.timeline.now)
        self.timeline.at(since + self.interval, save)

    # ------------------------------------------------------------------ faults

    def _fault(self, fault: Fault) -> None:
        world = self.world
        slot = self._slots.get(fault.node)
        if slot is None or slot >= len(world.members):
            return
        node = world.members[slot]
        world.fault(fault, node)
        b = self.baseline
        now = self.timeline.now
        if fault.kind == "node-lost":
            self._replace_after(node, b.node_lost_detection.seconds)
        elif fault.kind == "xid":
            self._replace_after(node, b.crash_detection.seconds)
        elif fault.kind == "software":
            self._restart_after(b.crash_detection.seconds)
        elif fault.kind == "hang":
            self._restart_after(b.hang_timeout.seconds)
        else:  # ib-link: nothing sees it; the watchdog restarts in place until a person acts
            self._restart_after(b.hang_timeout.seconds)
            self.timeline.at(now + float(self.settings.operator_response),
                             lambda: self._operator(node))

    def _operator(self, node: str) -> None:
        if node in self.world.members and node in self.world.broken:
            self._known_bad.add(node)
            self.world.detected()
            self._restart_after(0.0)

    def _replace_after(self, node: str, delay: float) -> None:
        def known() -> None:
            self._known_bad.add(node)
            self._restart_after(0.0)
        self.timeline.at(self.timeline.now + delay, known)

    def _restart_after(self, delay: float) -> None:
        when = self.timeline.now + delay
        if self._restart_at is not None and self._restart_at <= when:
            return
        self._restart_at = when
        self.timeline.at(when, lambda: self._restart(when))

    def _restart(self, when: float) -> None:
        if self._restart_at != when:
            return
        self._restart_at = None
        world = self.world
        if world.state == "running":
            return  # nothing wrong any more
        world.detected()
        bad = [n for n in world.members if n in self._known_bad]
        now = self.timeline.now
        if bad:  # out of the job now; the new nodes come after the replacement time
            world.abort_start()  # not onto the new nodes before they are there
            for node in bad:
                world.evicted(node)
                self._replacements += 1
                world.members[world.members.index(node)] = f"replacement-{self._replacements}"
                self._known_bad.discard(node)
            self._replacements_ready = now + float(self.settings.replacement)
        if now < self._replacements_ready:
            self._restart_after(self._replacements_ready - now)
            return
        world.restart(list(world.members), world.latest())

    def _failed_start(self, node: str) -> None:
        """A start failed on a broken node the tool does not know of: it hangs again."""
        del node
        self._restart_after(self.baseline.hang_timeout.seconds)
