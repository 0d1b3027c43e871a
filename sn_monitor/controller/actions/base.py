"""What a driver is, and how a driver fails.

A driver knows one outside system (a webhook, Alertmanager, Kubernetes, Slurm, a
program, an agent). It gets an :class:`~sn_monitor.controller.audit.ActionRequest` (the
request as the audit trail recorded it) and either returns an
:class:`Outcome` or raises :class:`TemporaryError` (worth retrying after a delay: a
timeout, a 503, a conflict) or :class:`PermanentError` (retrying cannot help: a 400,
no such node, a missing setting). Retries, backoff and timeouts belong to the runner,
not to drivers; the audit record is written before a driver is called.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sn_monitor.controller.audit import ActionRequest
from sn_monitor.errors import SnMonitorError


class ActionError(SnMonitorError):
    """A driver could not do what was asked."""


class TemporaryError(ActionError):
    """Worth retrying after ``retry_after`` seconds (or the runner's backoff)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(ActionError):
    """Retrying cannot help."""


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
