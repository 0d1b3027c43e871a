"""The controller's job orchestrator with a manual clock and a submitter that records what
it would launch, plus checkpoints written as the training script writes them; for the
job, checkpoint-advisor and audit tests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sn_monitor.clock import ManualClock
from sn_monitor.controller.audit import ActionRecord, ActionRequest
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.jobs.settings import JobSettings
from sn_monitor.controller.jobs.spec import DistributedJob, job_from_json
from sn_monitor.controller.storage.store import Store
from sn_monitor.dcp import write_checkpoint


class RecordingSubmit:
    """The jobs layer's port (JobActions) as a recording fake of the controller's side.

    ``submit`` records then "runs" an action like ActionRunner.submit: idempotent on the
    key. ``states[action]`` is the state a new action of that kind ends in at once
    (default ``succeeded``; ``pending`` leaves it to the test). With ``breaker_open`` a
    recovery's cordon, evict or restore is ``held`` (as the runner holds an owned action)
    and ``release`` leaves it so until the breaker closes. ``healthy`` and ``evicted``
    are what the controller would know of nodes.
    """

    def __init__(self, store: Store, clock: ManualClock) -> None:
        self.store = store
        self.clock = clock
        self.states: dict[str, str] = {}
        self.calls: list[ActionRequest] = []
        self.created: list[str] = []
        self.breaker_open = False
        self.healthy: set[str] = set()
        self.evicted: set[str] = set()
        self.cancelled: list[str] = []

    def submit(self, request: ActionRequest) -> ActionRecord:
        self.calls.append(request)
        record, created = self.store.record_action(request, "pending", at=self.clock.time())
        if not created:
            return record
        self.created.append(request.key)
        return self._decide(record)

    __call__ = submit

    def _decide(self, record: ActionRecord) -> ActionRecord:
        if (self.breaker_open and record.owner is not None
                and record.action in ("cordon", "evict", "restore", "failover")):
            return self.store.update_action(record.id, at=self.clock.time(), state="held",
                                            verdict_reason="held: circuit breaker open")
        state = self.states.get(record.action, "succeeded")
        if state != "pending":
            record = self.store.update_action(record.id, at=self.clock.time(),
                                              state=state)  # type: ignore[arg-type]
        return record

    def get(self, action_id: str) -> ActionRecord | None:
        return self.store.get_action(action_id)

    def release(self, action_id: str) -> ActionRecord:
        record = self.store.get_action(action_id)
        assert record is not None
        if record.state != "held" or self.breaker_open:
            return record
        return self._decide(record)

    def cancel(self, action_id: str, why: str) -> ActionRecord:
        record = self.store.get_action(action_id)
        assert record is not None
        if record.state not in ("held", "pending", "awaiting_approval"):
            return record
        self.cancelled.append(record.key)
        return self.store.update_action(action_id, at=self.clock.time(), state="cancelled",
                                        outcome_message=f"cancelled: {why}")

    def node_healthy(self, node: str) -> bool:
        return node in self.healthy

    def already_evicted(self, node: str) -> bool:
        return node in self.evicted

    def of(self, action: str) -> list[ActionRequest]:
        return [r for r in self.calls if r.action == action]

    def keys(self, action: str | None = None) -> list[str]:
        return [r.key for r in self.calls if action is None or r.action == action]

    def finish(self, key: str, state: str = "succeeded") -> None:
        record = self.store.get_action_by_key(key)
        assert record is not None, key
        self.store.update_action(record.id, at=self.clock.time(),
                                 state=state)  # type: ignore[arg-type]


def node(i: int) -> str:
    return f"node-{i:02d}"


def make_job(ckpt_dir: Path, *, name: str = "train", nodes: int = 16, spares: int = 2,
             strategy: str = "restart", interval: float = 900, max_failures: int = 3,
             min_replicas: int = 1, hang: float | None = None,
             selector: dict[str, str] | None = None) -> DistributedJob:
    spec: dict[str, Any] = {
        "replicas": nodes,
        "nodes": selector if selector is not None else [node(i) for i in range(nodes)],
        "spares": [node(nodes + i) for i in range(spares)],
        "checkpoint": {"dir": str(ckpt_dir)},
        "control": {"webhook": "http://launcher:8080/control"},
        "checkpointInterval": interval,
        "maxFailures": max_failures,
        "recoveryStrategy": strategy,
        "minReplicas": min_replicas,
    }
    if hang is not None:
        spec["hangTimeout"] = hang
    doc = {"apiVersion": "sn-monitor/v1", "kind": "DistributedJob",
           "metadata": {"name": name}, "spec": spec}
    return job_from_json(json.dumps(doc).encode())


def checkpoint(ckpt_dir: Path, step: int, clock: ManualClock, *,
               complete: bool = True) -> Path:
    """A DCP checkpoint of ``step``; ``complete=False`` truncates its data file."""
    path = write_checkpoint(ckpt_dir, step, {"model": b"w" * 64, "optim": b"o" * 32},
                            fsync=False)
    if not complete:
        data = path / "__0_0.distcp"
        data.write_bytes(data.read_bytes()[:-10])
    else:
        os.utime(path / ".metadata", (clock.time(), clock.time()))
    return path


def train(orch: JobOrchestrator, clock: ManualClock, job: str, nodes: list[str],
          first: int, last: int, step_time: float = 1.0, skip: frozenset[int] = frozenset(),
          ) -> Any:
    """Every rank (one per node) does steps first..last, ``step_time`` apart."""
    reply = None
    for step in range(first, last + 1):
        clock.advance(step_time)
        for rank, name in enumerate(nodes):
            if rank in skip:
                continue
            reply = orch.progress(job, rank, name, len(nodes), [(step, clock.time())],
                                  step_time)
    return reply


def orchestrator(store: Store, clock: ManualClock, submit: RecordingSubmit,
                 labels: dict[str, dict[str, str]] | None = None,
                 settings: JobSettings | None = None) -> JobOrchestrator:
    known = labels if labels is not None else {}
    orch = JobOrchestrator(store, clock, submit, known.get, settings or JobSettings())
    orch.load_from_store()
    return orch
