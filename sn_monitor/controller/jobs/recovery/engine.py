"""Who runs the recovery state machine: starts recoveries, joins faults, drives them.

One active recovery per job: every fault of one of its nodes while it runs joins it
(the same node again only adds the incident). A recovery is saved before it acts;
after a restart :meth:`RecoveryEngine.load` picks the active ones up where they stood
and re-applies their saved plans (idempotent). Incidents a recovery handled are
remembered, so a fault reported again (the controller settling again after a restart)
never starts a second one.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

import msgspec
from msgspec.structs import replace

from sn_monitor.clock import Clock
from sn_monitor.controller.jobs.checkpoints import Checkpoint
from sn_monitor.controller.jobs.ports import JobActions
from sn_monitor.controller.jobs.recovery import machine
from sn_monitor.controller.jobs.recovery_record import (
    ACTIVE_STATES,
    FailedNode,
    FaultKind,
    Recovery,
    from_row,
    to_row,
)
from sn_monitor.controller.jobs.registry import JobRecord, JobRegistry
from sn_monitor.controller.jobs.schedule import CheckpointSchedule
from sn_monitor.controller.jobs.settings import JobError, JobSettings, UnknownRecovery
from sn_monitor.controller.jobs.views import RecoveryDuration, recovery_duration
from sn_monitor.controller.storage.store import Store, StoreError

log = logging.getLogger(__name__)


class RecoveryEngine:
    """The active recoveries, one per job; the orchestrator's lock is held by callers."""

    def __init__(self, store: Store, clock: Clock, settings: JobSettings,
                 actions: JobActions, registry: JobRegistry,
                 schedule: CheckpointSchedule) -> None:
        self.store = store
        self.clock = clock
        self.settings = settings
        self.actions = actions
        self.registry = registry
        self.schedule = schedule
        self._active: dict[str, Recovery] = {}  # job -> its active recovery
        self._finished: list[RecoveryDuration] = []
        #: Incidents a recovery acted on, per job (a fault reported again is a no-op).
        self._handled: dict[str, set[int]] = {}
        #: restore action id -> when it succeeded (the launcher took it).
        self._taken_at: dict[str, float] = {}

    # ------------------------------------------------------------------ state

    def load(self) -> None:
        """Active recoveries carry on at the next tick; their plans are applied again."""
        for row in self.store.list_recoveries(limit=self.settings.finished_kept * 2):
            try:
                rec = from_row(row)
            except msgspec.ValidationError as err:
                log.error("recovery %s in the store cannot be read, skipped: %s", row.id, err)
                continue
            self._handled.setdefault(rec.job, set()).update(rec.incident_ids)
            j = self.registry.find(rec.job)
            if rec.active and j is not None:
                self._active[rec.job] = rec
                for node in rec.out_nodes:
                    if node not in j.row.excluded:
                        self.registry.evict(j, node)
                if rec.planned:
                    self.registry.take(j, rec.replacements, rec.nodes)
            duration = recovery_duration(rec)
            if duration is not None:
                self._finished.append(duration)
        del self._finished[:-self.settings.finished_kept]
        if self._active:
            log.info("resuming %d job recoveries: %s", len(self._active),
                     ", ".join(f"{r.job} ({r.state})" for r in self._active.values()))

    def active(self, job: str) -> Recovery | None:
        return self._active.get(job)

    def recovering(self, job: str, node: str) -> bool:
        """``job``'s active recovery counts ``node`` among its failed nodes."""
        rec = self.active(job)
        return rec is not None and rec.failed_node(node) is not None

    def finished(self) -> tuple[RecoveryDuration, ...]:
        return tuple(self._finished)

    def owns_incident(self, incident_id: int) -> bool:
        """A recovery (active or finished) acted on this incident: never plan it again."""
        return any(incident_id in ids for ids in self._handled.values())

    def _save(self, rec: Recovery) -> Recovery:
        rec = replace(rec, updated_at=self.clock.time())
        self.store.save_recovery(to_row(rec))
        if rec.active:
            self._active[rec.job] = rec
        elif self._active.get(rec.job, rec).id == rec.id:
            self._active.pop(rec.job, None)
            self._taken_at.clear()  # only the active recoveries' restores matter
        return rec

    def _context(self, j: JobRecord, latest: Checkpoint | None) -> machine.StepContext:
        return machine.StepContext(
            clock=self.clock, settings=self.settings, actions=self.actions,
            registry=self.registry, schedule=self.schedule, store=self.store,
            save=self._save, job=j, latest=latest)

    # ------------------------------------------------------------------ faults

    def on_fault(self, j: JobRecord, node: str | None, kind: FaultKind,
                 incident_id: int | None, alive: bool, seen: float, detected: float,
                 latest: Checkpoint | None) -> Recovery | None:
        """A fault of ``node`` (None: the whole job) starts a recovery or joins the active one."""
        handled = self._handled.setdefault(j.name, set())
        if incident_id is not None and incident_id in handled:
            log.info("job %s: incident %d already acted upon", j.name, incident_id)
            return self._active.get(j.name)
        if incident_id is not None:
            handled.add(incident_id)
        rec = self._active.get(j.name)
        ctx = self._context(j, latest)
        if rec is not None:
            return machine.drive(ctx, self._join(j, rec, node, kind, incident_id))
        rec = self._start(j, node, kind, incident_id, alive, seen, detected)
        return machine.drive(ctx, rec)

    def _start(self, j: JobRecord, node: str | None, kind: FaultKind,
               incident_id: int | None, alive: bool, seen: float,
               detected: float) -> Recovery:
        now = self.clock.time()
        failures = j.row.failures + 1
        spec = j.job.spec
        give_up = ""
        if failures > spec.max_failures:
            give_up = (f"more than maxFailures ({spec.max_failures}) recoveries: "
                       f"given up, no automatic recovery")
        p = j.progress
        progressing = (p.last_advance is not None and now - p.last_advance
                       < spec.effective_hang_timeout(p.median_step_time()))
        latest = j.catalogue.latest_complete()
        incidents = () if incident_id is None else (incident_id,)
        rec = Recovery(
            id=uuid.uuid4().hex[:16], job=j.name, state="detected", kind=kind,
            strategy=spec.recovery_strategy, generation=j.row.generation + 1,
            fault_seen=seen, detected=detected, created_at=now, updated_at=now,
            failed=() if node is None else (FailedNode(node, kind, incidents),),
            job_incidents=incidents if node is None else (), order=j.row.nodes,
            target=len(j.row.nodes),
            checkpoint_first=bool(alive and kind == "fatal" and progressing and not give_up
                                  and node is not None),
            checkpoint_before=latest.step if latest is not None else -1, give_up=give_up)
        rec = rec.noted(now, "detected", f"{kind} fault on {node}" if node else
                        f"{kind}: the whole job, restarted in place")
        rec = self._save(rec)  # the recovery exists before anything is done for it
        self.registry.save(j, failures=failures, state="failed" if give_up else "recovering",
                           state_reason=give_up or f"recovering from a {kind} fault"
                           + (f" on {node}" if node else ""))
        log.warning("job %s: recovery %s started: %s fault on %s", j.name, rec.id, kind,
                    node or "every node")
        return rec

    def _join(self, j: JobRecord, rec: Recovery, node: str | None, kind: FaultKind,
              incident_id: int | None) -> Recovery:
        now = self.clock.time()
        incidents = () if incident_id is None else (incident_id,)
        if node is None:
            return self._save(replace(rec, job_incidents=tuple(dict.fromkeys(
                (*rec.job_incidents, *incidents)))))
        known = rec.failed_node(node)
        if known is not None:
            again = replace(known, incidents=tuple(dict.fromkeys((*known.incidents,
                                                                  *incidents))))
            if known.eviction != "healed":  # one more fault of a node already failed
                return self._save(rec.with_failed(again))
            # it came back and stayed in the job, and fails again: evict it after all
            rec = rec.with_failed(replace(again, eviction="pending"))
        else:
            rec = rec.with_failed(FailedNode(node, kind, incidents))
        rec = rec.noted(now, "joined", f"{kind} fault on {node} joins the recovery")
        if rec.planned or rec.state in ("awaiting_approval", "restoring"):
            # plan again, from the last plan, without the node; a restore already sent
            # is replaced by a new attempt (a new generation)
            fresh = rec.restore_sent is not None or rec.restore_step in rec.steps
            rec = replace(rec, planned=False, order=rec.nodes or rec.order, state="evicting",
                          attempts=0, deadline=now + self.settings.evict_timeout)
            if fresh:
                rec = replace(rec, restore_sent=None, checkpoint=None,
                              generation=rec.generation + 1,
                              restore_attempt=rec.restore_attempt + 1)
        rec = self._save(rec)
        if j.row.state != "failed":
            self.registry.save(j, state="recovering",
                               state_reason=f"recovering; {kind} fault on {node} joined")
        return rec

    # ------------------------------------------------------------------ driving

    def tick(self, j: JobRecord, latest: Checkpoint | None) -> None:
        rec = self._active.get(j.name)
        if rec is not None:
            machine.drive(self._context(j, latest), rec)

    def approve(self, recovery_id: str, who: str, latest_of: dict[str, Checkpoint | None]
                ) -> Recovery:
        """A person approved a manual recovery: the restore goes out."""
        rec = next((r for r in self._active.values() if r.id == recovery_id), None)
        if rec is None:
            row = self.store.get_recovery(recovery_id)
            if row is None:
                raise UnknownRecovery(f"no recovery {recovery_id!r}")
            raise JobError(f"recovery {recovery_id} is {row.state}, not awaiting approval")
        if rec.state != "awaiting_approval":
            raise JobError(f"recovery {recovery_id} is {rec.state}, not awaiting approval")
        j = self.registry.get(rec.job)
        rec = rec.noted(self.clock.time(), "approved", f"approved by {who}")
        rec = self._save(replace(rec, state="restoring", attempts=0, deadline=None,
                                 approved_by=who))
        self.registry.save(j, state="recovering", state_reason=f"restore approved by {who}")
        return machine.drive(self._context(j, latest_of.get(j.name)), rec)

    def cancel(self, job: str, why: str) -> None:
        """The job is gone: its recovery and whatever it still waits on are cancelled."""
        rec = self._active.pop(job, None)
        if rec is None:
            return
        for action_id in rec.steps.values():
            self.actions.cancel(action_id, why)
        rec = rec.noted(self.clock.time(), "cancelled", why)
        self._save(replace(rec, state="cancelled", finished_at=self.clock.time(),
                           deadline=None))
        self._handled.pop(job, None)

    def progress(self, j: JobRecord, node: str, batch: Iterable[tuple[int, float]]) -> None:
        """A rank's progress; the new generation's makes the recovery done.

        That is progress from one of the new nodes, at or past the checkpoint's step,
        made after the launcher took the restore (until then the old ranks may still run).
        """
        rec = self._active.get(j.name)
        if rec is None or rec.state != "restoring" or rec.restore_sent is None \
                or node not in rec.nodes:
            return
        floor = rec.checkpoint.step if rec.checkpoint is not None else 0
        taken = self._restore_taken(rec)
        if taken is None or not any(step >= floor and when > taken for step, when in batch):
            return
        now = self.clock.time()
        rec = rec.noted(now, "resumed", f"progress from {node}")
        rec = self._save(replace(rec, state="done", resumed=now, finished_at=now,
                                 deadline=None))
        duration = recovery_duration(rec)
        if duration is not None:
            self._finished.append(duration)
            del self._finished[:-self.settings.finished_kept]
        self.registry.save(j, state="running", state_reason="")
        log.info("job %s: recovery %s done, generation %d resumed (MTTR %.1fs)", j.name,
                 rec.id, rec.generation, duration.total if duration else float("nan"))

    def _restore_taken(self, rec: Recovery) -> float | None:
        """When the current restore succeeded (the launcher took it): once a restore, a read."""
        action_id = rec.steps.get(rec.restore_step)
        if action_id is None:
            return None
        taken = self._taken_at.get(action_id)
        if taken is None:
            try:
                record = self.actions.get(action_id)
            except StoreError:
                return None
            if record is None or record.state not in machine.RAN:
                return None
            taken = self._taken_at[action_id] = record.updated_at
        return taken

    def recoveries(self, job: str | None, limit: int) -> list[Recovery]:
        """From the store, newest first (a row that cannot be read is left out)."""
        out: list[Recovery] = []
        for row in reversed(self.store.list_recoveries(job=job, limit=limit)):
            try:
                out.append(from_row(row))
            except msgspec.ValidationError:
                continue
        return out

    def recovery(self, recovery_id: str) -> Recovery | None:
        row = self.store.get_recovery(recovery_id)
        return None if row is None else from_row(row)


__all__ = ["ACTIVE_STATES", "RecoveryEngine"]
