"""What an action is, what a driver is, and how a driver fails.

A driver knows one outside system (a webhook, Alertmanager, Kubernetes, Slurm, a
program, an agent). It gets an :class:`ActionRequest` and either returns an
:class:`Outcome` or raises :class:`TemporaryError` (worth retrying after a delay: a
timeout, a 503, a conflict) or :class:`PermanentError` (retrying cannot help: a 400,
no such node, a missing setting). Retries, backoff and timeouts belong to the runner,
not to drivers; the audit record is written before a driver is called.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

ActionName = Literal[
    "alert", "throttle", "release", "cordon", "uncordon", "evict",
    "checkpoint", "restore", "failover",
]

#: Actions that take capacity away or change hardware: they go through the safety policy.
DISRUPTIVE: frozenset[str] = frozenset(
    {"throttle", "cordon", "evict", "restore", "failover"}
)


class ActionError(Exception):
    """A driver could not do what was asked."""


class TemporaryError(ActionError):
    """Worth retrying after ``retry_after`` seconds (or the runner's backoff)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(ActionError):
    """Retrying cannot help."""


@dataclass(frozen=True)
class ActionRequest:
    """One action to take, as recorded in the audit trail before it runs.

    ``key`` is the idempotency key: the same key is never run twice, across restarts.
    ``params`` carries what a driver needs beyond the node (``status`` firing/resolved
    for alerts, ``power_fraction`` for throttle, ``checkpoint`` and ``nodes`` for restore).
    """

    id: str
    key: str
    action: ActionName
    node: str | None
    reason: str
    rule: str | None = None
    incident_id: int | None = None
    gpu: int | None = None
    severity: str = "warning"
    labels: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    requested_by: str = "controller"
    created_seconds: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """What a driver did. ``details`` is stored with the action (no secrets in it)."""

    message: str
    details: Mapping[str, Any] = field(default_factory=dict)


class Driver(Protocol):
    """One outside system that carries out actions."""

    name: str

    def run(self, request: ActionRequest) -> Outcome:
        """Carry out ``request`` or raise TemporaryError / PermanentError."""
        ...
