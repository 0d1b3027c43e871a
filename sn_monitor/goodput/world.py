"""The simulated world of a replay: one synchronous training job on a fleet, on a virtual clock.

What is simulated is what no policy decides: the job's progress (work seconds), its
checkpoints (training pauses ``save_blocking`` while the state is staged; the checkpoint
is complete ``save_persist`` later, unless the job dies first), the launcher's relaunch
and the checkpoint load at a restart, nodes that break and are repaired, and which
ranks' processes are alive (``JobWorld.ranks``). Who notices a fault, when, and what is
done about it is the policy's (baselines.py, controlled.py); so is whether a restart is
warm (:func:`warm_start`: every rank kept or pre-warmed) or cold.

Accounting is exact: the job's *work* is the training time it has done since the start
that it still has (a restore from an older checkpoint takes the difference away: lost
work). ETTR = the work kept at the end / the wall time.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Literal

from sn_monitor.config import Duration, non_negative, optional, positive, setting
from sn_monitor.goodput.trace import Fault

JobState = Literal["running", "down", "starting"]
#: Why the job stopped: a fault of the trace; the policy's own restart of a running job
#: (a node taken out on a warning); the same, for a node that was healthy (noise).
Cause = Literal["fault", "own", "false"]
CAUSES: tuple[Cause, ...] = ("fault", "own", "false")


@dataclass(frozen=True)
class RelaunchBench:
    """The relaunch phase (restore sent -> new process group formed) measured on a real job.

    Cold: every rank started again (every agent killed, torchrun started, torch imported,
    the c10d rendezvous). Warm: the healthy ranks kept alive across the restore (they leave
    the broken process group and join the new one in-process) and a spare's rank a
    pre-warmed standby process.
    """

    cold_seconds: float
    warm_seconds: float
    source: str

    @property
    def ratio(self) -> float:
        return self.warm_seconds / self.cold_seconds


#: The medians of ``python -m bench.torch_recovery_bench`` (5 recoveries each, cold and
#: warm in one command).
TORCHRUN_RELAUNCH = RelaunchBench(
    cold_seconds=10.63, warm_seconds=0.14,
    source="bench.torch_recovery_bench, 4-node torchrun job on CPU/gloo, median of 5 "
           "each, 2026-12-07")
#: What a warm restore cannot skip at 2,048 nodes: the new generation's NCCL
#: communicators and the spares' join. The bench's CPU job has none of it (gloo on 4
#: ranks), so its ratio is not carried over: assumed.
WARM_RELAUNCH_AT_SCALE = 15.0


@dataclass(frozen=True)
class WorldSettings:
    """The job and its fleet. Defaults: a Llama 3-sized job with asynchronous checkpoints."""

    nodes: int = setting(default=2048, check=positive)
    #: Spare nodes held for the job (sn-monitor's pool; the baselines have none).
    spares: int = setting(default=32, check=non_negative)
    gpus_per_node: int = setting(default=8, check=positive)
    step_seconds: Duration = setting(default=Duration(10.0), check=positive)
    #: Training stops this long per checkpoint (asynchronous DCP: staging to host memory).
    save_blocking: Duration = setting(default=Duration(2.0), check=non_negative)
    #: After that, until the checkpoint is complete on storage (written in the background):
    #: Llama 3 405B's ~5.7 TB of weights and optimizer state at the 2 TB/s its storage
    #: sustains (the paper) is about 3 s; 20 s leaves room for stragglers.
    save_persist: Duration = setting(default=Duration(20.0), check=non_negative)
    #: Loading the checkpoint at a restart.
    load: Duration = setting(default=Duration(30.0), check=non_negative)
    #: Starting every rank again: processes, rendezvous, NCCL communicators.
    relaunch: Duration = setting(default=Duration(60.0), check=non_negative)
    #: The relaunch of a warm restart (:func:`warm_start`: the running ranks kept, the
    #: spares' standby processes pre-warmed). None: :data:`WARM_RELAUNCH_AT_SCALE`, or
    #: ``relaunch`` when that is shorter.
    warm_relaunch: Duration | None = setting(default=None, check=optional(non_negative))
    #: A person acting on what no tool acts on (a link down that only hangs the job; a
    #: healthy node a tool took out): the same for every policy. Assumed.
    operator_response: Duration = setting(default=Duration(1800.0), check=non_negative)
    #: From asking the cluster for a node to having it, for a policy without spares (the
    #: same scheduler under each): assumed, a free node and the image already cached.
    replacement: Duration = setting(default=Duration(30.0), check=non_negative)

    def relaunch_seconds(self, *, warm: bool) -> float:
        """The relaunch of a warm or a cold restart."""
        if not warm:
            return float(self.relaunch)
        if self.warm_relaunch is not None:
            return float(self.warm_relaunch)
        return min(float(self.relaunch), WARM_RELAUNCH_AT_SCALE)


def warm_start(members: Collection[str], ranks: Collection[str],
               standby: Collection[str]) -> bool:
    """Whether a start of ``members`` is warm: no rank of it has to be started cold.

    ``ranks``: the nodes whose ranks are alive out of the generation that just stopped
    (``JobWorld.ranks``: a rank kept across the restore leaves the broken process group
    and joins the new one in-process); ``standby``: spares whose standby process is
    pre-warmed (Python and torch imported). Warm when every member is one or the other
    and at least one rank is kept; cold when any member comes from elsewhere (a node
    given back after repair, a replacement from the cluster) or no rank survived (the
    whole job crashed). Only a launcher that keeps ranks (sn-monitor's) asks.
    """
    kept = [node for node in members if node in ranks]
    return bool(kept) and all(node in ranks or node in standby for node in members)


@dataclass
class Interruption:
    """One stop of the running job, from the fault to training again."""

    node: str
    kind: str
    category: str
    at: float
    work_at_stop: float
    detected: float | None = None
    restart: float | None = None
    running: float | None = None
    relaunch: float = 0.0
    load: float = 0.0
    lost_work: float = 0.0
    #: Starts that failed (a broken node still in the job) before the one that worked.
    failed_starts: int = 0
    cause: Cause = "fault"

    def split(self, end: float) -> dict[str, float]:
        """Seconds of detection, eviction (everything until the relaunch), relaunch, load."""
        detected = self.detected if self.detected is not None else (
            self.restart if self.restart is not None else end)
        restart = self.restart if self.restart is not None else end
        done = self.running if self.running is not None else end
        detection = max(0.0, detected - self.at)
        eviction = max(0.0, restart - detected)
        load = self.load if self.running is not None else 0.0
        relaunch = max(0.0, done - restart - load)
        return {"detection": detection, "eviction": eviction, "relaunch": relaunch,
                "load": load}


@dataclass(frozen=True)
class SavedCheckpoint:
    step: int
    work: float
    started: float
    complete_at: float


class Timeline:
    """Events at virtual times, in order (ties in the order they were scheduled)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), fn))

    def run_until(self, end: float, advance: Callable[[float], None]) -> None:
        """Run every event before ``end``; ``advance(t)`` moves the clock to each one."""
        while self._heap and self._heap[0][0] < end:
            when, _, fn = heapq.heappop(self._heap)
            if when > self.now:
                advance(when)
                self.now = when
            fn()
        if end > self.now:
            advance(end)
            self.now = end


@dataclass
class JobWorld:
    """The training job: its members, progress, checkpoints, and the faults that stop it."""

    settings: WorldSettings
    members: list[str]
    timeline: Timeline
    state: JobState = "running"
    #: Nodes broken (until repaired), and nodes taken out of service by a policy.
    broken: set[str] = field(default_factory=set)
    out: set[str] = field(default_factory=set)
    checkpoints: list[SavedCheckpoint] = field(default_factory=list)
    interruptions: list[Interruption] = field(default_factory=list)
    #: Nodes warned of a fault still to come (not healthy, not broken yet).
    warned: set[str] = field(default_factory=set)
    false_evictions: int = 0
    #: Checkpoints a policy asked for because of a healthy node.
    false_checkpoints: int = 0
    checkpoints_requested: int = 0
    #: Called when a start fails because a member is broken (the policy looks again).
    on_failed_start: Callable[[str], None] | None = None
    #: Called when the job runs again after a start.
    on_running: Callable[[], None] | None = None
    #: Called when a checkpoint is complete on storage.
    on_saved: Callable[[SavedCheckpoint], None] | None = None
    #: The nodes whose ranks are alive: the running job's, or out of a stopped generation
    #: and able to join the next (not the rank a fault killed or cut off).
    ranks: set[str] = field(init=False)
    _work_base: float = 0.0
    _base_time: float = 0.0
    _generation: int = 0
    _start_checkpoint: SavedCheckpoint | None = None

    def __post_init__(self) -> None:
        self.ranks = set(self.members)

    # ------------------------------------------------------------------ progress

    def work(self, t: float | None = None) -> float:
        """Training seconds done and kept so far (frozen while the job does not run)."""
        t = self.timeline.now if t is None else t
        if self.state != "running":
            return self._work_base
        return self._work_base + max(0.0, t - self._base_time)

    @property
    def generation(self) -> int:
        """Changes at every stop and start: an event of an earlier one is stale."""
        return self._generation

    def step(self) -> int:
        return int(self.work() // float(self.settings.step_seconds))

    @property
    def open(self) -> Interruption | None:
        last = self.interruptions[-1] if self.interruptions else None
        return last if last is not None and last.running is None else None

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, because: str | None = None) -> SavedCheckpoint | None:
        """Start a checkpoint now (None: the job is not running, nothing to save).

        ``because``: the node a policy asks for it because of; a healthy one makes it a
        false checkpoint.
        """
        if self.state != "running":
            return None
        if because is not None and self.healthy(because):
            self.false_checkpoints += 1
        now = self.timeline.now
        work = self.work()
        blocking = float(self.settings.save_blocking)
        self._work_base = work
        self._base_time = max(self._base_time, now) + blocking
        saved = SavedCheckpoint(step=int(work // float(self.settings.step_seconds)),
                                work=work, started=now,
                                complete_at=now + blocking + float(self.settings.save_persist))
        generation = self._generation
        self.checkpoints_requested += 1

        def complete() -> None:
            if self._generation == generation and self.state == "running":
                self.checkpoints.append(saved)
                if self.on_saved is not None:
                    self.on_saved(saved)
        self.timeline.at(saved.complete_at, complete)
        return saved

    def latest(self) -> SavedCheckpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def checkpoint_at(self, step: int) -> SavedCheckpoint | None:
        for saved in reversed(self.checkpoints):
            if saved.step == step:
                return saved
        return None

    # ------------------------------------------------------------------ faults

    def fault(self, fault: Fault, node: str) -> Interruption | None:
        """``fault`` hits ``node``: a running job stops (an interruption); a start fails."""
        if fault.breaks_node:
            self.broken.add(node)
        if node not in self.members:
            return None
        if fault.blocks_peers:
            # the launcher's warm restore starts again a rank that does not answer
            self.ranks.clear()
        else:
            self.ranks.discard(node)
        if self.state == "running":
            self._stop()
            record = Interruption(node=node, kind=fault.kind, category=fault.category,
                                  at=self.timeline.now, work_at_stop=self._work_base)
            self.interruptions.append(record)
            return record
        if self.state == "starting":
            self._stop()  # the start dies with it; the open interruption goes on
        return self.open

    def _stop(self) -> None:
        self._work_base = self.work()
        self.state = "down"
        self._generation += 1

    def detected(self) -> None:
        """The policy noticed the open interruption (first time counts)."""
        record = self.open
        if record is not None and record.detected is None:
            record.detected = self.timeline.now

    # ------------------------------------------------------------------ restarts

    def restart(self, members: list[str], checkpoint: SavedCheckpoint | None, *,
                warm: bool = False) -> None:
        """Relaunch the ranks on ``members``, then load ``checkpoint`` (None: from scratch).

        ``warm``: the policy's launcher keeps the running ranks and starts none cold
        (:func:`warm_start`), so the relaunch is ``WorldSettings.warm_relaunch``.
        """
        now = self.timeline.now
        if self.state == "running":
            self._stop()
            dropped = sorted(set(self.members) - set(members))
            false = [n for n in dropped if self.healthy(n)]
            self.interruptions.append(Interruption(
                node=(false or dropped or [""])[0], kind="restart", category="restart",
                at=now, work_at_stop=self._work_base, detected=now,
                cause="false" if false else "own"))
        self.state = "starting"
        self._generation += 1
        generation = self._generation
        self.members = list(members)
        self.ranks = set(members) - self.broken
        self._start_checkpoint = checkpoint
        record = self.open
        if record is not None and record.restart is None:
            record.restart = now
        relaunch = self.settings.relaunch_seconds(warm=warm)
        load = float(self.settings.load)

        def up() -> None:
            if self._generation != generation or self.state != "starting":
                return
            bad = sorted(set(self.members) & self.broken)
            if bad:
                # A broken node in the job: the start fails at the first collective.
                self.state = "down"
                self._generation += 1
                if record is not None:
                    record.failed_starts += 1
                if self.on_failed_start is not None:
                    self.on_failed_start(bad[0])
                return
            work = checkpoint.work if checkpoint is not None else 0.0
            if record is not None:
                record.lost_work += max(0.0, record.work_at_stop - work)
                record.work_at_stop = work
                record.running = self.timeline.now
                record.relaunch, record.load = relaunch, load
            self.state = "running"
            self._work_base = work
            self._base_time = self.timeline.now
            if self.on_running is not None:
                self.on_running()
        self.timeline.at(now + relaunch + load, up)

    def abort_start(self) -> None:
        """The start under way dies (a policy is changing the job's members)."""
        if self.state == "starting":
            self._stop()

    def healthy(self, node: str) -> bool:
        """Neither broken nor warned of a fault to come."""
        return node not in self.broken and node not in self.warned

    def evicted(self, node: str) -> None:
        """A policy took ``node`` out of service; a healthy one is a false eviction."""
        if node in self.out:
            return
        self.out.add(node)
        if self.healthy(node):
            self.false_evictions += 1

    def repaired(self, node: str) -> None:
        self.broken.discard(node)
        self.out.discard(node)

    def kept_work(self, end: float) -> float:
        """What the job has at the end: its work if running, else its latest checkpoint."""
        if self.state == "running":
            return self.work(end)
        latest = self.latest()
        return latest.work if latest is not None else 0.0
