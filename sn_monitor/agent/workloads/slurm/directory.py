"""A Slurm job id -> its user, partition and name, asked of slurmctld once per job.

The cgroup names a process's job but not its owner; when the process's environment
cannot say either (another user's, without the privilege to read it), the agent asks
``squeue --jobs=<id>``. A job's user, partition and name do not change while it
runs, so an answer is kept for ``ttl`` seconds; a failure (slurmctld down or slow) is
kept for ``retry_after`` seconds, so that an outage costs one ``squeue`` per job per
``retry_after``, not one per sample; a job Slurm does not know is asked about again
after ``retry_after`` too. Failures are logged once per outage and never
raised: the process keeps its job id, without the fields Slurm could not give.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from sn_monitor.agent.workloads.model import SourceUnavailable
from sn_monitor.agent.workloads.slurm.commands import SlurmCommands
from sn_monitor.agent.workloads.slurm.processes import ProcessJob
from sn_monitor.agent.workloads.slurm.records import JobRecord, parse_queue
from sn_monitor.clock import Clock

logger = logging.getLogger(__name__)

#: Seconds an answer is kept (a running job's user, partition and name are fixed).
DEFAULT_TTL_SECONDS = 300.0
#: Seconds before a job whose lookup failed is asked about again.
DEFAULT_RETRY_SECONDS = 30.0
#: Jobs remembered at most; the oldest answers go first (a node runs a few jobs at once).
MAX_JOBS = 256


@dataclass(frozen=True, slots=True)
class _Entry:
    record: JobRecord | None
    until: float


class JobDirectory:
    """Job id -> :class:`JobRecord` through ``squeue``, cached on ``clock``'s monotonic time."""

    def __init__(self, commands: SlurmCommands, clock: Clock, *,
                 ttl: float = DEFAULT_TTL_SECONDS,
                 retry_after: float = DEFAULT_RETRY_SECONDS) -> None:
        if ttl <= 0 or retry_after <= 0:
            raise ValueError("ttl and retry_after must be > 0")
        self._commands = commands
        self._clock = clock
        self._ttl = float(ttl)
        self._retry_after = float(retry_after)
        self._entries: dict[str, _Entry] = {}
        self._failing = False

    def lookup(self, job_id: str) -> JobRecord | None:
        """The job's record; None when Slurm does not know it or cannot answer now."""
        if not job_id.isdigit():
            return None
        now = self._clock.monotonic()
        entry = self._entries.get(job_id)
        if entry is not None and now < entry.until:
            return entry.record
        try:
            text = self._commands.job(job_id)
        except SourceUnavailable as exc:
            if not self._failing:
                logger.warning("cannot ask Slurm about job %s (%s): its user and partition "
                               "stay unknown; retrying every %gs", job_id, exc.why,
                               self._retry_after)
            self._failing = True
            self._remember(job_id, _Entry(None, now + self._retry_after))
            return None
        if self._failing:
            logger.info("Slurm answers again")
            self._failing = False
        records = parse_queue(text)
        record = next((r for r in records if r.job_id == job_id), None)
        self._remember(job_id, _Entry(record, now + (self._ttl if record else self._retry_after)))
        return record

    def complete(self, job: ProcessJob) -> ProcessJob:
        """``job`` with the user, partition and name Slurm has where its process did not say."""
        if job.user and job.partition and job.name:
            return job
        record = self.lookup(job.job_id)
        if record is None:
            return job
        return replace(job, user=job.user or record.user,
                       partition=job.partition or record.partition,
                       name=job.name or record.name)

    def _remember(self, job_id: str, entry: _Entry) -> None:
        self._entries.pop(job_id, None)
        self._entries[job_id] = entry
        while len(self._entries) > MAX_JOBS:
            del self._entries[next(iter(self._entries))]
