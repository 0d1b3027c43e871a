"""What users run today, as the replay models it: Kubernetes alone, and torchrun elastic.

Neither is sn-monitor, so neither runs its code: each is its documented timings. Both
restart the whole job from its latest complete checkpoint, taken on a fixed interval.

- *Kubernetes default*: a dead node is found by the node controller (``node-monitor-
  grace-period`` 40 s) and its pods evicted after the ``not-ready`` toleration (300 s);
  the job's pods are then created again on free nodes (the cluster has capacity) and
  start from the checkpoint. A GPU fault kills the rank (the training process exits):
  the pod fails and the job is requeued whole; NVIDIA's device plugin marks the GPU
  unhealthy, so the new pods go elsewhere. A hang is ended by NCCL's watchdog (10 min).
- *torchrun elastic*: the rendezvous keep-alive finds a dead node in about 15 s and a
  dead process at once; every rank restarts from the checkpoint. It holds no spares: a
  node that is gone is replaced when the scheduler provides another (``replacement``).

A fault neither can see (an InfiniBand link down: the node is up, the job only hangs)
ends in the watchdog's restart onto the same node, which hangs again, until a person
takes the node out (``operator_response``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from sn_monitor.goodput.trace import Fault, Trace
from sn_monitor.goodput.world import JobWorld, Timeline, WorldSettings


@dataclass(frozen=True)
class Baseline:
    """One tool's timings (seconds)."""

    name: str
    title: str
    node_lost_detection: float
    crash_detection: float
    hang_timeout: float
    operator_response: float
    #: From the decision to a replacement node being there.
    replacement: float
    checkpoint_interval: float
    assumes: str


KUBERNETES = Baseline(
    name="kubernetes", title="Kubernetes default", node_lost_detection=40.0 + 300.0,
    crash_detection=10.0, hang_timeout=600.0, operator_response=1800.0, replacement=30.0,
    checkpoint_interval=900.0,
    assumes=("node death: 40 s node-monitor grace + 300 s not-ready toleration, then the "
             "pods are evicted and the job requeued whole (30 s to schedule it again); "
             "a rank killed by a GPU fault: 10 s until the job restarts, the device "
             "plugin keeps it off that GPU; hangs: NCCL watchdog 10 min; an unseen link "
             "fault: 30 min until a person cordons the node; checkpoints every 15 min"))
TORCHRUN = Baseline(
    name="torchrun", title="torchrun elastic", node_lost_detection=15.0,
    crash_detection=5.0, hang_timeout=600.0, operator_response=1800.0, replacement=300.0,
    checkpoint_interval=900.0,
    assumes=("node death: 15 s rendezvous keep-alive; a dead process: 5 s; every rank "
             "restarts from the checkpoint; no spares: 300 s until the scheduler gives a "
             "replacement node; hangs: NCCL watchdog 10 min; an unseen link fault: 30 min "
             "until a person takes the node out; checkpoints every 15 min"))
BASELINES = (KUBERNETES, TORCHRUN)


class BaselineReplay:
    """One baseline on one trace."""

    def __init__(self, baseline: Baseline, trace: Trace, settings: WorldSettings,
                 nodes: list[str]) -> None:
        self.baseline = baseline
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
        self.timeline.at(since + self.baseline.checkpoint_interval, save)

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
            self._replace_after(node, b.node_lost_detection)
        elif fault.kind == "xid":
            self._replace_after(node, b.crash_detection)
        elif fault.kind == "software":
            self._restart_after(b.crash_detection)
        elif fault.kind == "hang":
            self._restart_after(b.hang_timeout)
        else:  # ib-link: nothing sees it; the watchdog restarts in place until a person acts
            self._restart_after(b.hang_timeout)
            self.timeline.at(now + b.operator_response, lambda: self._operator(node))

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
            for node in bad:
                world.evicted(node)
                self._replacements += 1
                world.members[world.members.index(node)] = f"replacement-{self._replacements}"
                self._known_bad.discard(node)
            self._replacements_ready = now + self.baseline.replacement
        if now < self._replacements_ready:
            self._restart_after(self._replacements_ready - now)
            return
        world.restart(list(world.members), world.latest())

    def _failed_start(self, node: str) -> None:
        """A start failed on a broken node the tool does not know of: it hangs again."""
        del node
        self._restart_after(self.baseline.hang_timeout)
