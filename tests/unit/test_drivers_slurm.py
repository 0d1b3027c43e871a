"""The Slurm driver with a fake scontrol (a shell script that records its argv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sn_monitor.controller.actions.base import PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.slurm import SlurmDriver, SlurmSettings, parse_show_node
from sn_monitor.controller.audit import ActionRequest
from tests.drivers.servers import FakeScontrol, make_fake_scontrol, show_node


@pytest.fixture
def scontrol(tmp_path: Path) -> FakeScontrol:
    fake = make_fake_scontrol(tmp_path / "bin")
    fake.set_node("n1", "IDLE")
    return fake


def slurm(fake: FakeScontrol, timeout: float = 5.0) -> SlurmDriver:
    return SlurmDriver(SlurmSettings(scontrol=fake.path, timeout=timeout))  # type: ignore[arg-type]


def act(action: str, reason: str = "GPU 3 XID 79; \"quoted\" $(rm -rf /)") -> ActionRequest:
    return ActionRequest(id="a", key="k", action=action, node="n1",  # type: ignore[arg-type]
                         reason=reason)


@pytest.mark.parametrize("action", ["cordon", "evict"])
def test_cordon_and_evict_drain(scontrol: FakeScontrol, action: str) -> None:
    outcome = slurm(scontrol).run(act(action))
    assert scontrol.calls() == [
        'update NodeName=n1 State=DRAIN Reason=sn-monitor: GPU 3 XID 79; "quoted" $(rm -rf /)']
    assert outcome.details["reason"].startswith("sn-monitor: ")


def test_uncordon_resumes_our_drain(scontrol: FakeScontrol) -> None:
    scontrol.set_node("n1", "IDLE+DRAIN", "sn-monitor: GPU 3 XID 79")
    slurm(scontrol).run(act("uncordon"))
    assert scontrol.calls() == ["show node n1", "update NodeName=n1 State=RESUME"]


def test_uncordon_refuses_someone_elses_drain(scontrol: FakeScontrol) -> None:
    scontrol.set_node("n1", "MIXED+DRAIN", "bad DIMM, ticket 4711")
    with pytest.raises(PermanentError, match="drained by someone else"):
        slurm(scontrol).run(act("uncordon"))
    assert scontrol.calls() == ["show node n1"]


def test_uncordon_of_a_node_not_drained_is_done(scontrol: FakeScontrol) -> None:
    outcome = slurm(scontrol).run(act("uncordon"))
    assert outcome.details["changed"] is False
    assert scontrol.calls() == ["show node n1"]


def test_reconcile(scontrol: FakeScontrol) -> None:
    driver = slurm(scontrol)
    assert driver.reconcile(act("cordon")) is False
    assert driver.reconcile(act("uncordon")) is True
    scontrol.set_node("n1", "IDLE+DRAIN", "sn-monitor: hot")
    assert driver.reconcile(act("evict")) is True
    assert driver.reconcile(act("uncordon")) is False
    scontrol.set_node("n1", "IDLE+DRAIN", "maintenance")
    assert driver.reconcile(act("cordon")) is False


def test_invalid_node_is_permanent_other_failures_temporary(scontrol: FakeScontrol) -> None:
    scontrol.fail_with("slurm_update error: Invalid node name specified\n")
    with pytest.raises(PermanentError, match="Invalid node name"):
        slurm(scontrol).run(act("cordon"))
    scontrol.fail_with("slurm_update error: Unable to contact slurm controller\n")
    with pytest.raises(TemporaryError, match="Unable to contact"):
        slurm(scontrol).run(act("cordon"))


def test_timeout_is_temporary(scontrol: FakeScontrol) -> None:
    scontrol.hang(30)
    with pytest.raises(TemporaryError, match="timed out"):
        slurm(scontrol, timeout=0.3).run(act("cordon"))


def test_missing_scontrol_is_permanent(tmp_path: Path) -> None:
    driver = SlurmDriver(SlurmSettings(scontrol=str(tmp_path / "nope")))
    with pytest.raises(PermanentError, match="cannot run"):
        driver.run(act("cordon"))


def test_other_actions_are_refused(scontrol: FakeScontrol) -> None:
    with pytest.raises(PermanentError):
        slurm(scontrol).run(act("throttle"))


@pytest.mark.parametrize(("state", "reason", "drained", "ours"), [
    ("IDLE", None, False, False),
    ("IDLE+DRAIN", "sn-monitor: hot", True, True),
    ("DOWN*+DRAIN", "Not responding", True, False),
    ("MIXED+DRAIN", "sn-monitor: GPU 3 XID 79 [x]", True, True),
])
def test_parse_show_node(state: str, reason: str | None, drained: bool, ours: bool) -> None:
    parsed = parse_show_node(show_node("n1", state, reason))
    assert parsed.state == state
    assert parsed.reason == reason
    assert parsed.drained is drained
    assert parsed.ours is ours


# Real ``scontrol show node`` output of Slurm 22.05 (Debian 12), captured from the
# throwaway cluster of tests/slurm.py.
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


@pytest.mark.parametrize(("name", "state", "reason", "ours"), [
    ("show_node_idle.txt", "IDLE", None, False),
    ("show_node_idle_drain.txt", "IDLE+DRAIN",
     'sn-monitor: GPU 3 XID 79; "quoted" $(rm -rf /)', True),
    ("show_node_allocated_drain.txt", "ALLOCATED+DRAIN", "bad DIMM, ticket 4711", False),
])
def test_parse_real_show_node(name: str, state: str, reason: str | None, ours: bool) -> None:
    parsed = parse_show_node((FIXTURES / name).read_text())
    assert (parsed.state, parsed.reason, parsed.ours) == (state, reason, ours)
    assert parsed.drained is ("DRAIN" in state)


def test_unknown_node_on_stdout_is_permanent(tmp_path: Path) -> None:
    """``scontrol show node n9`` prints "Node n9 not found" on stdout, nothing on stderr,
    and exits 1 (as an unreachable slurmctld also exits 1)."""
    script = tmp_path / "scontrol"
    script.write_text("#!/bin/sh\necho \"Node $3 not found\"\nexit 1\n")
    script.chmod(0o755)
    driver = SlurmDriver(SlurmSettings(scontrol=str(script)))
    with pytest.raises(PermanentError, match="Node n1 not found"):
        driver.run(act("uncordon"))
