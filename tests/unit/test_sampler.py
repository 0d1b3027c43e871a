"""The sampler: collector isolation, event joining, XID counting."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.sampler import Sampler, XidLedger, map_events_to_gpus
from sn_monitor.agent.snapshot import Collected, GpuSample, HostSample, XidCount
from sn_monitor.clock import ManualClock
from sn_monitor.model import Event
from sn_monitor.rules.xid_catalog import gpu_fatal_codes


class ScriptedCollector:
    """A collector whose results are a fixed script: a fake at our own boundary."""

    def __init__(self, name, results):
        self.name = name
        self._results = list(results)
        self.closed = False

    def collect(self):
        result = self._results.pop(0) if len(self._results) > 1 else self._results[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self):
        self.closed = True


@pytest.fixture
def samplers() -> Iterator[list[Sampler]]:
    """Samplers a test makes, closed (their collector threads stopped) at teardown."""
    made: list[Sampler] = []
    yield made
    for sampler in made:
        sampler.close()


def _xid(source, gpu, code, t=0.0):
    return Event(kind="xid", source=source, time_seconds=t, message="m", gpu=gpu, code=code)


GPU0 = GpuSample(index=0, uuid="GPU-a", name="H100", pci_bus_id="00000000:18:00.0")
GPU1 = GpuSample(index=1, uuid="GPU-b", name="H100", pci_bus_id="00000000:2A:00.0")


def test_one_xid_seen_by_nvml_and_kmsg_counts_once():
    ledger = XidLedger(ManualClock())
    kept = ledger.admit([_xid("nvml", 0, 79), _xid("kmsg", 0, 79)])
    assert len(kept) == 1
    assert ledger.counts() == (XidCount(gpu=0, xid=79, count=1),)


def test_repeats_from_one_source_each_count():
    ledger = XidLedger(ManualClock())
    ledger.admit([_xid("nvml", 2, 13)] * 3)
    ledger.admit([_xid("kmsg", 2, 13)] * 3)
    assert ledger.counts() == (XidCount(gpu=2, xid=13, count=3),)
    ledger.admit([_xid("kmsg", 2, 13)])
    assert ledger.counts() == (XidCount(gpu=2, xid=13, count=4),)


def test_twins_outside_the_window_are_separate_errors():
    clock = ManualClock()
    ledger = XidLedger(clock, window=10.0)
    ledger.admit([_xid("nvml", 0, 48)])
    clock.advance(11)
    ledger.admit([_xid("kmsg", 0, 48)])
    assert ledger.counts() == (XidCount(gpu=0, xid=48, count=2),)


def test_different_gpus_or_codes_are_not_twins():
    ledger = XidLedger(ManualClock())
    ledger.admit([_xid("nvml", 0, 79), _xid("kmsg", 1, 79), _xid("kmsg", 0, 74)])
    assert [c.count for c in ledger.counts()] == [1, 1, 1]


def test_each_gpus_latest_xid_is_kept_and_a_twin_does_not_change_it():
    ledger = XidLedger(ManualClock())
    assert ledger.last() == ()
    ledger.admit([_xid("nvml", 1, 79), _xid("nvml", 0, 48), _xid("nvml", 1, 13)])
    ledger.admit([_xid("kmsg", 1, 79)])  # the kernel's twin of the first: not a new error
    ledger.admit([_xid("kmsg", None, 31)])  # names no GPU: no GPU's latest
    assert ledger.last() == ((0, 48), (1, 13))


def test_kernel_events_are_mapped_to_gpus_by_pci_address():
    event = Event(kind="xid", source="kmsg", time_seconds=0, message="m",
                  pci_bus_id="PCI:0000:2a:00", code=79)
    sxid = Event(kind="sxid", source="kmsg", time_seconds=0, message="m",
                 pci_bus_id="0000:86:00.0", code=12028)
    mapped = map_events_to_gpus([event, sxid], [GPU0, GPU1])
    assert mapped[0].gpu == 1
    assert mapped[1].gpu is None


def test_a_failing_collector_never_blanks_the_others(caplog, samplers):
    clock = ManualClock()
    gpu = ScriptedCollector("nvml", [Collected(gpus=(GPU0,))])
    broken = ScriptedCollector("infiniband", [CollectorError("counters unreadable")])
    missing = ScriptedCollector("kmsg", [SourceMissing("/dev/kmsg absent")])
    host = ScriptedCollector("host", [Collected(host=HostSample(load1=1.5))])
    sampler = Sampler("n1", [gpu, broken, missing, host], clock)
    samplers.append(sampler)
    snapshot = sampler.sample()
    assert snapshot.gpus == (GPU0,)
    assert snapshot.host == HostSample(load1=1.5)
    assert {c.name: c.success for c in snapshot.collectors} == {
        "nvml": True, "infiniband": False, "kmsg": False, "host": True,
    }
    assert "counters unreadable" in caplog.text
    assert sampler.latest is snapshot


def test_a_crashing_collector_is_logged_with_its_name(caplog):
    crash = ScriptedCollector("net", [ZeroDivisionError("bug")])
    with Sampler("n1", [crash], ManualClock()) as sampler:
        snapshot = sampler.sample()
    assert snapshot.collectors[0].success is False
    record = next(r for r in caplog.records if r.levelname == "ERROR")
    assert record.collector == "net"
    assert record.exc_info is not None


def test_events_are_counted_by_kind_across_cycles(samplers):
    events = [Collected(gpus=(GPU0,), events=(_xid("nvml", 0, 31),))]
    sampler = Sampler("n1", [ScriptedCollector("nvml", events)], ManualClock())
    samplers.append(sampler)
    sampler.sample()
    snapshot = sampler.sample()
    assert dict(snapshot.event_counts) == {"xid": 2}
    seen = [c for c in snapshot.xid_counts if c.count]
    assert seen == [XidCount(gpu=0, xid=31, count=2, uuid="GPU-a")]


def test_watched_codes_are_counted_from_zero_on_every_known_gpu():
    ledger = XidLedger(ManualClock(), watched=[79, 48])
    assert ledger.counts() == ()  # no GPU known: nothing to count from 0
    ledger.admit([_xid("nvml", 1, 13), _xid("kmsg", None, 31)])
    assert ledger.counts([GPU0, GPU1]) == (
        XidCount(gpu=0, xid=48, count=0, uuid="GPU-a"),
        XidCount(gpu=0, xid=79, count=0, uuid="GPU-a"),
        XidCount(gpu=1, xid=13, count=1, uuid="GPU-b"),
        XidCount(gpu=1, xid=48, count=0, uuid="GPU-b"),
        XidCount(gpu=1, xid=79, count=0, uuid="GPU-b"),
        XidCount(gpu=None, xid=31, count=1, uuid=""),
    )


def test_the_catalogues_reset_and_reboot_codes_are_watched_by_default():
    ledger = XidLedger(ManualClock())
    watched = {c.xid for c in ledger.counts([GPU0])}
    assert watched == gpu_fatal_codes()
    assert {48, 64, 74, 79, 95, 119, 120, 140} <= watched  # SnGpuFatalXid's codes
    assert 13 not in watched  # an application's fault: counted once seen


def test_xid_series_keep_their_uuid_while_nvml_fails(samplers):
    nvml = ScriptedCollector("nvml", [Collected(gpus=(GPU0,)), CollectorError("lost"),
                                      CollectorError("lost")])
    kmsg = ScriptedCollector("kmsg", [Collected(), Collected(events=(_xid("kmsg", 0, 79),)),
                                      Collected()])
    sampler = Sampler("n1", [nvml, kmsg], ManualClock())
    samplers.append(sampler)
    before = sampler.sample().xid_counts
    during = sampler.sample().xid_counts
    assert {(c.gpu, c.uuid, c.xid) for c in during} == {(c.gpu, c.uuid, c.xid) for c in before}
    assert [(c.xid, c.count) for c in during if c.count] == [(79, 1)]


def test_gpu_index_is_kept_for_kernel_events_when_nvml_fails_later(samplers):
    kmsg_event = Event(kind="xid", source="kmsg", time_seconds=0, message="m",
                       pci_bus_id="0000:18:00.0", code=79)
    nvml = ScriptedCollector("nvml", [Collected(gpus=(GPU0,)), CollectorError("lost")])
    kmsg = ScriptedCollector("kmsg", [Collected(), Collected(events=(kmsg_event,))])
    sampler = Sampler("n1", [nvml, kmsg], ManualClock())
    samplers.append(sampler)
    sampler.sample()
    snapshot = sampler.sample()
    assert snapshot.events[0].gpu == 0


def test_close_closes_every_collector():
    collectors = [ScriptedCollector(n, [Collected()]) for n in ("a", "b")]
    Sampler("n1", collectors, ManualClock()).close()
    assert all(c.closed for c in collectors)
    ran = [ScriptedCollector(n, [Collected()]) for n in ("a", "b")]
    sampler = Sampler("n1", ran, ManualClock())
    sampler.sample()  # their threads run now: each closes its collector on its way out
    sampler.close()
    assert all(c.closed for c in ran)


@pytest.mark.parametrize("bad", [-1.0])
def test_manual_clock_refuses_to_go_back(bad):
    with pytest.raises(ValueError, match="backwards"):
        ManualClock().advance(bad)


@pytest.mark.parametrize("first", ["nvml", "kmsg"])
def test_the_kernel_logs_xid_79_is_the_nvml_xid_79_whichever_comes_first(first):
    """One fault, one event of one kind: the rule it fires does not depend on the race."""
    second = "kmsg" if first == "nvml" else "nvml"
    ledger = XidLedger(ManualClock())
    [kept] = ledger.admit([_xid(first, 3, 79)])
    assert ledger.admit([_xid(second, 3, 79)]) == []
    assert (kept.kind, kept.code, kept.source) == ("xid", 79, first)
    assert ledger.counts() == (XidCount(gpu=3, xid=79, count=1),)


def test_the_drivers_fallen_off_the_bus_sentence_is_no_xid():
    ledger = XidLedger(ManualClock())
    off_bus = Event(kind="gpu_fallen_off_bus", source="kmsg", time_seconds=0, message="m", gpu=3)
    assert ledger.admit([_xid("nvml", 3, 79), off_bus])[1] == off_bus
    assert ledger.counts() == (XidCount(gpu=3, xid=79, count=1),)
