"""Job control: checkpoint / restore / failover, handed to the job's launcher.

Which launcher runs a training job differs per site, so this driver only delegates, to
exactly one target:

* a webhook (the action and its params — ``job``, ``checkpoint``, ``nodes`` — are in
  the signed JSON body, see :mod:`.webhook`);
* a program (SN_ACTION and SN_PARAMS in its environment, see :mod:`.command`);
* Kubernetes (delete the job's pods on the failed nodes so that its operator recreates
  them; annotate them for a checkpoint, see :mod:`.k8s_jobs`);
* Slurm (``scontrol requeue`` the batch job, see :mod:`.slurm_jobs`).

The job orchestration (which checkpoint, which spare nodes) decides the params; this
driver does not.
"""

from __future__ import annotations

from typing import Any, Protocol

from sn_monitor.controller.actions.base import ActionRequest, Outcome, PermanentError


class JobControlTarget(Protocol):
    """What a job's launcher looks like to :class:`JobControlDriver`."""

    name: str

    def run(self, request: ActionRequest) -> Outcome: ...

    def reconcile(self, request: ActionRequest) -> bool | None: ...


class JobControlDriver:
    """checkpoint / restore / failover through a webhook, a command, Kubernetes or Slurm."""

    name = "job"
    actions = frozenset({"checkpoint", "restore", "failover"})

    def __init__(self, webhook: JobControlTarget | None = None,
                 command: JobControlTarget | None = None,
                 kubernetes: JobControlTarget | None = None,
                 slurm: JobControlTarget | None = None) -> None:
        given = [t for t in (webhook, command, kubernetes, slurm) if t is not None]
        if len(given) != 1:
            raise ValueError("job control needs exactly one of a webhook, a command, "
                             "kubernetes or slurm")
        self._target = given[0]
        self.idempotent = bool(getattr(self._target, "idempotent", False))

    @property
    def via(self) -> str:
        """The target's name: webhook, command, kubernetes or slurm."""
        return self._target.name

    def run(self, request: ActionRequest) -> Outcome:
        """Pass the action on to the configured target."""
        if request.action not in self.actions:
            raise PermanentError(f"the job driver cannot {request.action}")
        outcome = self._target.run(request)
        return Outcome(f"{request.action}: {outcome.message}",
                       {**outcome.details, "via": self._target.name})

    def reconcile(self, request: ActionRequest) -> bool | None:
        """Whatever the target can tell (a webhook or a program: unknown)."""
        return self._target.reconcile(request)

    def close(self) -> None:
        """Close the target's connections, if it holds any."""
        close: Any = getattr(self._target, "close", None)
        if callable(close):
            close()
