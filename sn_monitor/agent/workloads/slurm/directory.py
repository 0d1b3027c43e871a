"""A Slurm job id -> its user, partition and name, asked of slurmctld once per job.

A cgroup names a process's job, not the job's user, partition and name; a process's
environment names them, but it is whatever the process's owner set. So they are
Slurm's (``squeue --jobs=<id>``), the environment's only while Slurm cannot answer, and
a process that claims by its environment alone a job of another user is not that job's:
a forged ``SLURM_JOB_ID`` cannot put one user's GPU time on another's job (root's
processes are believed: root owns the node anyway).

The ``slurm`` allocation source's refresh hands over every job running on the node
(:meth:`JobDirectory.learn`), so a lookup asks Slurm only for a job that started since
the last refresh. A running job's user, partition and name do not change, so an answer is kept for
``ttl`` seconds. A failure (slurmctld down or slow), and a job Slurm does not know, is
kept for ``retry_after`` seconds, so that an outage costs one ``squeue`` per job per
``retry_after``, not one per sample. Failures are logged once per outage and never
raised: the process keeps its job id and what its environment said.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from sn_monitor.agent.workloads.model import SourceUnavailable, Workload
from sn_monitor.agent.workloads.slurm.commands import SlurmCommands
from sn_monitor.agent.workloads.slurm.processes import ProcessJob, job_of_process
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
    """Job id -> :class:`JobRecord` through ``squeue``, cached on ``clock``'s monotonic time.

    Safe to share between the sampling thread (lookups) and the Slurm source's (learning).
    """

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
        self._lock = threading.Lock()
        self._failing = False

    def learn(self, records: Iterable[JobRecord]) -> None:
        """Keep ``records`` (Slurm's own answer, from a listing of the node's jobs)."""
        until = self._clock.monotonic() + self._ttl
        for record in records:
            self._remember(record.job_id, _Entry(record, until))

    def lookup(self, job_id: str) -> JobRecord | None:
        """The job's record; None when Slurm does not know it or cannot answer now."""
        if not job_id.isdigit():
            return None
        now = self._clock.monotonic()
        with self._lock:
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

    def complete(self, job: ProcessJob) -> ProcessJob | None:
        """``job`` with Slurm's user, partition and name (its own where Slurm has none).

        None when its environment claims another user's job (see the module).
        """
        record = self.lookup(job.job_id)
        if record is None:
            return job
        if job.found_in == "environ" and _foreign(job.uid, record.uid):
            logger.debug("a process of uid %s claims job %s of uid %s by its environment: "
                         "not that job's", job.uid, job.job_id, record.uid)
            return None
        return replace(job, user=record.user or job.user,
                       partition=record.partition or job.partition,
                       name=record.name or job.name)

    def _remember(self, job_id: str, entry: _Entry) -> None:
        with self._lock:
            self._entries.pop(job_id, None)
            self._entries[job_id] = entry
            while len(self._entries) > MAX_JOBS:
                del self._entries[next(iter(self._entries))]


def _foreign(process_uid: int | None, job_uid: int | None) -> bool:
    """A process that is neither root nor the job's owner (either unknown: believed)."""
    return None not in (process_uid, job_uid) and process_uid not in (0, job_uid)


class SlurmProcessJobs:
    """The Slurm job of a GPU process, as the agent's process identities ask it.

    Its cgroup, else its environment, names the job (:func:`job_of_process`); Slurm's
    own answer (:class:`JobDirectory`, cached) gives the user, partition and name, and
    a claim Slurm does not vouch for is no job. Called once per (pid, start time).
    """

    def __init__(self, procfs: Path, directory: JobDirectory) -> None:
        self._procfs = procfs
        self._directory = directory

    def __call__(self, pid: int) -> Workload | None:
        job = job_of_process(self._procfs, pid)
        if job is None:
            return None
        done = self._directory.complete(job)
        return done.workload() if done is not None else None
