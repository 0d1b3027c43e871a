"""The read API: nodes, incidents, actions, events, jobs, repairs, the breaker, health.

Each answer is a JSON-ready document built from the store and what the controller holds
in memory; nothing here changes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sn_monitor.clock import Clock
from sn_monitor.controller.actions.policy import SafetyPolicy
from sn_monitor.controller.audit import ActionRecord
from sn_monitor.controller.errors import NotFound
from sn_monitor.controller.incidents.breaker import BreakerKeeper, breaker_doc
from sn_monitor.controller.incidents.fleet_state import FleetState
from sn_monitor.controller.ingest.decode import NodeRegistry
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.jobs.settings import UnknownJob
from sn_monitor.controller.jobs.triage import JobTriage
from sn_monitor.controller.remediation.ladder import RemediationLadder
from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Incident, Store
from sn_monitor.rules.view import NodeView

#: The newest actions of one incident its page shows (a flapping fault's alerts are many).
INCIDENT_ACTIONS_SHOWN = 1000


class ControllerQueries:
    """The read API's documents (module docstring)."""

    def __init__(self, *, registry: NodeRegistry, fleet: FleetState, store: Store,
                 store_health: StoreHealth, jobs: JobOrchestrator,
                 remediation: RemediationLadder, breaker: BreakerKeeper, policy: SafetyPolicy,
                 progress: Clock, peers: Callable[[], Mapping[str, tuple[str, int]]],
                 triage: JobTriage) -> None:
        """The collaborators, passed in.

        ``progress``: the clock report ages are measured on (the stall watch's);
        ``peers``: each agent's address and metrics port; ``triage``: each job's root
        cause, shown with the job.
        """
        self._registry = registry
        self._fleet = fleet
        self._store = store
        self._store_health = store_health
        self._jobs = jobs
        self._remediation = remediation
        self._breaker = breaker
        self._policy = policy
        self._progress = progress
        self._peers = peers
        self._triage = triage

    # ------------------------------------------------------------------ nodes

    def list_nodes(self) -> list[dict[str, Any]]:
        return [self._node_doc(view) for _, view in sorted(self._registry.views().items())]

    def get_node(self, name: str) -> dict[str, Any] | None:
        view = self._registry.get(name)
        if view is None:
            return None
        doc = self._node_doc(view)
        doc["incidents"] = [incident_doc(i) for i in self._store.list_incidents(
            status="open", node=name, limit=100)]
        return doc

    def _node_doc(self, view: NodeView) -> dict[str, Any]:
        report = view.report
        temps = [g.temperature_celsius for g in report.gpus
                 if g.temperature_celsius is not None] if report else []
        firing = self._fleet.firing_rules(view.name)
        age = self._progress.monotonic() - view.received_monotonic
        return {
            "name": view.name,
            "labels": dict(view.labels),
            "state": self._fleet.state_of(view.name),
            "last_report_age_seconds": round(age, 3) if report else None,
            "gpus": len(report.gpus) if report else 0,
            "gpus_lost": sum(1 for g in report.gpus if g.lost) if report else 0,
            "hottest_gpu_celsius": max(temps) if temps else None,
            "firing": firing,
            "cordoned_by_us": self._fleet.cordoned_by_us(view.name),
            "jobs": self._jobs.roles_of(view.name),
        }

    def service_discovery(self) -> list[dict[str, Any]]:
        """Prometheus HTTP SD: one target group per agent, labelled for dashboards."""
        groups = []
        peers = self._peers()
        for name, view in sorted(self._registry.views().items()):
            address = peers.get(name)
            if address is None:
                continue
            host, port = address
            target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            labels = {"node": name}
            for key in ("supernode", "rack", "job"):
                if key in view.labels:
                    labels[key] = view.labels[key]
            groups.append({"targets": [target], "labels": labels})
        return groups

    # ------------------------------------------------------------------ incidents, actions

    def list_incidents(self, status: str | None, node: str | None,
                       limit: int) -> list[dict[str, Any]]:
        return [incident_doc(i) for i in self._store.list_incidents(
            status=status, node=node, limit=limit)]  # type: ignore[arg-type]

    def get_incident(self, incident_id: int) -> dict[str, Any] | None:
        incident = self._store.get_incident(incident_id)
        if incident is None:
            return None
        doc = incident_doc(incident)
        doc["actions"] = [action_doc(a) for a in self._store.list_actions(
            incident_id=incident_id, limit=INCIDENT_ACTIONS_SHOWN)]
        return doc

    def list_actions(self, node: str | None, state: str | None,
                     limit: int) -> list[dict[str, Any]]:
        return [action_doc(a) for a in self._store.list_actions(
            node=node, state=state, limit=limit)]

    def list_events(self, node: str | None, kind: str | None,
                    limit: int) -> list[dict[str, Any]]:
        return self._store.list_events(node=node, kind=kind, limit=limit)

    # ------------------------------------------------------------------ jobs, repairs

    def list_jobs(self) -> list[dict[str, Any]]:
        return [self._with_root_cause(status.to_dict()) for status in self._jobs.jobs()]

    def get_job(self, name: str) -> dict[str, Any] | None:
        status = self._jobs.job(name)
        if status is None:
            return None
        doc = self._with_root_cause(status.to_dict())
        doc["recoveries"] = [r.to_dict() for r in self._jobs.recoveries(name, limit=20)]
        return doc

    def _with_root_cause(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The job's document with its latest failure's root cause (None: none known)."""
        cause = self._triage.root_cause(doc["name"])
        doc["root_cause"] = None if cause is None else cause.to_dict()
        return doc

    def restore_point(self, name: str) -> dict[str, Any] | None:
        try:
            point = self._jobs.restore_point(name)
        except UnknownJob:
            raise NotFound(f"no job {name!r}") from None
        return None if point is None else point.to_dict()

    def list_recoveries(self, job: str | None, limit: int) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self._jobs.recoveries(job, limit=limit)]

    def list_repairs(self, node: str | None, limit: int) -> list[dict[str, Any]]:
        """The remediation ladders in progress and the latest ended, newest first."""
        return self._remediation.repairs(node)[:limit]

    # ------------------------------------------------------------------ the controller

    def breaker_state(self) -> dict[str, Any]:
        return breaker_doc(self._breaker.state())

    def health(self) -> tuple[bool, dict[str, Any]]:
        breaker = self._policy.breaker_state()
        body = {
            "status": "ok" if self._store_health.ok else "refusing to act",
            "nodes": len(self._registry),
            "breaker": {"open": breaker.open, "reason": breaker.reason},
            "store": self._store_health.error or "ok",
        }
        return self._store_health.ok, body


def incident_doc(incident: Incident) -> dict[str, Any]:
    return {
        "id": incident.id, "rule": incident.rule, "node": incident.node,
        "subject": incident.subject, "gpu": incident.gpu, "severity": incident.severity,
        "status": incident.status, "message": incident.message,
        "observed_at": incident.observed_at, "detected_at": incident.detected_at,
        "detection_latency_seconds": round(incident.detected_at - incident.observed_at, 3),
        "closed_at": incident.closed_at, "value": incident.value,
    }


def action_doc(record: ActionRecord) -> dict[str, Any]:
    return {
        "id": record.id, "key": record.key, "action": record.action, "node": record.node,
        "gpu": record.gpu, "rule": record.rule, "incident_id": record.incident_id,
        "severity": record.severity, "reason": record.reason, "state": record.state,
        "verdict": record.verdict_reason, "requested_by": record.requested_by,
        "attempts": record.attempts, "created_at": record.created_at,
        "updated_at": record.updated_at, "outcome": record.outcome_message,
        "params": dict(record.params),
    }
