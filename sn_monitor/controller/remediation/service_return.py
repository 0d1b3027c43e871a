"""What the remediation ladder does to the rest of the controller: actions, and the way back.

:class:`ServiceReturn` is the ladder's
:class:`~sn_monitor.controller.remediation.ladder.RemediationPorts`:

- a rung (``reset_gpu``, ``reboot``) or a verification is an action through the runner,
  so through the safety policy, audited before it runs, and carried to the agent in the
  reply to its next report;
- a node that passed its check goes **back into service** with no person: its fault's
  incidents close (the reset cleared it), the cordon the controller put on it is lifted,
  and every job that had taken it out gets it back in its spare pool. An audit record
  says so, with the checks it passed;
- a node no rung repaired stays out: cordoned (through the policy) and a critical alert
  to a person, with the ladder's history. A node that fails the check a person's
  uncordon asked for stays out of the spare pools and is paged about, but the person's
  uncordon is not undone.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any, cast

from sn_monitor.clock import Clock
from sn_monitor.controller.audit import ActionRecord, ActionRequest
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.jobs.settings import JobError
from sn_monitor.controller.remediation.ladder import META_KEY, Repair
from sn_monitor.controller.storage.store import Store
from sn_monitor.model import ActionName

log = logging.getLogger(__name__)

#: Who the ladder's actions are requested by (the audit trail's ``requested_by``).
REQUESTER = "remediation"


class ServiceReturn:
    """The ladder's ports; see the module docstring.

    ``submit`` runs an action request through the runner (None: the store refused it);
    ``audit`` writes a final audit record; ``clear_faults(node, gpu, why)`` closes the
    fault incidents a passed check cancels; ``labels_of`` gives a node's labels;
    ``forget_attempt`` tells the safety policy an action changed nothing.
    """

    def __init__(self, *, store: Store, clock: Clock, jobs: JobOrchestrator,
                 submit: Callable[[ActionRequest], ActionRecord | None],
                 audit: Callable[[str, str, str, str, dict[str, Any]], None],
                 clear_faults: Callable[[str, int | None, str], None],
                 labels_of: Callable[[str], dict[str, str] | None],
                 forget_attempt: Callable[[ActionRequest], None]) -> None:
        self._store = store
        self._clock = clock
        self._jobs = jobs
        self._submit = submit
        self._audit = audit
        self._clear_faults = clear_faults
        self._labels_of = labels_of
        self._forget_attempt = forget_attempt

    def _request(self, action: str, repair: Repair, reason: str, *, key: str,
                 severity: str = "warning") -> ActionRequest:
        return ActionRequest(
            id=uuid.uuid4().hex, key=key, action=cast(ActionName, action), node=repair.node,
            reason=reason, rule=repair.rule, incident_id=repair.incident_id, gpu=repair.gpu,
            severity=severity, labels=self._labels_of(repair.node) or {},
            params={"status": "firing", "rung": repair.rung, "subject": "remediation",
                    "repair_started": repair.started},
            requested_by=REQUESTER, created_seconds=self._clock.time())

    def submit_rung(self, action: str, repair: Repair, reason: str) -> tuple[str, str]:
        key = (f"repair:{repair.node}:{repair.started:.6f}:{repair.rung}:"
               f"{repair.attempts}:{action}:{self._clock.time():.6f}")
        record = self._submit(self._request(action, repair, reason, key=key))
        if record is None:
            return "", "refused"
        return record.id, record.state

    def return_to_service(self, repair: Repair, checks: str) -> None:
        node = repair.node
        jobs = self._jobs.excluding(node)
        why = (f"{node} passed its check after {repair.rung} ({checks}): back into service"
               + (f", a spare of {', '.join(jobs)} again" if jobs else ""))
        self._audit("return-to-service", REQUESTER, why, node,
                    {"rung": repair.rung, "checks": checks, "jobs": jobs})
        self._clear_faults(node, repair.gpu if repair.rung == "reset_gpu" else None,
                           f"cleared by {repair.rung}, and {node} passed its check")
        record = self._store.get_node(node)
        if record is not None and record.cordoned_by_us:
            self._submit(self._request("uncordon", repair, why,
                                       key=f"repair:{node}:{repair.started:.6f}:uncordon"))
        for job in jobs:
            try:
                self._jobs.return_to_pool(job, node)
            except JobError as err:  # it runs the job again, or the job is gone
                log.info("%s not returned to the pool of %s: %s", node, job, err,
                         extra={"node": node})
        log.warning("%s", why, extra={"node": node})

    def needs_replacement(self, repair: Repair, *, cordon: bool = True) -> None:
        node = repair.node
        why = (f"{node} needs a person: {repair.reason}. Tried: "
               + " | ".join(repair.history[-6:]))
        record = self._store.get_node(node)
        if cordon and repair.origin == "fault" and (
                record is None or not record.cordoned_by_us):
            self._submit(self._request("cordon", repair, why,
                                       key=f"repair:{node}:{repair.started:.6f}:cordon"))
        self._submit(self._request("alert", repair, why, severity="critical",
                                   key=f"repair:{node}:{repair.started:.6f}:alert"))

    def did_nothing(self, action_id: str) -> None:
        record = self._store.get_action(action_id)
        if record is not None:
            # no attempt took effect: a restarted controller does not seed a cooldown from it
            self._store.update_action(action_id, at=self._clock.time(), attempts=0)
            self._forget_attempt(record.to_request())

    def load(self) -> str | None:
        return self._store.get_meta(META_KEY)

    def save(self, text: str) -> None:
        self._store.set_meta(META_KEY, text)
