"""Processes from /proc: the parsers of /proc/<pid>/ files, and processes stuck in D state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sn_monitor.agent.collectors.base import SourceMissing
from sn_monitor.agent.collectors.processes import ProcessesCollector, StuckTracker
from sn_monitor.agent.workloads.procfs import (
    CgroupIdentity,
    ProcStat,
    parse_cgroup,
    parse_cmdline_command,
    parse_proc_stat_line,
    parse_status_uid,
)
from sn_monitor.clock import ManualClock
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.node_tree import SimulatedNodeTree
from tests.conftest import FIXTURES

PROC = FIXTURES / "h100-node" / "proc"
ID = "3f2b8c1d9e0a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c"
ID2 = "5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b"
POD = "8e1a2c4b-5d6f-4a7b-9c8d-0e1f2a3b4c5d"
POD_ = POD.replace("-", "_")


@pytest.fixture(autouse=True)
def _clean_fake() -> Iterator[None]:
    yield
    fake_nvml.reset()


@pytest.mark.parametrize(
    ("text", "container", "pod"),
    [
        pytest.param("0::/init.scope\n", None, None, id="host process"),
        pytest.param("", None, None, id="empty"),
        pytest.param("garbage without colons\n", None, None, id="malformed"),
        pytest.param(f"0::/system.slice/docker-{ID}.scope\n", ID, None, id="docker systemd"),
        pytest.param(f"12:memory:/docker/{ID}\n11:cpu:/docker/{ID}\n", ID, None,
                     id="docker cgroupfs v1"),
        pytest.param(f"0::/kubepods.slice/kubepods-burstable.slice/"
                     f"kubepods-burstable-pod{POD_}.slice/cri-containerd-{ID}.scope\n",
                     ID, POD, id="kubernetes containerd systemd"),
        pytest.param(f"0::/kubepods.slice/kubepods-pod{POD_}.slice/crio-{ID}.scope\n",
                     ID, POD, id="kubernetes cri-o guaranteed"),
        pytest.param(f"0::/kubepods.slice/kubepods-pod{POD_}.slice/crio-conmon-{ID}.scope\n",
                     None, POD, id="cri-o conmon is not the container"),
        pytest.param(f"0::/kubepods/besteffort/pod{POD}/{ID}\n", ID, POD,
                     id="kubernetes cgroupfs"),
        pytest.param(f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/"
                     f"libpod-{ID}.scope/container\n", ID, None, id="podman rootless"),
        pytest.param(f"0::/docker/{ID2}/kubepods/besteffort/pod{POD}/{ID}\n", ID, POD,
                     id="kind: the innermost container"),
        pytest.param(f"1:name=systemd:/docker/{ID2}\n0::/system.slice/docker-{ID}.scope\n",
                     ID, None, id="hybrid: the v2 line first"),
        pytest.param(f"0::/system.slice/docker-{ID[:63]}.scope\n", None, None,
                     id="63 hex is not an id"),
    ],
)
def test_parse_cgroup(text: str, container: str | None, pod: str | None) -> None:
    assert parse_cgroup(text) == CgroupIdentity(container, pod)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("5150 (dataloader (io)) D 4242 4242 4200 0 -1 4194560 800 0 0 0 75 31 "
                     "0 0 20 0 1 0 3290000 2000000000 90000\n",
                     ProcStat(5150, "dataloader (io)", "D", 106, 3290000), id="parens in name"),
        pytest.param("7 (a b) S 1 1 1 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 99 0 0",
                     ProcStat(7, "a b", "S", 3, 99), id="spaces in name"),
        pytest.param("7 (x) S 1 1 1", None, id="too few fields"),
        pytest.param("seven (x) S 1 1 1 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 99 0 0", None,
                     id="pid not a number"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_proc_stat_line(text: str, expected: ProcStat | None) -> None:
    assert parse_proc_stat_line(text) == expected


def stat(pid: int, state: str = "D", cpu: int = 5, start: int = 100) -> ProcStat:
    return ProcStat(pid, f"p{pid}", state, cpu, start)


def test_a_process_in_d_without_cpu_time_becomes_stuck_after_the_threshold() -> None:
    tracker = StuckTracker(stuck_after=60)
    assert tracker.update(0, [stat(1, "S"), stat(2)]) == (1, ())
    assert tracker.update(59, [stat(1, "S"), stat(2)]) == (1, ())
    in_d, stuck = tracker.update(60, [stat(1, "S"), stat(2)])
    assert in_d == 1
    assert [(p.pid, p.name, p.stuck_seconds) for p in stuck] == [(2, "p2", 60.0)]


def test_cpu_time_a_new_process_on_a_reused_pid_or_leaving_d_restart_the_clock() -> None:
    tracker = StuckTracker(stuck_after=30)
    tracker.update(0, [stat(2), stat(3), stat(4)])
    # pid 2 ran between scans (busy I/O, not stuck); pid 3 is another process now;
    # pid 4 left D once.
    tracker.update(20, [stat(2, cpu=6), stat(3, start=500), stat(4, "S")])
    assert tracker.update(31, [stat(2, cpu=6), stat(3, start=500), stat(4)]) == (3, ())
    _, stuck = tracker.update(61, [stat(2, cpu=6), stat(3, start=500), stat(4)])
    assert sorted(p.pid for p in stuck) == [2, 3, 4]


def test_the_tracker_forgets_processes_that_left() -> None:
    tracker = StuckTracker(stuck_after=10)
    tracker.update(0, [stat(2)])
    tracker.update(5, [])
    assert tracker.update(12, [stat(2)]) == (1, ())  # a fresh start, not 12 s


def test_stuck_after_must_be_positive() -> None:
    with pytest.raises(ValueError, match="stuck_after"):
        StuckTracker(0)


def test_the_collector_scans_every_interval_and_serves_the_last_scan_between(
        tmp_path: Path) -> None:
    tree = SimulatedNodeTree(tmp_path)
    clock = ManualClock()
    collector = ProcessesCollector(tree.procfs, clock, interval=10, stuck_after=30)
    first = collector.collect().processes
    assert first is not None
    assert (first.total, first.uninterruptible, first.stuck_count) == (3, 0, 0)
    tree.add_stuck_process("nfsread", count=2)
    clock.advance(5)
    assert collector.collect().processes == first  # not scanned yet
    clock.advance(5)
    seen = collector.collect().processes
    assert seen is not None
    assert (seen.total, seen.uninterruptible, seen.stuck_count) == (5, 2, 0)
    clock.advance(30)
    seen = collector.collect().processes
    assert seen is not None
    assert seen.stuck_count == 2
    assert [(p.pid, p.name, p.stuck_seconds) for p in seen.stuck] == [
        (50000, "nfsread", 30.0), (50001, "nfsread", 30.0)]
    tree.clear_stuck_processes()
    clock.advance(10)
    seen = collector.collect().processes
    assert seen is not None
    assert (seen.total, seen.uninterruptible, seen.stuck_count) == (3, 0, 0)


def test_the_fixture_node_has_one_process_in_d(tmp_path: Path) -> None:
    clock = ManualClock()
    collector = ProcessesCollector(PROC, clock, interval=0, stuck_after=10)
    assert collector.collect().processes is not None
    clock.advance(10)
    seen = collector.collect().processes
    assert seen is not None
    assert (seen.total, seen.uninterruptible, seen.stuck_count) == (4, 1, 1)
    assert seen.stuck[0].name == "dataloader (io)"


@pytest.mark.parametrize("make", [lambda p: p / "absent", lambda p: p])
def test_a_proc_without_processes_is_source_missing(tmp_path: Path, make) -> None:
    collector = ProcessesCollector(make(tmp_path), ManualClock())
    with pytest.raises(SourceMissing):
        collector.collect()


@pytest.mark.parametrize(
    ("text", "uid"),
    [
        pytest.param("Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\n", 1000, id="user"),
        pytest.param("Uid:\t0\t1000\t0\t0\n", 0, id="the real uid, not the effective"),
        pytest.param("Name:\tx\n", None, id="no Uid line"),
        pytest.param("Uid:\n", None, id="empty Uid line"),
    ],
)
def test_parse_status_uid(text: str, uid: int | None) -> None:
    assert parse_status_uid(text) == uid


@pytest.mark.parametrize(
    ("raw", "command"),
    [
        pytest.param(b"/usr/bin/python3\0train.py\0", "python3", id="path"),
        pytest.param(b"torchrun\0--nnodes=2\0", "torchrun", id="bare"),
        pytest.param(b"", None, id="kernel thread or zombie"),
        pytest.param(b"\0", None, id="cleared argv"),
        pytest.param(b"/opt/app/\0", None, id="directory only"),
    ],
)
def test_parse_cmdline_command(raw: bytes, command: str | None) -> None:
    assert parse_cmdline_command(raw) == command
