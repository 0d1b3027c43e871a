from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.collectors.net import NetCollector, NetDevCounters, parse_netdev, parse_speed
from sn_monitor.agent.snapshot import NetDeviceSample

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h100-node"

HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast"
    "|bytes    packets errs drop fifo colls carrier compressed\n"
)
U64_MAX = 2**64 - 1


def _line(name: str, values: list[int]) -> str:
    return f"{name:>6}:" + " ".join(str(v) for v in values) + "\n"


SIXTEEN = list(range(1, 17))
EXPECTED_SIXTEEN = NetDevCounters(
    receive_bytes=1,
    receive_packets=2,
    receive_errors=3,
    receive_drops=4,
    transmit_bytes=9,
    transmit_packets=10,
    transmit_errors=11,
    transmit_drops=12,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", {}, id="empty"),
        pytest.param(HEADER, {}, id="header-only"),
        pytest.param(HEADER + _line("eth0", SIXTEEN), {"eth0": EXPECTED_SIXTEEN}, id="fields"),
        pytest.param(
            HEADER + "    lo: 2776770   11307    0    0    0     0          0         0"
            "  2776770   11307    0    0    0     0       0          0\n",
            {"lo": NetDevCounters(2776770, 11307, 0, 0, 2776770, 11307, 0, 0)},
            id="kernel-spacing",
        ),
        pytest.param(
            f"ens1f0np0:{U64_MAX} 5 0 0 0 0 0 0 {U64_MAX - 1} 6 0 0 0 0 0 0\n",
            {"ens1f0np0": NetDevCounters(U64_MAX, 5, 0, 0, U64_MAX - 1, 6, 0, 0)},
            id="u64-counter-runs-into-colon",
        ),
        pytest.param(_line("eth0.100", SIXTEEN), {"eth0.100": EXPECTED_SIXTEEN}, id="vlan-name"),
        pytest.param(_line("bond0:1", SIXTEEN), {"bond0:1": EXPECTED_SIXTEEN}, id="colon-name"),
        pytest.param(_line("eth0", SIXTEEN[:15]), {}, id="too-few-fields"),
        pytest.param(_line("eth0", [*SIXTEEN, 17]), {"eth0": EXPECTED_SIXTEEN}, id="extra-field"),
        pytest.param("eth0: 1 2 x 4 5 6 7 8 9 10 11 12 13 14 15 16\n", {}, id="non-numeric"),
        pytest.param("eth0: -1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n", {}, id="negative"),
        pytest.param("1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n", {}, id="no-colon"),
        pytest.param(": 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n", {}, id="no-name"),
        pytest.param(
            _line("eth0", [0] * 16) + "garbage\n" + _line("eth1", SIXTEEN),
            {"eth0": NetDevCounters(0, 0, 0, 0, 0, 0, 0, 0), "eth1": EXPECTED_SIXTEEN},
            id="bad-line-between-good-ones",
        ),
    ],
)
def test_parse_netdev(text: str, expected: dict[str, NetDevCounters]) -> None:
    assert parse_netdev(text) == expected


def test_parse_netdev_keeps_file_order() -> None:
    text = HEADER + _line("zz0", SIXTEEN) + _line("aa0", SIXTEEN) + _line("mm0", SIXTEEN)
    assert list(parse_netdev(text)) == ["zz0", "aa0", "mm0"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("200000\n", 25_000_000_000),
        ("1000", 125_000_000),
        ("0", 0),
        ("-1\n", None),
        ("", None),
        ("unknown", None),
    ],
)
def test_parse_speed(text: str, expected: int | None) -> None:
    assert parse_speed(text) == expected


def _read_int(path: Path) -> int:
    return int(path.read_text())


def test_collector_on_fixture_tree() -> None:
    samples = {s.device: s for s in NetCollector(FIXTURE / "proc", FIXTURE / "sys").collect().net}
    assert list(samples) == ["lo", "eno1", "ens1f0np0", "ens1f1np1"]

    ens = samples["ens1f0np0"]
    sysnet = FIXTURE / "sys" / "class" / "net" / "ens1f0np0"
    assert ens.receive_bytes_total == 918273645501234
    assert ens.receive_packets_total == 612345678901
    assert ens.receive_errors_total == 3
    assert ens.receive_drops_total == 1289
    assert ens.transmit_bytes_total == 871234509876543
    assert ens.transmit_drops_total == 7
    assert ens.carrier_up is True
    assert ens.carrier_changes_total == _read_int(sysnet / "carrier_changes")
    assert ens.speed_bytes_per_second == _read_int(sysnet / "speed") * 1_000_000 // 8
    assert ens.mtu_bytes == _read_int(sysnet / "mtu") == 9000

    # eno1 is down: no carrier file (reading it fails with EINVAL), operstate "down".
    eno = samples["eno1"]
    assert not (FIXTURE / "sys" / "class" / "net" / "eno1" / "carrier").exists()
    assert eno.carrier_up is False
    assert eno.speed_bytes_per_second is None  # speed reads -1
    assert eno.carrier_changes_total == 3
    assert eno.mtu_bytes == 1500

    lo = samples["lo"]
    assert lo.carrier_up is True
    assert lo.speed_bytes_per_second is None  # no speed file on a virtual device
    assert lo.mtu_bytes == 65536


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    shutil.copytree(FIXTURE / "proc", root / "proc")
    shutil.copytree(FIXTURE / "sys" / "class" / "net", root / "sys" / "class" / "net")
    return root


def _sample(root: Path, device: str) -> NetDeviceSample:
    samples = NetCollector(root / "proc", root / "sys").collect().net
    return next(s for s in samples if s.device == device)


def test_unreadable_carrier_with_operstate_up_is_unknown(tree: Path) -> None:
    base = tree / "sys" / "class" / "net" / "ens1f1np1"
    (base / "carrier").unlink()
    (base / "carrier").mkdir()  # reading a directory fails like EINVAL does
    sample = _sample(tree, "ens1f1np1")
    assert sample.carrier_up is None
    assert sample.carrier_changes_total == 2  # the other values are still there


@pytest.mark.parametrize("missing", ["carrier_changes", "speed", "mtu"])
def test_missing_sysfs_value_skips_only_that_value(tree: Path, missing: str) -> None:
    (tree / "sys" / "class" / "net" / "ens1f0np0" / missing).unlink()
    sample = _sample(tree, "ens1f0np0")
    values = {
        "carrier_changes": sample.carrier_changes_total,
        "speed": sample.speed_bytes_per_second,
        "mtu": sample.mtu_bytes,
    }
    assert values.pop(missing) is None
    assert None not in values.values()
    assert sample.carrier_up is True
    assert sample.receive_bytes_total == 918273645501234


def test_garbled_sysfs_value_is_skipped(tree: Path) -> None:
    (tree / "sys" / "class" / "net" / "ens1f0np0" / "mtu").write_text("nine thousand\n")
    sample = _sample(tree, "ens1f0np0")
    assert sample.mtu_bytes is None
    assert sample.carrier_up is True


def test_device_without_sysfs_directory(tree: Path) -> None:
    shutil.rmtree(tree / "sys" / "class" / "net" / "ens1f1np1")
    sample = _sample(tree, "ens1f1np1")
    assert sample.receive_bytes_total == 48213377120
    assert (sample.carrier_up, sample.carrier_changes_total, sample.mtu_bytes) == (None, None, None)


@pytest.mark.parametrize(
    ("include", "exclude", "expected"),
    [
        (None, None, ["lo", "eno1", "ens1f0np0", "ens1f1np1"]),
        (None, "^(lo|docker.*|veth.*)$", ["eno1", "ens1f0np0", "ens1f1np1"]),
        ("ens.*", None, ["ens1f0np0", "ens1f1np1"]),
        ("ens.*", "ens1f1.*", ["ens1f0np0"]),
        ("ens1", None, []),  # full match: a prefix is not enough
        (None, "en", ["lo", "eno1", "ens1f0np0", "ens1f1np1"]),
        ("eno1|lo", "lo", ["eno1"]),
    ],
)
def test_include_exclude(include: str | None, exclude: str | None, expected: list[str]) -> None:
    collector = NetCollector(FIXTURE / "proc", FIXTURE / "sys", include=include, exclude=exclude)
    assert [s.device for s in collector.collect().net] == expected


@pytest.mark.parametrize("kwarg", ["include", "exclude"])
def test_invalid_regex_is_a_value_error(kwarg: str) -> None:
    with pytest.raises(ValueError, match=kwarg):
        NetCollector(FIXTURE / "proc", FIXTURE / "sys", **{kwarg: "(unclosed"})


def test_missing_proc_net_dev_is_source_missing(tmp_path: Path) -> None:
    with pytest.raises(SourceMissing):
        NetCollector(tmp_path / "proc", tmp_path / "sys").collect()


def test_unreadable_proc_net_dev_is_a_fault(tmp_path: Path) -> None:
    (tmp_path / "proc" / "net" / "dev").mkdir(parents=True)
    with pytest.raises(CollectorError) as info:
        NetCollector(tmp_path / "proc", tmp_path / "sys").collect()
    assert not isinstance(info.value, SourceMissing)


def test_collector_protocol() -> None:
    collector = NetCollector(FIXTURE / "proc", FIXTURE / "sys")
    assert collector.name == "net"
    collector.close()
