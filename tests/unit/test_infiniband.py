from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.collectors.infiniband import (
    COUNTER_STEMS,
    InfinibandCollector,
    counter_stem,
    parse_port_state,
    parse_rate,
)
from sn_monitor.agent.snapshot import IbPortSample

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h100-node"
IB = FIXTURE / "sys" / "class" / "infiniband"
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
STEM = re.compile(r"^[a-z0-9_]+$")


@pytest.mark.parametrize(
    ("file_name", "stem"),
    [
        ("port_rcv_data", "received_bytes"),
        ("port_xmit_data", "transmitted_bytes"),
        ("port_rcv_packets", "received_packets"),
        ("port_xmit_packets", "transmitted_packets"),
        ("unicast_rcv_packets", "unicast_received_packets"),
        ("unicast_xmit_packets", "unicast_transmitted_packets"),
        ("multicast_rcv_packets", "multicast_received_packets"),
        ("multicast_xmit_packets", "multicast_transmitted_packets"),
        ("symbol_error", "symbol_errors"),
        ("link_downed", "link_downed"),
        ("link_error_recovery", "link_error_recovery"),
        ("port_rcv_errors", "receive_errors"),
        ("port_xmit_discards", "transmit_discards"),
        ("port_rcv_remote_physical_errors", "receive_remote_physical_errors"),
        ("port_rcv_switch_relay_errors", "receive_switch_relay_errors"),
        ("local_link_integrity_errors", "local_link_integrity_errors"),
        ("excessive_buffer_overrun_errors", "excessive_buffer_overrun_errors"),
        ("VL15_dropped", "vl15_dropped"),
        ("port_xmit_wait", "transmit_wait"),
        ("port_rcv_constraint_errors", "receive_constraint_errors"),
        ("port_xmit_constraint_errors", "transmit_constraint_errors"),
        ("out_of_sequence", "out_of_sequence"),
        ("out_of_buffer", "out_of_buffer"),
        ("local_ack_timeout_err", "local_ack_timeout_err"),
        ("np_cnp_sent", "np_cnp_sent"),
        ("rp_cnp_handled", "rp_cnp_handled"),
        ("np_ecn_marked_roce_packets", "np_ecn_marked_roce_packets"),
        ("Weird-Name.v2", "weird_name_v2"),
        ("rx_bytes_total", "rx_bytes"),
        ("--", None),
    ],
)
def test_counter_stem(file_name: str, stem: str | None) -> None:
    assert counter_stem(file_name) == stem


def test_mapped_stems_are_distinct() -> None:
    assert len(set(COUNTER_STEMS.values())) == len(COUNTER_STEMS)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param({}, (), id="empty"),
        pytest.param({"port_rcv_data": "10"}, (("received_bytes", 40),), id="words-to-bytes"),
        pytest.param(
            {"port_xmit_data": "230442669431839\n"},
            (("transmitted_bytes", 921770677727356),),
            id="words-to-bytes-large",
        ),
        pytest.param(
            {"port_rcv_packets": "10", "symbol_error": " 3 \n"},
            (("received_packets", 10), ("symbol_errors", 3)),
            id="packets-not-scaled",
        ),
        pytest.param(
            {"symbol_error": "", "link_downed": "abc", "port_rcv_errors": "-1", "out": "7"},
            (("out", 7),),
            id="garbled-skipped",
        ),
        pytest.param({"lifespan": "12"}, (), id="lifespan-is-not-a-counter"),
        pytest.param({"port_xmit_wait": "1.5"}, (), id="float-skipped"),
        pytest.param(
            {"symbol_error": "1", "symbol_errors": "2"},
            (("symbol_errors", 1),),
            id="first-wins-on-stem-collision",
        ),
        pytest.param(
            {"z_counter": "1", "a_counter": "2"},
            (("a_counter", 2), ("z_counter", 1)),
            id="sorted-by-stem",
        ),
        pytest.param({"x": str(2**64 - 1)}, (("x", 2**64 - 1),), id="u64"),
    ],
)
def test_counter_files_to_stems_and_values(tmp_path: Path, files: dict[str, str],
                                           expected: tuple[tuple[str, int], ...]) -> None:
    counters = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    counters.mkdir(parents=True)
    for name, text in files.items():
        (counters / name).write_text(text)
    [port] = InfinibandCollector(tmp_path / "sys").collect().infiniband
    assert port.counters == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4: ACTIVE", 4), ("1: DOWN\n", 1), ("5: LinkUp", 5), (" 2: Polling", 2), ("3", 3)],
)
def test_parse_port_state(text: str, expected: int) -> None:
    assert parse_port_state(text) == expected


@pytest.mark.parametrize("text", ["", "ACTIVE", ": 4", "four: ACTIVE"])
def test_parse_port_state_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="invalid literal"):
        parse_port_state(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)", 50e9),
        ("200 Gb/sec (2X NDR)\n", 25e9),
        ("100 Gb/sec (4X EDR)", 12.5e9),
        ("56 Gb/sec (4X FDR)", 7e9),
        ("2.5 Gb/sec (1X SDR)", 312.5e6),
        ("800 Mb/sec", 100e6),
    ],
)
def test_parse_rate(text: str, expected: float) -> None:
    assert parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "fast", "Gb/sec (4X NDR)", "400 Tb/sec"])
def test_parse_rate_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="not an InfiniBand rate"):
        parse_rate(text)


def _fixture_int(device: str, sub: str, name: str) -> int:
    return int((IB / device / "ports" / "1" / sub / name).read_text())


def _ports(sysfs: Path) -> dict[str, IbPortSample]:
    return {s.device: s for s in InfinibandCollector(sysfs).collect().infiniband}


def test_collector_on_fixture_tree() -> None:
    ports = _ports(FIXTURE / "sys")
    assert list(ports) == [
        "mlx5_0",
        "mlx5_1",
        "mlx5_4",
        "mlx5_5",
        "mlx5_6",
        "mlx5_7",
        "mlx5_8",
        "mlx5_9",
        "mlx5_bond_0",
    ]
    mlx5_0 = ports["mlx5_0"]
    assert mlx5_0.port == 1
    assert mlx5_0.state == 4
    assert mlx5_0.phys_state == 5
    assert mlx5_0.rate_bytes_per_second == 50e9
    assert mlx5_0.link_layer == "InfiniBand"

    counters = dict(mlx5_0.counters)
    assert counters["received_bytes"] == 4 * _fixture_int("mlx5_0", "counters", "port_rcv_data")
    assert counters["received_bytes"] == 4 * 230539874932483
    assert counters["transmitted_bytes"] == 4 * _fixture_int("mlx5_0", "counters", "port_xmit_data")
    assert counters["received_packets"] == _fixture_int("mlx5_0", "counters", "port_rcv_packets")
    assert counters["excessive_buffer_overrun_errors"] == 15
    assert counters["receive_errors"] == 14
    assert counters["receive_switch_relay_errors"] == 1
    assert counters["transmit_wait"] == 2489603687
    assert counters["roce_adp_retrans"] == 3
    assert counters["rx_write_requests"] == 3809045607
    assert "lifespan" not in counters

    assert dict(ports["mlx5_1"].counters)["link_downed"] == 255

    bond = ports["mlx5_bond_0"]
    assert bond.link_layer == "Ethernet"
    assert bond.rate_bytes_per_second == 25e9


def test_every_fixture_counter_file_becomes_a_valid_stem() -> None:
    port_dir = IB / "mlx5_0" / "ports" / "1"
    files = [p.name for p in (port_dir / "counters").iterdir()]
    hw_files = [p.name for p in (port_dir / "hw_counters").iterdir() if p.name != "lifespan"]
    counters = dict(_ports(FIXTURE / "sys")["mlx5_0"].counters)
    assert len(counters) == len(files) + len(hw_files)
    for name in hw_files:
        assert name in counters
    for stem in counters:
        assert STEM.match(stem), stem
        assert METRIC_NAME.match(f"sn_infiniband_port_{stem}_total")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(IB, root / "class" / "infiniband")
    return root


def test_missing_counter_file_skips_only_that_counter(sysfs: Path) -> None:
    (sysfs / "class/infiniband/mlx5_0/ports/1/counters/symbol_error").unlink()
    ports = _ports(sysfs)
    counters = dict(ports["mlx5_0"].counters)
    assert "symbol_errors" not in counters
    assert counters["received_bytes"] == 4 * 230539874932483
    assert "symbol_errors" in dict(ports["mlx5_1"].counters)


def test_garbled_counter_file_is_skipped(sysfs: Path) -> None:
    (sysfs / "class/infiniband/mlx5_0/ports/1/hw_counters/out_of_sequence").write_text("N/A\n")
    counters = dict(_ports(sysfs)["mlx5_0"].counters)
    assert "out_of_sequence" not in counters
    assert "out_of_buffer" in counters


def test_unreadable_counter_file_is_skipped(sysfs: Path) -> None:
    path = sysfs / "class/infiniband/mlx5_0/ports/1/counters/link_downed"
    path.unlink()
    path.mkdir()
    counters = dict(_ports(sysfs)["mlx5_0"].counters)
    assert "link_downed" not in counters
    assert counters["symbol_errors"] == 0


@pytest.mark.parametrize("name", ["state", "phys_state", "rate", "link_layer"])
def test_missing_port_attribute_skips_only_that_value(sysfs: Path, name: str) -> None:
    (sysfs / "class/infiniband/mlx5_4/ports/1" / name).unlink()
    port = _ports(sysfs)["mlx5_4"]
    values = {
        "state": port.state,
        "phys_state": port.phys_state,
        "rate": port.rate_bytes_per_second,
        "link_layer": port.link_layer,
    }
    assert values.pop(name) is None
    assert None not in values.values()
    assert port.counters


def test_garbled_state_and_rate(sysfs: Path) -> None:
    port_dir = sysfs / "class/infiniband/mlx5_4/ports/1"
    (port_dir / "state").write_text("ACTIVE\n")
    (port_dir / "rate").write_text("fast\n")
    port = _ports(sysfs)["mlx5_4"]
    assert port.state is None
    assert port.rate_bytes_per_second is None
    assert port.phys_state == 5


def test_missing_counter_directories(sysfs: Path) -> None:
    shutil.rmtree(sysfs / "class/infiniband/mlx5_5/ports/1/hw_counters")
    shutil.rmtree(sysfs / "class/infiniband/mlx5_6/ports/1/counters")
    ports = _ports(sysfs)
    mlx5_5 = dict(ports["mlx5_5"].counters)
    assert "received_bytes" in mlx5_5
    assert "out_of_sequence" not in mlx5_5
    mlx5_6 = dict(ports["mlx5_6"].counters)
    assert "received_bytes" not in mlx5_6
    assert "out_of_sequence" in mlx5_6


def test_device_without_ports_gives_no_samples(sysfs: Path) -> None:
    shutil.rmtree(sysfs / "class/infiniband/mlx5_7/ports")
    assert "mlx5_7" not in _ports(sysfs)


def test_several_ports_and_natural_order(tmp_path: Path) -> None:
    root = tmp_path / "sys" / "class" / "infiniband"
    for device, port in [("mlx5_10", "1"), ("mlx5_2", "2"), ("mlx5_2", "1"), ("mlx5_2", "x")]:
        (root / device / "ports" / port / "counters").mkdir(parents=True)
        (root / device / "ports" / port / "counters" / "port_rcv_data").write_text("1\n")
    samples = InfinibandCollector(tmp_path / "sys").collect().infiniband
    assert [(s.device, s.port) for s in samples] == [
        ("mlx5_2", 1),
        ("mlx5_2", 2),
        ("mlx5_10", 1),
    ]
    assert samples[0].counters == (("received_bytes", 4),)
    assert samples[0].state is None


def test_missing_infiniband_class_is_source_missing(tmp_path: Path) -> None:
    (tmp_path / "sys" / "class" / "net").mkdir(parents=True)
    with pytest.raises(SourceMissing) as info:
        InfinibandCollector(tmp_path / "sys").collect()
    assert isinstance(info.value, CollectorError)
    with pytest.raises(SourceMissing):
        InfinibandCollector(tmp_path / "nowhere").collect()


def test_empty_infiniband_class_is_no_ports(tmp_path: Path) -> None:
    (tmp_path / "sys" / "class" / "infiniband").mkdir(parents=True)
    assert InfinibandCollector(tmp_path / "sys").collect().infiniband == ()


def test_collector_protocol() -> None:
    collector = InfinibandCollector(FIXTURE / "sys")
    assert collector.name == "infiniband"
    collector.close()


def test_one_collector_follows_the_counters_cycle_after_cycle(sysfs: Path) -> None:
    """The files stay open between cycles and are read again from the start."""
    collector = InfinibandCollector(sysfs)
    port_dir = sysfs / "class/infiniband/mlx5_0/ports/1"
    try:
        first = {s.device: s for s in collector.collect().infiniband}["mlx5_0"]
        (port_dir / "counters" / "port_rcv_data").write_text("7\n")
        (port_dir / "counters" / "symbol_error").write_text("123456789012\n")
        (port_dir / "state").write_text("1: DOWN\n")
        second = {s.device: s for s in collector.collect().infiniband}["mlx5_0"]
    finally:
        collector.close()
    assert dict(first.counters)["received_bytes"] == 4 * 230539874932483
    assert dict(second.counters)["received_bytes"] == 28
    assert dict(second.counters)["symbol_errors"] == 123456789012
    assert (first.state, second.state) == (4, 1)


def test_a_device_that_goes_and_comes_back_is_listed_again(sysfs: Path) -> None:
    collector = InfinibandCollector(sysfs)
    device = sysfs / "class/infiniband/mlx5_0"
    try:
        assert "mlx5_0" in {s.device for s in collector.collect().infiniband}
        shutil.rmtree(device)
        assert "mlx5_0" not in {s.device for s in collector.collect().infiniband}
        shutil.copytree(IB / "mlx5_0", device)
        (device / "ports/1/counters/link_downed").write_text("3\n")
        back = {s.device: s for s in collector.collect().infiniband}["mlx5_0"]
        assert dict(back.counters)["link_downed"] == 3
        # replaced under the same name between two cycles: a new directory, listed anew
        shutil.rmtree(device)
        shutil.copytree(IB / "mlx5_0", device)
        (device / "ports/1/counters/link_downed").write_text("9\n")
        again = {s.device: s for s in collector.collect().infiniband}["mlx5_0"]
        assert dict(again.counters)["link_downed"] == 9
    finally:
        collector.close()


def test_past_the_open_file_budget_files_are_opened_at_each_read(sysfs: Path) -> None:
    kept = InfinibandCollector(sysfs)
    frugal = InfinibandCollector(sysfs, max_open_files=3)
    try:
        assert frugal.collect() == kept.collect()
        (sysfs / "class/infiniband/mlx5_9/ports/1/counters/link_downed").write_text("5\n")
        ports = {s.device: s for s in frugal.collect().infiniband}
        assert dict(ports["mlx5_9"].counters)["link_downed"] == 5
    finally:
        kept.close()
        frugal.close()
    assert len(os.listdir("/proc/self/fd")) < 200  # close() let go of every file


def test_the_open_file_budget_is_a_quarter_of_the_limit_at_most() -> None:
    import resource

    from sn_monitor.agent.collectors.infiniband import MAX_OPEN_FILES, open_file_budget

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        assert open_file_budget() == 256
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(65536, hard), hard))
        assert open_file_budget() == min(MAX_OPEN_FILES, min(65536, hard) // 4)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_port_that_trains_again_slower_is_seen_at_the_next_cycle(sysfs: Path) -> None:
    collector = InfinibandCollector(sysfs)
    rate = sysfs / "class/infiniband/mlx5_0/ports/1/rate"
    try:
        before = {s.device: s for s in collector.collect().infiniband}["mlx5_0"]
        rate.write_text("200 Gb/sec (2X NDR)\n")
        after = {s.device: s for s in collector.collect().infiniband}["mlx5_0"]
    finally:
        collector.close()
    assert (before.rate_bytes_per_second, after.rate_bytes_per_second) == (50e9, 25e9)
