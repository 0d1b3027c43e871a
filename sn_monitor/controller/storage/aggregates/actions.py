"""Actions: the audit trail, one row per action, written before the action is taken.

Every write here is durable (see ``store.py``): an action row is a promise that an
outside system was, or is about to be, changed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from sn_monitor.controller.audit import (
    ACTION_STATES,
    ActionRecord,
    ActionRequest,
    ActionState,
    Refusal,
)
from sn_monitor.controller.storage.aggregates.base import StoreBase
from sn_monitor.controller.storage.aggregates.columns import dumps
from sn_monitor.controller.storage.database.base import Row, StoreError
from sn_monitor.controller.storage.query import Select


class UnknownAction(StoreError):
    """No action with that id."""


class _Unset:
    """Marks "leave this column alone" where ``None`` is a value (NULL)."""


_UNSET: Final = _Unset()


def _check_state(state: str) -> None:
    if state not in ACTION_STATES:
        raise ValueError(f"unknown action state {state!r}")


class ActionStore(StoreBase):
    """The ``actions`` table: record, update (compare-and-set), look up, list."""

    def record_action(self, request: ActionRequest, state: ActionState = "pending",
                      reason: str = "", *, at: float | None = None
                      ) -> tuple[ActionRecord, bool]:
        """Write the audit record for ``request`` before anything is done about it.

        Idempotent on ``request.key``: if an action with that key exists, nothing is
        written and ``(existing record, False)`` comes back. Committed durably (see the
        module docstring). ``at`` defaults to ``request.created_seconds``.
        """
        _check_state(state)
        when = request.created_seconds if at is None else at
        record = ActionRecord.from_request(request, state, reason, when)
        with self._tx(durable=True) as db:
            inserted = db.execute(
                "INSERT INTO actions (id, key, action, node, gpu, rule, incident_id,"
                " severity, reason, labels, params, requested_by, state, verdict_reason,"
                " created_at, updated_at, owner)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (record.id, record.key, record.action, record.node, record.gpu, record.rule,
                 record.incident_id, record.severity, record.reason, dumps(record.labels),
                 dumps(record.params), record.requested_by, record.state,
                 record.verdict_reason, when, when, record.owner),
            )
            if inserted == 1:
                return record, True
            row = db.one("SELECT * FROM actions WHERE key = ?", (request.key,))
        if row is None:
            raise StoreError(f"action id {request.id} is already used by another key")
        return self._action(row), False

    def update_action(self, action_id: str, *, at: float,
                      state: ActionState | None = None,
                      expect_state: ActionState | None = None,
                      verdict_reason: str | None = None,
                      attempts: int | None = None,
                      next_attempt_at: float | _Unset | None = _UNSET,
                      outcome_message: str | None = None,
                      outcome: Mapping[str, Any] | None = None,
                      refusal: Refusal | _Unset | None = _UNSET) -> ActionRecord:
        """Change the named columns of an action (the others stay); the new record.

        ``expect_state`` makes the update conditional (compare-and-set): when the action
        is no longer in that state, StoreError is raised and nothing is written.
        ``next_attempt_at=None`` clears the retry time, ``refusal=None`` the refusal.
        Committed durably.
        """
        changes: dict[str, Any] = {"updated_at": at}
        if state is not None:
            _check_state(state)
            changes["state"] = state
        if verdict_reason is not None:
            changes["verdict_reason"] = verdict_reason
        if attempts is not None:
            changes["attempts"] = attempts
        if not isinstance(next_attempt_at, _Unset):
            changes["next_attempt_at"] = next_attempt_at
        if outcome_message is not None:
            changes["outcome_message"] = outcome_message
        if outcome is not None:
            changes["outcome"] = dumps(outcome)
        if not isinstance(refusal, _Unset):
            changes["refusal"] = None if refusal is None else str(refusal)
        return self._change_action(action_id, changes, expect_state)

    def _change_action(self, action_id: str, changes: Mapping[str, Any],
                       expect_state: ActionState | None) -> ActionRecord:
        """Set ``changes`` (column -> value) on one action, if in ``expect_state``."""
        with self._tx(durable=True) as db:
            row = db.one("SELECT state FROM actions WHERE id = ?", (action_id,))
            if row is None:
                raise UnknownAction(f"no action {action_id!r}")
            if expect_state is not None and row["state"] != expect_state:
                raise StoreError(
                    f"action {action_id} is {row['state']}, not {expect_state}")
            db.execute("UPDATE actions SET " + ", ".join(f"{c} = ?" for c in changes)
                       + " WHERE id = ?", (*changes.values(), action_id))
            new = db.one("SELECT * FROM actions WHERE id = ?", (action_id,))
        assert new is not None  # read in the transaction that found it
        return self._action(new)

    @staticmethod
    def _action(row: Row) -> ActionRecord:
        return ActionRecord(
            id=row["id"], key=row["key"], action=row["action"], node=row["node"],
            reason=row["reason"], state=row["state"], created_at=row["created_at"],
            updated_at=row["updated_at"], rule=row["rule"], incident_id=row["incident_id"],
            gpu=row["gpu"], severity=row["severity"], labels=json.loads(row["labels"]),
            params=json.loads(row["params"]), requested_by=row["requested_by"],
            verdict_reason=row["verdict_reason"], attempts=row["attempts"],
            next_attempt_at=row["next_attempt_at"], outcome_message=row["outcome_message"],
            outcome=json.loads(row["outcome"]),
            refusal=Refusal(row["refusal"]) if row["refusal"] else None, owner=row["owner"],
        )

    def get_action(self, action_id: str) -> ActionRecord | None:
        """One action by id, or None."""
        rows = self._query("SELECT * FROM actions WHERE id = ?", (action_id,))
        return self._action(rows[0]) if rows else None

    def get_action_by_key(self, key: str) -> ActionRecord | None:
        """One action by idempotency key, or None."""
        rows = self._query("SELECT * FROM actions WHERE key = ?", (key,))
        return self._action(rows[0]) if rows else None

    def list_actions(self, *, node: str | None = None, action: str | None = None,
                     state: str | None = None, rule: str | None = None,
                     owner: str | None = None, incident_id: int | None = None,
                     since: float | None = None, limit: int = 100) -> list[ActionRecord]:
        """Actions, newest first, filtered by any of the named columns.

        ``since`` keeps actions updated at or after that wall time.
        """
        select = (Select("actions").equal("node", node).equal("action", action)
                  .equal("state", state).equal("rule", rule).equal("owner", owner)
                  .equal("incident_id", incident_id).at_least("updated_at", since)
                  .order_by("created_at DESC", f"{self.db.insertion_order} DESC")
                  .limit(limit))
        return [self._action(r) for r in self._select(select)]

    def count_evictions(self, node: str, since: float) -> int:
        """How many times ``node`` was taken out of service (an eviction that ran) since then."""
        return int(self._query(
            "SELECT COUNT(*) AS n FROM actions WHERE node = ? AND action = 'evict'"
            " AND state = 'succeeded' AND created_at >= ?", (node, since))[0]["n"])

    def actions_in_states(self, states: Iterable[str]) -> list[ActionRecord]:
        """Every action in one of ``states``, oldest first (resume after a restart)."""
        wanted = set(states)
        for state in sorted(wanted):
            _check_state(state)
        select = (Select("actions").one_of("state", wanted)
                  .order_by("created_at", self.db.insertion_order))
        return [self._action(r) for r in self._select(select)]
