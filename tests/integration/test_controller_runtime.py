"""The controller's runtime, from outside: a real ``sn-monitor controller`` process.

- A checkpoint directory whose listing blocks for 10 s (the file system call slowed in
  the controller process by a ``sitecustomize`` the test writes): reports keep being
  answered while it blocks and none is lost, and the sweep does not stall (their
  latency is measured in ``make bench``, not here).
- Each worker broken by an unexpected exception (the same ``sitecustomize`` makes its
  next call raise when the test drops a file named after it): it is logged, started
  again (``sn_controller_worker_up`` back to 1) and the controller still works; a broken
  server stops the process in order.
- SIGTERM under load: the process ends within the stop deadline, exit 0.
- A ``GET /api/v1/topology`` whose document is being built (held there by the same
  ``sitecustomize`` until the test lets it go): reports and ``/livez`` are answered
  meanwhile, so the event loop waits for no API read.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import requests

from sn_monitor.controller.supervision.runtime import STOP_DEADLINE_SECONDS
from tests.integration.cluster import Cluster, ClusterHa, metric_value

pytestmark = pytest.mark.integration

WAIT = 60.0
NODES = [f"sim-{i}" for i in range(16)]
#: How long the checkpoint directory's listing blocks.
BLOCK_SECONDS = 10.0

SITECUSTOMIZE = '''\
"""Test hooks for one controller process (tests/integration/test_controller_runtime.py)."""
import functools, os, pathlib, time

_slow = os.environ.get("SN_TEST_SLOW_LISTING")
if _slow:
    _iterdir = pathlib.Path.iterdir

    def _slow_iterdir(self):
        if str(self) == _slow and os.path.exists(_slow + ".slow"):
            pathlib.Path(_slow + ".listing").touch()
            time.sleep(BLOCK)
            os.remove(_slow + ".slow")
        return _iterdir(self)

    pathlib.Path.iterdir = _slow_iterdir

_hold = os.environ.get("SN_TEST_HOLD_TOPOLOGY")
if _hold:
    import sn_monitor.controller.service.topology_desk as _topology_desk

    _build = _topology_desk.fleet_topology

    def _held_build(*args, **kwargs):
        if os.path.exists(_hold):
            pathlib.Path(_hold + ".building").touch()
            deadline = time.monotonic() + 300  # a bound on the test, should it fail
            while os.path.exists(_hold) and time.monotonic() < deadline:
                time.sleep(0.05)
        return _build(*args, **kwargs)

    _topology_desk.fleet_topology = _held_build

_breaks = os.environ.get("SN_TEST_BREAK_DIR")
if _breaks:
    import importlib

    TARGETS = {
        "sweep": ("sn_monitor.controller.service", "Controller", "sweep"),
        "writer": ("sn_monitor.controller.storage.writer", "StoreWriter", "_write"),
        "actions": ("sn_monitor.controller.actions.runner", "ActionRunner", "tick"),
        "checkpoints": ("sn_monitor.controller.jobs.orchestrator", "JobOrchestrator",
                        "scan_checkpoints"),
        "reload": ("sn_monitor.controller.service", "Controller", "reload_rules"),
        "server": ("sn_monitor.controller.process.server", "NotifyingServer", "on_tick"),
        "lease": ("sn_monitor.controller.ha.elector", "Elector", "check"),
    }

    def _breakable(worker, method):
        flag = os.path.join(_breaks, worker)

        @functools.wraps(method)
        def call(*args, **kwargs):
            if os.path.exists(flag):
                os.remove(flag)
                raise RuntimeError(f"{worker} broken by the test")
            return method(*args, **kwargs)
        return call

    for _worker, (_module, _cls, _name) in TARGETS.items():
        _owner = getattr(importlib.import_module(_module), _cls)
        setattr(_owner, _name, _breakable(_worker, getattr(_owner, _name)))
'''


class Rig:
    """The controller process, its job with a checkpoint directory, a report sender."""

    def __init__(self, root: Path, ha: ClusterHa | None = None) -> None:
        self.site = root / "site"
        self.site.mkdir(parents=True)
        (self.site / "sitecustomize.py").write_text(
            SITECUSTOMIZE.replace("BLOCK", repr(BLOCK_SECONDS)))
        self.breaks = root / "breaks"
        self.breaks.mkdir()
        #: While this file exists, a topology being built waits (see SITECUSTOMIZE).
        self.hold_topology = root / "hold-topology"
        self.ckpt = root / "ckpt"
        self.ckpt.mkdir()
        self.cluster = Cluster(root, nodes=0, config={
            "recovery": {"scan_interval": "1s"}}, ha=ha)
        for controller in self.cluster.controllers:
            controller.env = {
                **os.environ, "PYTHONPATH": os.pathsep.join(
                    [str(self.site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                "SN_TEST_SLOW_LISTING": str(self.ckpt), "SN_TEST_BREAK_DIR": str(self.breaks),
                "SN_TEST_HOLD_TOPOLOGY": str(self.hold_topology)}
        self.sequence = 0
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {self.cluster.agent_token}",
                                     "Content-Type": "application/json"})

    def start(self) -> None:
        self.cluster.start_controller(WAIT)
        job = {"apiVersion": "sn-monitor/v1", "kind": "DistributedJob",
               "metadata": {"name": "train"},
               "spec": {"replicas": 4, "nodes": NODES[:4], "checkpointInterval": "1h",
                        "checkpoint": {"dir": str(self.ckpt)}}}
        answer = requests.post(f"{self.cluster.url}/api/v1/jobs", json=job, timeout=30,
                               headers={"Authorization": f"Bearer {self.cluster.admin_token}"})
        assert answer.status_code == 201, answer.text

    def report(self, node: str) -> None:
        """One report (asserts it was accepted)."""
        self.sequence += 1
        body = msgspec.json.encode({
            "node": node, "instance": "rig", "sequence": self.sequence,
            "sample_time_seconds": time.time(), "interval_seconds": 1.0,
            "gpus": [{"index": i, "temperature_celsius": 50.0} for i in range(8)]})
        answer = self.session.post(f"{self.cluster.url}/api/v1/reports", data=body,
                                   timeout=30)
        assert answer.status_code == 200, answer.text

    def rounds_of_reports(self, rounds: int) -> int:
        """Every node reports, ``rounds`` times over: how many reports."""
        for _ in range(rounds):
            for node in NODES:
                self.report(node)
        return rounds * len(NODES)

    def log_lines(self, needle: str) -> list[dict[str, object]]:
        """The controller's JSON log records whose message holds ``needle``."""
        text = self.cluster.controller.log_path.read_text(encoding="utf-8", errors="replace")
        records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        return [r for r in records if needle in str(r.get("message", ""))]

    def metrics(self) -> str:
        return self.cluster.controller_metrics()

    def accepted(self) -> float:
        return metric_value(self.metrics(), "sn_controller_reports_total",
                            outcome="accepted") or 0.0

    def close(self) -> None:
        self.session.close()
        self.cluster.close()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    rig = Rig(tmp_path_factory.mktemp("runtime"))
    try:
        rig.start()
        yield rig
    finally:
        rig.close()


def test_a_blocked_checkpoint_listing_stalls_no_report(rig: Rig) -> None:
    before = rig.accepted()
    (rig.ckpt.parent / (rig.ckpt.name + ".slow")).touch()
    listing = rig.ckpt.parent / (rig.ckpt.name + ".listing")
    rig.cluster.wait_for(listing.exists, WAIT, "the controller listing the directory")
    sent = rig.rounds_of_reports(3)
    # Each answered while the listing still blocked (it removes .slow when it ends): none
    # waited for it. Their latencies are measured in make bench, not here.
    assert (rig.ckpt.parent / (rig.ckpt.name + ".slow")).exists(), \
        "a report waited for the listing (or the block ended early)"
    assert rig.accepted() - before == sent, "a report was lost"
    assert not rig.cluster.logs_containing("controller stalled"), \
        "the sweep stalled behind the listing"
    rig.cluster.wait_for(lambda: not (rig.ckpt.parent / (rig.ckpt.name + ".slow")).exists(),
                         WAIT, "the listing to end")


def test_a_topology_being_built_holds_no_report(rig: Rig) -> None:
    for node in NODES:
        rig.report(node)
    before = rig.accepted()
    rig.hold_topology.touch()
    building = Path(str(rig.hold_topology) + ".building")
    answers: list[requests.Response] = []
    reader = threading.Thread(target=lambda: answers.append(requests.get(
        f"{rig.cluster.url}/api/v1/topology", timeout=600,
        headers={"Authorization": f"Bearer {rig.cluster.admin_token}"})), name="topology")
    reader.start()
    try:
        rig.cluster.wait_for(building.exists, WAIT, "the topology document being built")
        for node in NODES:  # each answered (200) while the document is still held
            rig.report(node)
        assert requests.get(f"{rig.cluster.url}/livez", timeout=30).status_code == 200
        assert not answers, "the topology was answered before the test let it go"
        assert rig.accepted() - before == len(NODES)
    finally:
        rig.hold_topology.unlink(missing_ok=True)
        reader.join(WAIT)
    assert not reader.is_alive(), "the topology read never ended"
    assert answers[0].status_code == 200, answers[0].text
    assert sorted(answers[0].json()["nodes"]) == sorted(NODES)


@pytest.mark.parametrize("worker", ["sweep", "writer", "actions", "checkpoints", "reload"])
def test_a_broken_worker_is_logged_and_started_again(rig: Rig, worker: str) -> None:
    failed = f"worker {worker} failed"
    seen = len(rig.cluster.logs_containing(failed))
    (rig.breaks / worker).touch()
    if worker == "reload":
        assert rig.cluster.controller.popen is not None
        rig.cluster.controller.popen.send_signal(signal.SIGHUP)
    elif worker == "writer":
        rig.report(NODES[0])  # a new label set is a write; any report's events would do
        rig.report("sim-new-" + str(rig.sequence))
    rig.cluster.wait_for(lambda: len(rig.cluster.logs_containing(failed)) > seen, WAIT,
                         f"the {worker} worker's failure logged")
    line = rig.log_lines(failed)[-1]
    assert f"{worker} broken by the test" in json.dumps(line), line  # with its traceback
    rig.cluster.wait_for(
        lambda: metric_value(rig.metrics(), "sn_controller_worker_up", worker=worker) == 1.0,
        WAIT, f"the {worker} worker up again")
    assert not (rig.breaks / worker).exists()
    rig.report(NODES[1])  # and the controller still answers
    assert rig.cluster.controller.running


def test_sigterm_under_load_ends_within_the_deadline(rig: Rig) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def load() -> None:
        for _ in range(100_000):
            if stop.is_set():
                return
            try:
                rig.report(NODES[2])
            except (requests.RequestException, AssertionError):
                return  # the controller went away: expected
            except BaseException as err:  # noqa: BLE001 -- handed to the test
                errors.append(err)
                return

    before = rig.accepted()
    sender = threading.Thread(target=load, name="test-report-load")
    sender.start()
    try:
        rig.cluster.wait_for(lambda: rig.accepted() >= before + 20, WAIT, "reports flowing")
        proc = rig.cluster.controller.popen
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=STOP_DEADLINE_SECONDS + 15)
    finally:
        stop.set()
        sender.join(timeout=WAIT)
    assert not errors
    assert code == 0, rig.cluster.logs()
    # within its own deadline: no worker named as still running at it
    assert not rig.cluster.logs_containing("did not stop within the deadline")
    assert rig.cluster.logs_containing("controller stopped")


def test_a_broken_server_stops_the_process_in_order(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        rig.start()
        proc = rig.cluster.controller.popen
        assert proc is not None
        (rig.breaks / "server").touch()
        code = proc.wait(timeout=STOP_DEADLINE_SECONDS + 15)
        assert code != 0
        assert rig.cluster.logs_containing("server broken by the test")
        assert rig.cluster.logs_containing("controller stopped")
    finally:
        rig.close()


def test_a_broken_lease_renewer_stops_the_active_and_the_standby_takes_over(
        tmp_path: Path, pg_dsn: str) -> None:
    rig = Rig(tmp_path, ha=ClusterHa(pg_dsn))
    try:
        rig.cluster.start_controller(WAIT)
        active = rig.cluster.find_active(WAIT)
        assert active.popen is not None
        (rig.breaks / "lease").touch()
        code = active.popen.wait(timeout=STOP_DEADLINE_SECONDS + 30)
        assert code == 1, active.tail()
        assert "worker lease failed" in active.tail(200)
        assert "lease broken by the test" in active.tail(200)
        successor = rig.cluster.find_active(WAIT)
        assert successor is not active
    finally:
        rig.close()
