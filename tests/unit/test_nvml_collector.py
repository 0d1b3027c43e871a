from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest

from sn_monitor.agent.collectors.base import SourceMissing
from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.nvml import THROTTLE_REASONS, NvmlLibrary
from sn_monitor.agent.snapshot import Collected, GpuSample
from sn_monitor.clock import ManualClock
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import A100_SXM, H100_SXM, SimulatedGpu, make_gpus


@pytest.fixture(autouse=True)
def _clean_fake() -> Iterator[None]:
    yield
    fake_nvml.reset()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def node(gpus: list[SimulatedGpu], clock: ManualClock, **configure) -> NvmlCollector:
    fake_nvml.configure(gpus, **configure)
    return NvmlCollector(fake_nvml, clock)


def cycle(collector: NvmlCollector, gpus: list[SimulatedGpu], clock: ManualClock) -> Collected:
    for gpu in gpus:
        gpu.step(1.0)
    clock.advance(1.0)
    return collector.collect()


def record_field_ids(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Wrap the fake's nvmlDeviceGetFieldValues; returns the ids asked, one list per call."""
    requested: list[list[int]] = []
    real = fake_nvml.nvmlDeviceGetFieldValues

    def recording(handle, field_ids):
        requested.append(list(field_ids))
        return real(handle, field_ids)

    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetFieldValues", recording)
    return requested


def reasons(sample: GpuSample) -> dict[str, bool]:
    assert sample.throttle_reasons is not None
    return dict(sample.throttle_reasons)


def test_full_h100_node_is_fully_populated_in_base_units(clock):
    gpus = make_gpus(8)
    for gpu in gpus:
        gpu.set_load(0.9)
        gpu.step(120.0)
    collector = node(gpus, clock)
    first = cycle(collector, gpus, clock)
    assert first.gpus[0].memory_bandwidth_utilization_ratio is None  # GPM needs two samples
    collected = cycle(collector, gpus, clock)
    assert len(collected.gpus) == 8
    assert collected.events == ()
    bus_ids = [g.pci_bus_id for g in collected.gpus]
    assert bus_ids[0] == "0000:18:00.0"
    assert len(set(bus_ids)) == 8
    for sample, gpu in zip(collected.gpus, gpus, strict=True):
        missing = [name for name in GpuSample.__slots__ if getattr(sample, name) is None]
        assert missing == []
        assert sample.index == gpu.index
        assert sample.uuid == gpu.uuid
        assert sample.name == H100_SXM.name
        assert sample.driver_version == "550.90.07"
        assert not sample.lost
        assert sample.utilization_ratio == pytest.approx(0.9)
        assert sample.memory_utilization_ratio == pytest.approx(0.54)
        assert sample.memory_bandwidth_utilization_ratio == pytest.approx(0.675, abs=0.01)
        assert sample.memory_total_bytes == 80 * 1024**3
        assert sample.power_watts == pytest.approx(gpu.power_watts, abs=0.001)
        assert sample.power_limit_watts == 700.0
        assert (sample.power_min_limit_watts, sample.power_max_limit_watts) == (200.0, 700.0)
        assert sample.energy_joules_total == pytest.approx(gpu.energy_millijoules / 1000, abs=0.01)
        assert sample.sm_max_clock_hertz == 1980e6
        assert sample.memory_clock_hertz == 2619e6
        assert sample.temperature_celsius == round(gpu.temperature_celsius)
        assert sample.memory_temperature_celsius == round(gpu.memory_temperature_celsius)
        assert (sample.slowdown_temperature_celsius, sample.shutdown_temperature_celsius) == (
            89.0,
            92.0,
        )
        assert sample.pcie_receive_bytes_per_second == pytest.approx(
            gpu.pcie_rx_bytes_per_second, abs=1024
        )
        assert sample.pcie_link_generation == sample.pcie_link_generation_max == 5
        assert sample.pcie_link_width == sample.pcie_link_width_max == 16
        assert [name for name, _ in sample.throttle_reasons or ()] == [
            name for name, _ in THROTTLE_REASONS
        ]
        assert len(sample.nvlinks) == 18
        assert all(link.up and link.crc_errors_total == 0 for link in sample.nvlinks)


def test_a100_leaves_gpm_and_memory_temperature_out_and_asks_once(clock, monkeypatch):
    requested = record_field_ids(monkeypatch)
    profile = replace(A100_SXM, unsupported=frozenset({"nvmlDeviceGetPcieReplayCounter"}))
    gpus = [SimulatedGpu(i, profile) for i in range(2)]
    collector = node(gpus, clock)
    samples = [cycle(collector, gpus, clock) for _ in range(4)]
    last = samples[-1].gpus[0]
    assert last.memory_temperature_celsius is None
    assert last.pcie_replays_total is None
    assert last.temperature_celsius is not None
    # Without GPM the bandwidth ratio falls back to NVML's memory utilization.
    assert last.memory_bandwidth_utilization_ratio == last.memory_utilization_ratio
    assert len(last.nvlinks) == 12
    counts = fake_nvml.call_counts()
    # One field-values call per GPU and cycle (for the NVLink totals); the HBM
    # temperature is asked in the first only.
    assert counts["nvmlDeviceGetFieldValues"] == 2 * 4
    memory_temp = fake_nvml.NVML_FI_DEV_MEMORY_TEMP
    assert [memory_temp in ids for ids in requested] == [True, True] + [False] * 6
    assert counts["nvmlDeviceGetPcieReplayCounter"] == 2
    assert counts["nvmlGpmQueryDeviceSupport"] == 2
    assert "nvmlGpmSampleGet" not in counts
    # The link count is probed once (12 links + the InvalidArgument answer), the links are
    # read in the first cycle, and the quiet ones are served for nvlink_link_interval.
    assert counts["nvmlDeviceGetNvLinkState"] == 2 * (13 + 12)


def test_missing_library_is_source_missing_logged_once_and_retried_each_minute(clock, caplog):
    fake_nvml.configure_missing_library()
    collector = NvmlCollector(fake_nvml, clock)
    caplog.set_level(logging.INFO)
    for _ in range(3):
        with pytest.raises(SourceMissing):
            collector.collect()
        clock.advance(10)
    lines = [r for r in caplog.records if "NVML library not found" in r.getMessage()]
    assert len(lines) == 1
    assert "host collectors keep running" in lines[0].getMessage()
    assert fake_nvml.call_count("nvmlInit") == 1
    clock.advance(60)
    with pytest.raises(SourceMissing):
        collector.collect()
    assert fake_nvml.call_count("nvmlInit") == 2
    # The driver gets loaded: the next retry finds the GPUs.
    fake_nvml.configure(make_gpus(1))
    clock.advance(61)
    assert len(collector.collect().gpus) == 1


def test_driver_not_loaded_is_source_missing(clock):
    fake_nvml.configure_driver_not_loaded()
    with pytest.raises(SourceMissing):
        NvmlCollector(fake_nvml, clock).collect()


def test_fallen_off_bus_is_lost_with_one_event_and_xid_79(clock):
    gpus = make_gpus(2)
    collector = node(gpus, clock)
    healthy = cycle(collector, gpus, clock).gpus[1]
    gpus[1].fall_off_bus()
    collected = cycle(collector, gpus, clock)
    lost = collected.gpus[1]
    assert lost.lost
    assert (lost.uuid, lost.name, lost.pci_bus_id) == (
        healthy.uuid,
        healthy.name,
        healthy.pci_bus_id,
    )
    assert lost.temperature_celsius is None
    assert not collected.gpus[0].lost
    kinds = sorted((e.kind, e.code) for e in collected.events)
    assert kinds == [("gpu_lost", None), ("xid", 79)]
    for event in collected.events:
        assert event.gpu == 1
        assert event.source == "nvml"
        assert event.pci_bus_id == "0000:2a:00.0"
        assert event.time_seconds == clock.time()
    # Still lost: no new event.
    again = cycle(collector, gpus, clock)
    assert again.gpus[1].lost
    assert again.events == ()
    # Recovered, then lost again: a new loss event.
    gpus[1].reset()
    assert not cycle(collector, gpus, clock).gpus[1].lost
    gpus[1].fall_off_bus()
    relost = cycle(collector, gpus, clock)
    assert sorted((e.kind, e.code) for e in relost.events) == [("gpu_lost", None), ("xid", 79)]


def test_repeated_xids_are_separate_events(clock):
    gpus = make_gpus(2)
    collector = node(gpus, clock)
    cycle(collector, gpus, clock)
    for _ in range(3):
        gpus[0].inject_xid(13)
    gpus[1].inject_xid(94)
    collected = cycle(collector, gpus, clock)
    xids = [(e.gpu, e.code) for e in collected.events if e.kind == "xid"]
    assert sorted(xids) == [(0, 13), (0, 13), (0, 13), (1, 94)]
    assert cycle(collector, gpus, clock).events == ()


def test_throttle_reasons_map(clock):
    gpus = make_gpus(2)
    for gpu in gpus:
        gpu.set_load(1.0)
    gpus[0].set_power_limit_watts(300)
    gpus[1].inject_cooling_failure(2.0)
    collector = node(gpus, clock)
    for _ in range(600):
        for gpu in gpus:
            gpu.step(1.0)
    capped, hot = cycle(collector, gpus, clock).gpus
    assert reasons(capped)["sw_power_cap"]
    assert not reasons(capped)["sw_thermal_slowdown"]
    assert reasons(hot)["sw_thermal_slowdown"]
    assert not reasons(hot)["gpu_idle"]
    assert hot.sm_clock_hertz is not None
    assert hot.sm_clock_hertz < 1980e6


def test_old_driver_falls_back_to_throttle_reasons_once(clock, caplog):
    caplog.set_level(logging.INFO, logger="sn_monitor.agent.nvml")
    gpus = make_gpus(2)
    collector = node(gpus, clock, missing_functions={"nvmlDeviceGetCurrentClocksEventReasons"})
    for _ in range(3):
        collected = cycle(collector, gpus, clock)
    assert collected.gpus[0].throttle_reasons is not None
    assert fake_nvml.call_count("nvmlDeviceGetCurrentClocksEventReasons") == 1
    assert fake_nvml.call_count("nvmlDeviceGetCurrentClocksThrottleReasons") == 6
    logged = [r for r in caplog.records if "nvmlDeviceGetCurrentClocksEventReasons" in r.message]
    assert len(logged) == 1


def test_pcie_downgrade_and_nvlink_faults_visible(clock):
    gpus = make_gpus(1)
    gpus[0].inject_pcie_downgrade(3, 8)
    gpus[0].inject_nvlink_errors(2, crc=5, crc_data=2, replay=3, recovery=1)
    gpus[0].set_nvlink_down(7)
    gpus[0].inject_ecc_uncorrectable()
    collector = node(gpus, clock)
    sample = cycle(collector, gpus, clock).gpus[0]
    assert sample.pcie_link_generation == 3
    assert sample.pcie_link_generation_max == 5
    assert sample.pcie_link_width == 8
    assert sample.pcie_link_width_max == 16
    link = sample.nvlinks[2]
    assert (link.crc_errors_total, link.replay_errors_total, link.recovery_errors_total) == (
        7,
        3,
        1,
    )
    assert sample.nvlinks[7].up is False
    assert sample.ecc_uncorrected_errors_total == 1
    assert sample.row_remap_pending


def test_power_cap_through_the_adapter_cools_an_overheating_gpu(clock):
    gpus = make_gpus(1)
    gpus[0].set_load(1.0)
    gpus[0].inject_cooling_failure(1.6)
    collector = node(gpus, clock)
    for _ in range(600):
        gpus[0].step(1.0)
    hot = cycle(collector, gpus, clock).gpus[0]
    assert hot.temperature_celsius is not None
    assert hot.temperature_celsius > 85
    collector.library.set_power_limit_watts(0, 300)
    for _ in range(300):
        gpus[0].step(1.0)
    cooled = cycle(collector, gpus, clock).gpus[0]
    assert cooled.power_limit_watts == 300
    assert cooled.temperature_celsius is not None
    assert cooled.temperature_celsius < 80


def test_close_shuts_nvml_down(clock):
    gpus = make_gpus(1)
    collector = node(gpus, clock)
    cycle(collector, gpus, clock)
    cycle(collector, gpus, clock)
    collector.close()
    assert fake_nvml.call_count("nvmlShutdown") == 1
    assert fake_nvml.call_count("nvmlEventSetFree") == 1
    assert fake_nvml.call_count("nvmlGpmSampleFree") == fake_nvml.call_count("nvmlGpmSampleAlloc")


def test_gpm_gpus_read_pcie_from_gpm_and_never_block_on_pcie_throughput(clock):
    gpus = make_gpus(8)
    for gpu in gpus:
        gpu.set_load(0.5)
    collector = node(gpus, clock)
    first = cycle(collector, gpus, clock)
    assert first.gpus[0].pcie_receive_bytes_per_second is None  # GPM needs two samples
    assert first.gpus[0].pcie_transmit_bytes_per_second is None
    for gpu in gpus:
        gpu.set_load(0.9)
    collected = cycle(collector, gpus, clock)
    for sample, gpu in zip(collected.gpus, gpus, strict=True):
        # The average over the cycle between the two GPM samples, in bytes/s (not MiB/s).
        assert sample.pcie_receive_bytes_per_second == pytest.approx(gpu.pcie_rx_bytes_per_second)
        assert sample.pcie_transmit_bytes_per_second == pytest.approx(gpu.pcie_tx_bytes_per_second)
        assert sample.pcie_receive_bytes_per_second > 1e10
    for _ in range(3):
        cycle(collector, gpus, clock)
    counts = fake_nvml.call_counts()
    assert "nvmlDeviceGetPcieThroughput" not in counts
    # DRAM bandwidth and PCIe come from one nvmlGpmMetricsGet per GPU and cycle.
    assert counts["nvmlGpmMetricsGet"] == 8 * 4


def test_gpm_pcie_is_the_average_between_samples(clock):
    gpus = make_gpus(1)
    collector = node(gpus, clock)
    gpus[0].set_load(1.0)
    cycle(collector, gpus, clock)
    gpus[0].step(1.0)
    full = gpus[0].pcie_rx_bytes_per_second
    gpus[0].set_load(0.0)
    sample = cycle(collector, gpus, clock).gpus[0]  # one second busy, one second idle
    assert gpus[0].pcie_rx_bytes_per_second == 0.0
    assert sample.pcie_receive_bytes_per_second == pytest.approx(full / 2)


def test_gpus_without_gpm_read_pcie_throughput_once_per_interval(clock):
    gpus = [SimulatedGpu(i, A100_SXM) for i in range(2)]
    for gpu in gpus:
        gpu.set_load(0.8)
    collector = node(gpus, clock)
    samples = [cycle(collector, gpus, clock) for _ in range(10)]  # monotonic 1 s .. 10 s
    # Two counters (RX, TX) per GPU, read once in the first cycle and served since.
    assert fake_nvml.call_count("nvmlDeviceGetPcieThroughput") == 2 * 2
    first = samples[0].gpus[0].pcie_receive_bytes_per_second
    assert first == pytest.approx(gpus[0].pcie_rx_bytes_per_second, abs=1024)
    assert all(s.gpus[0].pcie_receive_bytes_per_second == first for s in samples)
    assert samples[-1].gpus[1].pcie_transmit_bytes_per_second is not None
    # Ten seconds after the first read: read again, with the new load.
    for gpu in gpus:
        gpu.set_load(0.4)
    fresh = cycle(collector, gpus, clock)
    assert fake_nvml.call_count("nvmlDeviceGetPcieThroughput") == 2 * 2 * 2
    assert fresh.gpus[0].pcie_receive_bytes_per_second == pytest.approx(first / 2, rel=0.01)
    cycle(collector, gpus, clock)
    assert fake_nvml.call_count("nvmlDeviceGetPcieThroughput") == 2 * 2 * 2
    clock.advance(10.0)
    cycle(collector, gpus, clock)
    assert fake_nvml.call_count("nvmlDeviceGetPcieThroughput") == 2 * 2 * 3


def test_pcie_throughput_interval_is_a_setting(clock):
    gpus = [SimulatedGpu(0, A100_SXM)]
    fake_nvml.configure(gpus)
    library = NvmlLibrary(fake_nvml, clock, pcie_throughput_interval=0.0)
    library.init()
    try:
        for _ in range(3):
            clock.advance(1.0)
            library.collect()
    finally:
        library.close()
    assert fake_nvml.call_count("nvmlDeviceGetPcieThroughput") == 2 * 3
    with pytest.raises(ValueError, match="pcie_throughput_interval"):
        NvmlLibrary(fake_nvml, clock, pcie_throughput_interval=-1.0)


def test_gpm_without_pcie_metrics_falls_back_to_throttled_throughput(clock, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="sn_monitor.agent.nvml")
    real = fake_nvml.nvmlGpmMetricsGet
    pcie = {fake_nvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, fake_nvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC}

    def without_pcie(request):
        real(request)
        for metric in request.metrics[: request.numMetrics]:
            if metric.metricId in pcie:
                metric.nvmlReturn = fake_nvml.NVML_ERROR_NOT_SUPPORTED
        return request

    monkeypatch.setattr(fake_nvml, "nvmlGpmMetricsGet", without_pcie)
    gpus = make_gpus(1)
    gpus[0].set_load(0.9)
    collector = node(gpus, clock)
    first = cycle(collector, gpus, clock).gpus[0]
    assert first.pcie_receive_bytes_per_second is None
    assert fake_nvml.call_count("nvmlDeviceGetPcieThroughput") == 0
    second = cycle(collector, gpus, clock).gpus[0]
    assert second.memory_bandwidth_utilization_ratio == pytest.approx(0.675, abs=0.01)
    assert second.pcie_receive_bytes_per_second == pytest.approx(
        gpus[0].pcie_rx_bytes_per_second, abs=1024
    )
    for _ in range(3):
        cycle(collector, gpus, clock)
    assert fake_nvml.call_count("nvmlDeviceGetPcieThroughput") == 2
    logged = [r for r in caplog.records if "GPM has no PCIe metrics" in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].gpu == 0


def test_gpu_log_lines_carry_the_gpu_index(clock, caplog):
    caplog.set_level(logging.DEBUG, logger="sn_monitor.agent.nvml")
    profile = replace(H100_SXM, unsupported=frozenset({"nvmlDeviceGetPcieReplayCounter"}))
    gpus = [SimulatedGpu(0, H100_SXM), SimulatedGpu(1, profile)]
    collector = node(gpus, clock)
    cycle(collector, gpus, clock)
    gpus[0].fall_off_bus()
    cycle(collector, gpus, clock)
    lost = [r for r in caplog.records if "lost" in r.getMessage()]
    assert [r.gpu for r in lost] == [0]
    unsupported = [r for r in caplog.records if "not supported" in r.getMessage()]
    assert unsupported
    assert {r.gpu for r in unsupported} == {1}


# ---------------------------------------------------------------- NVLink cadence

LINKS = 18
COUNTERS = 4  # CRC flit, CRC data, replay, recovery per link
PROBE = LINKS + 1  # the link count probe: 18 links and the InvalidArgument answer


def test_quiet_nvlinks_are_read_per_link_once_per_interval(clock):
    gpus = make_gpus(8)
    collector = node(gpus, clock)
    for step in range(1, 11):  # monotonic 1 s .. 10 s: within 10 s of the first read
        collected = cycle(collector, gpus, clock)
        for sample in collected.gpus:
            assert len(sample.nvlinks) == LINKS
            assert all(link.up and link.crc_errors_total == 0 for link in sample.nvlinks)
            assert all(link.recovery_errors_total == 0 for link in sample.nvlinks)
        counts = fake_nvml.call_counts()
        assert counts["nvmlDeviceGetNvLinkErrorCounter"] == 8 * LINKS * COUNTERS
        assert counts["nvmlDeviceGetNvLinkState"] == 8 * (PROBE + LINKS)
        assert counts["nvmlDeviceGetFieldValues"] == 8 * step
    # Ten seconds after the first read: every link of every GPU is read again.
    cycle(collector, gpus, clock)
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter") == 2 * 8 * LINKS * COUNTERS
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkState") == 8 * (PROBE + 2 * LINKS)


def test_nvlink_errors_show_per_link_within_one_cycle(clock):
    gpus = make_gpus(8)
    collector = node(gpus, clock)
    cycle(collector, gpus, clock)
    cycle(collector, gpus, clock)
    before = fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter")
    gpus[3].inject_nvlink_errors(5, crc=7, crc_data=2, replay=3)
    collected = cycle(collector, gpus, clock)
    link = collected.gpus[3].nvlinks[5]
    assert (link.crc_errors_total, link.replay_errors_total, link.recovery_errors_total) == (
        9,
        3,
        0,
    )
    # Only the GPU whose totals moved had its links read again.
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter") == before + LINKS * COUNTERS
    # Quiet again: served from the new read, no more per-link calls.
    again = cycle(collector, gpus, clock)
    assert again.gpus[3].nvlinks[5].crc_errors_total == 9
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter") == before + LINKS * COUNTERS


def test_nvlink_down_shows_within_one_cycle_and_up_again(clock):
    gpus = make_gpus(2)
    collector = node(gpus, clock)
    cycle(collector, gpus, clock)
    gpus[1].set_nvlink_down(7)  # counts a recovery: the totals move
    down = cycle(collector, gpus, clock).gpus[1].nvlinks[7]
    assert down.up is False
    assert down.recovery_errors_total == 1
    # While down, only that link's state is asked each cycle; its counters are not.
    states = fake_nvml.call_count("nvmlDeviceGetNvLinkState")
    counters = fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter")
    for _ in range(3):
        assert cycle(collector, gpus, clock).gpus[1].nvlinks[7].up is False
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkState") == states + 3
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter") == counters
    gpus[1].set_nvlink_up(7)  # no counter moves: seen through the down link's state
    up = cycle(collector, gpus, clock).gpus[1].nvlinks[7]
    assert up.up is True
    assert up.recovery_errors_total == 1


def test_xid_74_forces_a_per_link_read(clock):
    gpus = make_gpus(2)
    collector = node(gpus, clock)
    cycle(collector, gpus, clock)
    counters = fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter")
    gpus[0].inject_xid(74)
    collected = cycle(collector, gpus, clock)  # the cycle that drains the XID
    assert [(e.gpu, e.code) for e in collected.events] == [(0, 74)]
    cycle(collector, gpus, clock)
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter") == counters + LINKS * COUNTERS


def test_gpu_back_after_a_loss_reads_its_links_again(clock):
    gpus = make_gpus(1)
    collector = node(gpus, clock)
    cycle(collector, gpus, clock)
    gpus[0].fall_off_bus()
    assert cycle(collector, gpus, clock).gpus[0].lost
    counters = fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter")
    gpus[0].reset()
    back = cycle(collector, gpus, clock).gpus[0]
    assert not back.lost
    assert len(back.nvlinks) == LINKS
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter") == counters + LINKS * COUNTERS


def test_without_nvlink_totals_every_link_is_read_every_cycle(clock, monkeypatch):
    requested = record_field_ids(monkeypatch)
    profile = replace(H100_SXM, nvlink_totals_supported=False)
    gpus = [SimulatedGpu(i, profile) for i in range(2)]
    collector = node(gpus, clock)
    for _ in range(3):
        collected = cycle(collector, gpus, clock)
    assert collected.gpus[0].memory_temperature_celsius is not None
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter") == 3 * 2 * LINKS * COUNTERS
    # The totals answered NotSupported once, per field: asked no more; HBM temperature and
    # the NVLink data counters stay.
    assert [len(ids) for ids in requested] == [7, 7, 3, 3, 3, 3]
    gpus[0].inject_nvlink_errors(1, replay=2)
    assert cycle(collector, gpus, clock).gpus[0].nvlinks[1].replay_errors_total == 2


def test_a_failed_totals_read_falls_back_to_per_link_for_that_cycle(clock, monkeypatch):
    gpus = make_gpus(1)
    collector = node(gpus, clock)
    cycle(collector, gpus, clock)
    real = fake_nvml.nvmlDeviceGetFieldValues

    def flaky(handle, field_ids):
        entries = real(handle, field_ids)
        for entry in entries:
            if entry.fieldId == fake_nvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL:
                entry.nvmlReturn = fake_nvml.NVML_ERROR_TIMEOUT
        return entries

    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetFieldValues", flaky)
    counters = fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter")
    cycle(collector, gpus, clock)
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter") == counters + LINKS * COUNTERS
    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetFieldValues", real)
    cycle(collector, gpus, clock)  # totals back: they differ from "none", read once more
    cycle(collector, gpus, clock)
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter") == (
        counters + 2 * LINKS * COUNTERS
    )


def test_intervals_are_collector_settings(clock):
    gpus = [SimulatedGpu(0, A100_SXM)]
    fake_nvml.configure(gpus)
    collector = NvmlCollector(
        fake_nvml, clock, pcie_throughput_interval=0.0, nvlink_link_interval=0.0
    )
    for _ in range(3):
        cycle(collector, gpus, clock)
    assert fake_nvml.call_count("nvmlDeviceGetPcieThroughput") == 2 * 3
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter") == 3 * 12 * COUNTERS
    with pytest.raises(ValueError, match="nvlink_link_interval"):
        NvmlCollector(fake_nvml, clock, nvlink_link_interval=-1.0)
    with pytest.raises(ValueError, match="pcie_throughput_interval"):
        NvmlCollector(fake_nvml, clock, pcie_throughput_interval=-1.0)


# ---------------------------------------------------------------- fabric, processes


def test_fabric_state_of_a_registered_and_an_unregistered_gpu(clock):
    gpus = make_gpus(3)
    gpus[1].inject_fabric_not_ready()  # Fabric Manager not running
    gpus[2].inject_fabric_not_ready(state=3, status=fake_nvml.NVML_ERROR_UNKNOWN)
    first, second, third = node(gpus, clock).collect().gpus
    assert (first.fabric_state, first.fabric_status, first.fabric_clique_id) == (3, 0, 0)
    assert first.fabric_cluster_uuid == "00000000-0000-0000-0000-000000000000"
    # Before completion the status, clique and cluster mean nothing: left out.
    assert (second.fabric_state, second.fabric_status, second.fabric_clique_id,
            second.fabric_cluster_uuid) == (1, None, None, None)
    assert (third.fabric_state, third.fabric_status) == (3, fake_nvml.NVML_ERROR_UNKNOWN)
    assert fake_nvml.call_count("nvmlDeviceGetGpuFabricInfo") == 0  # the V call served


def test_a_gpu_without_fabric_has_no_fabric_values_and_is_not_asked_again(clock):
    gpus = make_gpus(1, A100_SXM)
    collector = node(gpus, clock)
    sample = collector.collect().gpus[0]
    assert (sample.fabric_state, sample.fabric_status, sample.fabric_clique_id) == (
        None, None, None)
    cycle(collector, gpus, clock)
    assert fake_nvml.call_count("nvmlDeviceGetGpuFabricInfoV") == 1


def test_a_fabric_state_of_not_supported_is_an_absent_capability(clock):
    gpus = make_gpus(1)
    collector = node(gpus, clock)
    gpus[0].fabric_state = fake_nvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    assert collector.collect().gpus[0].fabric_state is None
    gpus[0].fabric_state = fake_nvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert cycle(collector, gpus, clock).gpus[0].fabric_state is None
    assert fake_nvml.call_count("nvmlDeviceGetGpuFabricInfoV") == 1


def test_an_older_driver_without_the_v_call_uses_the_first_fabric_call(clock):
    gpus = make_gpus(1)
    gpus[0].inject_fabric_not_ready(state=2)
    collector = node(gpus, clock, missing_functions=["nvmlDeviceGetGpuFabricInfoV"])
    assert collector.collect().gpus[0].fabric_state == 2
    assert cycle(collector, gpus, clock).gpus[0].fabric_state == 2
    assert fake_nvml.call_count("nvmlDeviceGetGpuFabricInfoV") == 1
    assert fake_nvml.call_count("nvmlDeviceGetGpuFabricInfo") == 2


def test_a_transient_fabric_error_leaves_the_values_out_for_one_cycle(clock):
    gpus = make_gpus(1)
    collector = node(gpus, clock)
    fake_nvml.inject_error(0, "nvmlDeviceGetGpuFabricInfoV", fake_nvml.NVML_ERROR_TIMEOUT,
                           times=1)
    sample = collector.collect().gpus[0]
    assert sample.fabric_state is None
    assert sample.temperature_celsius is not None  # the rest of the sample stays
    assert cycle(collector, gpus, clock).gpus[0].fabric_state == 3


def test_a_fabric_fault_is_a_lost_gpu(clock):
    gpus = make_gpus(1)
    collector = node(gpus, clock)
    fake_nvml.inject_error(0, "nvmlDeviceGetGpuFabricInfoV", fake_nvml.NVML_ERROR_GPU_IS_LOST)
    collected = collector.collect()
    assert collected.gpus[0].lost
    assert [e.kind for e in collected.events] == ["gpu_lost"]


def test_compute_processes_per_gpu(clock):
    gpus = make_gpus(2)
    gpus[1].set_processes([(100, 5 * 2**30), (101, 2**30)])
    first, second = node(gpus, clock).collect().gpus
    assert first.processes == ()
    assert second.processes is not None
    assert [(p.pid, p.used_memory_bytes) for p in second.processes] == [
        (100, 5 * 2**30), (101, 2**30)]


def test_processes_not_supported_are_none_and_an_old_driver_uses_v2(clock):
    gpus = make_gpus(1, replace(H100_SXM, unsupported=frozenset(
        {"nvmlDeviceGetComputeRunningProcesses"})))
    assert node(gpus, clock).collect().gpus[0].processes is None
    gpus = make_gpus(1)
    gpus[0].set_processes([(7, 1)])
    collector = node(gpus, clock, missing_functions=["nvmlDeviceGetComputeRunningProcesses"])
    assert collector.collect().gpus[0].processes is not None
    assert fake_nvml.call_count("nvmlDeviceGetComputeRunningProcesses_v2") == 1


def test_nvlink_data_counters_sum_every_link_and_grow_with_load(clock):
    gpus = make_gpus(2)
    gpus[0].set_load(1.0)
    gpus[1].set_load(0.0)
    gpus[1].set_nvlink_down(3)
    collector = node(gpus, clock)
    before = cycle(collector, gpus, clock).gpus
    after = cycle(collector, gpus, clock).gpus
    busy, idle = (
        (a.nvlink_transmitted_bytes_total - b.nvlink_transmitted_bytes_total,
         a.nvlink_received_bytes_total - b.nvlink_received_bytes_total)
        for a, b in zip(after, before, strict=True)
    )
    # 18 links at 35 % of 25 GB/s each way for one second; NVML counts whole KiB
    assert busy[0] == pytest.approx(18 * 0.35 * 25e9, rel=1e-3)
    assert busy[1] == busy[0]
    assert idle == (0, 0)
    assert before[0].nvlink_transmitted_bytes_total % 1024 == 0


def test_nvlink_data_read_with_the_all_links_scope(clock, monkeypatch):
    """A bare field id is scope 0, link 0 alone: the adapter asks for every link's sum."""
    requested = record_field_ids(monkeypatch)
    gpus = make_gpus(1)
    collector = node(gpus, clock)
    cycle(collector, gpus, clock)
    data_ids = {fake_nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                fake_nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX}
    asked = [item for item in requested[0] if isinstance(item, tuple)]
    assert {field for field, _ in asked} == data_ids
    assert {scope for _, scope in asked} == {0xFFFFFFFF}


def test_gpus_without_nvlink_have_no_nvlink_data(clock):
    gpus = [SimulatedGpu(0, replace(H100_SXM, nvlink_count=0))]
    collector = node(gpus, clock)
    sample = cycle(collector, gpus, clock).gpus[0]
    assert sample.nvlink_transmitted_bytes_total is None
    assert sample.nvlink_received_bytes_total is None


def test_gpm_tensor_activity_is_the_average_and_a_refusing_driver_loses_only_it(
        clock, monkeypatch):
    gpus = make_gpus(2)
    for gpu in gpus:
        gpu.set_load(0.9)
    collector = node(gpus, clock)
    assert cycle(collector, gpus, clock).gpus[0].tensor_active_ratio is None  # two samples
    before = [gpu.gpm_snapshot() for gpu in gpus]
    read = cycle(collector, gpus, clock).gpus
    for sample, gpu, first in zip(read, gpus, before, strict=True):
        after = gpu.gpm_snapshot()
        expected = ((after.tensor_active_seconds - first.tensor_active_seconds)
                    / (after.elapsed_seconds - first.elapsed_seconds))
        assert sample.tensor_active_ratio == pytest.approx(expected)
        assert 0.0 < expected < 1.0
    real = fake_nvml.nvmlGpmMetricsGet

    def without_tensor(request):
        real(request)
        for metric in request.metrics[: request.numMetrics]:
            if metric.metricId == fake_nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL:
                metric.nvmlReturn = fake_nvml.NVML_ERROR_NOT_SUPPORTED
        return request

    monkeypatch.setattr(fake_nvml, "nvmlGpmMetricsGet", without_tensor)
    refused = cycle(collector, gpus, clock).gpus[0]
    assert refused.tensor_active_ratio is None
    assert refused.memory_bandwidth_utilization_ratio is not None
    assert refused.pcie_receive_bytes_per_second is not None
