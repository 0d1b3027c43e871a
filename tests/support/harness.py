"""The controller in process with a manual clock: ``make_harness`` builds one on a
temporary store with recording drivers, ``report_body`` and ``xid`` write what an agent
reports, ``rules_from`` parses rule text. Nearly every controller test starts here, so
they all drive the same Controller the same way."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from sn_monitor.clock import ManualClock
from sn_monitor.config import Duration, parse_yaml
from sn_monitor.controller.actions.base import Outcome
from sn_monitor.controller.actions.policy import PolicySettings
from sn_monitor.controller.actions.routing import Drivers, build_drivers
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.security.auth import OPEN_ACCESS, Identity
from sn_monitor.controller.service import Controller
from sn_monitor.controller.settings import ControllerSettings, DriverSettings
from sn_monitor.controller.storage.store import Store
from sn_monitor.model import ReportReply
from sn_monitor.rules.spec import Rule, parse_rules

T0 = 1_700_000_000.0


HOT_RULE = """
- name: gpu-hot
  metric: gpu_temperature_celsius
  above: 85
  for: 5s
  clear_below: 80
  severity: critical
  actions: [throttle, alert]
"""


XID_RULE = """
- name: fatal-xid
  event: xid
  codes: [79]
  clear_after: {clear_after}
  severity: critical
  actions: [alert, failover]
"""


HEARTBEAT_RULE = """
- name: node-lost
  heartbeat_timeout: 10s
  severity: critical
  actions: [alert, failover]
"""


def rules_from(text: str) -> list[Rule]:
    return parse_rules(parse_yaml(text, "test-rules.yaml"))


class FakeDriver:
    """An outside system that does what it is asked and remembers it."""

    idempotent = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[ActionRequest] = []
        self._lock = threading.Lock()

    def run(self, request: ActionRequest) -> Outcome:
        with self._lock:
            self.calls.append(request)
        return Outcome(f"{self.name} did {request.action} on {request.node}")

    def actions(self) -> list[str]:
        with self._lock:
            return [c.action for c in self.calls]


@dataclass
class Harness:
    """A controller with fake outside systems, a manual clock and a store on disk."""

    controller: Controller
    clock: ManualClock
    store: Store
    drivers: Drivers
    fakes: dict[str, FakeDriver]
    sequences: dict[str, int] = field(default_factory=dict)

    def report(self, node: str, *, temps: Sequence[float] = (), instance: str = "i1",
               sequence: int | None = None, identity: Identity = OPEN_ACCESS,
               peer: str | None = None, **extra: Any) -> ReportReply:
        """One report from ``node``'s agent, sampled now; sequence numbers count up."""
        if sequence is None:
            sequence = self.sequences.get(f"{node}/{instance}", 0) + 1
        self.sequences[f"{node}/{instance}"] = sequence
        body = report_body(node, temps=temps, instance=instance, sequence=sequence,
                           sample_time=self.clock.time(), **extra)
        return self.controller.ingest(body, identity, peer)

    def settle(self) -> None:
        """Wait until every decision queued for the writer is handed on and none runs.

        A settled action goes to the runner through the writer's thread (where the
        controller runs one): an idle runner alone may only mean it is still queued.
        """
        for _ in range(20):
            assert self.controller.writer.flush(10), "store writes still queued after 10 s"
            assert self.controller.runner.wait_idle(10), "actions still running after 10 s"
            if self.controller.writer.depth == 0:
                return
        raise AssertionError("the writer and the runner still hand work on after 20 rounds")

    def actions(self, action: str | None = None) -> list[dict[str, Any]]:
        self.settle()
        found = self.controller.list_actions(None, None, 1000)
        return [a for a in found if action is None or a["action"] == action]


def report_body(node: str, *, temps: Sequence[float] = (), instance: str = "i1",
                sequence: int = 1, sample_time: float = T0, **extra: Any) -> bytes:
    doc: dict[str, Any] = {
        "node": node, "instance": instance, "sequence": sequence,
        "sample_time_seconds": sample_time, "interval_seconds": 1.0,
        "gpus": [{"index": i, "temperature_celsius": t} for i, t in enumerate(temps)],
    }
    doc.update(extra)
    return msgspec.json.encode(doc)


def make_harness(tmp_path: Path, rules: Sequence[Rule], *, settle: float = 0.0,
                 policy: PolicySettings | None = None, store: Store | None = None,
                 drivers: DriverSettings | None = None,
                 fake: Sequence[str] = ("alert", "cordon", "uncordon", "evict", "failover",
                                        "checkpoint", "restore"),
                 xid_catalog: str | None = None) -> Harness:
    """A started controller; the actions in ``fake`` go to :class:`FakeDriver` s."""
    clock = ManualClock(T0)
    settings = ControllerSettings(
        state_dir=str(tmp_path), settle=Duration(settle),
        policy=policy or PolicySettings(), drivers=drivers or DriverSettings(),
        xid_catalog=xid_catalog,
    )
    built = build_drivers(settings.drivers, settings.routes, clock)
    fakes = {action: FakeDriver(f"fake-{action}") for action in fake}
    built.by_action.update(fakes)
    if store is None:
        store = Store(tmp_path / "controller.db")
    controller = Controller(settings, rules, clock, store, built)
    controller.start()
    return Harness(controller, clock, store, built, fakes)


def xid(event_id: int, code: int, at: float, gpu: int = 0) -> dict[str, Any]:
    return {"id": event_id, "kind": "xid", "source": "kmsg", "time_seconds": at,
            "code": code, "gpu": gpu, "message": f"Xid {code}"}
