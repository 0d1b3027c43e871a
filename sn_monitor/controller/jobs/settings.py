"""The jobs layer's settings (the controller's ``recovery:`` section) and its errors."""

from __future__ import annotations

from dataclasses import dataclass

from sn_monitor.config import Duration, non_negative, positive, setting
from sn_monitor.errors import SnMonitorError


class JobError(SnMonitorError):
    """A job request that cannot be done (the API answers 409)."""


class UnknownJob(JobError, KeyError):
    """No job by that name (the API answers 404)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown job"


class UnknownRecovery(JobError, KeyError):
    """No recovery by that id (the API answers 404)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown recovery"


@dataclass(frozen=True)
class JobSettings:
    """Timeouts and limits of job recovery (the controller's ``jobs:`` section)."""

    #: How long a recovery waits for a checkpoint before evicting a node still alive.
    checkpoint_wait: Duration = setting(default=Duration(120.0), check=non_negative)
    #: How long the evictions of a recovery may take, per wait (not while the breaker
    #: holds them or a person is asked to approve them).
    evict_timeout: Duration = setting(default=Duration(300.0), check=positive)
    #: How long after the restore is sent the new generation has to make progress.
    restore_timeout: Duration = setting(default=Duration(900.0), check=positive)
    #: Restore attempts after the first (each one a new launch: a new generation, a new
    #: action) and extra waits for evictions still running, before the recovery fails.
    #: An action itself is never submitted twice: its retries are the action runner's.
    step_retries: int = setting(default=2, check=non_negative)
    #: False: an eviction that failed for good is noted and the recovery goes on without
    #: the node (which leaves the job either way).
    require_eviction: bool = True
    #: A pre-emptive checkpoint is not requested again within this time of the last.
    preemptive_min_interval: Duration = setting(default=Duration(60.0), check=non_negative)
    #: How long after a job's first log finding its root cause is decided: time for the
    #: cascade's lines (every rank's timeouts, torchrun's summary) to come in from every
    #: agent (:mod:`sn_monitor.controller.jobs.triage`).
    failure_settle: Duration = setting(default=Duration(30.0), check=non_negative)
    #: How often a job's checkpoint directory is scanned (at most).
    scan_interval: Duration = setting(default=Duration(30.0), check=positive)
    #: How often a job's progress counters (ETTR) are saved.
    save_interval: Duration = setting(default=Duration(10.0), check=positive)
    #: ETTR: a gap between new steps counted whole while the step time is unknown.
    unknown_gap: Duration = setting(default=Duration(60.0), check=positive)
    max_ranks: int = setting(default=1 << 20, check=positive)
    #: Progress updates taken from one post (the latest ones).
    max_updates: int = setting(default=64, check=positive)
    #: Finished recoveries kept in memory for the duration histogram.
    finished_kept: int = setting(default=10_000, check=positive)
