"""The controller's side of the jobs layer's port (:class:`~.jobs.ports.JobActions`).

Job recoveries submit their steps through the action runner like every other action
(the audit record first, the safety policy, the drivers), and learn from the controller
what it knows of a node.
"""

from __future__ import annotations

from collections.abc import Callable

from sn_monitor.controller.actions.policy import ClusterSummary
from sn_monitor.controller.actions.runner import ActionRunner
from sn_monitor.controller.audit import ActionRecord, ActionRequest
from sn_monitor.controller.storage.store import Store

#: How far back the audit trail is read to tell whether a node was already evicted.
_EVICTION_LOOKBACK = 50


class RunnerJobActions:
    """Actions through the runner; node facts from the controller's state and store."""

    def __init__(self, runner: ActionRunner, store: Store,
                 cluster: Callable[[], ClusterSummary],
                 node_healthy: Callable[[str], bool]) -> None:
        self._runner = runner
        self._store = store
        self._cluster = cluster
        self._node_healthy = node_healthy

    def submit(self, request: ActionRequest) -> ActionRecord:
        return self._runner.submit(request, self._cluster(), False)

    def get(self, action_id: str) -> ActionRecord | None:
        return self._store.get_action(action_id)

    def release(self, action_id: str) -> ActionRecord:
        return self._runner.release(action_id, self._cluster())

    def cancel(self, action_id: str, why: str) -> ActionRecord:
        return self._runner.cancel(action_id, why)

    def node_healthy(self, node: str) -> bool:
        return self._node_healthy(node)

    def already_evicted(self, node: str) -> bool:
        """Its newest eviction or uncordon that ran is an eviction, and the cordon is ours."""
        record = self._store.get_node(node)
        if record is None or not record.cordoned_by_us:
            return False
        for action in self._store.list_actions(node=node, state="succeeded",
                                               limit=_EVICTION_LOOKBACK):
            if action.action == "evict":
                return True
            if action.action == "uncordon":
                return False
        return False
