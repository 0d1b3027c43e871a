"""The agent's fast event path: the NVML waiter, the kernel-log follower, the hand-off.

Every wait here is for a thread to hand something over (a queue, an event), bounded.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.collectors.kmsg import KmsgCollector
from sn_monitor.agent.fastpath import kernel_follower
from sn_monitor.agent.fastpath.handoff import EventHandoff
from sn_monitor.agent.fastpath.inotify import (
    IN_CREATE,
    IN_MODIFY,
    InotifyUnavailable,
    parse_events,
)
from sn_monitor.agent.fastpath.kernel_follower import KernelLogFollower
from sn_monitor.agent.fastpath.nvml_waiter import NvmlEventWaiter
from sn_monitor.agent.fastpath.threads import FastEventPath
from sn_monitor.agent.sampler import Sampler
from sn_monitor.agent.snapshot import Collected
from sn_monitor.clock import ManualClock
from sn_monitor.model import Event
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import make_gpus
from sn_monitor.sim.node import SimulatedNode

WAIT = 10.0  # seconds a test waits for a thread to hand something over, at most
XID_LINE = "[ 3600.000000] NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python, GPU gone\n"


@pytest.fixture(autouse=True)
def _clean_fake() -> Iterator[None]:
    yield
    fake_nvml.reset()


class Received:
    """A deliver callable that queues what it is given."""

    def __init__(self) -> None:
        self.batches: queue.Queue[tuple[Event, ...]] = queue.Queue()

    def __call__(self, events: Sequence[Event]) -> None:
        self.batches.put(tuple(events))

    def next(self) -> tuple[Event, ...]:
        return self.batches.get(timeout=WAIT)


# ---------------------------------------------------------------- the NVML waiter


def test_waiter_delivers_an_xid_injected_after_it_started_and_stops():
    gpus = make_gpus(2)
    fake_nvml.configure(gpus)
    clock = ManualClock()
    collector = NvmlCollector(fake_nvml, clock)
    collector.collect()  # init, and the GPUs registered on the event set
    received = Received()
    waiter = NvmlEventWaiter(collector.library, received, wait_seconds=0.05)
    waiter.start()
    gpus[1].inject_xid(48)
    [event] = received.next()
    assert (event.kind, event.source, event.gpu, event.code) == ("xid", "nvml", 1, 48)
    waiter.stop(timeout=WAIT)
    assert not waiter.running
    # Taken by the waiter: the cycle's drain does not report it again.
    assert collector.collect().events == ()
    collector.close()


def test_an_xid_74_the_waiter_took_makes_the_next_cycle_read_every_link():
    gpus = make_gpus(1)
    fake_nvml.configure(gpus)
    collector = NvmlCollector(fake_nvml, ManualClock())
    collector.collect()
    collector.collect()
    counters = fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter")
    received = Received()
    waiter = NvmlEventWaiter(collector.library, received, wait_seconds=0.05)
    waiter.start()
    gpus[0].inject_xid(74)
    assert [(e.gpu, e.code) for e in received.next()] == [(0, 74)]
    waiter.stop(timeout=WAIT)
    collector.collect()
    links = len(gpus[0].nvlinks)
    # Every link's counters, as after the cycle's own drain of an XID 74.
    assert fake_nvml.call_count("nvmlDeviceGetNvLinkErrorCounter") >= counters + links
    collector.close()


def test_waiter_before_the_first_registration_waits_for_it():
    gpus = make_gpus(1)
    fake_nvml.configure(gpus)
    collector = NvmlCollector(fake_nvml, ManualClock())
    received = Received()
    waiter = NvmlEventWaiter(collector.library, received, wait_seconds=0.05)
    waiter.start()  # NVML not even initialised: it waits on the registration
    collector.collect()
    gpus[0].inject_xid(79)
    assert [(e.gpu, e.code) for e in received.next()] == [(0, 79)]
    waiter.stop(timeout=WAIT)
    assert not waiter.running
    collector.close()


def test_closing_nvml_while_the_waiter_waits_frees_the_set_between_two_waits(caplog):
    gpus = make_gpus(1)
    fake_nvml.configure(gpus)
    collector = NvmlCollector(fake_nvml, ManualClock())
    collector.collect()
    hang = fake_nvml.inject_hang(function="nvmlEventSetWait_v2")
    waiter = NvmlEventWaiter(collector.library, Received(), wait_seconds=0.05)
    waiter.start()
    assert hang.entered.wait(WAIT)  # the waiter is inside the driver's wait now
    closed = threading.Event()
    closing = threading.Thread(target=lambda: (collector.close(), closed.set()), daemon=True)
    caplog.set_level(logging.DEBUG, logger="sn_monitor.agent.nvml")
    closing.start()
    hang.release()
    assert closed.wait(WAIT)
    assert fake_nvml.call_count("nvmlEventSetFree") == 1
    waiter.stop(timeout=WAIT)
    assert not waiter.running
    # Had the set been freed under the wait, the wait would have failed on it.
    assert not [r for r in caplog.records if "failed" in r.getMessage()]


# ---------------------------------------------------------------- the kernel-log follower


def _followed(tmp_path: Path) -> tuple[Path, KmsgCollector]:
    path = tmp_path / "log" / "kern.log"
    path.parent.mkdir()
    path.write_text("[ 1.0] boot\n")
    collector = KmsgCollector(path, ManualClock())
    assert collector.collect().events == ()  # opened at its end, as the first cycle does
    return path, collector


def test_follower_delivers_a_line_appended_to_a_followed_file(tmp_path):
    path, collector = _followed(tmp_path)
    received = Received()
    follower = KernelLogFollower(collector, received)
    follower.start()
    try:
        with path.open("a") as log:
            log.write(XID_LINE)
        [event] = received.next()
    finally:
        follower.stop(timeout=WAIT)
    assert (event.kind, event.source, event.code, event.pci_bus_id) == (
        "xid", "kmsg", 79, "0000:18:00.0")
    assert not follower.running
    # Read by the follower: the cycle's collect does not report it again.
    assert collector.collect().events == ()
    collector.close()


def test_follower_survives_rotation(tmp_path):
    path, collector = _followed(tmp_path)
    received = Received()
    follower = KernelLogFollower(collector, received)
    follower.start()
    with path.open("a") as log:
        log.write(XID_LINE.replace(": 79,", ": 13,"))
    assert [e.code for e in received.next()] == [13]
    path.rename(path.with_name("kern.log.1"))
    fresh = path.with_name("kern.log.new")
    fresh.write_text(XID_LINE.replace(": 79,", ": 48,"))
    fresh.rename(path)  # moved in under the name, as logrotate's create does
    assert [e.code for e in received.next()] == [48]
    with path.open("a") as log:
        log.write(XID_LINE.replace(": 79,", ": 31,"))
    assert [e.code for e in received.next()] == [31]
    follower.stop(timeout=WAIT)
    assert not follower.running
    collector.close()


def test_follower_without_inotify_looks_at_the_file_and_says_so_once(tmp_path, monkeypatch,
                                                                     caplog):
    def no_inotify(directory: Path) -> None:
        raise InotifyUnavailable("inotify_init1: Too many open files")

    monkeypatch.setattr(kernel_follower, "DirectoryWatch", no_inotify)
    path, collector = _followed(tmp_path)
    received = Received()
    caplog.set_level(logging.WARNING, logger=kernel_follower.__name__)
    follower = KernelLogFollower(collector, received, fallback_interval=0.01)
    follower.start()
    with path.open("a") as log:
        log.write(XID_LINE)
    assert [e.code for e in received.next()] == [79]
    follower.stop(timeout=WAIT)
    assert not follower.running
    assert len([r for r in caplog.records if "no inotify" in r.getMessage()]) == 1
    collector.close()


class PipeLog:
    """A stand-in for the collector on a character device: its descriptor is a pipe's."""

    path = Path(os.devnull)  # a character device, so the follower polls ``device_fd``

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe2(os.O_NONBLOCK)

    @property
    def device_fd(self) -> int:
        return self.read_end

    def collect(self) -> Collected:
        try:
            data = os.read(self.read_end, 4096)
        except BlockingIOError:
            return Collected()
        return Collected(events=tuple(
            Event("xid", "kmsg", 1.0, f"Xid {code}", code=int(code))
            for code in data.decode().split()))


def test_follower_polls_a_device_descriptor(tmp_path):
    source = PipeLog()
    received = Received()
    follower = KernelLogFollower(source, received)
    follower.start()
    os.write(source.write_end, b"79 ")
    assert [e.code for e in received.next()] == [79]
    follower.stop(timeout=WAIT)
    assert not follower.running
    os.close(source.read_end)
    os.close(source.write_end)


def test_parse_inotify_events():
    import struct

    raw = (struct.pack("iIII", 1, IN_MODIFY, 0, 16) + b"kern.log".ljust(16, b"\0")
           + struct.pack("iIII", 1, IN_CREATE, 0, 0))
    assert [(e.watch, e.mask, e.name) for e in parse_events(raw)] == [
        (1, IN_MODIFY, "kern.log"), (1, IN_CREATE, "")]


# ---------------------------------------------------------------- the hand-off


def test_one_xid_seen_by_both_threads_is_handed_on_once(tmp_path):
    node = SimulatedNode(tmp_path, gpus=2)
    clock = ManualClock()
    nvml = NvmlCollector(node.nvml, clock)
    kmsg = KmsgCollector(node.kmsg_path, clock)
    sampler = Sampler("n1", [nvml, kmsg], clock)
    sampler.sample()  # the GPUs known, registered; the log open
    looked = threading.Semaphore(0)

    def admit(events: Sequence[Event]) -> list[Event]:
        new = sampler.admit(events)
        looked.release()
        return new

    spooled: list[Event] = []
    woken = threading.Event()
    path = FastEventPath(EventHandoff(admit, spooled.extend, woken.set),
                         xids=nvml.library, kernel_log=kmsg)
    path.start()
    node.inject_xid(1, 79)  # an NVML event and an NVRM line
    assert looked.acquire(timeout=WAIT)  # one view ...
    assert looked.acquire(timeout=WAIT)  # ... and the other
    path.stop(timeout=WAIT)
    assert woken.is_set()
    assert [(e.gpu, e.code) for e in spooled if e.code == 79] == [(1, 79)]
    after = sampler.sample()
    # Counted once in the next snapshot, and not among its events: already spooled.
    assert {(c.gpu, c.xid): c.count for c in after.xid_counts}[(1, 79)] == 1
    assert [e for e in after.events if e.code == 79] == []
    sampler.close()
