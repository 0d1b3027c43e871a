"""What the jobs layer asks of the controller around it: actions, and facts about nodes.

Jobs never run a driver or read the rules' state themselves. Every outside effect is an
action given to :meth:`JobActions.submit` (recorded in the audit trail, judged by the
safety policy, run by the action runner); what the controller knows of a node (does it
report, is a fault firing on it, was it already evicted) comes through the same port.
The controller implements it (``actions.py``, wired by ``service/``); the unit tests
implement it with a recording fake.
"""

from __future__ import annotations

from typing import Protocol

from sn_monitor.controller.audit import ActionRecord, ActionRequest


class JobActions(Protocol):
    """The controller's side of the jobs layer."""

    def submit(self, request: ActionRequest) -> ActionRecord:
        """Record ``request`` and run it through the policy; the record (idempotent on key).

        An action whose ``owner`` is set that the open breaker refuses comes back
        ``held``. Raises StoreUnavailable when nothing could be recorded.
        """
        ...

    def get(self, action_id: str) -> ActionRecord | None:
        """The action's record as it is now."""
        ...

    def release(self, action_id: str) -> ActionRecord:
        """Decide a ``held`` action again (it stays held while the breaker is open)."""
        ...

    def cancel(self, action_id: str, why: str) -> ActionRecord:
        """Cancel an action that has not run yet; a running or finished one is left be."""
        ...

    def node_healthy(self, node: str) -> bool:
        """The node reports and no fault that takes it out is firing on it."""
        ...

    def already_evicted(self, node: str) -> bool:
        """An eviction of the node ran and nothing has put it back in service since."""
        ...
