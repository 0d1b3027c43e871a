"""Run an outside program with a real timeout.

The agent's reset, reboot and checks, and the controller's command and Slurm drivers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sn_monitor.errors import SnMonitorError

#: How much of stderr/stdout a message quotes.
TAIL_CHARS = 500
#: After killing a timed-out group, how long to wait for its pipes to close.
KILL_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class Finished:
    """A program that ran to its end (not one that timed out)."""

    returncode: int
    stdout: str
    stderr: str

    def tail(self) -> str:
        """The end of stderr (else of stdout) on one line, for a message."""
        return tail(self.stderr) or tail(self.stdout) or "(no output)"


class ProgramTimeout(SnMonitorError):
    """The program ran past its timeout; its process group was killed."""


def tail(text: str, chars: int = TAIL_CHARS) -> str:
    """The last ``chars`` characters of ``text`` with its whitespace folded to spaces."""
    return " ".join(text.split())[-chars:]


def run_program(argv: Sequence[str], *, timeout: float,
                env: Mapping[str, str] | None = None) -> Finished:
    """Run ``argv`` (no shell) in a new process group; on timeout kill the whole group.

    ``subprocess.run(timeout=...)`` kills only the direct child and then waits for the
    pipes, which a grandchild (a ``sleep`` in a shell script) keeps open: the group kill
    is what makes the timeout real. Raises :class:`ProgramTimeout`, or OSError when the
    program cannot be started (not found, not executable).
    """
    process = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, errors="replace", env=None if env is None else dict(env),
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        try:
            process.communicate(timeout=KILL_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()  # something left the group and holds our pipes: stop waiting
            process.wait()
        raise ProgramTimeout(f"{argv[0]} ran past {timeout:g}s; killed its process group") \
            from None
    finally:
        if process.returncode is None:  # an exception other than a timeout
            _kill_group(process)
            process.wait()
    return Finished(process.returncode, stdout, stderr)


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)
