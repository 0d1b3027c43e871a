"""sn-monitor in the replay: the real controller, on a virtual clock, acting on the world.

Nothing here decides. The controller (:class:`~sn_monitor.controller.service.Controller`:
its rule engine, safety policy and breaker, the recovery engine, the checkpoint
schedule and the interval advisor) gets what its agents and training client would send,
on a :class:`~sn_monitor.clock.ManualClock`, and its actions reach the world through
drivers (:class:`ReplayDriver`) the way they reach Kubernetes or a launcher:

- reports: every node's agent; a fault or a warning is the report that shows it (an
  XID event, an InfiniBand port down, a pending row remap, guard throttling, rising
  symbol errors), a lost node stops reporting. Between faults a healthy node's reports
  are identical, so only their arrival is replayed (``NodeRegistry.heard_from``);
- noise (noise.py): a healthy node's report shows it for a while, the job runs on;
- the training client: rank 0's progress and its checkpoint reports (with the save time);
- actions: ``checkpoint`` makes the job save, ``evict`` takes a node out (repaired and
  given back to the job's spare pool by the operator later), ``restore`` relaunches the
  ranks on the nodes and from the checkpoint it names: warm (world.py's
  :func:`~sn_monitor.goodput.world.warm_start`) when every node is one whose rank is
  alive or a pre-warmed spare (the job's spares at the start, then the pool the last
  restore left, as examples/pytorch/launcher.py pre-warms them), cold otherwise.

The controller is swept the way the daemon sweeps it, but only when something can
happen: every second after a fault, every few seconds while the job is down, at the
next checkpoint due, and at least every few minutes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from sn_monitor.clock import ManualClock
from sn_monitor.controller.actions.base import Outcome
from sn_monitor.controller.actions.routing import build_drivers
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.errors import ControllerError
from sn_monitor.controller.jobs.settings import JobError
from sn_monitor.controller.security.auth import OPEN_ACCESS
from sn_monitor.controller.service import Controller
from sn_monitor.controller.settings import ControllerSettings
from sn_monitor.controller.storage.store import Store
from sn_monitor.goodput.noise import APP_XID, EXCURSION_CELSIUS, SYMBOL_BURST, Noise
from sn_monitor.goodput.trace import Fault, Trace
from sn_monitor.goodput.world import (
    JobWorld,
    SavedCheckpoint,
    Timeline,
    WorldSettings,
    warm_start,
)
from sn_monitor.model import EventRecord, GpuReport, IbPortReport, Report
from sn_monitor.rules.spec import EventRule, Rule
from sn_monitor.rules.xid_catalog import XidCatalog, load_catalog

log = logging.getLogger(__name__)

T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC: the replay's wall clock starts here
JOB = "llm"
OPERATOR = "replay-operator"
#: Actions the replay carries out; the others (alerts, throttles) are only counted.
ACTIONS = ("alert", "cordon", "uncordon", "evict", "failover", "checkpoint", "restore",
           "throttle", "release")
#: A process that exits is restarted in place by the job's launcher after this long.
CRASH_RESTART = 5.0
CHECKPOINTS_KEPT = 3
#: NVIDIA's Xid resolution for the application's own fault: the GPU needs nothing.
APPLICATION_RESOLUTIONS = frozenset({"RESTART_APP"})


@dataclass(frozen=True)
class Cadence:
    """When the replay sweeps the controller (the daemon sweeps every 0.5 s)."""

    fine: float = 1.0
    #: How long the fine cadence lasts after a fault that shows in time only (past the
    #: heartbeat timeout and the rules' ``for`` holds of 10 s), and after any other fault
    #: or a warning (past the settle time).
    fine_for: float = 15.0
    fine_for_reported: float = 5.0
    busy: float = 10.0
    quiet: float = 600.0


class ReplayDriver:
    """An outside system of the replay: the action lands in the world's inbox."""

    idempotent = True

    def __init__(self, action: str, inbox: list[ActionRequest], lock: threading.Lock) -> None:
        self.name = f"replay-{action}"
        self._inbox = inbox
        self._lock = lock

    def run(self, request: ActionRequest) -> Outcome:
        with self._lock:
            self._inbox.append(request)
        return Outcome(f"{request.action}: carried out in the replay")


@dataclass(frozen=True)
class WarningCheckpoints:
    """The rules of the "+ advisor" row, and the names of the rules a checkpoint went to."""

    rules: list[Rule]
    changed: list[str]
    #: Warnings left as they were: their findings are the application's (see
    #: :func:`application_rule`).
    skipped: list[str]


def warning_checkpoints(rules: Sequence[Rule],
                        catalog: XidCatalog | None = None) -> WarningCheckpoints:
    """The rules with ``checkpoint`` added to every warning about a node.

    A checkpoint on a warning saves the work before a fault of that node. A warning
    whose findings are the application's own (:func:`application_rule`: XIDs NVIDIA
    resolves RESTART_APP, such as 13) warns of no node fault: it gets none. ``catalog``:
    NVIDIA's Xid catalogue (None: the packaged one, the replayed controller's).
    """
    catalog = catalog if catalog is not None else load_catalog()
    out: list[Rule] = []
    changed: list[str] = []
    skipped: list[str] = []
    for rule in rules:
        actions = list(rule.actions)
        if rule.severity != "warning" or "checkpoint" in actions or rule.kind == "alert":
            out.append(rule)
        elif application_rule(rule, catalog):
            out.append(rule)
            skipped.append(rule.name)
        else:
            out.append(dataclasses.replace(rule, actions=[*actions, "checkpoint"]))
            changed.append(rule.name)
    return WarningCheckpoints(out, changed, skipped)


def application_rule(rule: Rule, catalog: XidCatalog) -> bool:
    """Whether every finding of ``rule`` is the application's fault, none the node's.

    True for an XID rule all of whose XIDs, its ``codes`` and its ``resolutions``, NVIDIA's
    catalogue resolves RESTART_APP (restart the application; the GPU is fine). An XID
    rule with neither matches every XID, a code the catalogue does not list could be
    anything, and any other kind of rule watches the node: False.
    """
    if not isinstance(rule, EventRule) or rule.event != "xid":
        return False
    if not rule.codes and not rule.resolutions:
        return False
    entries = [catalog.get(code) for code in rule.codes]
    return (set(rule.resolutions) <= APPLICATION_RESOLUTIONS
            and all(entry is not None and entry.resolution in APPLICATION_RESOLUTIONS
                    for entry in entries))


class ControlledReplay:
    """One sn-monitor configuration on one trace."""

    def __init__(self, trace: Trace, settings: WorldSettings, nodes: list[str],
                 rules: Sequence[Rule], *, state_dir: Path, interval: float | str,
                 cadence: Cadence | None = None, noise: Sequence[Noise] = ()) -> None:
        self.trace = trace
        self.noise = tuple(noise)
        self.settings = settings
        self.cadence = cadence or Cadence()
        self.timeline = Timeline()
        self.clock = ManualClock(T0)
        self.world = JobWorld(settings, list(nodes), self.timeline)
        self.world.on_running = self._running
        self.world.on_saved = self._saved
        self.spares = [f"spare-{i:03d}" for i in range(settings.spares)]
        #: Spares whose standby process is pre-warmed: the job's own at the start, then
        #: the pool each restore leaves (the launcher's ``SN_PARAMS["spares"]``).
        self._standby = set(self.spares)
        self._slots = {name: i for i, name in enumerate(nodes)}
        self._inbox: list[ActionRequest] = []
        self._inbox_lock = threading.Lock()
        self._silent: set[str] = set()
        #: The nodes whose agents report (None: to be worked out again).
        self._heard: tuple[str, ...] | None = None
        self._condition: dict[str, dict[str, Any]] = {}
        self._sequence: dict[str, int] = {}
        self._event_id = 0
        self._repair: dict[str, float] = {}
        self._tick_at: float | None = None
        self._fine_until = -1.0
        self._last_request = 0.0
        self.counts: dict[str, int] = {}
        self._encoder = msgspec.json.Encoder()
        self._ckpt_dir = state_dir / "checkpoints"
        self._ckpt_dir.mkdir(parents=True, exist_ok=True)
        controller_settings = ControllerSettings(state_dir=str(state_dir))
        drivers = build_drivers(controller_settings.drivers, controller_settings.routes,
                                self.clock)
        for action in ACTIONS:
            drivers.by_action[action] = ReplayDriver(action, self._inbox, self._inbox_lock)
        self.store = Store(state_dir / "controller.db")
        self.controller = Controller(controller_settings, rules, self.clock, self.store,
                                     drivers)
        self.controller.start()
        for node in [*nodes, *self.spares]:
            self._report(node)
        self.controller.add_job(json.dumps({
            "apiVersion": "training.ai/v1", "kind": "DistributedJob",
            "metadata": {"name": JOB},
            "spec": {"replicas": len(nodes), "nodes": list(nodes), "spares": self.spares,
                     "checkpoint": {"dir": str(self._ckpt_dir), "marker": "COMPLETE"},
                     "checkpointInterval": interval,
                     "maxFailures": 1_000_000, "recoveryStrategy": "restart"},
        }).encode(), "replay", admin=True)

    # ------------------------------------------------------------------ the run

    def run(self) -> JobWorld:
        for fault in self.trace.faults:
            self.timeline.at(fault.time, partial(self._fault, fault))
            if fault.warning is not None:
                start = max(0.0, fault.time - fault.warning.lead)
                self.timeline.at(start, partial(self._warn, fault))
        for noise in self.noise:
            self.timeline.at(noise.time, partial(self._noise, noise))
        self._progress()
        self._wake(0.0)
        self.timeline.run_until(self.trace.duration, self._advance)
        self.controller.runner.wait_idle(30)
        return self.world

    def close(self) -> None:
        self.controller.close()
        self.store.close()

    def controller_ettr(self) -> float | None:
        """The controller's ETTR gauge now, rank 0's step at this time reported first.

        (A live client reports every few seconds; the replay only at its ticks, up to
        ``Cadence.quiet`` apart: the last stretch of training would be missing.)
        """
        self._progress()
        status = self.controller.jobs.job(JOB)
        return None if status is None else status.effective_training_ratio

    def interval(self) -> float | None:
        status = self.controller.jobs.job(JOB)
        return None if status is None else status.checkpoint_interval_seconds

    def _advance(self, t: float) -> None:
        self.clock.advance(max(0.0, T0 + t - self.clock.time()))

    # ------------------------------------------------------------------ ticks

    def _wake(self, at: float) -> None:
        if self._tick_at is not None and self._tick_at <= at:
            return
        self._tick_at = at
        self.timeline.at(at, lambda: self._tick(at))

    def _tick(self, at: float) -> None:
        if self._tick_at != at:
            return  # a sooner tick took its place
        self._tick_at = None
        if self._heard is None:
            self._heard = tuple(n for n in dict.fromkeys(
                [*self._slots, *self.spares, *self._condition]) if n not in self._silent)
        self.controller.registry.heard_from(self._heard)
        self._progress()
        self.controller.sweep()
        self._drain()
        self._wake(self._next_tick())

    def _next_tick(self) -> float:
        now = self.timeline.now
        c = self.cadence
        if now < self._fine_until:
            return now + c.fine
        status = self.controller.jobs.job(JOB)
        if self.world.state != "running" or status is None or status.state != "running":
            return now + c.busy
        # The schedule's period runs from its last request (the world saves only when asked).
        # (a millisecond late: wall seconds near 1.8e9 carry a few microseconds of error)
        due = self._last_request + status.checkpoint_interval_seconds + 1e-3
        return min(now + c.quiet, due if due > now else now + c.busy)

    def _drain(self) -> None:
        """Carry out what the controller asked, until it asks nothing more."""
        for _ in range(100):
            self.controller.runner.wait_idle(30)
            with self._inbox_lock:
                batch = sorted(self._inbox, key=lambda r: r.key or r.id)
                self._inbox.clear()
            if not batch:
                return
            for request in batch:
                self.counts[request.action] = self.counts.get(request.action, 0) + 1
                self._carry_out(request)

    def _carry_out(self, request: ActionRequest) -> None:
        if request.action == "checkpoint":
            self._last_request = self.timeline.now
            self.world.checkpoint(because=self._node_behind(request))
        elif request.action == "evict" and request.node is not None:
            self._evict(request.node)
        elif request.action == "restore":
            self._restore(request)

    def _node_behind(self, request: ActionRequest) -> str | None:
        """The node whose incident the action is for (None: the job's schedule)."""
        if request.node is not None or request.incident_id is None:
            return request.node
        incident = self.controller.get_incident(request.incident_id)
        node = None if incident is None else incident.get("node")
        return str(node) if node else None

    # ------------------------------------------------------------------ the world's side

    def _report(self, node: str, events: Sequence[EventRecord] = ()) -> None:
        condition = self._condition.get(node, {})
        gpus = [GpuReport(index=i, utilization_ratio=0.95,
                          temperature_celsius=float(condition.get("temperature", 60.0))
                          if i == 0 else 60.0,
                          ecc_corrected_errors_total=condition.get("ecc_corrected")
                          if i == 0 else None,
                          row_remap_pending=bool(condition.get("row_remap_pending"))
                          and i == 0)
                for i in range(self.settings.gpus_per_node)]
        ports = [IbPortReport(device="mlx5_0", port=1, state=int(condition.get("ib_state", 4)),
                              counters={"symbol_errors": int(condition.get("symbols", 0))})]
        sequence = self._sequence.get(node, 0) + 1
        self._sequence[node] = sequence
        body = self._encoder.encode(Report(
            node=node, instance="replay", sequence=sequence,
            sample_time_seconds=self.clock.time(), gpus=gpus, infiniband=ports,
            events=list(events)))
        self.controller.ingest(body, OPEN_ACCESS)

    def _event(self, kind: str, node: str, code: int | None = None) -> EventRecord:
        self._event_id += 1
        return EventRecord(id=self._event_id, kind=kind, source="nvml",  # type: ignore[arg-type]
                           time_seconds=self.clock.time(), gpu=0, code=code,
                           message=f"{kind} {code if code is not None else ''}".strip())

    def _progress(self) -> None:
        if self.world.state != "running" or not self.world.members:
            return
        self.controller.jobs.progress(JOB, 0, self.world.members[0], 1,
                                      [(self.world.step(), self.clock.time())],
                                      float(self.settings.step_seconds))

    def _node_of(self, fault: Fault) -> str | None:
        return self._member(fault.node)

    def _member(self, name: str) -> str | None:
        """The job's node in the slot of trace node ``name`` now."""
        slot = self._slots.get(name)
        if slot is None or slot >= len(self.world.members):
            return None
        return self.world.members[slot]

    def _fault(self, fault: Fault) -> None:
        node = self._node_of(fault)
        if node is None:
            return
        self._progress()  # the rank's last step before it stopped
        self.world.warned.discard(node)
        self.world.fault(fault, node)
        fine = (self.cadence.fine_for if fault.kind in ("node-lost", "ib-link")
                else self.cadence.fine_for_reported)
        self._fine_until = max(self._fine_until, self.timeline.now + fine)
        self._repair[node] = fault.repair
        if fault.kind == "xid":
            self._condition.setdefault(node, {})
            self._report(node, [self._event("xid", node, fault.code)])
        elif fault.kind == "node-lost":
            # Its agent reported until now: the heartbeat timeout runs from the fault, not
            # from the last sweep (up to ``Cadence.quiet`` before it).
            self.controller.registry.heard_from([node])
            self._silent.add(node)
            self._heard = None
        elif fault.kind == "ib-link":
            self._condition.setdefault(node, {})["ib_state"] = 1
            self._report(node)
        elif fault.kind == "software":
            # The launcher (torchrun) sees its worker exit and restarts the ranks in place.
            members = list(self.world.members)

            def relaunch() -> None:
                if self.world.state == "down":
                    self.world.detected()
                    self.world.restart(members, self.world.latest())
            self.timeline.at(self.timeline.now + CRASH_RESTART, relaunch)
        self._drain()
        self._wake(self.timeline.now + self.cadence.fine)

    def _warn(self, fault: Fault) -> None:
        """The signal before ``fault``: reports that show it, until the fault."""
        node = self._node_of(fault)
        if node is None or fault.warning is None:
            return
        self.world.warned.add(node)
        self._fine_until = max(self._fine_until,
                               self.timeline.now + self.cadence.fine_for_reported)
        signal = fault.warning.signal
        if signal == "row-remap-pending":
            self._condition.setdefault(node, {})["row_remap_pending"] = True
            self._report(node)
        elif signal == "thermal":
            for i in range(3):  # three guard throttles within minutes
                self.timeline.at(self.timeline.now + 40.0 * i,
                                 lambda: self._signal(node, [self._event("guard", node)]))
        else:  # symbol errors rising: 20 a second, reported every 30 s until the fault
            end = fault.time
            t = self.timeline.now
            while t < end:
                self.timeline.at(t, lambda: self._symbols(node))
                t += 30.0
        self._drain()
        self._wake(self.timeline.now + self.cadence.fine)

    def _noise(self, noise: Noise) -> None:
        """A healthy node's noise: its reports show it (for ``noise.lasts``); no fault."""
        node = self._member(noise.slot)
        if node is None or not self.world.healthy(node) or node in self._silent:
            return
        self._fine_until = max(self._fine_until,
                               self.timeline.now + self.cadence.fine_for_reported)
        condition = self._condition.setdefault(node, {})
        events = []
        if noise.signal == "app-xid":
            events.append(self._event("xid", node, APP_XID))
        elif noise.signal == "ecc-corrected":
            condition["ecc_corrected"] = int(condition.get("ecc_corrected", 0)) + 1
        elif noise.signal == "ib-symbols":
            condition["symbols"] = int(condition.get("symbols", 0)) + SYMBOL_BURST
        elif noise.signal == "temperature":
            condition["temperature"] = EXCURSION_CELSIUS
        else:  # link-flap
            condition["ib_state"] = 1
        self._signal(node, events)
        if noise.lasts > 0:
            self.timeline.at(self.timeline.now + noise.lasts,
                             partial(self._noise_over, node, noise))

    def _noise_over(self, node: str, noise: Noise) -> None:
        condition = self._condition.get(node)
        if condition is None or not self.world.healthy(node) or node in self._silent:
            return  # repaired since, or a fault shows now: not the noise's to undo
        condition.pop("temperature" if noise.signal == "temperature" else "ib_state", None)
        self._signal(node)

    def _symbols(self, node: str) -> None:
        condition = self._condition.setdefault(node, {})
        condition["symbols"] = int(condition.get("symbols", 0)) + 600
        self._signal(node)

    def _signal(self, node: str, events: Sequence[EventRecord] = ()) -> None:
        """A report that shows something: what the rules do about it is done at once."""
        self._report(node, events)
        self._drain()
        self._wake(self.timeline.now + self.cadence.fine)

    def _evict(self, node: str) -> None:
        self.world.evicted(node)
        broken = node in self.world.broken
        # a healthy node taken out is given back when the operator has looked at it
        delay = (self._repair.get(node, 0.0) if broken
                 else float(self.settings.operator_response))
        self.timeline.at(self.timeline.now + max(delay, 1.0), lambda: self._repaired(node))

    def _repaired(self, node: str) -> None:
        """The node is fixed: it reports healthy again and the operator gives it back."""
        self.world.repaired(node)
        self.world.warned.discard(node)
        self._silent.discard(node)
        self._heard = None
        self._condition.pop(node, None)
        self._report(node)
        try:  # what the API refuses (the node is in the job again, say) is left as it is
            self.controller.return_to_pool(JOB, node, OPERATOR)
        except ControllerError as err:
            log.info("replay: %s not returned to the pool: %s", node, err)
        try:
            self.controller.manual_action("uncordon", node, OPERATOR, "repaired")
        except ControllerError as err:
            log.info("replay: %s not uncordoned: %s", node, err)

    def _restore(self, request: ActionRequest) -> None:
        nodes = [str(n) for n in request.params.get("nodes", [])]
        checkpoint = request.params.get("checkpoint")
        saved = None
        if isinstance(checkpoint, dict):
            saved = self.world.checkpoint_at(int(checkpoint["step"]))
        recovery = self.controller.jobs.recovery(str(request.params.get("recovery", "")))
        record = self.world.open
        if record is not None and recovery is not None and recovery.detected is not None:
            detected = recovery.detected - T0
            if record.detected is None or detected < record.detected:
                record.detected = max(record.at, detected)
        self.world.detected()
        members = nodes or list(self.world.members)
        warm = warm_start(members, self.world.ranks, self._standby)
        # the launcher pre-warms the pool the restore leaves (a node given back included)
        self._standby = {str(n) for n in request.params.get("spares", [])}
        self.world.restart(members, saved, warm=warm)

    def _running(self) -> None:
        self._progress()
        self._wake(self.timeline.now)

    def _saved(self, saved: SavedCheckpoint) -> None:
        """The checkpoint is on storage: the directory, then the client's report."""
        path = self._ckpt_dir / f"step_{saved.step:010d}"
        path.mkdir(exist_ok=True)
        marker = path / "COMPLETE"
        marker.touch()
        os.utime(marker, (self.clock.time(), self.clock.time()))
        kept = sorted(self._ckpt_dir.iterdir())
        for old in kept[:-CHECKPOINTS_KEPT]:
            shutil.rmtree(old, ignore_errors=True)
        member = self.world.members[0] if self.world.members else "node-0000"
        try:
            self.controller.jobs.checkpoint_saved(JOB, 0, member, saved.step, str(path),
                                                  float(self.settings.save_blocking))
        except (JobError, ValueError, OSError) as err:
            log.warning("replay: checkpoint of step %d not taken: %s", saved.step, err)
