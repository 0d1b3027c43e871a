"""Run a configured program for an action: the escape hatch for any outside system.

The program runs without a shell, in its own process group, with the request in its
environment::

    SN_ACTION       cordon | evict | checkpoint | restore | failover | ...
    SN_NODE         node name ("" when none)
    SN_GPU          GPU index ("" when none)
    SN_RULE         rule name ("" when none)
    SN_SEVERITY     critical | warning | ...
    SN_REASON       one line of text
    SN_ACTION_ID    the action id: the same on every retry (for idempotence)
    SN_INCIDENT_ID  incident number ("" when none)
    SN_PARAMS       JSON object (status, power_fraction, checkpoint, nodes, ...)

Idempotence by action id. A controller that crashes while the program runs cannot know
whether it finished; after the restart it runs the program again with the same
``SN_ACTION_ID`` (never under a new id). The program must therefore take an id it has
already carried out as done: exit 0 without doing it again (the demo's launcher,
``sn_monitor/sim/launcher.py``, keeps the ids it ran in its state file).

Exit status: 0 is success (the first line of stdout becomes the outcome's message);
75 (``EX_TEMPFAIL`` from sysexits.h) asks for a retry; anything else is a permanent
failure, reported with the end of stderr. A program killed by a signal (the OOM killer,
an operator) is treated as temporary. On timeout the whole process group is killed, so
children the program started do not outlive it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from sn_monitor.config import Duration, positive, setting
from sn_monitor.controller.actions.base import Outcome, PermanentError, TemporaryError
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.program import TAIL_CHARS, run_program
from sn_monitor.program import ProgramTimeout as Timeout

EX_TEMPFAIL = 75


def _program(value: list[str]) -> None:
    if not value or not value[0]:
        raise ValueError("name the program to run, e.g. [/usr/local/bin/drain-node]")


@dataclass(frozen=True)
class CommandSettings:
    """The program (argv list, no shell), its timeout and extra environment.

    ``inherit_environment`` passes the controller's own environment on (PATH, proxies);
    switch it off to give the program only ``env`` and the SN_ variables.
    """

    program: list[str] = setting(check=_program)
    timeout: Duration = setting(default=Duration(60.0), check=positive)
    env: dict[str, str] = field(default_factory=dict)
    inherit_environment: bool = True


def request_environment(request: ActionRequest) -> dict[str, str]:
    """The SN_ variables for ``request`` (see the module docstring)."""
    def text(value: object) -> str:
        return "" if value is None else str(value)

    return {
        "SN_ACTION": request.action,
        "SN_NODE": text(request.node),
        "SN_GPU": text(request.gpu),
        "SN_RULE": text(request.rule),
        "SN_SEVERITY": request.severity,
        "SN_REASON": " ".join(request.reason.split()),
        "SN_ACTION_ID": request.id,
        "SN_INCIDENT_ID": text(request.incident_id),
        "SN_PARAMS": json.dumps(dict(request.params), sort_keys=True, default=str),
    }


def _tail(text: str) -> str:
    return " ".join(text.split())[-TAIL_CHARS:]


class CommandDriver:
    """Runs one configured program for any action it is routed."""

    name = "command"
    #: Unknown: it depends on the program. SN_ACTION_ID lets a program make itself so.
    #: By contract: a repeated SN_ACTION_ID is taken as done (see the module docstring).
    idempotent = True

    def __init__(self, settings: CommandSettings) -> None:
        self.settings = settings

    def run(self, request: ActionRequest) -> Outcome:
        """Run the program; map its exit status to an outcome or an error."""
        env = dict(os.environ) if self.settings.inherit_environment else {}
        env.update(self.settings.env)
        env.update(request_environment(request))
        program = self.settings.program[0]
        try:
            done = run_program(self.settings.program, timeout=self.settings.timeout, env=env)
        except Timeout as err:
            raise TemporaryError(str(err)) from None
        except OSError as err:
            raise PermanentError(f"cannot run {program}: {err.strerror}") from None
        if done.returncode == 0:
            first = next((line.strip() for line in done.stdout.splitlines() if line.strip()),
                         f"{program} succeeded")
            return Outcome(first[:TAIL_CHARS], {"exit_code": 0})
        stderr = _tail(done.stderr) or _tail(done.stdout) or "(no output)"
        if done.returncode == EX_TEMPFAIL:
            raise TemporaryError(f"{program} exited 75 (temporary failure): {stderr}")
        if done.returncode < 0:
            raise TemporaryError(f"{program} killed by signal {-done.returncode}: {stderr}")
        raise PermanentError(f"{program} exited {done.returncode}: {stderr}")

    def reconcile(self, request: ActionRequest) -> bool | None:
        """A program cannot be asked whether it already ran: unknown (it is run again)."""
        return None
