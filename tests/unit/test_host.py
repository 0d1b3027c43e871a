from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.collectors.host import (
    HostCollector,
    parse_loadavg,
    parse_mbm_bytes,
    parse_mbm_domain,
    parse_meminfo,
    parse_proc_stat,
)
from sn_monitor.agent.snapshot import HostSample, MemoryBandwidthSample

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h100-node"

ALL_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@pytest.mark.parametrize(
    ("text", "ticks", "expected"),
    [
        pytest.param(
            "cpu  100 200 300 400 500 600 700 800 900 1000\ncpu0 1 1 1 1 1 1 1 1 1 1\n",
            100,
            tuple(zip(ALL_MODES, (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0), strict=True)),
            id="guest-left-out",
        ),
        pytest.param(
            "cpu  250 0 500 1000\n",
            250,
            (("user", 1.0), ("nice", 0.0), ("system", 2.0), ("idle", 4.0)),
            id="old-kernel-four-modes",
        ),
        pytest.param(
            "intr 1 2 3\ncpu  100 0 0 0 0 0 0 0 0 0\n",
            100,
            tuple(zip(ALL_MODES, (1.0, 0, 0, 0, 0, 0, 0, 0), strict=True)),
            id="cpu-line-not-first",
        ),
        pytest.param("cpu0 1 2 3 4\nctxt 5\n", 100, (), id="no-aggregate-line"),
        pytest.param("cpu  1 2 x 4\n", 100, (), id="malformed"),
        pytest.param("", 100, (), id="empty"),
        pytest.param("cpu\n", 100, (), id="no-fields"),
    ],
)
def test_parse_proc_stat(text: str, ticks: int, expected: tuple[tuple[str, float], ...]) -> None:
    assert parse_proc_stat(text, ticks) == expected


def test_parse_proc_stat_large_counters() -> None:
    ticks = 2**63
    assert dict(parse_proc_stat(f"cpu  {ticks} 0 0 0\n"))["user"] == ticks / 100


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("MemTotal:       2113389000 kB\n", {"MemTotal": 2113389000 * 1024}),
        ("HugePages_Total:       8\n", {"HugePages_Total": 8}),
        (
            "MemTotal: 10 kB\nMemAvailable: 4 kB\n",
            {"MemTotal": 10240, "MemAvailable": 4096},
        ),
        ("garbage\nMemFree: x kB\nMemTotal: 1 MB\nA: 1 kB extra\nB:\n: 3 kB\n", {}),
        ("", {}),
    ],
)
def test_parse_meminfo(text: str, expected: dict[str, int]) -> None:
    assert parse_meminfo(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("112.45 108.90 95.12 129/3456 987654\n", 112.45),
        ("0.00 0.00 0.00 1/100 1", 0.0),
        ("", None),
        ("load 1 2", None),
    ],
)
def test_parse_loadavg(text: str, expected: float | None) -> None:
    assert parse_loadavg(text) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [("mon_L3_00", "L3_00"), ("mon_L3_01", "L3_01"), ("mon_", None), ("info", None)],
)
def test_parse_mbm_domain(name: str, expected: str | None) -> None:
    assert parse_mbm_domain(name) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8523316123648\n", 8523316123648),
        ("0", 0),
        ("Unavailable\n", None),
        ("Error\n", None),
        ("-5", None),
        ("", None),
    ],
)
def test_parse_mbm_bytes(text: str, expected: int | None) -> None:
    assert parse_mbm_bytes(text) == expected


def _host(procfs: Path, sysfs: Path) -> HostSample:
    host = HostCollector(procfs, sysfs, ticks_per_second=100).collect().host
    assert host is not None
    return host


def test_collector_on_fixture_tree() -> None:
    host = _host(FIXTURE / "proc", FIXTURE / "sys")
    cpu = dict(host.cpu_seconds_total)
    assert tuple(cpu) == ALL_MODES
    first = (FIXTURE / "proc" / "stat").read_text().splitlines()[0].split()
    assert cpu["user"] == pytest.approx(int(first[1]) / 100)
    assert cpu["idle"] == pytest.approx(98123456.78)
    assert host.memory_total_bytes == 2113389000 * 1024
    assert host.memory_available_bytes == 1987654321 * 1024
    assert host.load1 == 112.45
    resctrl = FIXTURE / "sys" / "fs" / "resctrl" / "mon_data"
    assert host.memory_bandwidth == (
        MemoryBandwidthSample(
            "L3_00", int((resctrl / "mon_L3_00" / "mbm_total_bytes").read_text())
        ),
        MemoryBandwidthSample(
            "L3_01", int((resctrl / "mon_L3_01" / "mbm_total_bytes").read_text())
        ),
    )


def test_default_ticks_come_from_sysconf() -> None:
    collected = HostCollector(FIXTURE / "proc", FIXTURE / "sys").collect()
    assert collected.host is not None
    assert dict(collected.host.cpu_seconds_total)["user"] > 0


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    shutil.copytree(FIXTURE / "proc", root / "proc")
    shutil.copytree(FIXTURE / "sys" / "fs", root / "sys" / "fs")
    return root


def test_missing_resctrl_is_no_bandwidth(tree: Path) -> None:
    shutil.rmtree(tree / "sys" / "fs" / "resctrl")
    host = _host(tree / "proc", tree / "sys")
    assert host.memory_bandwidth == ()
    assert host.memory_total_bytes == 2113389000 * 1024


def test_unavailable_and_odd_domains_are_skipped(tree: Path) -> None:
    mon_data = tree / "sys" / "fs" / "resctrl" / "mon_data"
    (mon_data / "mon_L3_01" / "mbm_total_bytes").write_text("Unavailable\n")
    (mon_data / "mon_L3_02").mkdir()  # no mbm_total_bytes
    (mon_data / "not_a_domain").mkdir()
    (mon_data / "not_a_domain" / "mbm_total_bytes").write_text("1\n")
    host = _host(tree / "proc", tree / "sys")
    assert [s.domain for s in host.memory_bandwidth] == ["L3_00"]


@pytest.mark.parametrize("missing", ["stat", "meminfo", "loadavg"])
def test_missing_proc_file_leaves_its_values_out(tree: Path, missing: str) -> None:
    (tree / "proc" / missing).unlink()
    host = _host(tree / "proc", tree / "sys")
    assert (host.cpu_seconds_total == ()) == (missing == "stat")
    assert (host.memory_total_bytes is None) == (missing == "meminfo")
    assert (host.memory_available_bytes is None) == (missing == "meminfo")
    assert (host.load1 is None) == (missing == "loadavg")
    assert len(host.memory_bandwidth) == 2


def test_meminfo_without_mem_available(tree: Path) -> None:
    (tree / "proc" / "meminfo").write_text("MemTotal: 100 kB\nMemFree: 50 kB\n")
    host = _host(tree / "proc", tree / "sys")
    assert host.memory_total_bytes == 102400
    assert host.memory_available_bytes is None


def test_no_proc_at_all_is_source_missing(tmp_path: Path) -> None:
    with pytest.raises(SourceMissing):
        HostCollector(tmp_path / "proc", tmp_path / "sys", ticks_per_second=100).collect()


def test_unreadable_proc_file_is_a_fault(tree: Path) -> None:
    (tree / "proc" / "loadavg").unlink()
    (tree / "proc" / "loadavg").mkdir()
    with pytest.raises(CollectorError) as info:
        HostCollector(tree / "proc", tree / "sys", ticks_per_second=100).collect()
    assert not isinstance(info.value, SourceMissing)


def test_collector_protocol() -> None:
    collector = HostCollector(FIXTURE / "proc", FIXTURE / "sys", ticks_per_second=100)
    assert collector.name == "host"
    collector.close()
