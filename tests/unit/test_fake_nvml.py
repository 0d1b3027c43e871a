from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import A100_SXM, H100_SXM, GpuProfile, SimulatedGpu, make_gpus


@pytest.fixture(autouse=True)
def _clean_fake() -> Iterator[None]:
    yield
    fake_nvml.reset()


def start(gpus: list[SimulatedGpu]) -> None:
    fake_nvml.configure(gpus)
    fake_nvml.nvmlInit()


def test_reuses_pynvml_exceptions():
    import pynvml  # noqa: TID251 - checking the fake against the real bindings

    assert fake_nvml.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert fake_nvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT).__class__ is pynvml.NVMLError_Timeout
    assert fake_nvml.nvmlExceptionClass(pynvml.NVML_ERROR_NOT_SUPPORTED) is (
        pynvml.NVMLError_NotSupported
    )


def test_calls_before_init_raise_uninitialized():
    fake_nvml.configure(make_gpus(1))
    with pytest.raises(fake_nvml.NVMLError_Uninitialized):
        fake_nvml.nvmlDeviceGetCount()
    fake_nvml.nvmlInit()
    assert fake_nvml.nvmlDeviceGetCount() == 1
    fake_nvml.nvmlShutdown()
    with pytest.raises(fake_nvml.NVMLError_Uninitialized):
        fake_nvml.nvmlDeviceGetCount()


def test_missing_library_and_driver():
    fake_nvml.configure_missing_library()
    with pytest.raises(fake_nvml.NVMLError_LibraryNotFound):
        fake_nvml.nvmlInit()
    fake_nvml.configure_driver_not_loaded()
    with pytest.raises(fake_nvml.NVMLError_DriverNotLoaded):
        fake_nvml.nvmlInit()


def test_units_and_struct_shapes():
    gpus = make_gpus(2)
    start(gpus)
    for gpu in gpus:
        gpu.set_load(1.0)
        gpu.step(10.0)
    handle = fake_nvml.nvmlDeviceGetHandleByIndex(1)
    assert fake_nvml.nvmlDeviceGetIndex(handle) == 1
    assert fake_nvml.nvmlSystemGetDriverVersion() == "550.90.07"
    pci = fake_nvml.nvmlDeviceGetPciInfo(handle)
    assert pci.busId == "00000000:2A:00.0"
    assert pci.busIdLegacy == "0000:2A:00.0"
    memory = fake_nvml.nvmlDeviceGetMemoryInfo(handle)
    assert memory.total == H100_SXM.memory_total_bytes == memory.used + memory.free
    assert fake_nvml.nvmlDeviceGetUtilizationRates(handle).gpu == 100
    power_mw = fake_nvml.nvmlDeviceGetPowerUsage(handle)
    assert power_mw == round(gpus[1].power_watts * 1000)
    assert fake_nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle) == [200_000, 700_000]
    assert fake_nvml.nvmlDeviceGetMaxClockInfo(handle, fake_nvml.NVML_CLOCK_SM) == 1980
    kbps = fake_nvml.nvmlDeviceGetPcieThroughput(handle, fake_nvml.NVML_PCIE_UTIL_RX_BYTES)
    assert kbps == int(gpus[1].pcie_rx_bytes_per_second / 1024)
    (field,) = fake_nvml.nvmlDeviceGetFieldValues(handle, [fake_nvml.NVML_FI_DEV_MEMORY_TEMP])
    assert field.nvmlReturn == fake_nvml.NVML_SUCCESS
    assert field.value.uiVal == round(gpus[1].memory_temperature_celsius)


def test_set_power_limit_out_of_range_is_invalid_argument():
    gpus = make_gpus(1)
    start(gpus)
    handle = fake_nvml.nvmlDeviceGetHandleByIndex(0)
    fake_nvml.nvmlDeviceSetPowerManagementLimit(handle, 350_000)
    assert fake_nvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 350_000
    with pytest.raises(fake_nvml.NVMLError_InvalidArgument):
        fake_nvml.nvmlDeviceSetPowerManagementLimit(handle, 10_000)


def test_lost_gpu_raises_gpu_is_lost_from_every_device_call():
    gpus = make_gpus(2)
    start(gpus)
    handle = fake_nvml.nvmlDeviceGetHandleByIndex(0)
    gpus[0].fall_off_bus()
    for call in (
        lambda: fake_nvml.nvmlDeviceGetUUID(handle),
        lambda: fake_nvml.nvmlDeviceGetTemperature(handle, fake_nvml.NVML_TEMPERATURE_GPU),
        lambda: fake_nvml.nvmlDeviceGetNvLinkState(handle, 0),
        lambda: fake_nvml.nvmlDeviceGetHandleByIndex(0),
    ):
        with pytest.raises(fake_nvml.NVMLError_GpuIsLost):
            call()
    other = fake_nvml.nvmlDeviceGetHandleByIndex(1)
    assert fake_nvml.nvmlDeviceGetName(other) == H100_SXM.name


def test_not_supported_configuration():
    profile = GpuProfile(
        name="test", memory_total_bytes=1, unsupported=frozenset({"nvmlDeviceGetPcieReplayCounter"})
    )
    start([SimulatedGpu(0, profile), SimulatedGpu(1, A100_SXM)])
    with pytest.raises(fake_nvml.NVMLError_NotSupported):
        fake_nvml.nvmlDeviceGetPcieReplayCounter(fake_nvml.nvmlDeviceGetHandleByIndex(0))
    a100 = fake_nvml.nvmlDeviceGetHandleByIndex(1)
    assert fake_nvml.nvmlGpmQueryDeviceSupport(a100).isSupportedDevice == 0
    (field,) = fake_nvml.nvmlDeviceGetFieldValues(a100, [fake_nvml.NVML_FI_DEV_MEMORY_TEMP])
    assert field.nvmlReturn == fake_nvml.NVML_ERROR_NOT_SUPPORTED
    assert fake_nvml.call_count("nvmlDeviceGetPcieReplayCounter") == 1


def test_missing_function_raises_function_not_found():
    fake_nvml.configure(make_gpus(1), missing_functions={"nvmlDeviceGetCurrentClocksEventReasons"})
    fake_nvml.nvmlInit()
    handle = fake_nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(fake_nvml.NVMLError_FunctionNotFound):
        fake_nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    assert fake_nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle) >= 0


def test_event_set_drains_xids_then_times_out_at_once_for_a_zero_timeout():
    gpus = make_gpus(2)
    start(gpus)
    gpus[0].inject_xid(31)  # before registration: not delivered
    event_set = fake_nvml.nvmlEventSetCreate()
    for index in range(2):
        handle = fake_nvml.nvmlDeviceGetHandleByIndex(index)
        fake_nvml.nvmlDeviceRegisterEvents(
            handle, fake_nvml.nvmlEventTypeXidCriticalError, event_set
        )
    handle0 = fake_nvml.nvmlDeviceGetHandleByIndex(0)
    gpus[1].inject_xid(48)
    gpus[1].inject_xid(48)
    gpus[0].fall_off_bus()
    handles = {id(fake_nvml.nvmlDeviceGetHandleByIndex(1)): 1, id(handle0): 0}
    seen = []
    for _ in range(3):
        data = fake_nvml.nvmlEventSetWait_v2(event_set, 10_000)
        assert data.eventType == fake_nvml.nvmlEventTypeXidCriticalError
        seen.append((handles[id(data.device)], data.eventData))
    assert sorted(seen) == [(0, 79), (1, 48), (1, 48)]
    with pytest.raises(fake_nvml.NVMLError_Timeout):
        fake_nvml.nvmlEventSetWait_v2(event_set, 0)
    fake_nvml.nvmlEventSetFree(event_set)


def test_event_set_wait_blocks_until_an_xid_is_injected():
    gpus = make_gpus(2)
    start(gpus)
    event_set = fake_nvml.nvmlEventSetCreate()
    handle = fake_nvml.nvmlDeviceGetHandleByIndex(1)
    fake_nvml.nvmlDeviceRegisterEvents(handle, fake_nvml.nvmlEventTypeXidCriticalError,
                                       event_set)
    waiting = threading.Event()
    got: list[object] = []

    def wait() -> None:
        waiting.set()
        got.append(fake_nvml.nvmlEventSetWait_v2(event_set, 60_000))

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    assert waiting.wait(5)
    # Blocked: no XID queued, so nothing came back (and Timeout would take 60 s).
    assert got == []
    gpus[1].inject_xid(48)
    waiter.join(30)
    assert not waiter.is_alive()
    assert [(data.eventType, data.eventData) for data in got] == [
        (fake_nvml.nvmlEventTypeXidCriticalError, 48)]
    fake_nvml.nvmlEventSetFree(event_set)


def test_event_set_wait_times_out_after_its_timeout_when_nothing_comes():
    start(make_gpus(1))
    event_set = fake_nvml.nvmlEventSetCreate()
    fake_nvml.nvmlDeviceRegisterEvents(fake_nvml.nvmlDeviceGetHandleByIndex(0),
                                       fake_nvml.nvmlEventTypeXidCriticalError, event_set)
    with pytest.raises(fake_nvml.NVMLError_Timeout):
        fake_nvml.nvmlEventSetWait_v2(event_set, 20)
    assert fake_nvml.call_count("nvmlEventSetWait_v2") >= 1


def test_nvlink_beyond_count_is_invalid_argument():
    start(make_gpus(1))
    handle = fake_nvml.nvmlDeviceGetHandleByIndex(0)
    assert fake_nvml.nvmlDeviceGetNvLinkState(handle, 17) == fake_nvml.NVML_FEATURE_ENABLED
    with pytest.raises(fake_nvml.NVMLError_InvalidArgument):
        fake_nvml.nvmlDeviceGetNvLinkState(handle, 18)
    with pytest.raises(fake_nvml.NVMLError_InvalidArgument):
        fake_nvml.nvmlDeviceGetNvLinkErrorCounter(
            handle, 18, fake_nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
        )


def test_gpm_metrics_between_two_samples():
    gpus = make_gpus(1)
    start(gpus)
    gpus[0].set_load(1.0)
    handle = fake_nvml.nvmlDeviceGetHandleByIndex(0)
    first = fake_nvml.nvmlGpmSampleGet(handle, fake_nvml.nvmlGpmSampleAlloc())
    gpus[0].step(5.0)
    second = fake_nvml.nvmlGpmSampleGet(handle, fake_nvml.nvmlGpmSampleAlloc())
    request = fake_nvml.c_nvmlGpmMetricsGet_t()
    request.version = fake_nvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = fake_nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
    fake_nvml.nvmlGpmMetricsGet(request)
    assert request.metrics[0].nvmlReturn == fake_nvml.NVML_SUCCESS
    assert request.metrics[0].value == pytest.approx(75.0)
    fake_nvml.nvmlGpmSampleFree(first)
    fake_nvml.nvmlGpmSampleFree(second)


def test_gpm_pcie_metrics_are_mib_per_second_averaged_between_samples():
    gpus = make_gpus(1)
    start(gpus)
    handle = fake_nvml.nvmlDeviceGetHandleByIndex(0)
    gpus[0].set_load(1.0)
    first = fake_nvml.nvmlGpmSampleGet(handle, fake_nvml.nvmlGpmSampleAlloc())
    gpus[0].step(2.0)
    busy_rx, busy_tx = gpus[0].pcie_rx_bytes_per_second, gpus[0].pcie_tx_bytes_per_second
    gpus[0].set_load(0.0)
    gpus[0].step(2.0)
    second = fake_nvml.nvmlGpmSampleGet(handle, fake_nvml.nvmlGpmSampleAlloc())
    request = fake_nvml.c_nvmlGpmMetricsGet_t()
    request.version = fake_nvml.NVML_GPM_METRICS_GET_VERSION
    request.sample1, request.sample2 = first, second
    ids = (
        fake_nvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
        fake_nvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
        fake_nvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC,
        fake_nvml.NVML_GPM_METRIC_MAX - 1,  # not simulated
    )
    request.numMetrics = len(ids)
    for slot, metric_id in enumerate(ids):
        request.metrics[slot].metricId = metric_id
    fake_nvml.nvmlGpmMetricsGet(request)
    dram, rx, tx, other = request.metrics[: len(ids)]
    assert fake_nvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC == 20
    assert fake_nvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC == 21
    assert dram.nvmlReturn == rx.nvmlReturn == tx.nvmlReturn == fake_nvml.NVML_SUCCESS
    assert dram.value == pytest.approx(75.0 / 2)
    # Two busy seconds and two idle ones: half the busy rate, in MiB/s.
    assert rx.value == pytest.approx(busy_rx / 2 / 2**20)
    assert tx.value == pytest.approx(busy_tx / 2 / 2**20)
    assert rx.value > 5000
    assert other.nvmlReturn == fake_nvml.NVML_ERROR_NOT_SUPPORTED
    assert fake_nvml.call_count("nvmlGpmMetricsGet") == 1
    assert fake_nvml.call_count("nvmlGpmSampleGet") == 2
    assert fake_nvml.call_count("nvmlDeviceGetPcieThroughput") == 0
    fake_nvml.nvmlGpmSampleFree(first)
    fake_nvml.nvmlGpmSampleFree(second)


NVLINK_TOTALS = (
    fake_nvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    fake_nvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    fake_nvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    fake_nvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
)


def test_nvlink_error_totals_are_field_values_summed_over_links():
    assert NVLINK_TOTALS == (38, 45, 52, 59)
    gpus = make_gpus(1)
    start(gpus)
    gpus[0].inject_nvlink_errors(2, crc=5, crc_data=2, replay=3, recovery=1)
    gpus[0].inject_nvlink_errors(9, crc=1, replay=4)
    handle = fake_nvml.nvmlDeviceGetHandleByIndex(0)
    entries = fake_nvml.nvmlDeviceGetFieldValues(
        handle, [fake_nvml.NVML_FI_DEV_MEMORY_TEMP, *NVLINK_TOTALS, 9999]
    )
    assert [e.fieldId for e in entries] == [fake_nvml.NVML_FI_DEV_MEMORY_TEMP, *NVLINK_TOTALS, 9999]
    temperature, *totals, other = entries
    assert temperature.nvmlReturn == fake_nvml.NVML_SUCCESS
    assert other.nvmlReturn == fake_nvml.NVML_ERROR_NOT_SUPPORTED
    for entry in totals:
        assert entry.nvmlReturn == fake_nvml.NVML_SUCCESS
        assert entry.valueType == fake_nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert [e.value.ullVal for e in totals] == [6, 2, 7, 1]
    assert fake_nvml.call_count("nvmlDeviceGetFieldValues") == 1


def test_nvlink_totals_not_supported_per_field():
    no_totals = GpuProfile(name="old driver", memory_total_bytes=1, nvlink_totals_supported=False)
    no_nvlink = GpuProfile(name="pcie card", memory_total_bytes=1, nvlink_count=0)
    start([SimulatedGpu(0, no_totals), SimulatedGpu(1, no_nvlink), SimulatedGpu(2, A100_SXM)])
    for index in (0, 1):
        handle = fake_nvml.nvmlDeviceGetHandleByIndex(index)
        temperature, *totals = fake_nvml.nvmlDeviceGetFieldValues(
            handle, [fake_nvml.NVML_FI_DEV_MEMORY_TEMP, *NVLINK_TOTALS]
        )
        assert temperature.nvmlReturn == fake_nvml.NVML_SUCCESS
        assert {e.nvmlReturn for e in totals} == {fake_nvml.NVML_ERROR_NOT_SUPPORTED}
    # A100: no HBM temperature, but NVLink totals.
    a100 = fake_nvml.nvmlDeviceGetHandleByIndex(2)
    temperature, *totals = fake_nvml.nvmlDeviceGetFieldValues(
        a100, [fake_nvml.NVML_FI_DEV_MEMORY_TEMP, *NVLINK_TOTALS]
    )
    assert temperature.nvmlReturn == fake_nvml.NVML_ERROR_NOT_SUPPORTED
    assert {e.nvmlReturn for e in totals} == {fake_nvml.NVML_SUCCESS}


def test_nvlink_down_counts_one_recovery_like_real_hardware():
    gpus = make_gpus(1)
    start(gpus)
    handle = fake_nvml.nvmlDeviceGetHandleByIndex(0)
    gpus[0].set_nvlink_down(4)
    gpus[0].set_nvlink_down(4)  # already down: no second recovery
    assert fake_nvml.nvmlDeviceGetNvLinkState(handle, 4) == fake_nvml.NVML_FEATURE_DISABLED
    recovery = fake_nvml.nvmlDeviceGetNvLinkErrorCounter(
        handle, 4, fake_nvml.NVML_NVLINK_ERROR_DL_RECOVERY
    )
    assert recovery == 1
    (total,) = fake_nvml.nvmlDeviceGetFieldValues(
        handle, [fake_nvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL]
    )
    assert total.value.ullVal == 1


def _call_in_thread(fn, *args):
    """Run ``fn(*args)`` on a thread; returns the thread and a dict with its outcome."""
    import threading

    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = fn(*args)
        except fake_nvml.NVMLError as err:
            outcome["error"] = err

    thread = threading.Thread(target=run, name="fake-nvml-caller", daemon=True)
    thread.start()
    return thread, outcome


def test_a_hung_call_blocks_until_released_and_other_calls_go_on():
    start(make_gpus(2))
    hang = fake_nvml.inject_hang(gpu=1, function="nvmlDeviceGetTemperature")
    handles = [fake_nvml.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    thread, outcome = _call_in_thread(fake_nvml.nvmlDeviceGetTemperature, handles[1],
                                      fake_nvml.NVML_TEMPERATURE_GPU)
    try:
        assert hang.entered.wait(10)
        assert hang.waiting == 1
        assert outcome == {}
        # The module lock is free: GPU 0, and other functions on GPU 1, answer.
        assert fake_nvml.nvmlDeviceGetTemperature(handles[0], fake_nvml.NVML_TEMPERATURE_GPU)
        assert fake_nvml.nvmlDeviceGetPowerUsage(handles[1]) > 0
        assert fake_nvml.call_count("nvmlDeviceGetTemperature") == 2
    finally:
        hang.release()
        thread.join(10)
    assert not thread.is_alive()
    assert isinstance(outcome["value"], int)
    assert hang.released
    assert hang.waiting == 0
    # Released for good: the next call returns at once.
    assert fake_nvml.nvmlDeviceGetTemperature(handles[1], fake_nvml.NVML_TEMPERATURE_GPU)


def test_a_global_hang_wedges_every_call_and_reset_releases_it():
    start(make_gpus(1))
    hang = fake_nvml.inject_hang()
    assert hang.matches(-1, "nvmlShutdown")
    assert hang.matches(0, "nvmlDeviceGetCount")
    thread, outcome = _call_in_thread(fake_nvml.nvmlSystemGetDriverVersion)
    try:
        assert hang.entered.wait(10)
    finally:
        fake_nvml.reset()  # releases every hang; the call then meets an empty NVML
        thread.join(10)
    assert not thread.is_alive()
    assert isinstance(outcome["error"], fake_nvml.NVMLError_Uninitialized)
    assert hang.released


def test_release_hangs_lets_every_blocked_call_go_on():
    start(make_gpus(2))
    hangs = [fake_nvml.inject_hang(gpu=i) for i in range(2)]
    callers = [_call_in_thread(fake_nvml.nvmlDeviceGetHandleByIndex, i) for i in range(2)]
    try:
        for hang in hangs:
            assert hang.entered.wait(10)
    finally:
        fake_nvml.release_hangs()
        for thread, _ in callers:
            thread.join(10)
    assert [repr(outcome["value"]) for _, outcome in callers] == [
        "<fake nvmlDevice_t 0>", "<fake nvmlDevice_t 1>"]


@pytest.mark.parametrize(("gpu", "function", "message"), [
    (None, "nvmlNoSuchCall", "no NVML function"),
    (-2, None, "gpu must be"),
])
def test_bad_hangs_are_refused(gpu, function, message):
    with pytest.raises(ValueError, match=message):
        fake_nvml.inject_hang(gpu, function)
