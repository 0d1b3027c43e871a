"""Per-process SM utilisation and the minor number, through the NVML adapter on the fake NVML."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest

from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.snapshot import GpuSample
from sn_monitor.clock import ManualClock
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import H100_SXM, SimulatedGpu, make_gpus

FUNCTION = "nvmlDeviceGetProcessUtilization"


@pytest.fixture(autouse=True)
def _clean_fake() -> Iterator[None]:
    yield
    fake_nvml.reset()


def sm(sample: GpuSample) -> dict[int, float | None]:
    assert sample.processes is not None
    return {p.pid: p.sm_utilization_ratio for p in sample.processes}


def busy_gpu(load: float = 0.8) -> SimulatedGpu:
    gpu = make_gpus(1)[0]
    gpu.set_processes([(100, 2**30), (200, 2**30)])
    gpu.set_load(load)
    gpu.step(1.0)
    return gpu


def test_each_process_gets_its_latest_sm_sample_and_only_new_samples_count(caplog) -> None:
    gpu = busy_gpu(0.8)
    fake_nvml.configure([gpu])
    collector = NvmlCollector(fake_nvml, ManualClock())
    caplog.set_level(logging.DEBUG, logger="sn_monitor.agent.nvml")
    assert sm(collector.collect().gpus[0]) == {100: 0.4, 200: 0.4}
    # No sample newer than the last one seen: NVML says NotFound; no value, no complaint.
    assert sm(collector.collect().gpus[0]) == {100: None, 200: None}
    gpu.set_load(0.3)
    gpu.step(1.0)
    assert sm(collector.collect().gpus[0]) == {100: 0.15, 200: 0.15}
    assert not [r for r in caplog.records if FUNCTION in r.getMessage()]


def test_not_supported_is_asked_once_and_left_out() -> None:
    gpu = SimulatedGpu(0, replace(H100_SXM, unsupported=frozenset({FUNCTION})))
    gpu.set_processes([(100, 2**30)])
    fake_nvml.configure([gpu])
    collector = NvmlCollector(fake_nvml, ManualClock())
    for _ in range(3):
        gpu.step(1.0)
        sample = collector.collect().gpus[0]
        assert sm(sample) == {100: None}
        assert sample.processes is not None
        assert sample.processes[0].used_memory_bytes == 2**30
    assert fake_nvml.call_count(FUNCTION) == 1


def test_a_driver_without_the_function_leaves_it_out() -> None:
    gpu = busy_gpu()
    fake_nvml.configure([gpu], missing_functions={FUNCTION})
    assert sm(NvmlCollector(fake_nvml, ManualClock()).collect().gpus[0]) == {100: None, 200: None}


def test_an_idle_gpu_asks_nothing() -> None:
    fake_nvml.configure(make_gpus(1))
    assert NvmlCollector(fake_nvml, ManualClock()).collect().gpus[0].processes == ()
    assert fake_nvml.call_count(FUNCTION) == 0


def test_a_fault_on_the_call_is_a_lost_gpu_not_a_blank() -> None:
    gpu = busy_gpu()
    fake_nvml.configure([gpu])
    fake_nvml.inject_error(0, FUNCTION, fake_nvml.NVML_ERROR_GPU_IS_LOST)
    collected = NvmlCollector(fake_nvml, ManualClock()).collect()
    assert collected.gpus[0].lost
    assert [e.kind for e in collected.events] == ["gpu_lost"]


def test_the_minor_number_is_read_once_and_kept_by_a_lost_gpu() -> None:
    gpus = make_gpus(2)
    gpus[0].minor_number, gpus[1].minor_number = 1, 0
    fake_nvml.configure(gpus)
    collector = NvmlCollector(fake_nvml, ManualClock())
    assert [g.minor_number for g in collector.collect().gpus] == [1, 0]
    gpus[1].fall_off_bus()
    second = collector.collect().gpus[1]
    assert (second.lost, second.minor_number) == (True, 0)
    assert fake_nvml.call_count("nvmlDeviceGetMinorNumber") == 2
