"""Job control through Slurm: ``scontrol requeue`` the job's batch job.

A DistributedJob that runs as a Slurm batch job names it by id or by name::

    control:
      slurm: {jobId: "4242"}                 # or: {jobName: trillion, user: ml}
      # scontrol: /usr/bin/scontrol, squeue: /usr/bin/squeue, timeout: 10s

* **restore** and **failover**: ``scontrol requeue <id>``. Slurm kills the running job
  and puts it back in the queue; when it starts again Slurm picks its nodes, and the
  failed node is not among them (the orchestrator has drained it: the slurm driver's
  evict). The batch script restarts from its beginning; the ranks learn which
  checkpoint to load from the controller (the training client's progress replies carry
  it), as Slurm cannot pass it on. A job that is already pending (requeued by a previous
  attempt, or by Slurm itself after a node failure) is success: nothing to do. With
  ``jobName``, ``squeue --name`` (and ``--user`` when set) finds the job's ids; every
  running one is requeued, none in the queue at all is a permanent error.
* **checkpoint**: nothing to do. Slurm has no way to ask a running job to checkpoint
  (a signal would need the job's cooperation, and the ranks already get the request
  from the training client's ``should_checkpoint()``, the primary path). The action
  succeeds with that message, so the audit trail says what happened and no alert fires.

``scontrol`` and ``squeue`` run with an argument list (never a shell) and a timeout. A
timeout or an unexpected failure (slurmctld busy or restarting: "Unable to contact slurm
controller", "Unexpected message received") is temporary; an invalid job id (a job
slurmctld has forgotten, after ``MinJobAge``), a job that may not be requeued
(``--no-requeue``: "Requested operation is presently disabled", not a batch job) and
permission errors are permanent.

What a real slurmctld (22.05; tests/integration/test_slurm_real.py) does: right after a
requeue the job is ``COMPLETING`` (its processes are being killed; a second requeue then
already answers "Job is pending execution"), then ``PENDING`` with ``Restarts`` counted
up and a ``BeginTime`` ``cred_expire`` ahead (``AuthInfo``, 120 s by default: until then
slurmd refuses the job's revoked credential); a finished job slurmctld still remembers
(``COMPLETED``, ``FAILED``) is requeued like a running one and runs again.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from sn_monitor.config import Duration, positive, setting
from sn_monitor.controller.actions.base import Outcome, PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.slurm import run_slurm_tool
from sn_monitor.controller.audit import ActionRequest

log = logging.getLogger(__name__)

#: A job id, or one task of a job array (``1234_7``).
_JOB_ID = re.compile(r"[0-9]+(_[0-9]+)?")
_JOB_NAME = re.compile(r"[^\s,]+")
_USER = re.compile(r"[A-Za-z0-9_.][-A-Za-z0-9_.$]*")
#: stderr phrases that retrying cannot fix.
_PERMANENT = re.compile(
    r"Invalid job id|already completing or completed|Access/permission denied|"
    r"Invalid user|presently disabled|Only batch jobs|not supported|"
    r"Requeue of a job array|Invalid argument", re.IGNORECASE)
#: The job is not running but waiting: requeued already.
_PENDING = re.compile(r"Job is pending execution", re.IGNORECASE)
_STATE = re.compile(r"(?:^|\s)JobState=(\S+)")
#: Job states in which the job waits in the queue to start (again).
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


def _job_id(value: str | None) -> None:
    if value is not None and not _JOB_ID.fullmatch(value):
        raise ValueError(f"expected a Slurm job id such as '4242' or '4242_7', got {value!r}")


def _job_name(value: str | None) -> None:
    if value is not None and not _JOB_NAME.fullmatch(value):
        raise ValueError(f"expected a Slurm job name without spaces or commas, got {value!r}")


def _user(value: str | None) -> None:
    if value is not None and not _USER.fullmatch(value):
        raise ValueError(f"expected a user name, got {value!r}")


def _program(value: str) -> None:
    if not value:
        raise ValueError("name the program (a name on PATH or a path)")


@dataclass(frozen=True)
class SlurmJobSettings:
    """A job's Slurm batch job (``spec.control.slurm`` of a DistributedJob)."""

    job_id: str | None = setting(key="jobId", default=None, check=_job_id)
    job_name: str | None = setting(key="jobName", default=None, check=_job_name)
    #: With ``jobName``: only this user's jobs (names are not unique on a shared cluster).
    user: str | None = setting(default=None, check=_user)
    scontrol: str = setting(default="scontrol", check=_program)
    squeue: str = setting(default="squeue", check=_program)
    timeout: Duration = setting(default=Duration(10.0), check=positive)

    def __post_init__(self) -> None:
        if (self.job_id is None) == (self.job_name is None):
            raise ValueError("give exactly one of jobId and jobName")
        if self.user is not None and self.job_name is None:
            raise ValueError("user only narrows a jobName lookup: drop it, or use jobName")


class SlurmJobControl:
    """checkpoint / restore / failover for one Slurm batch job (see the module docstring)."""

    name = "slurm"
    #: A second requeue of a requeued (pending) job does nothing; but one that reaches
    #: the job after it started again restarts it, so a lost reply is not blindly retried.
    idempotent = False
    actions = frozenset({"checkpoint", "restore", "failover"})

    def __init__(self, settings: SlurmJobSettings) -> None:
        self.settings = settings

    def run(self, request: ActionRequest) -> Outcome:
        if request.action == "checkpoint":
            return Outcome("nothing to do: Slurm cannot ask a running job to checkpoint; "
                           "the training client's should_checkpoint() asks the ranks",
                           {"changed": False, "supported": False})
        if request.action not in ("restore", "failover"):
            raise PermanentError(f"slurm job control cannot {request.action}")
        jobs = self._jobs()
        requeued: list[str] = []
        waiting: list[str] = []
        for job_id, state in jobs:
            if state is not None and state in WAITING_STATES:
                waiting.append(job_id)
                continue
            if self._requeue(job_id):
                requeued.append(job_id)
            else:
                waiting.append(job_id)
        details = {"requeued": requeued, "pending": waiting, "changed": bool(requeued)}
        if not requeued:
            return Outcome(f"Slurm job {', '.join(waiting)} is already waiting in the queue",
                           details)
        return Outcome(f"requeued Slurm job {', '.join(requeued)}; Slurm restarts it on "
                       "healthy nodes", details)

    def reconcile(self, request: ActionRequest) -> bool | None:
        """Done when the job waits in the queue (restore / failover); else unknown.

        A running job may be one that was requeued and started again, or one that never
        was: that cannot be told apart, so the answer is None.
        """
        if request.action == "checkpoint":
            return True
        try:
            states = [state if state is not None else self._state(job_id)
                      for job_id, state in self._jobs()]
        except (TemporaryError, PermanentError) as err:
            log.warning("slurm job control: cannot reconcile %s: %s", request.action, err)
            return None
        if states and all(s is not None and s in WAITING_STATES for s in states):
            return True
        return None

    # ------------------------------------------------------------------ helpers

    def _jobs(self) -> list[tuple[str, str | None]]:
        """(job id, state) of the job: by id (state unknown) or by name (from squeue)."""
        if self.settings.job_id is not None:
            return [(self.settings.job_id, None)]
        assert self.settings.job_name is not None
        argv = [self.settings.squeue, "--noheader", "--format=%i %T",
                f"--name={self.settings.job_name}"]
        if self.settings.user is not None:
            argv.append(f"--user={self.settings.user}")
        out: list[tuple[str, str | None]] = []
        for line in self._run(argv, "squeue").splitlines():
            parts = line.split()
            if len(parts) >= 2 and _JOB_ID.fullmatch(parts[0]):
                out.append((parts[0], parts[1].upper()))
        if not out:
            who = f" of user {self.settings.user}" if self.settings.user else ""
            raise PermanentError(f"no Slurm job named {self.settings.job_name!r}{who} in the "
                                 "queue")
        return out

    def _state(self, job_id: str) -> str | None:
        """``JobState`` from ``scontrol show job``, or None when it has none."""
        found = _STATE.search(self._run([self.settings.scontrol, "show", "job", job_id],
                                        f"scontrol show job {job_id}"))
        return found.group(1).upper() if found else None

    def _requeue(self, job_id: str) -> bool:
        """``scontrol requeue``; False when Slurm says the job is pending already."""
        try:
            self._run([self.settings.scontrol, "requeue", job_id], f"scontrol requeue {job_id}")
        except _Pending:
            return False
        return True

    def _run(self, argv: list[str], what: str) -> str:
        def pending(stderr: str) -> None:
            if argv[1:2] == ["requeue"] and _PENDING.search(stderr):
                raise _Pending(stderr)

        return run_slurm_tool(argv, what, self.settings.timeout, _PERMANENT, pending)


class _Pending(Exception):
    """scontrol requeue of a job that is pending already."""


__all__ = ["SlurmJobControl", "SlurmJobSettings"]
