from __future__ import annotations

import json
import logging
import stat
from dataclasses import replace

import msgspec
import pytest

from sn_monitor.agent.commands import CommandExecutor
from sn_monitor.agent.guard import STATE_FILE, ThermalGuard
from sn_monitor.agent.nvml import NvmlError
from sn_monitor.agent.remedy import RebootLedger
from sn_monitor.agent.settings import GuardSettings, RemediationSettings, VerifySettings
from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot
from sn_monitor.clock import ManualClock
from sn_monitor.model import Command, CommandResult, Report
from sn_monitor.sim import fake_nvml
from tests.support.commands import Remedied


class Gpus:
    """Power limits as NVML would hold them; the guard's setter."""

    def __init__(self, count: int = 4, limit: float = 700.0) -> None:
        self.limits = {i: limit for i in range(count)}
        self.calls: list[tuple[int, float]] = []
        self.refuse: set[int] = set()

    def set(self, gpu: int, watts: float) -> None:
        self.calls.append((gpu, watts))
        if gpu in self.refuse:
            raise NvmlError(f"GPU {gpu}: No permission")
        self.limits[gpu] = watts

    def snapshot(self, clock: ManualClock) -> NodeSnapshot:
        return NodeSnapshot("n", clock.time(), gpus=tuple(
            GpuSample(index=i, uuid=f"GPU-{i}", name="H100", pci_bus_id="0000:18:00.0",
                      temperature_celsius=60.0, slowdown_temperature_celsius=89.0,
                      power_limit_watts=limit, power_default_limit_watts=700.0,
                      power_min_limit_watts=200.0, power_max_limit_watts=700.0)
            for i, limit in self.limits.items()))


@pytest.fixture
def setup(tmp_path, request):
    mode = getattr(request, "param", "enforce")
    clock, gpus = ManualClock(), Gpus()
    guard = ThermalGuard(GuardSettings(mode=mode), gpus.set, tmp_path, clock)
    guard.observe(gpus.snapshot(clock))
    return clock, gpus, guard


def throttle(command_id: str, **fields) -> Command:
    return Command(id=command_id, kind="throttle", **fields)


def test_throttle_by_fraction_of_the_default_limit(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock)
    [result] = executor.execute([throttle("c1", gpu=2, power_fraction=0.6, reason="hot")])
    assert result.ok
    assert result.id == "c1"
    assert result.time_seconds == clock.time()
    assert not result.dry_run
    assert gpus.limits[2] == pytest.approx(420.0)
    assert guard.throttled() == {2}
    assert guard.caps()[2].owner == "controller"


def test_throttle_by_watts_and_release_restores_the_original(setup, tmp_path):
    clock, gpus, guard = setup
    gpus.limits[1] = 650.0  # the operator's own limit
    guard.observe(gpus.snapshot(clock))
    executor = CommandExecutor(guard, clock)
    [capped] = executor.execute([throttle("c1", gpu=1, power_watts=450.0)])
    assert capped.ok
    assert gpus.limits[1] == 450.0
    assert (tmp_path / STATE_FILE).exists()
    events = guard.observe(gpus.snapshot(clock))
    [released] = executor.execute([Command(id="c2", kind="release", gpu=1)])
    assert released.ok
    assert gpus.limits[1] == 650.0
    assert guard.throttled() == set()
    assert not (tmp_path / STATE_FILE).exists()
    events += guard.observe(gpus.snapshot(clock))
    assert [e.kind for e in events] == ["guard", "guard"]  # both actions reach the spool
    assert [e.gpu for e in events] == [1, 1]


def test_throttle_and_release_every_gpu(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock)
    [result] = executor.execute([throttle("all", power_fraction=0.5)])
    assert result.ok
    assert set(gpus.limits.values()) == {350.0}
    assert guard.throttled() == {0, 1, 2, 3}
    [result] = executor.execute([Command(id="rel", kind="release")])
    assert result.ok
    assert set(gpus.limits.values()) == {700.0}


def test_a_duplicate_command_id_is_not_executed_twice(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock)
    first = executor.execute([throttle("c1", gpu=0, power_watts=500.0)])
    clock.advance(5)
    again = executor.execute([throttle("c1", gpu=0, power_watts=300.0)])
    assert again == first
    assert gpus.calls == [(0, 500.0)]


@pytest.mark.parametrize("setup", ["enforce"], indirect=True)
def test_dry_run_changes_nothing(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock, dry_run=True)
    results = executor.execute([
        throttle("c1", gpu=0, power_watts=500.0), Command(id="c2", kind="release", gpu=0)])
    assert all(r.ok and r.dry_run for r in results)
    assert results[0].message == "would cap GPU 0 to 500 W"
    assert gpus.calls == []
    assert guard.caps() == {}


@pytest.mark.parametrize("setup", ["dry-run"], indirect=True)
def test_guard_in_dry_run_mode_turns_commands_into_dry_runs(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock)
    [result] = executor.execute([throttle("c1", gpu=0, power_watts=500.0)])
    assert result.ok
    assert result.dry_run
    assert gpus.calls == []


def test_checkpoint_is_not_the_agents(setup):
    clock, _, guard = setup
    [result] = CommandExecutor(guard, clock).execute([Command(id="k", kind="checkpoint")])
    assert not result.ok
    assert "not handled by the agent" in result.message


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (throttle("a", gpu=0), "exactly one of"),
        (throttle("b", gpu=0, power_watts=400.0, power_fraction=0.5), "exactly one of"),
        (throttle("c", gpu=0, power_watts=-1.0), "greater than 0"),
        (throttle("d", gpu=9, power_watts=400.0), "GPU 9 is not present"),
        (Command(id="e", kind="release", gpu=9), "GPU 9 is not present"),
    ],
)
def test_bad_commands_fail_with_a_reason(setup, command, message):
    clock, gpus, guard = setup
    [result] = CommandExecutor(guard, clock).execute([command])
    assert not result.ok
    assert message in result.message
    assert gpus.calls == []


def test_a_refused_throttle_is_a_failed_result(setup):
    clock, gpus, guard = setup
    gpus.refuse.add(3)
    [result] = CommandExecutor(guard, clock).execute([throttle("c", power_watts=400.0)])
    assert not result.ok
    assert "GPU 3" in result.message
    assert "No permission" in result.message
    assert guard.throttled() == {0, 1, 2}


def test_release_of_an_uncapped_gpu_is_fine(setup):
    clock, gpus, guard = setup
    [result] = CommandExecutor(guard, clock).execute([Command(id="r", kind="release", gpu=0)])
    assert result.ok
    assert "was not capped" in result.message
    assert gpus.calls == []


def test_only_recent_ids_are_remembered(setup):
    clock, gpus, guard = setup
    executor = CommandExecutor(guard, clock, remember=2)
    for n in range(3):
        executor.execute([Command(id=f"r{n}", kind="release", gpu=0)])
    executor.execute([throttle("r0", gpu=0, power_watts=400.0)])  # forgotten: runs again
    assert gpus.calls == [(0, 400.0)]


# --------------------------------------------------------------------------- remediation
#
# On a simulated node: the fake NVML's GPUs, the agent's own NVML adapter (running_pids),
# the reset and reboot programs as tiny scripts in tmp_path (real processes).


@pytest.fixture
def remedied(tmp_path):
    made: list[Remedied] = []

    def make(remediation: RemediationSettings | None = None, **kwargs) -> Remedied:
        made.append(Remedied(tmp_path, remediation or RemediationSettings(), **kwargs))
        return made[-1]

    yield make
    for one in made:
        one.close()


def recorder(tmp_path, name: str = "reset", exit_code: int = 0, stderr: str = "") -> str:
    """A program that appends its arguments to ``<name>.argv``, then exits as told."""
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/{name}.argv\n'
                    + (f'echo "{stderr}" >&2\n' if stderr else "") + f"exit {exit_code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def calls(tmp_path, name: str = "reset") -> list[str]:
    path = tmp_path / f"{name}.argv"
    return path.read_text().splitlines() if path.exists() else []


def enforce(tmp_path, **fields) -> RemediationSettings:
    return RemediationSettings(
        mode="enforce", reset_command=[recorder(tmp_path), "--gpu-reset", "-i", "{gpu}"],
        reboot_command=[recorder(tmp_path, "reboot")], **fields)


def test_reset_is_refused_while_a_process_uses_the_gpu(remedied, tmp_path):
    r = remedied(enforce(tmp_path))
    r.node.gpus[1].set_processes([(4242, 2**30), (777, 2**30)])
    result = r.run(Command(id="r1", kind="reset_gpu", gpu=1))
    assert not result.ok
    assert result.message == "not resetting GPU 1: in use by process 777, 4242"
    assert calls(tmp_path) == []


def test_reset_is_refused_when_nvml_cannot_list_the_processes(remedied, tmp_path):
    r = remedied(enforce(tmp_path))
    fake_nvml.inject_error(2, "nvmlDeviceGetComputeRunningProcesses",
                           fake_nvml.NVML_ERROR_NOT_SUPPORTED)
    result = r.run(Command(id="r1", kind="reset_gpu", gpu=2))
    assert not result.ok
    assert result.message.startswith("not resetting GPU 2: GPU 2: running processes unknown")
    assert "Not Supported" in result.message
    assert calls(tmp_path) == []


def test_reset_in_dry_run_says_what_would_run_and_runs_nothing(remedied, tmp_path):
    settings = replace(enforce(tmp_path), mode=None)  # unset: dry-run on a real node
    r = remedied(settings)
    result = r.run(Command(id="r1", kind="reset_gpu", gpu=3))
    assert result.ok
    assert result.dry_run
    assert result.message == f"dry run: would run {tmp_path / 'reset'} --gpu-reset -i 3"
    assert calls(tmp_path) == []


def test_reset_in_enforce_runs_the_configured_command(remedied, tmp_path):
    r = remedied(enforce(tmp_path))
    result = r.run(Command(id="r1", kind="reset_gpu", gpu=2, reason="xid 48"))
    assert result.ok
    assert not result.dry_run
    assert result.message == f"reset GPU 2: {tmp_path / 'reset'} --gpu-reset -i 2 exited 0"
    assert calls(tmp_path) == ["--gpu-reset -i 2"]
    # Sent again (the report with the result was lost): answered, not run again.
    assert r.executor.execute([Command(id="r1", kind="reset_gpu", gpu=2)]) == [result]
    assert calls(tmp_path) == ["--gpu-reset -i 2"]


def test_a_failing_reset_command_reports_its_exit_code_and_stderr(remedied, tmp_path):
    settings = replace(enforce(tmp_path), reset_command=[
        recorder(tmp_path, exit_code=255, stderr="Unable to reset GPU: in use by nv-hostengine"),
        "-i", "{gpu}"])
    result = remedied(settings).run(Command(id="r1", kind="reset_gpu", gpu=0))
    assert not result.ok
    assert result.message.endswith("exited 255: Unable to reset GPU: in use by nv-hostengine")


def test_a_reset_past_its_timeout_is_killed(remedied, tmp_path):
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    settings = replace(enforce(tmp_path), reset_command=[str(slow), "{gpu}"], timeout=0.3)
    result = remedied(settings).run(Command(id="r1", kind="reset_gpu", gpu=0))
    assert not result.ok
    assert "ran past 0.3s" in result.message


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (Command(id="a", kind="reset_gpu"), "reset_gpu needs a gpu"),
        (Command(id="b", kind="reset_gpu", gpu=9), "GPU 9 is not present"),
    ],
)
def test_bad_reset_commands_are_refused_at_once(remedied, tmp_path, command, message):
    r = remedied(enforce(tmp_path))
    [result] = r.executor.execute([command])
    assert not result.ok
    assert message in result.message


def test_a_simulated_reset_really_clears_the_fault(remedied, tmp_path):
    r = remedied(RemediationSettings(mode="enforce"), actuator=None)
    r.actuator = r.node.actuator()
    r.restart()
    r.node.inject("row-remap-pending", 1)
    r.node.inject("nvlink-down", 1, link=2)
    r.node.fall_off_bus(1)
    assert r.sample().gpus[1].lost
    result = r.run(Command(id="r1", kind="reset_gpu", gpu=1))
    assert result.ok, result.message
    assert "simulated reset done" in result.message
    assert "no process can be using it" in result.message  # lost: NVML could not list them
    gpu = r.sample().gpus[1]
    assert not gpu.lost
    assert not gpu.row_remap_pending
    assert all(link.up for link in gpu.nvlinks)
    assert "GPU reset" in r.node.kmsg_path.read_text()
    verdict = r.run(Command(id="v1", kind="verify"))
    assert verdict.ok, verdict.checks


def test_a_simulated_reset_is_refused_by_the_driver_while_in_use(remedied):
    r = remedied(RemediationSettings(mode="enforce"))
    r.actuator = r.node.actuator()
    r.restart()
    r.node.fall_off_bus(0)
    r.node.gpus[0].set_processes([(99, 2**30)])  # NVML cannot list them: the GPU is lost
    result = r.run(Command(id="r1", kind="reset_gpu", gpu=0))
    assert not result.ok
    assert "simulated reset refused" in result.message


def test_reboot_in_dry_run_runs_nothing(remedied, tmp_path):
    r = remedied(replace(enforce(tmp_path), mode="dry-run"))
    result = r.run(Command(id="b1", kind="reboot"))
    assert (result.ok, result.dry_run) == (True, True)
    assert result.message == f"dry run: would run {tmp_path / 'reboot'}"
    assert calls(tmp_path, "reboot") == []


def boot(tmp_path, boot_id: str) -> None:
    path = tmp_path / "proc" / "sys" / "kernel" / "random" / "boot_id"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(boot_id + "\n")


def test_a_reboot_is_recorded_before_it_runs_and_not_repeated_after(remedied, tmp_path, caplog):
    boot(tmp_path, "boot-1")
    r = remedied(enforce(tmp_path))
    with caplog.at_level(logging.WARNING, logger="sn_monitor.agent.commands"):
        result = r.run(Command(id="b1", kind="reboot", reason="xid 79 after a reset"))
    assert result.ok
    assert calls(tmp_path, "reboot") == [""]
    assert "REBOOTING this node for controller command b1 (xid 79 after a reset)" in caplog.text
    [record] = json.loads((r.state / RebootLedger.FILE).read_text())
    assert (record["id"], record["boot_id"]) == ("b1", "boot-1")
    boot(tmp_path, "boot-2")  # the node came back; the controller sends b1 again
    r.restart()
    again = r.run(Command(id="b1", kind="reboot"))
    assert again.ok
    assert "the node has rebooted since" in again.message
    assert calls(tmp_path, "reboot") == [""]


def test_a_reboot_that_did_not_happen_is_a_failure_after_the_restart(remedied, tmp_path):
    boot(tmp_path, "boot-1")
    r = remedied(enforce(tmp_path))
    r.run(Command(id="b1", kind="reboot"))
    r.restart()  # the agent restarted, the kernel did not
    again = r.run(Command(id="b1", kind="reboot"))
    assert not again.ok
    assert "did not happen" in again.message
    assert calls(tmp_path, "reboot") == [""]


def test_a_simulated_reboot_clears_the_gpu_faults(remedied):
    r = remedied(RemediationSettings(mode="enforce"))
    r.actuator = r.node.actuator()
    r.restart()
    r.node.inject("pcie-downgrade", 2, generation=3, width=8)
    r.node.gpus[3].set_processes([(1234, 2**30)])
    r.sample()
    refused = r.run(Command(id="b0", kind="reboot"))
    assert not refused.ok  # work on a GPU: a reboot would kill it
    assert refused.message.startswith("not rebooting: GPU 3 in use by process 1234")
    r.node.gpus[3].set_processes([])
    assert r.run(Command(id="b1", kind="reboot")).ok
    gpus = r.sample().gpus
    assert (gpus[2].pcie_link_generation, gpus[2].pcie_link_width) == (5, 16)


def test_verify_answers_with_its_checks(remedied, tmp_path):
    r = remedied(RemediationSettings(verify=VerifySettings(dcgm_level=0)))
    r.node.inject("nvlink-down", 0, link=4)
    r.sample()
    result = r.run(Command(id="v1", kind="verify"))
    assert not result.ok
    assert not result.dry_run  # verification changes nothing: it runs in dry-run mode too
    assert result.message == "verification failed: nvlinks"
    checks = {c.name: c for c in result.checks}
    assert checks["nvlinks"].detail == "down: GPU 0 link 4"
    assert checks["dcgm-diag"].skipped
    # On the wire: a report carries the checks, and a result without any leaves them off.
    wire = msgspec.json.encode(Report(node="n", instance="i", sequence=1,
                                      sample_time_seconds=0.0, command_results=[result]))
    assert msgspec.json.decode(wire, type=Report).command_results == [result]
    plain = CommandResult(id="x", ok=True, time_seconds=1.0)
    assert b"checks" not in msgspec.json.encode(plain)


def test_verify_waits_for_a_sample_taken_after_the_question(remedied):
    r = remedied(RemediationSettings(verify=VerifySettings(dcgm_level=0, sample_wait=0.05)))
    r.clock.advance(30)  # the latest sample is now 30 s older than the question
    result = r.run(Command(id="v1", kind="verify"))
    assert not result.ok
    assert result.checks[0].name == "sample"
    assert "the latest is 30s old" in result.checks[0].detail


def test_a_slow_command_sent_twice_in_one_reply_runs_once(remedied, tmp_path):
    r = remedied(enforce(tmp_path))
    command = Command(id="r1", kind="reset_gpu", gpu=0)
    assert r.executor.execute([command, command]) == []
    assert r.executor.wait_idle(timeout=30)
    assert len(r.executor.finished()) == 1
    assert calls(tmp_path) == ["--gpu-reset -i 0"]


def test_an_executor_without_remedies_refuses_them(setup):
    clock, _, guard = setup
    [result] = CommandExecutor(guard, clock).execute([Command(id="v", kind="verify")])
    assert not result.ok
    assert result.message == "verify is not set up on this agent"
