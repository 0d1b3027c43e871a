"""The one place the agent runs ``scontrol``: an argument list, never a shell, and a timeout.

It runs through :func:`sn_monitor.program.run_program`, as the controller's Slurm drivers
and ``sn-monitor slurm-health`` do (a timed-out ``scontrol`` has its process group
killed). ``scontrol`` finds slurmctld as any client does (``SLURM_CONF``, or
``/etc/slurm/slurm.conf``). Every failure is :class:`SourceUnavailable` (``slurm``): a
slurmctld that does not answer costs the agent this source, never the sample; a job
Slurm no longer knows is an answer (None), not a failure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from sn_monitor.agent.workloads.model import SourceUnavailable
from sn_monitor.program import Finished, ProgramTimeout, run_program

SOURCE = "slurm"
#: Seconds one ``scontrol`` may take; a busy slurmctld answers in well under one.
DEFAULT_TIMEOUT_SECONDS = 5.0
#: ``scontrol show job <id>`` of a job slurmctld has purged (older than ``MinJobAge``).
_UNKNOWN_JOB = re.compile(r"Invalid job id specified")


class ProgramRunner(Protocol):
    """How a program is run: :func:`sn_monitor.program.run_program`, or a test's stand-in."""

    def __call__(self, argv: Sequence[str], *, timeout: float) -> Finished:
        """Run ``argv`` to its end or its timeout."""
        ...


class Scontrol:
    """``scontrol show job``, one line per job (``-o``).

    ``program``: a name on ``PATH`` or a path; ``timeout``: seconds per call.
    """

    def __init__(self, program: str = "scontrol", timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 run: ProgramRunner = run_program) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self._program = program
        self._timeout = float(timeout)
        self._run = run

    def show_job(self, job_id: str) -> str | None:
        """``scontrol show job -o <id>``; None when Slurm does not know the job."""
        if not job_id.isdigit():
            raise ValueError(f"not a Slurm job id: {job_id!r}")
        finished = self._call("show", "job", "-o", job_id, allow=_UNKNOWN_JOB)
        return None if finished.returncode != 0 else finished.stdout

    def show_jobs_detail(self) -> str:
        """``scontrol show job -d -o``: every job, with its nodes' GRES indices."""
        return self._call("show", "job", "-d", "-o").stdout

    def _call(self, *args: str, allow: re.Pattern[str] | None = None) -> Finished:
        argv = [self._program, *args]
        what = " ".join(argv)
        try:
            finished = self._run(argv, timeout=self._timeout)
        except ProgramTimeout:
            raise SourceUnavailable(SOURCE, f"{what} ran past {self._timeout:g}s") from None
        except OSError as exc:
            raise SourceUnavailable(SOURCE, f"cannot run {self._program}: {exc}") from None
        if finished.returncode != 0 and not (allow and allow.search(finished.tail())):
            raise SourceUnavailable(SOURCE, f"{what} exited {finished.returncode}: "
                                            f"{finished.tail()}")
        return finished
