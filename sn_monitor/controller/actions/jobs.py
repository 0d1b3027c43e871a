"""Job control: checkpoint / restore / failover, handed to the job's launcher.

Which launcher runs a training job differs per site, so this driver only delegates:
to a webhook (the action and its params — ``job``, ``checkpoint``, ``nodes`` — are in
the signed JSON body, see :mod:`.webhook`) or to a program (SN_ACTION and SN_PARAMS in
its environment, see :mod:`.command`). Exactly one of the two is configured. The job
orchestration (which checkpoint, which spare nodes) decides the params; this driver
does not.
"""

from __future__ import annotations

from sn_monitor.controller.actions.base import ActionRequest, Outcome, PermanentError
from sn_monitor.controller.actions.command import CommandDriver
from sn_monitor.controller.actions.webhook import WebhookDriver


class JobControlDriver:
    """checkpoint / restore / failover through a webhook or a command."""

    name = "job"
    actions = frozenset({"checkpoint", "restore", "failover"})

    def __init__(self, webhook: WebhookDriver | None = None,
                 command: CommandDriver | None = None) -> None:
        target: WebhookDriver | CommandDriver | None = webhook if webhook is not None else command
        if target is None or (webhook is not None and command is not None):
            raise ValueError("job control needs exactly one of a webhook or a command")
        self._target = target
        self.idempotent = bool(self._target.idempotent)

    def run(self, request: ActionRequest) -> Outcome:
        """Pass the action on to the configured webhook or command."""
        if request.action not in self.actions:
            raise PermanentError(f"the job driver cannot {request.action}")
        outcome = self._target.run(request)
        return Outcome(f"{request.action}: {outcome.message}",
                       {**outcome.details, "via": self._target.name})

    def reconcile(self, request: ActionRequest) -> bool | None:
        """Whatever the target can tell (a webhook or a program: unknown)."""
        return self._target.reconcile(request)
