"""Every NVML error code, injected into the fake, against the adapter's documented policy.

The whole policy is :data:`POLICY`: one line per ``NVML_ERROR_*`` constant of pynvml. A
code pynvml adds later fails :func:`test_policy_covers_every_pynvml_error_code` until
someone classifies it here (and in ``sn_monitor/agent/nvml/errors.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pynvml  # noqa: TID251 - the test iterates pynvml's own list of error codes
import pytest

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.snapshot import Collected, GpuSample
from sn_monitor.clock import ManualClock
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import SimulatedGpu, make_gpus

# Field left out, never asked again on that GPU.
ABSENT = "absent"
# Field left out, never asked again on any GPU: the library lacks the function.
MISSING_FUNCTION = "missing function"
# The GPU is lost: lost=True, identity kept, one gpu_lost event per loss.
FAULT = "fault"
# Field left out this cycle only.
TRANSIENT = "transient"

# The adapter's classification of an error from a per-cycle device read, per code.
POLICY: dict[str, str] = {
    "NVML_ERROR_UNINITIALIZED": FAULT,  # NVML torn down under the agent
    "NVML_ERROR_INVALID_ARGUMENT": TRANSIENT,
    "NVML_ERROR_NOT_SUPPORTED": ABSENT,
    "NVML_ERROR_NO_PERMISSION": ABSENT,
    "NVML_ERROR_ALREADY_INITIALIZED": TRANSIENT,
    "NVML_ERROR_NOT_FOUND": TRANSIENT,
    "NVML_ERROR_INSUFFICIENT_SIZE": TRANSIENT,
    "NVML_ERROR_INSUFFICIENT_POWER": FAULT,  # external power cables not attached
    "NVML_ERROR_DRIVER_NOT_LOADED": FAULT,  # after init: the driver went away
    "NVML_ERROR_TIMEOUT": TRANSIENT,
    "NVML_ERROR_IRQ_ISSUE": FAULT,
    "NVML_ERROR_LIBRARY_NOT_FOUND": TRANSIENT,  # cannot happen once the library is loaded
    "NVML_ERROR_FUNCTION_NOT_FOUND": MISSING_FUNCTION,
    "NVML_ERROR_CORRUPTED_INFOROM": FAULT,
    "NVML_ERROR_GPU_IS_LOST": FAULT,
    "NVML_ERROR_RESET_REQUIRED": FAULT,
    "NVML_ERROR_OPERATING_SYSTEM": FAULT,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": FAULT,
    "NVML_ERROR_IN_USE": TRANSIENT,
    "NVML_ERROR_MEMORY": TRANSIENT,
    "NVML_ERROR_NO_DATA": TRANSIENT,
    "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED": ABSENT,
    "NVML_ERROR_INSUFFICIENT_RESOURCES": TRANSIENT,
    "NVML_ERROR_FREQ_NOT_SUPPORTED": TRANSIENT,
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": ABSENT,  # bindings newer/older than the driver
    "NVML_ERROR_DEPRECATED": ABSENT,
    "NVML_ERROR_NOT_READY": TRANSIENT,
    "NVML_ERROR_GPU_NOT_FOUND": FAULT,  # the device is gone
    "NVML_ERROR_INVALID_STATE": TRANSIENT,
    "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED": TRANSIENT,
    "NVML_ERROR_UNKNOWN": FAULT,
}

# From nvmlInit: these mean "no NVML on this node" (SourceMissing); any other code is a
# CollectorError.
INIT_SOURCE_MISSING = frozenset({"NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED"})

CODES: dict[str, int] = {
    name: value
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_") and isinstance(value := getattr(pynvml, name), int)
}
NAMES = sorted(CODES, key=CODES.__getitem__)

GPU = 2
READ = "nvmlDeviceGetPowerUsage"
FIELD = "power_watts"
IDENTITY = ("index", "uuid", "name", "pci_bus_id", "serial", "vbios_version", "driver_version")


@pytest.fixture(autouse=True)
def _clean_fake() -> Iterator[None]:
    yield
    fake_nvml.reset()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


class Node:
    """An 8-GPU fake node read by the collector; ``cycle()`` steps time and collects."""

    def __init__(self, clock: ManualClock, count: int = 8) -> None:
        self.clock = clock
        self.gpus: list[SimulatedGpu] = make_gpus(count)
        for gpu in self.gpus:
            gpu.set_load(0.5)
        fake_nvml.configure(self.gpus)
        self.collector = NvmlCollector(fake_nvml, clock)

    def cycle(self) -> Collected:
        for gpu in self.gpus:
            gpu.step(1.0)
        self.clock.advance(1.0)
        return self.collector.collect()


def missing(sample: GpuSample) -> set[str]:
    return {name for name in GpuSample.__slots__ if getattr(sample, name) is None}


def identity(sample: GpuSample) -> tuple[object, ...]:
    return tuple(getattr(sample, name) for name in IDENTITY)


def adapter_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("sn_monitor")]


def test_policy_covers_every_pynvml_error_code():
    assert len(CODES) >= 30
    assert set(POLICY) == set(CODES), "classify the new NVML error code in POLICY"


@pytest.mark.parametrize("name", NAMES)
def test_error_on_a_per_cycle_read(name, clock, caplog):
    code = CODES[name]
    node = Node(clock)
    node.cycle()
    healthy = node.cycle()
    assert all(missing(sample) == set() for sample in healthy.gpus)
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    before = fake_nvml.call_count(READ)
    fake_nvml.inject_error(GPU, READ, code)
    collected = node.cycle()
    expected = POLICY[name]
    # Every GPU asks once; after FunctionNotFound on GPU 2 the later ones do not.
    asked = GPU + 1 if expected == MISSING_FUNCTION else 8
    assert fake_nvml.call_count(READ) - before == asked
    if expected == FAULT:
        assert_fault(node, collected, healthy, code)
    elif expected == TRANSIENT:
        assert_transient(node, collected, caplog)
    elif expected == ABSENT:
        assert_absent(node, collected, caplog)
    else:
        assert_missing_function(node, collected, caplog)


def assert_others_unaffected(collected: Collected, skip: set[int]) -> None:
    for sample in collected.gpus:
        if sample.index not in skip:
            assert not sample.lost
            assert missing(sample) == set(), sample.index


def assert_absent(node: Node, collected: Collected, caplog: pytest.LogCaptureFixture) -> None:
    sample = collected.gpus[GPU]
    assert not sample.lost
    assert missing(sample) == {FIELD}
    assert collected.events == ()
    assert_others_unaffected(collected, {GPU})
    # Never asked again on that GPU, even once the error is gone.
    for clear in (False, True):
        if clear:
            fake_nvml.clear_errors()
        before = fake_nvml.call_count(READ)
        again = node.cycle()
        assert fake_nvml.call_count(READ) - before == 7
        assert missing(again.gpus[GPU]) == {FIELD}
        assert_others_unaffected(again, {GPU})
    assert len(adapter_lines(caplog)) <= 1


def assert_missing_function(
    node: Node, collected: Collected, caplog: pytest.LogCaptureFixture
) -> None:
    # FunctionNotFound is the library's answer (the symbol is not in libnvidia-ml), the
    # same for every GPU: the GPUs read before GPU 2 had it, those after do not ask.
    for sample in collected.gpus:
        assert not sample.lost
        assert missing(sample) == (set() if sample.index < GPU else {FIELD})
    assert collected.events == ()
    before = fake_nvml.call_count(READ)
    again = node.cycle()
    assert fake_nvml.call_count(READ) == before
    for sample in again.gpus:
        assert missing(sample) == {FIELD}
    lines = adapter_lines(caplog)
    assert len(lines) == 1
    assert READ in lines[0]


def assert_fault(node: Node, collected: Collected, healthy: Collected, code: int) -> None:
    lost = collected.gpus[GPU]
    assert lost.lost
    assert identity(lost) == identity(healthy.gpus[GPU])
    assert lost.uuid
    assert lost.power_watts is None
    assert [(e.kind, e.gpu, e.pci_bus_id) for e in collected.events] == [
        ("gpu_lost", GPU, healthy.gpus[GPU].pci_bus_id)
    ]
    assert_others_unaffected(collected, {GPU})
    # Still failing: still lost, no new event.
    again = node.cycle()
    assert again.gpus[GPU].lost
    assert again.events == ()
    assert_others_unaffected(again, {GPU})
    # The error clears: the GPU is back, with its values.
    fake_nvml.clear_errors()
    back = node.cycle()
    assert not back.gpus[GPU].lost
    assert back.gpus[GPU].power_watts is not None
    assert identity(back.gpus[GPU]) == identity(healthy.gpus[GPU])
    assert back.events == ()
    # A later loss is a new event.
    fake_nvml.inject_error(GPU, READ, code)
    relost = node.cycle()
    assert relost.gpus[GPU].lost
    assert [(e.kind, e.gpu) for e in relost.events] == [("gpu_lost", GPU)]


def assert_transient(node: Node, collected: Collected, caplog: pytest.LogCaptureFixture) -> None:
    sample = collected.gpus[GPU]
    assert not sample.lost
    assert missing(sample) == {FIELD}
    assert collected.events == ()
    assert_others_unaffected(collected, {GPU})
    # Asked again every cycle while it fails, not remembered.
    before = fake_nvml.call_count(READ)
    again = node.cycle()
    assert fake_nvml.call_count(READ) - before == 8
    assert missing(again.gpus[GPU]) == {FIELD}
    # The error clears: the value returns at once.
    fake_nvml.clear_errors()
    back = node.cycle()
    assert missing(back.gpus[GPU]) == set()
    assert back.gpus[GPU].power_watts == pytest.approx(node.gpus[GPU].power_watts, abs=0.001)
    assert len(adapter_lines(caplog)) <= 1


@pytest.mark.parametrize("name", NAMES)
def test_error_from_nvml_init(name, clock, caplog):
    caplog.set_level(logging.DEBUG)
    gpus = make_gpus(2)
    fake_nvml.configure(gpus)
    fake_nvml.inject_error(-1, "nvmlInit", CODES[name])
    collector = NvmlCollector(fake_nvml, clock)
    expected = SourceMissing if name in INIT_SOURCE_MISSING else CollectorError
    for _ in range(2):
        with pytest.raises(CollectorError) as raised:
            collector.collect()
        assert raised.type is expected
        clock.advance(61)
    if expected is SourceMissing:
        assert len(adapter_lines(caplog)) == 1
    assert fake_nvml.call_count("nvmlDeviceGetCount") == 0
    # NVML comes up at the next try.
    fake_nvml.clear_errors()
    collected = collector.collect()
    assert [sample.lost for sample in collected.gpus] == [False, False]


@pytest.mark.parametrize("name", NAMES)
def test_error_from_event_wait_loses_no_sample(name, clock, caplog):
    node = Node(clock)
    node.cycle()
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    node.gpus[1].inject_xid(13)
    fake_nvml.inject_error(-1, "nvmlEventSetWait_v2", CODES[name], times=1)
    collected = node.cycle()
    assert_others_unaffected(collected, set())
    assert collected.events == ()
    timeout = name == "NVML_ERROR_TIMEOUT"
    assert len(adapter_lines(caplog)) == (0 if timeout else 1)
    # The XID waits in the queue for the next cycle.
    after = node.cycle()
    assert [(e.kind, e.gpu, e.code) for e in after.events] == [("xid", 1, 13)]
    assert_others_unaffected(after, set())


# ---------------------------------------------------------------- decisions kept for good


def test_transient_error_while_probing_nvlinks_probes_again(clock):
    node = Node(clock, count=2)
    fake_nvml.inject_error(0, "nvmlDeviceGetNvLinkState", pynvml.NVML_ERROR_TIMEOUT, times=1)
    first = node.cycle()
    assert first.gpus[0].nvlinks == ()
    assert len(first.gpus[1].nvlinks) == 18
    assert len(node.cycle().gpus[0].nvlinks) == 18


def test_transient_error_on_gpm_support_asks_again(clock):
    node = Node(clock, count=2)
    fake_nvml.inject_error(0, "nvmlGpmQueryDeviceSupport", pynvml.NVML_ERROR_TIMEOUT, times=1)
    for _ in range(3):
        last = node.cycle()
    assert fake_nvml.call_count("nvmlGpmQueryDeviceSupport") == 3
    assert missing(last.gpus[0]) == set()


def test_transient_error_on_event_set_create_tries_again(clock):
    node = Node(clock, count=2)
    fake_nvml.inject_error(-1, "nvmlEventSetCreate", pynvml.NVML_ERROR_MEMORY, times=1)
    node.cycle()
    node.gpus[0].inject_xid(48)
    node.cycle()  # the event set exists now; XIDs before registration are not delivered
    node.gpus[0].inject_xid(63)
    assert [(e.gpu, e.code) for e in node.cycle().events] == [(0, 63)]


def test_event_set_not_supported_is_given_up_once(clock):
    node = Node(clock, count=2)
    fake_nvml.inject_error(-1, "nvmlEventSetCreate", pynvml.NVML_ERROR_NOT_SUPPORTED)
    for _ in range(3):
        node.cycle()
    assert fake_nvml.call_count("nvmlEventSetCreate") == 1


def test_transient_error_on_identity_at_init_is_read_again(clock):
    node = Node(clock, count=2)
    fake_nvml.inject_error(1, "nvmlDeviceGetUUID", pynvml.NVML_ERROR_TIMEOUT, times=1)
    # Init leaves GPU 1 unidentified; the first collect reads the UUID again.
    assert node.cycle().gpus[1].uuid == node.gpus[1].uuid
    node.cycle()
    assert fake_nvml.call_count("nvmlDeviceGetUUID") == 3  # 2 at init, 1 retry


def test_transient_error_on_driver_version_is_read_again(clock):
    node = Node(clock, count=1)
    fake_nvml.inject_error(-1, "nvmlSystemGetDriverVersion", pynvml.NVML_ERROR_TIMEOUT, times=1)
    assert node.cycle().gpus[0].driver_version == "550.90.07"


def test_fault_while_identifying_at_init_is_a_lost_gpu_not_a_crash(clock):
    node = Node(clock, count=3)
    fake_nvml.inject_error(1, "nvmlDeviceGetUUID", pynvml.NVML_ERROR_GPU_IS_LOST)
    collected = node.cycle()
    assert [sample.lost for sample in collected.gpus] == [False, True, False]
    assert [(e.kind, e.gpu) for e in collected.events] == [("gpu_lost", 1)]
    fake_nvml.clear_errors()
    back = node.cycle().gpus[1]
    assert not back.lost
    assert back.uuid == node.gpus[1].uuid


# ---------------------------------------------------------------- the fake's injection


def test_inject_error_counts_down_and_targets_one_gpu():
    fake_nvml.configure(make_gpus(2))
    fake_nvml.nvmlInit()
    handles = [fake_nvml.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    fake_nvml.inject_error(1, READ, pynvml.NVML_ERROR_TIMEOUT, times=2)
    for _ in range(2):
        with pytest.raises(pynvml.NVMLError_Timeout):
            fake_nvml.nvmlDeviceGetPowerUsage(handles[1])
        fake_nvml.nvmlDeviceGetPowerUsage(handles[0])
    fake_nvml.nvmlDeviceGetPowerUsage(handles[1])
    assert fake_nvml.call_count(READ) == 5


def test_inject_error_until_cleared_and_reset_clears():
    fake_nvml.configure(make_gpus(1))
    fake_nvml.inject_error(-1, "nvmlInit", pynvml.NVML_ERROR_UNKNOWN)
    for _ in range(3):
        with pytest.raises(pynvml.NVMLError_Unknown):
            fake_nvml.nvmlInit()
    fake_nvml.clear_errors(function="nvmlInit")
    fake_nvml.nvmlInit()
    fake_nvml.inject_error(0, "nvmlDeviceGetHandleByIndex", pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake_nvml.nvmlDeviceGetHandleByIndex(0)
    fake_nvml.configure(make_gpus(1))
    fake_nvml.nvmlInit()
    fake_nvml.nvmlDeviceGetHandleByIndex(0)
    fake_nvml.inject_error(-1, "nvmlSystemGetDriverVersion", pynvml.NVML_ERROR_NO_PERMISSION)
    fake_nvml.reset()
    fake_nvml.nvmlInit()
    assert fake_nvml.nvmlSystemGetDriverVersion() == "550.90.07"


@pytest.mark.parametrize(
    ("gpu", "function", "code", "times"),
    [
        (0, "nvmlNoSuchFunction", 3, None),
        (0, "configure", 3, None),
        (0, READ, pynvml.NVML_SUCCESS, None),
        (0, READ, 3, 0),
        (-2, READ, 3, None),
    ],
)
def test_inject_error_rejects_nonsense(gpu, function, code, times):
    with pytest.raises(ValueError, match=r"."):
        fake_nvml.inject_error(gpu, function, code, times)
