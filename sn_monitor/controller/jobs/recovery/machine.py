"""The recovery state machine: one step function per state, in a transition table.

::

    detected -> [checkpointing] -> evicting -> [awaiting_approval] -> restoring -> done
                                      |  (every failed node back healthy) -> cancelled
                                      (any step) -> failed

A step takes the recovery and the :class:`StepContext` (the job, the clock, the
actions port) and returns the recovery as it now stands, saved, and whether the next
step may run at once. A step is idempotent and crash-consistent: what it is about to do
is saved before it does it, and each action it submits has a key that never changes
(``recovery:ID:STEP``), so running a step again after a crash finds the action it
submitted instead of submitting another. A recovery's actions carry it as their
``owner``: the open breaker holds them (one record, "held since ..."), and its own
earlier evictions never count against its next one.

- ``detected``: a node still alive and a job still progressing first get a checkpoint.
- ``checkpointing``: wait (``checkpoint_wait``) for a checkpoint newer than the latest.
- ``evicting``: one ``evict`` per failed node (none if the node was already evicted).
  A node leaves the job when its eviction has run. While the breaker holds an eviction
  there is no timeout; a node that comes back healthy before its eviction runs is
  ``healed`` (the eviction is cancelled) and stays in the job. Then the plan: spares
  (``restart`` / ``manual``) or fewer nodes (``elastic``, down to ``minReplicas``).
- ``awaiting_approval``: ``manual`` waits for a person.
- ``restoring``: a ``restore`` to job control with the latest complete checkpoint, the
  nodes and the generation; done when the new generation makes progress (the
  orchestrator's progress path). No progress in ``restore_timeout``: a new attempt.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from msgspec.structs import replace

from sn_monitor.clock import Clock
from sn_monitor.controller.audit import ActionRecord, ActionRequest
from sn_monitor.controller.jobs.checkpoints import Checkpoint
from sn_monitor.controller.jobs.ports import JobActions
from sn_monitor.controller.jobs.recovery_record import (
    SETTLED_EVICTIONS,
    CheckpointRef,
    EvictionState,
    FailedNode,
    Recovery,
    RecoveryState,
)
from sn_monitor.controller.jobs.registry import JobRecord, JobRegistry
from sn_monitor.controller.jobs.schedule import REQUESTER, CheckpointSchedule
from sn_monitor.controller.jobs.settings import JobSettings
from sn_monitor.controller.jobs.views import JOB_FAILED_RULE, RECOVERY_RULE
from sn_monitor.controller.storage.store import Store
from sn_monitor.model import ActionName

log = logging.getLogger(__name__)

#: Action states that mean the action will not happen.
WILL_NOT_RUN: Final = frozenset({"failed", "refused", "cancelled"})
#: Action states that mean it happened (a dry run is as good as done for the plan).
RAN: Final = frozenset({"succeeded", "dry_run"})


@dataclass
class StepContext:
    """What a step works with; ``latest`` was read (and verified) outside the lock."""

    clock: Clock
    settings: JobSettings
    actions: JobActions
    registry: JobRegistry
    schedule: CheckpointSchedule
    store: Store
    save: Callable[[Recovery], Recovery]
    job: JobRecord
    latest: Checkpoint | None

    def now(self) -> float:
        return self.clock.time()


Step = Callable[[StepContext, Recovery], tuple[Recovery, bool]]


def submit_step(ctx: StepContext, rec: Recovery, step: str, action: ActionName,
                node: str | None, reason: str, params: Mapping[str, Any], *,
                severity: str = "warning", rule: str = RECOVERY_RULE
                ) -> tuple[Recovery, ActionRecord]:
    """The action of one step: submitted once, under a key that never changes."""
    known = rec.steps.get(step)
    if known is not None:
        record = ctx.actions.get(known)
        if record is not None:
            return rec, record
    incidents = rec.incident_ids
    record = ctx.actions.submit(ActionRequest(
        id=uuid.uuid4().hex, key=f"recovery:{rec.id}:{step}", action=action, node=node,
        reason=reason, rule=rule, incident_id=incidents[0] if incidents else None,
        severity=severity, labels={"job": rec.job},
        params={**params, "job": rec.job, "recovery": rec.id},
        requested_by=REQUESTER, created_seconds=ctx.now(), owner=rec.id))
    return ctx.save(replace(rec, steps={**rec.steps, step: record.id})), record


def goto(ctx: StepContext, rec: Recovery, state: RecoveryState, *,
         deadline: float | None = None) -> Recovery:
    return ctx.save(replace(rec, state=state, attempts=0, deadline=deadline))


# ---------------------------------------------------------------------- the steps


def detected(ctx: StepContext, rec: Recovery) -> tuple[Recovery, bool]:
    now = ctx.now()
    if not rec.checkpoint_first:
        return goto(ctx, rec, "evicting", deadline=now + ctx.settings.evict_timeout), True
    if "checkpoint" not in rec.steps:
        incidents = rec.incident_ids
        ask = ctx.schedule.request(ctx.job, "recovery", key=f"recovery:{rec.id}:checkpoint",
                                   incident_id=incidents[0] if incidents else None,
                                   rule=RECOVERY_RULE)
        if ask.action_id is not None:
            rec = replace(rec, steps={**rec.steps, "checkpoint": ask.action_id})
    rec = rec.noted(now, "checkpointing", f"the node is alive: waiting up to "
                                          f"{ctx.settings.checkpoint_wait:g}s for a checkpoint")
    return goto(ctx, rec, "checkpointing", deadline=now + ctx.settings.checkpoint_wait), True


def checkpointing(ctx: StepContext, rec: Recovery) -> tuple[Recovery, bool]:
    now = ctx.now()
    latest = ctx.job.catalogue.latest_complete()
    if latest is not None and latest.step > rec.checkpoint_before:
        rec = rec.noted(now, "checkpointed", f"checkpoint of step {latest.step}")
    elif rec.deadline is not None and now >= rec.deadline:
        rec = rec.noted(now, "checkpoint-timeout",
                        "no new checkpoint in time: the latest complete one is used")
    elif stopped_at_fault(ctx, rec, now):
        rec = rec.noted(now, "checkpoint-abandoned",
                        "the job has made no progress since the fault: no checkpoint will "
                        "come, the latest complete one is used")
    else:
        return rec, False
    return goto(ctx, rec, "evicting", deadline=now + ctx.settings.evict_timeout), True


#: A job with no progress this long after the fault (or this many median step times,
#: whichever is longer) died with it: its checkpoint is not waited for.
STOPPED_MIN_SECONDS: Final = 15.0
STOPPED_STEPS: Final = 3


def stopped_at_fault(ctx: StepContext, rec: Recovery, now: float) -> bool:
    """The job stopped when the fault came (a rank died with its GPU): nothing to save."""
    p = ctx.job.progress
    median = p.median_step_time() or 0.0
    quiet = max(STOPPED_MIN_SECONDS, STOPPED_STEPS * median)
    last = p.last_advance
    return now - rec.fault_seen >= quiet and (last is None or last <= rec.fault_seen)


def _healed(ctx: StepContext, failed: FailedNode) -> bool:
    """The node is back: its incidents closed and no fault on it.

    A hang never heals (its node may be fine, its rank is not), and neither does a fault
    no incident stands for: nothing would say it is over.
    """
    if failed.kind == "hang" or not failed.incidents \
            or not ctx.actions.node_healthy(failed.node):
        return False
    for incident_id in failed.incidents:
        incident = ctx.store.get_incident(incident_id)
        if incident is not None and incident.status == "open":
            return False
    return True


def _settle(ctx: StepContext, rec: Recovery, failed: FailedNode, state: str,
            how: EvictionState) -> Recovery:
    """The eviction of ``failed`` is settled: the node leaves the job unless it healed."""
    if how != "healed":
        ctx.registry.evict(ctx.job, failed.node)
    rec = rec.with_failed(replace(failed, eviction=how))
    return ctx.save(rec.noted(ctx.now(), f"evict-{how}", f"{failed.node}: {state}"))


#: How one failed node's eviction stands after a pass of :func:`evicting`: settled,
#: still running (``untimed`` while the breaker or a person holds it: no timeout), or
#: the recovery failed for it.
_Eviction = Literal["settled", "running", "untimed", "failed"]


def evicting(ctx: StepContext, rec: Recovery) -> tuple[Recovery, bool]:
    now = ctx.now()
    waiting = untimed = False
    for failed in [f for f in rec.failed if f.eviction not in SETTLED_EVICTIONS]:
        rec, how = _evict(ctx, rec, failed)
        if how == "failed":
            return rec, False
        waiting = waiting or how != "settled"
        untimed = untimed or how == "untimed"
    if waiting:
        return _await_evictions(ctx, rec, now, untimed=untimed), False
    if not rec.out_nodes and rec.failed:
        return healed(ctx, rec), True
    if rec.evicted is None:
        rec = replace(rec, evicted=now)
    if rec.give_up:
        return fail(ctx, rec, rec.give_up), False
    return plan(ctx, rec), True


def _evict(ctx: StepContext, rec: Recovery, failed: FailedNode) -> tuple[Recovery, _Eviction]:
    """One pass over the eviction of ``failed``: submitted once, settled when it is over."""
    step = f"evict:{failed.node}"
    if _healed(ctx, failed):
        action_id = rec.steps.get(step)
        record = ctx.actions.cancel(action_id, f"{failed.node} is back and healthy") \
            if action_id is not None else None
        if record is None or record.state == "cancelled":
            return _settle(ctx, rec, failed, "back and healthy before its eviction",
                           "healed"), "settled"
    if step not in rec.steps and ctx.actions.already_evicted(failed.node):
        return _settle(ctx, rec, failed, "already evicted", "done"), "settled"
    rec, record = submit_step(
        ctx, rec, step, "evict", failed.node,
        f"{failed.kind} fault on {failed.node}: out of job {rec.job} (recovery {rec.id})",
        {"status": "firing"})
    if record.state == "held":
        record = ctx.actions.release(record.id)
    if record.state in RAN:
        return _settle(ctx, rec, failed, record.state, "done"), "settled"
    if record.state in WILL_NOT_RUN:
        why = f"evicting {failed.node}: {record.state}"
        detail = record.outcome_message or record.verdict_reason
        why += f": {detail}" if detail else ""
        if ctx.settings.require_eviction:
            return fail(ctx, rec, why), "failed"
        return _settle(ctx, rec, failed, why + "; going on without it", "skipped"), "settled"
    return rec, "untimed" if record.state in ("held", "awaiting_approval") else "running"


def _await_evictions(ctx: StepContext, rec: Recovery, now: float, *,
                     untimed: bool) -> Recovery:
    """Evictions still run: wait up to ``evict_timeout``, ``step_retries`` times over."""
    if untimed:  # the breaker or a person decides: no timeout meanwhile
        if rec.deadline is not None:
            rec = ctx.save(replace(rec, deadline=None))
        return rec
    if rec.deadline is None:
        return ctx.save(replace(rec, deadline=now + ctx.settings.evict_timeout))
    if now < rec.deadline:
        return rec
    if rec.attempts + 1 > ctx.settings.step_retries:
        return fail(ctx, rec, "evictions did not finish in time")
    rec = rec.noted(now, "timeout", "evictions not finished yet; waiting again")
    return ctx.save(replace(rec, attempts=rec.attempts + 1,
                            deadline=now + ctx.settings.evict_timeout))


def healed(ctx: StepContext, rec: Recovery) -> Recovery:
    """Every failed node came back before its eviction: nothing to recover, or a restart.

    The nodes stay in the job. If the job went on making progress meanwhile, the
    recovery is cancelled; if it did not (its ranks died with the fault), it restarts
    in place, on the same nodes, from its latest complete checkpoint.
    """
    now = ctx.now()
    p = ctx.job.progress
    if p.last_advance is not None and p.last_advance > rec.detected:
        rec = rec.noted(now, "healed", "every failed node is back and healthy, and the job "
                                       "kept training: nothing to recover")
        rec = ctx.save(replace(rec, state="cancelled", finished_at=now, deadline=None,
                               error="healed: the failed nodes came back"))
        ctx.registry.save(ctx.job, state="running", state_reason="",
                          failures=max(0, ctx.job.row.failures - 1))
        log.info("job %s: recovery %s cancelled: %s came back healthy", rec.job, rec.id,
                 ", ".join(rec.failed_nodes))
        return rec
    rec = rec.noted(now, "healed", "every failed node is back, but the job stopped: "
                                   "restarting on the same nodes")
    return plan(ctx, replace(rec, evicted=now))


def plan(ctx: StepContext, rec: Recovery) -> Recovery:
    """Which nodes the job restarts on; spares leave the pool once the plan is saved."""
    j, spec = ctx.job, ctx.job.job.spec
    out = set(rec.out_nodes)
    members = [n for n in j.row.nodes if n not in out]
    pool = [n for n in j.row.pool if n not in out]
    take, note, why_not = _spares(rec, members, pool, spec.min_replicas)
    if why_not:
        return fail(ctx, rec, why_not)
    if not members and not take:
        return fail(ctx, rec, "no node left to run on")
    nodes = _placed(rec, members, out, take)
    detail = f"{len(nodes)} nodes" + (f", spares {', '.join(take)}" if take else "")
    waiting = rec.strategy == "manual" and rec.approved_by is None
    rec = replace(rec, nodes=tuple(nodes), planned=True,
                  replacements=tuple(dict.fromkeys((*rec.replacements, *take))))
    rec = rec.noted(ctx.now(), "planned", note or f"{rec.strategy}: {detail}")
    rec = goto(ctx, rec, "awaiting_approval" if waiting else "restoring")
    ctx.registry.take(j, tuple(take), rec.nodes)  # after the plan is saved: re-applied
    ctx.registry.save(j, state="awaiting_approval" if waiting else "recovering",
                      state_reason=("waiting for approval: " if waiting else "") + detail)
    return rec


def _spares(rec: Recovery, members: list[str], pool: list[str],
            min_replicas: int) -> tuple[list[str], str, str]:
    """The spares the plan takes, a note when too few are left, why the job cannot go on.

    The reason is "" when the job can go on. ``restart`` and ``manual`` take spares up
    to the target (elastic below it, down to ``minReplicas``); ``elastic`` takes none.
    """
    if rec.strategy not in ("restart", "manual"):
        if len(members) < min_replicas:
            return [], "", f"{len(members)} nodes left, below minReplicas ({min_replicas})"
        return [], "", ""
    target = rec.target or len(members)
    need = max(0, target - len(members))
    take = pool[:need]
    if len(take) >= need:
        return take, "", ""
    if len(members) + len(take) < min_replicas:
        return take, "", (f"no spare left ({len(take)} of {need}) and "
                          f"{len(members) + len(take)} nodes are below "
                          f"minReplicas ({min_replicas})")
    return take, (f"only {len(take)} of {need} spares left: continuing elastic on "
                  f"{len(members) + len(take)} nodes (minReplicas {min_replicas})"), ""


def _placed(rec: Recovery, members: list[str], out: set[str], take: list[str]) -> list[str]:
    """The job's nodes in rank order: each spare takes the place of a node that left."""
    spares = iter(take)
    nodes: list[str] = []
    for node in dict.fromkeys((*rec.order, *members)):
        if node in members:
            nodes.append(node)
        elif node in out and (spare := next(spares, None)) is not None:
            nodes.append(spare)
    nodes.extend(spares)
    return nodes


def awaiting_approval(ctx: StepContext, rec: Recovery) -> tuple[Recovery, bool]:
    return rec, False


def restoring(ctx: StepContext, rec: Recovery) -> tuple[Recovery, bool]:
    now = ctx.now()
    step = rec.restore_step
    if step not in rec.steps:  # the checkpoint is chosen (and saved) before it is sent
        point = ctx.latest
        rec = replace(rec, checkpoint=None if point is None else
                      CheckpointRef(step=point.step, path=str(point.path)))
        if point is None:
            rec = rec.noted(now, "no-checkpoint",
                            "no complete checkpoint: the job restarts from scratch")
        rec = ctx.save(rec)
    checkpoint = (None if rec.checkpoint is None else
                  {"step": rec.checkpoint.step, "path": rec.checkpoint.path})
    rec, record = submit_step(
        ctx, rec, step, "restore", None,
        f"restore job {rec.job} on {len(rec.nodes)} nodes from "
        + (f"step {rec.checkpoint.step}" if rec.checkpoint else "scratch")
        + f" (generation {rec.generation}, recovery {rec.id})",
        {"checkpoint": checkpoint, "nodes": list(rec.nodes),
         "failed_nodes": list(rec.out_nodes), "generation": rec.generation,
         # what is left in the pool: a launcher may pre-warm the next restore's spares
         "spares": [n for n in ctx.job.row.pool if n not in rec.nodes]})
    if record.state == "held":
        record = ctx.actions.release(record.id)
    if record.state in WILL_NOT_RUN:
        detail = record.outcome_message or record.verdict_reason
        return retry_restore(ctx, rec, f"restore {record.state}"
                             + (f": {detail}" if detail else ""))
    if record.state in ("held", "awaiting_approval"):
        return rec, False
    if record.state == "dry_run":  # nothing was restored: the ranks must not be told either
        rec = rec.noted(now, "dry-run", "the restore was a dry run: not sent")
        rec = ctx.save(replace(rec, state="cancelled", deadline=None, finished_at=now,
                               error="dry run: the restore was not sent"))
        ctx.registry.save(ctx.job, state="running",
                          state_reason="dry run: recovery not carried out")
        return rec, False
    if rec.restore_sent is None:
        rec = rec.noted(now, "restore-sent", f"generation {rec.generation} on "
                                             f"{', '.join(rec.nodes)}")
        rec = ctx.save(replace(rec, restore_sent=now,
                               deadline=now + ctx.settings.restore_timeout))
        ctx.job.progress.reset_ranks()
        ctx.registry.save(ctx.job, generation=rec.generation)
        return rec, False
    if rec.deadline is not None and now >= rec.deadline:
        return retry_restore(ctx, rec, f"no progress from generation {rec.generation} "
                                       f"within {ctx.settings.restore_timeout:g}s")
    return rec, False


def retry_restore(ctx: StepContext, rec: Recovery, why: str) -> tuple[Recovery, bool]:
    """A new restore attempt: a new generation and a new action, or the recovery fails."""
    attempts = rec.attempts + 1
    if attempts > ctx.settings.step_retries:
        return fail(ctx, rec, why), False
    rec = rec.noted(ctx.now(), "retry", why)
    return ctx.save(replace(rec, attempts=attempts, restore_sent=None, deadline=None,
                            checkpoint=None, generation=rec.generation + 1,
                            restore_attempt=rec.restore_attempt + 1)), True


def fail(ctx: StepContext, rec: Recovery, why: str) -> Recovery:
    """The recovery failed: page a person; the job is failed (no more automatic recovery)."""
    for step, action_id in rec.steps.items():
        if step != "alert":
            ctx.actions.cancel(action_id, f"recovery {rec.id} failed")
    rec, _ = submit_step(ctx, rec, "alert", "alert", None, f"job {rec.job} failed: {why}",
                         {"status": "firing", "subject": rec.job}, severity="critical",
                         rule=JOB_FAILED_RULE)
    rec = rec.noted(ctx.now(), "failed", why)
    rec = ctx.save(replace(rec, state="failed", error=why, finished_at=ctx.now(),
                           deadline=None))
    ctx.registry.save(ctx.job, state="failed", state_reason=why)
    log.error("job %s: recovery %s failed: %s", rec.job, rec.id, why)
    return rec


#: The transition table: the step of each active state.
STEPS: Final[Mapping[RecoveryState, Step]] = {
    "detected": detected,
    "checkpointing": checkpointing,
    "evicting": evicting,
    "awaiting_approval": awaiting_approval,
    "restoring": restoring,
}


def drive(ctx: StepContext, rec: Recovery) -> Recovery:
    """Take every step that can be taken now; the recovery as it stands after."""
    for _ in range(32):
        step = STEPS.get(rec.state)
        if step is None:
            break
        rec, again = step(ctx, rec)
        if not again:
            break
    return rec
