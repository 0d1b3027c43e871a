from __future__ import annotations

import pytest

from sn_monitor.sim.gpu_model import (
    H100_SXM,
    H200_SXM,
    REASON_HW_THERMAL_SLOWDOWN,
    REASON_SW_POWER_CAP,
    REASON_SW_THERMAL_SLOWDOWN,
    SimulatedGpu,
    make_gpus,
)


def run(gpu: SimulatedGpu, seconds: int) -> None:
    for _ in range(seconds):
        gpu.step(1.0)


def test_temperature_follows_power():
    idle, busy = SimulatedGpu(0), SimulatedGpu(1)
    idle.set_load(0.0)
    busy.set_load(0.92)
    run(idle, 300)
    run(busy, 300)
    assert idle.power_watts == pytest.approx(H100_SXM.idle_power_watts, rel=0.05)
    assert busy.power_watts == pytest.approx(650, rel=0.05)
    assert idle.temperature_celsius < 40
    # ~650 W settles near 70 °C at 30 °C ambient.
    assert busy.temperature_celsius == pytest.approx(70, abs=2)
    assert busy.memory_temperature_celsius > busy.temperature_celsius


def test_large_step_is_stable_and_matches_small_steps():
    fine, coarse = SimulatedGpu(0, seed=3), SimulatedGpu(0, seed=3)
    for gpu in (fine, coarse):
        gpu.set_load(1.0)
    run(fine, 600)
    coarse.step(600.0)
    assert coarse.temperature_celsius == pytest.approx(fine.temperature_celsius, abs=0.5)
    assert coarse.energy_millijoules == pytest.approx(fine.energy_millijoules, rel=0.01)


def test_cooling_failure_overheats_and_power_cap_brings_it_back():
    gpu = SimulatedGpu(0)
    gpu.set_load(1.0)
    gpu.inject_cooling_failure(1.6)
    run(gpu, 600)
    assert gpu.temperature_celsius > 85
    assert not gpu.lost
    assert gpu.set_power_limit_watts(300) == 300
    run(gpu, 300)
    assert gpu.temperature_celsius < 80
    assert gpu.power_watts <= 300
    assert gpu.clock_event_reasons & REASON_SW_POWER_CAP
    assert gpu.sm_clock_mhz < H100_SXM.sm_max_clock_mhz


def test_clocks_fall_and_thermal_reasons_set_near_slowdown():
    gpu = SimulatedGpu(0)
    gpu.set_load(1.0)
    gpu.inject_cooling_failure(2.0)
    seen = 0
    min_clock = gpu.profile.sm_max_clock_mhz
    for _ in range(900):
        gpu.step(1.0)
        seen |= gpu.clock_event_reasons
        min_clock = min(min_clock, gpu.sm_clock_mhz)
    assert seen & REASON_SW_THERMAL_SLOWDOWN
    assert seen & REASON_HW_THERMAL_SLOWDOWN
    assert min_clock <= gpu.profile.sm_max_clock_mhz // 2
    assert gpu.temperature_celsius < gpu.profile.shutdown_celsius


def test_power_limit_clamps_to_constraints():
    gpu = SimulatedGpu(0)
    assert gpu.set_power_limit_watts(50) == H100_SXM.power_min_limit_watts
    assert gpu.set_power_limit_watts(5000) == H100_SXM.power_max_limit_watts


def test_deterministic_with_seed():
    a, b, c = make_gpus(2, seed=7), make_gpus(2, seed=7), make_gpus(2, seed=8)
    for gpus in (a, b, c):
        for gpu in gpus:
            run(gpu, 120)
    assert [g.uuid for g in a] == [g.uuid for g in b]
    assert [g.power_watts for g in a] == [g.power_watts for g in b]
    assert [g.temperature_celsius for g in a] == [g.temperature_celsius for g in b]
    assert [g.uuid for g in a] != [g.uuid for g in c]


def test_training_load_has_dips():
    gpu = SimulatedGpu(0)
    utilizations = []
    for _ in range(60):
        gpu.step(1.0)
        utilizations.append(gpu.utilization)
    assert max(utilizations) > 0.85
    assert min(utilizations) < 0.6


def test_faults_change_state():
    gpu = SimulatedGpu(0, H200_SXM)
    assert gpu.profile.memory_total_bytes == 141 * 10**9
    gpu.inject_xid(13)
    gpu.inject_xid(13)
    gpu.inject_ecc_uncorrectable(2)
    gpu.inject_nvlink_errors(3, crc=5, crc_data=1, replay=2, recovery=1)
    gpu.set_nvlink_down(4)
    gpu.inject_pcie_downgrade(3, 8)
    assert gpu.xid_log == [13, 13]
    assert gpu.ecc_uncorrected == 2
    assert gpu.row_remap_pending
    assert gpu.nvlinks[3].crc_flit_errors == 5
    assert not gpu.nvlinks[4].up
    assert (gpu.pcie_generation, gpu.pcie_width) == (3, 8)
    gpu.fall_off_bus()
    gpu.fall_off_bus()
    assert gpu.lost
    assert gpu.xid_log == [13, 13, 79]
    gpu.reset()
    assert not gpu.lost
    assert not gpu.row_remap_pending
    assert gpu.remapped_rows_uncorrectable == 1
