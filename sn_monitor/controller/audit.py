"""The audit trail's vocabulary: what an action is, the request, and what became of it.

Every action the controller takes (alert, throttle, cordon, evict, restore, ...) is an
:class:`ActionRequest`, written to the store as an :class:`ActionRecord` before anything
is done about it; the record then carries the safety policy's verdict and the driver's
outcome. The rules name actions, the policy judges them, the runner and the drivers
carry them out, the store keeps them and the job recovery submits them: all of them
speak these types, so they live below all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Literal

from sn_monitor.model import ActionName

#: Actions that take capacity away or change hardware: they go through the safety policy.
DISRUPTIVE: frozenset[str] = frozenset(
    {"throttle", "cordon", "evict", "restore", "failover", "reset_gpu", "reboot"}
)

#: Actions that take a node out of service: counted against max_unavailable.
TAKES_NODE_OUT: Final[frozenset[str]] = frozenset({"cordon", "evict", "failover", "reboot"})

#: ``held``: refused by the open circuit breaker but kept, not final, because a recovery
#: owns it; the recovery releases it once the breaker closes, or cancels it.
ActionState = Literal[
    "pending", "awaiting_approval", "held", "running", "succeeded", "failed", "dry_run",
    "refused", "cancelled",
]
ACTION_STATES: Final[frozenset[str]] = frozenset(
    {"pending", "awaiting_approval", "held", "running", "succeeded", "failed", "dry_run",
     "refused", "cancelled"}
)
#: States an action never leaves.
FINAL_STATES: Final[frozenset[str]] = frozenset(
    {"succeeded", "failed", "dry_run", "refused", "cancelled"}
)


class Refusal(StrEnum):
    """Why an action was refused (or held): the policy's reasons, as the record keeps them.

    Code decides on this, never on the refusal's text (which is for people).
    """

    BREAKER = "breaker"
    MAX_UNAVAILABLE = "max_unavailable"
    RATE_LIMIT = "rate_limit"
    COOLDOWN = "cooldown"
    #: (node, action) failed too often recently: the runner's failure throttle.
    THROTTLED = "throttled"
    #: An uncordon of a node sn-monitor did not cordon.
    NOT_OURS = "not_ours"


@dataclass(frozen=True)
class ActionRequest:
    """One action to take, as recorded in the audit trail before it runs.

    ``key`` is the idempotency key: the same key is never run twice, across restarts.
    ``params`` carries what a driver needs beyond the node (``status`` firing/resolved
    for alerts, ``power_fraction`` for throttle, ``checkpoint`` and ``nodes`` for restore).
    ``owner`` names the multi-step process (a job recovery) the action is a step of: the
    open breaker holds such an action instead of refusing it, and the owner's own earlier
    actions do not count against its later ones (max_unavailable).
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
    owner: str | None = None


@dataclass(frozen=True)
class ActionRecord:
    """One row of the audit trail: the request, the policy's verdict and what happened."""

    id: str
    key: str
    action: ActionName
    node: str | None
    reason: str
    state: ActionState
    created_at: float
    updated_at: float
    rule: str | None = None
    incident_id: int | None = None
    gpu: int | None = None
    severity: str = "warning"
    labels: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    requested_by: str = "controller"
    verdict_reason: str = ""
    attempts: int = 0
    next_attempt_at: float | None = None
    outcome_message: str = ""
    outcome: Mapping[str, Any] = field(default_factory=dict)
    #: Set with ``refused`` and ``held``: the policy's reason, typed.
    refusal: Refusal | None = None
    owner: str | None = None

    @property
    def final(self) -> bool:
        """True once the action can no longer change."""
        return self.state in FINAL_STATES

    def to_request(self) -> ActionRequest:
        """The request this record was made from (for drivers, on retry and resume)."""
        return ActionRequest(
            id=self.id, key=self.key, action=self.action, node=self.node,
            reason=self.reason, rule=self.rule, incident_id=self.incident_id, gpu=self.gpu,
            severity=self.severity, labels=dict(self.labels), params=dict(self.params),
            requested_by=self.requested_by, created_seconds=self.created_at,
            owner=self.owner,
        )

    @classmethod
    def from_request(cls, request: ActionRequest, state: ActionState, reason: str,
                     at: float) -> ActionRecord:
        """A new record for ``request``, created at wall time ``at``."""
        return cls(
            id=request.id, key=request.key, action=request.action, node=request.node,
            reason=request.reason, state=state, created_at=at, updated_at=at,
            rule=request.rule, incident_id=request.incident_id, gpu=request.gpu,
            severity=request.severity, labels=dict(request.labels),
            params=dict(request.params), requested_by=request.requested_by,
            verdict_reason=reason, owner=request.owner,
        )
