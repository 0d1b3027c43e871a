"""Job control: checkpoint / restore / failover, handed to the job's launcher.

Which launcher runs a training job differs per site, so this driver only delegates, to
exactly one target:

* a webhook (the action and its params — ``job``, ``checkpoint``, ``nodes`` — are in
  the signed JSON body, see :mod:`.webhook`);
* a program (SN_ACTION and SN_PARAMS in its environment, see :mod:`.command`);
* Kubernetes (delete the job's pods on the failed nodes so that its operator recreates
  them; annotate them for a checkpoint, see :mod:`.k8s_jobs`);
* Slurm (``scontrol requeue`` the batch job, see :mod:`.slurm_jobs`).

A job that names no launcher (no ``spec.control``, no controller-wide ``drivers.job``)
is controlled through its training client alone (:class:`TrainingClientControl`).

The job orchestration (which checkpoint, which spare nodes) decides the params; this
driver does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sn_monitor.controller.actions.base import Outcome, PermanentError
from sn_monitor.controller.actions.drivers.command import CommandSettings
from sn_monitor.controller.actions.drivers.slurm_jobs import SlurmJobSettings
from sn_monitor.controller.actions.drivers.webhook import WebhookSettings
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.k8s.settings import KubernetesJobSettings


@dataclass(frozen=True)
class JobControl:
    """How to ask the job's launcher to checkpoint, stop and restore: exactly one way.

    A DistributedJob's ``spec.control``. ``webhook: URL`` is short for ``webhook: {url:
    URL}``; ``command: [argv...]`` for ``command: {program: [argv...]}``. ``kubernetes:
    {namespace, selector, ...}``: the job's pods (see :mod:`.k8s_jobs`); ``slurm:
    {jobId}`` or ``slurm: {jobName}``: its batch job (see :mod:`.slurm_jobs`). A numeric
    ``jobId`` may be written unquoted.
    """

    webhook: WebhookSettings | None = None
    command: CommandSettings | None = None
    kubernetes: KubernetesJobSettings | None = None
    slurm: SlurmJobSettings | None = None

    def __post_init__(self) -> None:
        given = [x for x in (self.webhook, self.command, self.kubernetes, self.slurm)
                 if x is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of webhook, command, kubernetes and slurm")

    @property
    def kind(self) -> str:
        """webhook, command, kubernetes or slurm."""
        for kind in ("webhook", "command", "kubernetes", "slurm"):
            if getattr(self, kind) is not None:
                return kind
        raise AssertionError("unreachable: __post_init__ checks one is set")


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


class TrainingClientControl:
    """Job control for a job that names no launcher: its training client is the channel.

    The ranks of such a job hear of checkpoint requests and of the restore point in their
    progress replies (:mod:`sn_monitor.client`), and the job's own launcher (torchrun's
    elastic agent, a Kubernetes or Slurm job that restarts failed ranks) starts the
    ranks again: there is nothing for the controller to call. The action succeeds,
    saying so; a recovery then waits for the new generation's progress as always.
    """

    name = "client"
    idempotent = True
    actions = frozenset({"checkpoint", "restore", "failover"})

    def run(self, request: ActionRequest) -> Outcome:
        """Nothing to call: the outcome says where the ranks learn about it."""
        if request.action not in self.actions:
            raise PermanentError(f"the training client cannot {request.action}")
        job = request.params.get("job", "?")
        what = {"checkpoint": "the ranks are asked in their progress replies",
                "restore": "the ranks get the restore point in their progress replies; "
                           "the job's launcher restarts them",
                "failover": "the job's launcher restarts its ranks"}[request.action]
        return Outcome(f"{request.action} of job {job}: {what} (no launcher to call)",
                       {"via": self.name})

    def reconcile(self, request: ActionRequest) -> bool:
        """Always done: running it is only saying so."""
        del request
        return True
