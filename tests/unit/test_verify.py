"""The return-to-service checks: on the fake NVML with injected faults, DCGM's JSON, the
user command (real tiny programs), and ``sn-monitor verify`` through the CLI entry."""

from __future__ import annotations

import json
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.sampler import Sampler
from sn_monitor.agent.settings import VerifySettings
from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot
from sn_monitor.agent.verify import (
    GpuCountMemory,
    check_pcie_links,
    check_temperatures,
    parse_dcgm_diag,
    run_dcgm,
    run_user_command,
    snapshot_checks,
    summary,
    verify_node,
)
from sn_monitor.cli import main
from sn_monitor.clock import ManualClock
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.node import SimulatedNode

NO_PROGRAMS = VerifySettings(dcgm_level=0)


@pytest.fixture
def node(tmp_path):
    sim = SimulatedNode(tmp_path / "node", gpus=4)
    yield sim
    fake_nvml.reset()


def sample(node: SimulatedNode) -> NodeSnapshot:
    sampler = Sampler("n", [NvmlCollector(node.nvml, ManualClock())], ManualClock())
    try:
        return sampler.sample()
    finally:
        sampler.close()


def failing(checks) -> dict[str, str]:
    return {c.name: c.detail for c in checks if not c.ok}


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_healthy_simulated_node_passes_every_check(node):
    checks = snapshot_checks(sample(node), NO_PROGRAMS, expected=4)
    assert failing(checks) == {}
    assert [c.name for c in checks] == [
        "gpus-present", "gpus-reachable", "row-remap", "pcie-links", "nvlinks",
        "temperatures", "ecc-uncorrectable"]
    assert not any(c.skipped for c in checks)
    assert "all 72 NVLinks up" in {c.detail for c in checks}


@pytest.mark.parametrize(
    ("fault", "gpu", "params", "failed"),
    [
        ("fall-off-bus", 1, {}, {"gpus-reachable": "lost (NVML cannot reach it): GPU 1"}),
        ("row-remap-pending", 2, {}, {"row-remap": "GPU 2: a row remap is pending"}),
        ("row-remap-failure", 0, {}, {"row-remap": "GPU 0: a row remap failed"}),
        ("nvlink-down", 3, {"link": 5}, {"nvlinks": "down: GPU 3 link 5"}),
        ("pcie-downgrade", 1, {"generation": 5, "width": 8},
         {"pcie-links": "GPU 1: link x8, max x16"}),
        ("ecc-uncorrectable", 2, {"count": 2},
         {"ecc-uncorrectable": "GPU 2: 2", "row-remap": "GPU 2: a row remap is pending"}),
    ],
)
def test_each_fault_fails_its_check_with_a_clear_detail(node, fault, gpu, params, failed):
    node.inject(fault, gpu, **params)
    found = failing(snapshot_checks(sample(node), NO_PROGRAMS, expected=4))
    assert found.keys() == failed.keys()
    for name, text in failed.items():
        assert text in found[name]


def test_fewer_gpus_than_expected_fail(node):
    [check] = [c for c in snapshot_checks(sample(node), NO_PROGRAMS, 8, "expected_gpus")
               if c.name == "gpus-present"]
    assert not check.ok
    assert check.detail == "4 GPUs present, 8 expected (expected_gpus)"


def test_the_gpu_count_is_remembered_across_restarts(tmp_path):
    GpuCountMemory(tmp_path).observe(8)
    after_reboot = GpuCountMemory(tmp_path)  # a new agent, on a node that lost a GPU
    after_reboot.observe(7)
    assert after_reboot.expected(None) == (8, "the most this agent has seen here")
    assert after_reboot.expected(6) == (6, "expected_gpus")
    assert GpuCountMemory(None).expected(None)[0] == 0


def gpu(**fields) -> GpuSample:
    base = dict(index=0, uuid="GPU-0", name="H100", pci_bus_id="0000:18:00.0",
                pcie_link_width=16, pcie_link_width_max=16, pcie_link_generation=5,
                pcie_link_generation_max=5)
    return GpuSample(**{**base, **fields})


def test_a_lower_pcie_generation_passes_only_while_idle():
    idle = NodeSnapshot("n", 0.0, gpus=(gpu(pcie_link_generation=1, utilization_ratio=0.0),))
    check = check_pcie_links(idle)
    assert check.ok
    assert "GPU 0 idle at gen 1 of 5" in check.detail
    busy = NodeSnapshot("n", 0.0, gpus=(gpu(pcie_link_generation=3, utilization_ratio=0.9),))
    check = check_pcie_links(busy)
    assert not check.ok
    assert "GPU 0: gen 3 under load, max gen 5" in check.detail
    idle_reason = NodeSnapshot("n", 0.0, gpus=(gpu(
        pcie_link_generation=2, utilization_ratio=0.5,
        throttle_reasons=(("gpu_idle", True),)),))
    assert check_pcie_links(idle_reason).ok


def test_pcie_not_reported_is_skipped():
    check = check_pcie_links(NodeSnapshot("n", 0.0, gpus=(gpu(
        pcie_link_width=None, pcie_link_generation=None),)))
    assert check.ok
    assert check.skipped


def test_a_gpu_near_its_slowdown_temperature_fails():
    hot = NodeSnapshot("n", 0.0, gpus=(
        gpu(temperature_celsius=80.0, slowdown_temperature_celsius=89.0),
        gpu(index=1, temperature_celsius=60.0, slowdown_temperature_celsius=89.0)))
    check = check_temperatures(hot, margin=10.0)
    assert not check.ok
    assert check.detail == "GPU 0 at 80 °C (slowdown 89 °C, margin 10)"
    assert check_temperatures(hot, margin=5.0).ok


# --------------------------------------------------------------------------- DCGM

DCGM4_PASS = {
    "DCGM Diagnostic": {"test_categories": [
        {"category": "Deployment", "tests": [
            {"name": "software", "results": [
                {"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
                {"entity_group": "GPU", "entity_id": 1, "status": "Pass"}],
             "test_summary": {"status": "Pass"}}]},
        {"category": "Hardware", "tests": [
            {"name": "memory", "results": [
                {"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
                {"entity_group": "GPU", "entity_id": 1, "status": "Skip",
                 "info": ["Plugin is not allowed on this SKU"]}]}]}]},
    "metadata": {"version": "4.2.3", "Driver Version Detected": "550.90.07"},
}
DCGM4_FAIL = {
    "DCGM Diagnostic": {"test_categories": [
        {"category": "Integration", "tests": [
            {"name": "pcie", "results": [
                {"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
                {"entity_group": "GPU", "entity_id": 3, "status": "Fail", "warnings": [
                    {"warning": "GPU 3 PCIe link is running at x8, expected x16",
                     "error_id": 43, "error_category": 13, "error_severity": 2}]}]}]}]},
}
DCGM3_FAIL = {
    "DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Hardware", "tests": [
            {"name": "GPU Memory", "results": [
                {"gpu_ids": "0", "status": "PASS"},
                {"gpu_ids": "1", "status": "FAIL",
                 "warnings": ["Pending page retirements found on GPU 1"]}]}]}],
        "version": "3.3.5"},
}
DCGM4_WARN = {
    "DCGM Diagnostic": {"test_categories": [
        {"category": "Deployment", "tests": [
            {"name": "software", "results": [
                {"entity_id": 0, "status": "Warn",
                 "warnings": [{"warning": "Persistence mode for GPU 0 is disabled."}]}]}]}]},
}
DCGM4_ALL_SKIPPED = {
    "DCGM Diagnostic": {"test_categories": [
        {"category": "Stress", "tests": [
            {"name": "targeted_stress", "results": [{"status": "Skip"}]},
            {"name": "sm_stress", "results": [{"status": "Not Run"}]}]}]},
}


@pytest.mark.parametrize(
    ("output", "ok", "detail"),
    [
        (json.dumps(DCGM4_PASS), True, "level 1: 3 results passed, 1 skipped"),
        (json.dumps(DCGM4_FAIL), False,
         "level 1 failed: pcie GPU 3: GPU 3 PCIe link is running at x8, expected x16 [error 43]"),
        (json.dumps(DCGM3_FAIL), False,
         "level 1 failed: GPU Memory GPU 1: Pending page retirements found on GPU 1"),
        (json.dumps(DCGM4_WARN), True,
         "level 1: 1 results passed; warnings: software GPU 0: Persistence mode for GPU 0 "
         "is disabled."),
        (json.dumps(DCGM4_ALL_SKIPPED), False, "level 1 ran no test (2 skipped or not run)"),
        (json.dumps({"DCGM Diagnostic": {"runtime_error": "Unable to connect to host engine"}}),
         False, "level 1: dcgmi could not run: Unable to connect to host engine"),
        ('{"something": "else"}', False, "level 1: no 'DCGM Diagnostic' object in the output"),
        ("Error: unable to establish a connection", False, "level 1: output is not JSON: Error"),
    ],
)
def test_dcgm_diag_output_is_judged(output, ok, detail):
    check = parse_dcgm_diag(output, level=1)
    assert check.name == "dcgm-diag"
    assert check.ok is ok
    assert check.detail.startswith(detail)


def test_dcgm_is_skipped_where_dcgmi_is_not_installed(tmp_path):
    check = run_dcgm(VerifySettings(dcgmi=str(tmp_path / "no-dcgmi")))
    assert check.ok
    assert check.skipped
    assert check.detail.startswith("dcgmi not installed")
    assert run_dcgm(VerifySettings(dcgm_level=0)).skipped


def test_dcgmi_runs_at_the_configured_level(tmp_path):
    (tmp_path / "out.json").write_text(json.dumps(DCGM4_FAIL))
    dcgmi = script(tmp_path / "dcgmi", f'echo "$@" > {tmp_path}/argv\n'
                                       f"cat {tmp_path}/out.json\nexit 226")
    check = run_dcgm(VerifySettings(dcgmi=dcgmi, dcgm_level=2))
    assert (tmp_path / "argv").read_text().split() == ["diag", "-r", "2", "-j"]
    assert not check.ok
    assert check.detail.startswith("level 2 failed: pcie GPU 3")


def test_dcgmi_that_prints_no_json_fails_with_its_exit_status(tmp_path):
    dcgmi = script(tmp_path / "dcgmi", 'echo "Host engine connection invalid" >&2\nexit 1')
    check = run_dcgm(VerifySettings(dcgmi=dcgmi))
    assert not check.ok
    assert check.detail == "dcgmi diag exited 1: Host engine connection invalid"


# --------------------------------------------------------------------------- user command


def test_the_user_command_passes_on_exit_0_and_fails_otherwise(tmp_path):
    good = script(tmp_path / "good", "exit 0")
    bad = script(tmp_path / "bad", 'echo "allreduce bus bandwidth 12 GB/s < 300" >&2\nexit 3')
    assert run_user_command([good], timeout=30).ok
    check = run_user_command([bad, "--min-bw", "300"], timeout=30)
    assert not check.ok
    assert check.detail == f"{bad} exited 3: allreduce bus bandwidth 12 GB/s < 300"
    assert run_user_command(None, timeout=30).skipped


def test_the_user_command_is_killed_at_its_timeout(tmp_path):
    slow = script(tmp_path / "slow", "sleep 30")
    check = run_user_command([slow], timeout=0.3)
    assert not check.ok
    assert "ran past 0.3s" in check.detail


def test_a_user_command_that_cannot_start_fails(tmp_path):
    check = run_user_command([str(tmp_path / "missing")], timeout=5)
    assert not check.ok
    assert check.detail.startswith(f"cannot run {tmp_path / 'missing'}")


def test_verify_node_runs_everything_in_order(node, tmp_path):
    settings = replace(NO_PROGRAMS, command=[script(tmp_path / "ok", "exit 0")])
    checks = verify_node(sample(node), settings, GpuCountMemory(tmp_path))
    assert [c.name for c in checks][-2:] == ["dcgm-diag", "user-command"]
    assert all(c.ok for c in checks)
    assert summary(checks) == "verification passed: 8 checks, 1 skipped"
    assert (tmp_path / "gpu-count").read_text() == "4\n"


# --------------------------------------------------------------------------- the CLI


def test_sn_monitor_verify_passes_a_healthy_simulated_node(capsys):
    assert main(["verify", "--simulate", "4", "--dcgm-level", "0"]) == 0
    out = capsys.readouterr().out
    assert "PASS  nvlinks" in out
    assert out.strip().endswith("verification passed: 7 checks, 2 skipped")


def test_sn_monitor_verify_fails_a_broken_simulated_node_as_json(capsys):
    code = main(["verify", "--simulate", "4", "--dcgm-level", "0", "--json",
                 "--fault", "pcie-downgrade@2", "--fault", "nvlink-down@0"])
    assert code == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    assert doc["summary"] == "verification failed: pcie-links, nvlinks"
    details = {c["name"]: c["detail"] for c in doc["checks"]}
    assert details["pcie-links"].startswith("GPU 2: link x8, max x16")


def test_sn_monitor_verify_counts_more_gpus_than_the_node_has_as_a_failure(capsys):
    assert main(["verify", "--simulate", "2", "--dcgm-level", "0",
                 "--expected-gpus", "8"]) == 1
    assert "2 GPUs present, 8 expected (expected_gpus)" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["verify", "--simulate", "2", "--fault", "melt@0"],
    ["verify", "--fault", "nvlink-down@0"],
])
def test_sn_monitor_verify_errors_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "sn-monitor verify:" in capsys.readouterr().err


def test_sn_monitor_verify_has_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["verify", "--help"])
    assert exit_.value.code == 0
    assert "Exit 0 when every check passes" in " ".join(capsys.readouterr().out.split())
