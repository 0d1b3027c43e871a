"""The remediation ladder and the way back into service, end to end in one process.

The real controller (default rules, store, runner, policy, job registry; fake outside
systems for cordon/evict/alert) and a real agent's command executor on a simulated node
(fake NVML, the simulator's reset and reboot): each reply's commands are carried out by
the agent and its results go back in the node's next report, as on the wire.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sn_monitor.agent.settings import RemediationSettings, VerifySettings
from sn_monitor.clock import ManualClock
from sn_monitor.controller.jobs.spec import job_from_json
from sn_monitor.controller.remediation.ladder import LadderSettings, RemediationLadder
from sn_monitor.model import ReportReply
from sn_monitor.rules.spec import load_rules, packaged_rules
from tests.support.commands import Remedied
from tests.support.harness import Harness, make_harness, xid

JOB_NODES = ["n0", "n1", "n2", "n3"]
SPARE = "s0"


class Rig:
    """A controller, a job on four nodes and a spare, and n1's agent simulated."""

    def __init__(self, tmp_path: Path, *, in_job: bool = True, **ladder: Any) -> None:
        self.h: Harness = make_harness(tmp_path / "controller", load_rules([packaged_rules()]))
        if ladder:
            self.h.controller.remediation.settings = LadderSettings(**ladder)
        job = job_from_json(msgspec.json.encode({
            "apiVersion": "sn-monitor/v1", "kind": "DistributedJob",
            "metadata": {"name": "llm"},
            "spec": {"replicas": 4, "nodes": JOB_NODES, "spares": [SPARE],
                     "checkpoint": {"dir": str(tmp_path)},
                     "control": {"command": ["/bin/true"]}}}))
        if in_job:
            self.h.controller.jobs.add_job(job, "test")
        (tmp_path / "agent").mkdir()
        self.agent = Remedied(tmp_path / "agent", RemediationSettings(
            mode="enforce", verify=VerifySettings(dcgm_level=0)))
        self.agent.actuator = self.agent.node.actuator()
        self.agent.restart()
        for node in [*JOB_NODES, SPARE]:
            self.h.report(node, temps=[40])
        self.event_id = 0

    def exchange(self, **extra: Any) -> ReportReply:
        """n1 reports (with its agent's finished results); the agent runs the reply."""
        results = [msgspec.to_builtins(r) for r in self.agent.executor.finished()]
        reply = self.h.report("n1", temps=[40], command_results=results, **extra)
        if reply.commands:
            self.agent.clock.advance(1)
            self.agent.executor.execute(reply.commands)
            self.agent.sample()  # a verification waits for a sample newer than the question
            assert self.agent.executor.wait_idle(timeout=30)
        return reply

    def xid(self, code: int, gpu: int) -> None:
        self.exchange(events=[xid(self.event_id, code, self.h.clock.time(), gpu)])
        self.event_id += 1

    def run(self, rounds: int = 12, *, seconds: float = 1.0) -> None:
        """Reports, sweeps and agent work until the ladder rests (bounded)."""
        for _ in range(rounds):
            self.h.clock.advance(seconds)
            for node in [*JOB_NODES, SPARE]:
                if node != "n1":
                    self.h.report(node, temps=[40])
            self.h.controller.sweep()
            self.h.settle()
            self.exchange()
            self.h.settle()
            if not self.h.controller.remediation.active("n1"):
                return

    def repair(self) -> dict[str, Any]:
        return self.h.controller.remediation.repairs("n1")[0]

    def job(self) -> dict[str, Any]:
        doc = self.h.controller.get_job("llm")
        assert doc is not None
        return doc

    def close(self) -> None:
        self.agent.close()
        self.h.controller.close()
        self.h.store.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Any]:
    made: list[Rig] = []

    def make(*, in_job: bool = True, **ladder: Any) -> Rig:
        made.append(Rig(tmp_path, in_job=in_job, **ladder))
        return made[-1]
    yield make
    for one in made:
        one.close()


def test_a_reset_that_clears_the_fault_returns_the_node_to_the_spare_pool(rig: Any) -> None:
    r = rig()
    r.agent.node.inject("row-remap-pending", 3)  # XID 95 leaves a remap waiting for a reset
    r.xid(95, gpu=3)
    r.run()

    repair = r.repair()
    assert (repair["rung"], repair["step"]) == ("reset_gpu", "done"), repair["history"]
    assert any("verified" in line for line in repair["history"])
    kinds = [a["action"] for a in r.h.actions() if a["node"] == "n1"]
    assert kinds.count("reset_gpu") == 1
    assert kinds.count("verify") == 1
    assert "reboot" not in kinds
    # the job went on on the spare; n1 is the job's spare now, with no person
    job = r.job()
    assert "n1" in job["spares"], job
    assert "n1" not in job["nodes"], job
    audit = r.h.actions("return-to-service")
    assert len(audit) == 1
    assert "passed its check after reset_gpu" in audit[0]["reason"]
    # the reset cleared the fault: the XID's incident is closed, and says why
    (incident,) = [i for i in r.h.controller.list_incidents(None, "n1", 10)
                   if i["rule"] == "fatal-xid"]
    assert incident["status"] == "closed"
    assert not r.agent.sample().gpus[3].row_remap_pending


def test_a_fault_the_reset_leaves_is_rebooted_away(rig: Any) -> None:
    r = rig()
    r.agent.node.inject("pcie-downgrade", 2, width=8)  # the slot: a reset does not retrain it
    r.xid(95, gpu=2)
    r.run()
    repair = r.repair()
    assert (repair["rung"], repair["step"]) == ("reboot", "done"), repair["history"]
    assert any("failed its check: pcie-links" in line for line in repair["history"])
    assert "n1" in r.job()["spares"]


def test_a_node_no_rung_repairs_stays_out_and_pages_a_person(rig: Any) -> None:
    r = rig()
    r.agent.node.inject("row-remap-failure", 1)  # out of spare rows: only an RMA helps
    r.xid(64, gpu=1)
    r.run()
    repair = r.repair()
    assert (repair["rung"], repair["step"]) == ("replace", "replace"), repair["history"]
    kinds = [a["action"] for a in r.h.actions() if a["node"] == "n1"]
    assert kinds.count("reset_gpu") == 1
    assert kinds.count("reboot") == 1
    assert kinds.count("verify") == 2
    job = r.job()
    assert "n1" not in job["spares"]
    assert "n1" not in job["nodes"]
    page = [a for a in r.h.actions("alert") if "needs a person" in a["reason"]]
    assert len(page) == 1
    assert "row-remap" in page[0]["reason"]
    assert r.h.actions("return-to-service") == []


def test_the_catalogue_starts_xid_79_at_a_reboot(rig: Any) -> None:
    r = rig()
    r.xid(79, gpu=0)
    r.run()
    repair = r.repair()
    assert (repair["rung"], repair["step"]) == ("reboot", "done"), repair["history"]
    kinds = [a["action"] for a in r.h.actions() if a["node"] == "n1"]
    assert "reset_gpu" not in kinds


def test_a_gpu_in_use_is_waited_for_and_never_rebooted_away(rig: Any) -> None:
    r = rig(retry_every=10.0, idle_wait=60.0)
    r.agent.node.gpus[3].set_processes([(4242, 2**30)])
    r.xid(95, gpu=3)
    r.run(rounds=3, seconds=1.0)
    repair = r.repair()
    assert repair["step"] == "waiting", repair["history"]
    assert "in use by process 4242" in " ".join(repair["history"])
    r.agent.node.gpus[3].set_processes([])  # the job's ranks left for the spare
    r.run(rounds=12, seconds=5.0)
    assert (r.repair()["rung"], r.repair()["step"]) == ("reset_gpu", "done")

    r.agent.node.gpus[3].set_processes([(4243, 2**30)])  # another fault, still in use
    r.h.clock.advance(3 * 86400)  # long after the last repair: not a repeat
    r.xid(95, gpu=3)
    r.run(rounds=30, seconds=5.0)
    repair = r.repair()
    assert (repair["rung"], repair["step"]) == ("replace", "replace"), repair["history"]
    assert "the node stayed in use for 1m" in " ".join(repair["history"])
    kinds = [a["action"] for a in r.h.actions() if a["node"] == "n1"]
    assert "reboot" not in kinds


def test_a_repeat_within_a_day_starts_one_rung_higher(rig: Any) -> None:
    r = rig()
    r.xid(95, gpu=3)
    r.run()
    assert r.repair()["rung"] == "reset_gpu"
    r.h.clock.advance(3600)
    r.xid(95, gpu=3)
    r.run()
    repair = r.repair()
    assert (repair["rung"], repair["step"]) == ("reboot", "done"), repair["history"]
    assert "reset_gpu repaired it 1h" in repair["reason"]


def test_a_ladder_survives_a_controller_restart(rig: Any, tmp_path: Path) -> None:
    r = rig(retry_every=10.0)
    r.agent.node.gpus[3].set_processes([(4242, 2**30)])
    r.xid(95, gpu=3)
    r.run(rounds=2)
    assert r.repair()["step"] == "waiting"
    store = r.h.store
    r.h.controller.close()
    again = make_harness(tmp_path / "controller", load_rules([packaged_rules()]), store=store)
    r.h = again
    r.agent.node.gpus[3].set_processes([])
    r.run(rounds=12, seconds=5.0)
    assert (r.repair()["rung"], r.repair()["step"]) == ("reset_gpu", "done")


def test_a_restart_does_not_repair_again_what_a_ladder_already_took_in(
        rig: Any, tmp_path: Path) -> None:
    """Two faults, one repair: neither incident's rung is asked for again after a restart.

    On a node in no job (a job's recovery owns the incidents on its nodes).

    An incident may stay open after the repair (until a person closes it); a restarted
    controller settles again the actions it cannot find recorded, and a rung is recorded
    by the ladder, not by the incident.
    """
    r = rig(in_job=False)
    r.exchange(events=[xid(0, 95, r.h.clock.time(), 3), xid(1, 95, r.h.clock.time(), 2)])
    r.event_id = 2
    r.run()
    first = r.repair()
    assert (first["rung"], first["step"]) == ("reset_gpu", "done"), first["history"]
    assert len(first["incidents"]) == 2
    open_ids = {i["id"] for i in r.h.controller.list_incidents("open", "n1", 100)}
    assert set(first["incidents"]) & open_ids  # still open: settled again after a restart
    resets = len(r.h.actions("reset_gpu"))

    store = r.h.store
    r.h.controller.close()
    r.h = make_harness(tmp_path / "controller", load_rules([packaged_rules()]), store=store)
    r.run(rounds=3, seconds=5.0)
    assert r.h.controller.remediation.repairs("n1") == [first]
    assert len(r.h.actions("reset_gpu")) == resets
    assert r.h.actions("reboot") == []


def test_a_node_a_person_uncordons_returns_to_the_pool_only_after_its_check(rig: Any) -> None:
    r = rig()
    r.agent.node.inject("row-remap-failure", 1)
    r.xid(64, gpu=1)
    r.run()
    assert r.repair()["step"] == "replace"
    assert "n1" not in r.job()["spares"]

    # a person swaps the GPU's board and lifts the cordon; the check runs first
    r.agent.node.gpus[1].row_remap_failed = False
    r.h.controller.manual_action("uncordon", "n1", "alice", "board replaced")
    r.run()
    repair = r.repair()
    assert (repair["rung"], repair["step"]) == ("check", "done"), repair["history"]
    assert "uncordoned by alice" in repair["reason"]
    assert "n1" in r.job()["spares"]


def test_a_person_uncordoning_a_node_that_fails_its_check_keeps_it_out_of_the_pool(
        rig: Any) -> None:
    r = rig()
    r.agent.node.inject("row-remap-failure", 1)
    r.xid(64, gpu=1)
    r.run()
    r.h.controller.manual_action("uncordon", "n1", "bob", "looked fine to me")
    r.run()
    repair = r.repair()
    assert (repair["rung"], repair["step"]) == ("replace", "replace"), repair["history"]
    assert any("failed its check: row-remap" in line for line in repair["history"])
    assert "n1" not in r.job()["spares"]
    assert [a for a in r.h.actions("cordon") if a["node"] == "n1"] == []  # bob's call stands


def test_the_ladders_are_served_by_the_api(rig: Any, tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from sn_monitor.controller.api.app import build_app

    r = rig()
    r.xid(95, gpu=3)
    r.run()
    with TestClient(build_app(r.h.controller, None)) as client:
        every = client.get("/api/v1/remediation").json()["repairs"]
        assert [(x["node"], x["rung"], x["step"]) for x in every] == [
            ("n1", "reset_gpu", "done")]
        assert client.get("/api/v1/remediation", params={"node": "n2"}).json() == {
            "repairs": []}
        assert client.get("/api/v1/remediation", params={"nod": "n2"}).status_code == 422


def test_with_the_ladder_off_a_fault_takes_the_node_out_and_nothing_more(rig: Any) -> None:
    r = rig(enabled=False)
    r.xid(95, gpu=3)
    r.run(rounds=3)
    assert r.h.controller.remediation.repairs() == []
    kinds = {a["action"] for a in r.h.actions() if a["node"] == "n1"}
    assert "evict" in kinds
    assert not kinds & {"reset_gpu", "reboot", "verify"}
    assert "n1" not in r.job()["spares"]


def test_a_spare_that_faults_leaves_the_pool_and_comes_back_after_its_repair(rig: Any) -> None:
    r = rig()
    r.xid(95, gpu=3)  # n1 fails over to the spare s0 and is repaired: now a spare itself
    r.run()
    assert "n1" in r.job()["spares"]
    r.h.clock.advance(3 * 86400)
    r.agent.node.inject("pcie-downgrade", 2, width=8)  # a fault of the spare: out of the pool
    r.xid(95, gpu=2)
    r.h.settle()
    assert "n1" not in r.job()["spares"]
    r.run()  # reset (the slot stays narrow), reboot (retrained), check: back again
    assert (r.repair()["rung"], r.repair()["step"]) == ("reboot", "done")
    assert "n1" in r.job()["spares"]


def test_saved_ladders_that_cannot_be_read_are_logged_and_forgotten(
        rig: Any, caplog: pytest.LogCaptureFixture) -> None:
    r = rig()
    r.h.store.set_meta("remediation", "{not json")
    r.h.controller.remediation.load()
    assert r.h.controller.remediation.repairs() == []
    assert "the saved ladders cannot be read" in caplog.text
    r.xid(95, gpu=3)  # and the ladder works on
    r.run()
    assert (r.repair()["rung"], r.repair()["step"]) == ("reset_gpu", "done")


class _FlakyStore:
    """The ladder's ports with a store that refuses the first write (an outage)."""

    def __init__(self) -> None:
        self.saved: list[str] = []
        self.refusals = 1

    def submit_rung(self, action: str, repair: Any, reason: str) -> tuple[str, str]:
        return f"{action}-1", "submitted"

    def return_to_service(self, repair: Any, checks: str) -> None:
        return None

    def needs_replacement(self, repair: Any, *, cordon: bool = True) -> None:
        return None

    def did_nothing(self, action_id: str) -> None:
        return None

    def load(self) -> str | None:
        return None

    def save(self, text: str) -> None:
        if self.refusals:
            self.refusals -= 1
            raise OSError("database is locked")
        self.saved.append(text)


def test_ladders_not_written_in_an_outage_are_written_at_the_next_sweep() -> None:
    store = _FlakyStore()
    ladder = RemediationLadder(LadderSettings(), ManualClock(1_700_000_000.0), store)
    ladder.start("n1", 0, "reset_gpu", rule="fatal-xid", reason="XID 48", incident_id=1)
    assert store.saved == []  # written once a sweep, not at each change
    with pytest.raises(OSError, match="database is locked"):
        ladder.persist()
    ladder.persist()  # the next sweep's write carries what the refused one had
    (text,) = store.saved
    assert '"node": "n1"' in text
    ladder.persist()  # nothing changed since: nothing written
    assert len(store.saved) == 1
