"""What the API and the metrics read of a job: its status and its metric values.

Functions of a job's record and the time; the facade calls them under its lock.

A job no rank has reported a step of yet (its frontier unknown: the ranks are still
being scheduled, or were never started) is ``pending``, whatever its row says, and has
no ETTR: a 0 would read as a job that trains badly, and raise its alert.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import cast

from sn_monitor import ettr
from sn_monitor.controller.jobs.advisor import Advice
from sn_monitor.controller.jobs.registry import JobRecord
from sn_monitor.controller.jobs.views import CheckpointRequest, JobMetric, JobState, JobStatus


def started(j: JobRecord) -> bool:
    """A rank of the job has reported a step (in any generation)."""
    return j.progress.frontier is not None


def job_state(j: JobRecord) -> tuple[JobState, str]:
    """The job's state and its reason: ``pending`` while it runs and has not started."""
    if j.row.state == "running" and not started(j):
        return "pending", f"waiting for ranks {len(j.progress.ranks)}/{j.job.spec.replicas}"
    return cast(JobState, j.row.state), j.row.state_reason


def effective_training_ratio(j: JobRecord, now: float) -> float | None:
    """The job's ETTR (:mod:`sn_monitor.ettr`): productive seconds over those since it started.

    None before the job started. A job kept from before the start was recorded counts
    from when it was added.
    """
    if not started(j):
        return None
    ledger = j.progress.ledger
    since = ledger.started if ledger.started is not None else j.row.created_at
    return ettr.effective_training_ratio(ledger.productive, now - since)


def job_status(j: JobRecord, now: float, *, recovery: str | None,
               request: CheckpointRequest | None, interval: float,
               advice: Advice | None) -> JobStatus:
    """The job as ``GET /api/v1/jobs/NAME`` shows it."""
    latest = j.catalogue.latest_complete()
    spec = j.job.spec
    state, reason = job_state(j)
    return JobStatus(
        name=j.name, source=j.row.source, state=state, state_reason=reason,
        generation=j.row.generation,
        failures=j.row.failures, max_failures=spec.max_failures,
        strategy=spec.recovery_strategy, replicas=spec.replicas,
        min_replicas=spec.min_replicas, nodes=j.row.nodes, spares=j.row.pool,
        failed_nodes=j.row.excluded,
        checkpoint=None if latest is None else {"step": latest.step, "path": str(latest.path)},
        checkpoint_request=request, recovery=recovery,
        world_size=j.progress.world_size, ranks_reporting=len(j.progress.ranks),
        last_step=j.progress.last_step(), median_step_seconds=j.progress.median_step_time(),
        recent_step_seconds=j.progress.recent_step_time(),
        effective_training_ratio=effective_training_ratio(j, now),
        checkpoint_interval_seconds=interval,
        checkpoint_interval_recommended_seconds=(
            advice.interval_seconds if advice is not None else None),
        checkpoint_save_seconds=j.saves.median(),
        mtbf_seconds=advice.mtbf_seconds if advice is not None else None,
        created_at=j.row.created_at, updated_at=j.row.updated_at, spec=j.row.spec)


def job_metrics(records: Iterable[JobRecord], now: float,
                advice_of: Callable[[JobRecord], Advice | None]) -> dict[str, JobMetric]:
    """Per job: state, generation, failures, checkpoint age, ETTR, nodes, progress."""
    return {
        j.name: JobMetric(
            checkpoint_interval_recommended_seconds=(
                advice.interval_seconds if (advice := advice_of(j)) is not None else None),
            state=job_state(j)[0],
            generation=j.row.generation, failures_total=j.row.failures,
            checkpoint_age_seconds=j.catalogue.age_seconds(),
            effective_training_ratio=effective_training_ratio(j, now),
            productive_seconds=j.progress.ledger.productive, nodes=len(j.row.nodes),
            spares=len(j.row.pool), median_step_seconds=j.progress.median_step_time(),
            last_step=j.progress.last_step())
        for j in records}
