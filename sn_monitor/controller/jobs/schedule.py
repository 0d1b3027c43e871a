"""When a job is asked to checkpoint: on schedule, before a node degrades, for a recovery.

Every ``checkpointInterval``; before a degrading node is taken out; when a recovery wants
a fresh checkpoint of a node still alive.

A request is written to the job's row first (its action's key with it) and submitted
after: a controller that crashes in between submits it again under the same key, so the
job's launcher hears of each request once. The ranks also see it in their progress
replies. A complete checkpoint of a newer step satisfies it.
"""

from __future__ import annotations

import logging
import math
import uuid

import msgspec

from sn_monitor.clock import Clock
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.jobs.advisor import Advice, FleetFaults, advise
from sn_monitor.controller.jobs.checkpoints import Checkpoint
from sn_monitor.controller.jobs.ports import JobActions
from sn_monitor.controller.jobs.recovery_record import CheckpointRef
from sn_monitor.controller.jobs.registry import CheckpointAsk, JobRecord, JobRegistry
from sn_monitor.controller.jobs.settings import JobSettings
from sn_monitor.controller.jobs.views import CheckpointRequest

log = logging.getLogger(__name__)

REQUESTER = "job-orchestrator"
#: How long a job's recommended interval stands without a new failure or save time.
ADVICE_REFRESH = 3600.0


class CheckpointSchedule:
    """Checkpoint requests of every job (the orchestrator's lock held by callers)."""

    def __init__(self, registry: JobRegistry, clock: Clock, settings: JobSettings,
                 actions: JobActions, fleet: FleetFaults | None = None) -> None:
        self.registry = registry
        self.clock = clock
        self.settings = settings
        self.actions = actions
        self.fleet = fleet if fleet is not None else FleetFaults()
        #: Per job: (when, the failures and save times it was computed from, the advice).
        self._advice: dict[str, tuple[float, int, float | None, Advice | None]] = {}

    def advice(self, j: JobRecord) -> Advice | None:
        """The interval the job's history recommends (advisor.py), None while unknown.

        Computed again when the job fails or its save time changes, else every
        ``ADVICE_REFRESH`` seconds: the estimate drifts with the job's age, and an
        interval that moved at every sweep would put off its own checkpoint.
        """
        now = self.clock.time()
        save = j.saves.median()
        cached = self._advice.get(j.name)
        if cached is not None and cached[1] == j.row.failures and cached[2] == save and (
                0 <= now - cached[0] < ADVICE_REFRESH):
            return cached[3]
        advice = advise(save, j.row.failures, now - j.row.created_at, len(j.row.nodes),
                        self.fleet.rate_per_node_second())
        self._advice[j.name] = (now, j.row.failures, save, advice)
        return advice

    def interval(self, j: JobRecord) -> float:
        """The job's checkpoint interval: the spec's, or the advisor's for ``auto``."""
        spec = j.job.spec
        if spec.auto_interval:
            advice = self.advice(j)
            if advice is not None:
                return advice.interval_seconds
        return spec.fixed_interval

    def current(self, j: JobRecord) -> CheckpointRequest | None:
        """The job's outstanding request, if any."""
        ask = j.book.request
        if ask is None:
            return None
        return CheckpointRequest(job=j.name, checkpoint_id=ask.id, reason=ask.reason,
                                 requested_at=ask.at, after_step=ask.after_step,
                                 action_id=ask.action_id)

    def request(self, j: JobRecord, reason: str, *, key: str | None = None,
                incident_id: int | None = None, rule: str | None = None) -> CheckpointAsk:
        """Ask the job for a checkpoint now: saved first, then submitted."""
        now = self.clock.time()
        seq = j.book.request_seq + 1
        checkpoint_id = f"{j.name}-{seq}"
        latest = j.catalogue.latest_complete()
        ask = CheckpointAsk(id=checkpoint_id, reason=reason, at=now,
                            after_step=latest.step if latest is not None else -1,
                            key=key or f"job:{j.name}:checkpoint:{checkpoint_id}",
                            incident_id=incident_id, rule=rule)
        j.book = msgspec.structs.replace(j.book, request=ask, request_seq=seq,
                                         last_request_at=now)
        self.registry.save(j)  # the request first: a crash now resubmits it (same key)
        self.submit_pending(j)
        log.info("job %s: %s checkpoint requested (%s)", j.name, reason, checkpoint_id)
        assert j.book.request is not None
        return j.book.request

    def submit_pending(self, j: JobRecord) -> None:
        """Submit a saved request that has no action yet (one saved just before a crash)."""
        ask = j.book.request
        if ask is None or ask.action_id is not None:
            return
        record = self.actions.submit(ActionRequest(
            id=uuid.uuid4().hex, key=ask.key, action="checkpoint", node=None,
            reason=f"{ask.reason} checkpoint of job {j.name}", rule=ask.rule,
            incident_id=ask.incident_id, severity="info", labels={"job": j.name},
            params={"job": j.name, "checkpoint_id": ask.id, "reason": ask.reason},
            requested_by=REQUESTER, created_seconds=self.clock.time()))
        j.book = msgspec.structs.replace(
            j.book, request=msgspec.structs.replace(ask, action_id=record.id))
        self.registry.save(j)

    def found(self, j: JobRecord, checkpoint: Checkpoint) -> None:
        """A complete checkpoint: the job's latest, and the end of a request it satisfies."""
        last = j.book.last_checkpoint
        if last is not None and last.step >= checkpoint.step:
            return
        now = self.clock.time()
        written = checkpoint.written_at if checkpoint.written_at is not None else \
            checkpoint.found_at
        ask = j.book.request
        if ask is not None and checkpoint.step > ask.after_step:
            log.info("job %s: checkpoint request %s satisfied by step %d", j.name, ask.id,
                     checkpoint.step)
            ask = None
        j.book = msgspec.structs.replace(
            j.book, last_checkpoint=CheckpointRef(step=checkpoint.step,
                                                  path=str(checkpoint.path)),
            last_checkpoint_at=min(now, written), request=ask)
        self.registry.save(j)

    def scheduled(self, j: JobRecord) -> None:
        """Request the ``checkpointInterval`` checkpoint when it is due."""
        if j.progress.frontier is None:
            return  # the job has not started
        interval = self.interval(j)
        asked, done = j.book.last_request_at, j.book.last_checkpoint_at
        if asked is not None and done is not None and asked <= done <= asked + interval:
            # The latest checkpoint answered the latest request: the interval runs from
            # when it was asked for (the checkpoint's start), not from when its upload
            # ended, or every period would be longer by the upload (Young/Daly's period
            # is from one checkpoint's start to the next).
            since = asked
        else:  # nothing asked yet, not answered, or the job saved later on its own
            since = max(asked or j.row.created_at, done if done is not None else -math.inf)
        if self.clock.time() - since >= interval:
            self.request(j, "scheduled")

    def preemptive(self, j: JobRecord, rule: str,
                   incident_id: int | None) -> CheckpointRequest | None:
        """A node of the job degrades: checkpoint now, unless one was asked for lately."""
        last = j.book.last_request_at
        if last is not None and (self.clock.time() - last
                                 < self.settings.preemptive_min_interval):
            return self.current(j)
        key = (f"job:{j.name}:checkpoint:incident:{incident_id}"
               if incident_id is not None else None)
        self.request(j, "pre-emptive", key=key, incident_id=incident_id, rule=rule)
        return self.current(j)
