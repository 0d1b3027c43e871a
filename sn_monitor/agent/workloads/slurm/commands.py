"""The one place the agent runs Slurm's commands: argument lists, never a shell, a timeout.

``squeue`` (which jobs, whose) and ``scontrol show job -d -o`` (a job's GPUs per node)
run through :func:`sn_monitor.program.run_program`, as the controller's Slurm drivers
and ``sn-monitor slurm-health`` do (a timed-out command has its process group killed).
They find slurmctld as any client does (``SLURM_CONF``, or ``/etc/slurm/slurm.conf``).
Every failure is :class:`SourceUnavailable` (``slurm``): a slurmctld that does not
answer costs the agent this source, never the sample. A job Slurm no longer knows is an
answer (None), not a failure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from sn_monitor.agent.workloads.model import SourceUnavailable
from sn_monitor.agent.workloads.slurm.records import HOLDING_STATES, QUEUE_FORMAT
from sn_monitor.program import Finished, ProgramTimeout, run_program

SOURCE = "slurm"
#: Seconds one command may take; a busy slurmctld answers in well under one.
DEFAULT_TIMEOUT_SECONDS = 5.0
#: A job slurmctld has purged (older than ``MinJobAge``), from squeue and scontrol.
_UNKNOWN_JOB = re.compile(r"Invalid job id specified")


class ProgramRunner(Protocol):
    """How a program is run: :func:`sn_monitor.program.run_program`, or a test's stand-in."""

    def __call__(self, argv: Sequence[str], *, timeout: float) -> Finished:
        """Run ``argv`` to its end or its timeout."""
        ...


class SlurmCommands:
    """``squeue`` and ``scontrol`` (names on ``PATH`` or paths), ``timeout`` seconds each."""

    def __init__(self, *, scontrol: str = "scontrol", squeue: str = "squeue",
                 timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 run: ProgramRunner = run_program) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self._scontrol = scontrol
        self._squeue = squeue
        self._timeout = float(timeout)
        self._run = run

    def jobs_on(self, node: str) -> str:
        """``squeue`` of the jobs holding an allocation on ``node``."""
        return self._call(self._squeue, "--noheader", "--all", f"--nodelist={node}",
                          f"--states={','.join(HOLDING_STATES)}",
                          f"--format={QUEUE_FORMAT}").stdout

    def job(self, job_id: str) -> str:
        """``squeue`` of one job, in any state; empty when Slurm does not know it."""
        return self._call(self._squeue, "--noheader", "--all", "--states=all",
                          f"--jobs={_job_id(job_id)}", f"--format={QUEUE_FORMAT}",
                          unknown_is_empty=True).stdout

    def job_detail(self, job_id: str) -> str:
        """``scontrol show job -d -o <id>``; empty when Slurm does not know the job."""
        return self._call(self._scontrol, "show", "job", "-d", "-o", _job_id(job_id),
                          unknown_is_empty=True).stdout

    def _call(self, program: str, *args: str, unknown_is_empty: bool = False) -> Finished:
        argv = [program, *args]
        what = " ".join(argv)
        try:
            finished = self._run(argv, timeout=self._timeout)
        except ProgramTimeout:
            raise SourceUnavailable(SOURCE, f"{what} ran past {self._timeout:g}s") from None
        except OSError as exc:
            raise SourceUnavailable(SOURCE, f"cannot run {program}: {exc}") from None
        if finished.returncode == 0:
            return finished
        if unknown_is_empty and _UNKNOWN_JOB.search(finished.tail()):
            return Finished(0, "", "")
        raise SourceUnavailable(SOURCE, f"{what} exited {finished.returncode}: "
                                        f"{finished.tail()}")


def _job_id(job_id: str) -> str:
    if not job_id.isdigit():
        raise ValueError(f"not a Slurm job id: {job_id!r}")
    return job_id
