from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sn_monitor.agent.collectors.base import SourceMissing
from sn_monitor.agent.collectors.host import HostCollector
from sn_monitor.agent.collectors.infiniband import InfinibandCollector
from sn_monitor.agent.collectors.net import NetCollector, parse_netdev
from sn_monitor.agent.snapshot import HostSample, IbPortSample, NetDeviceSample
from sn_monitor.sim.node_tree import (
    DEFAULT_IB_DEVICES,
    IB_COUNTER_FILES,
    IB_HW_COUNTER_FILES,
    ROCE_HW_COUNTER_FILES,
    SimulatedNodeTree,
)

FIXTURE_PORT = (
    Path(__file__).resolve().parents[1] / "fixtures/h100-node/sys/class/infiniband/mlx5_0/ports/1"
)


@pytest.fixture
def tree(tmp_path: Path) -> SimulatedNodeTree:
    return SimulatedNodeTree(tmp_path / "node", seed=7)


def _ib(tree: SimulatedNodeTree) -> dict[str, IbPortSample]:
    return {s.device: s for s in InfinibandCollector(tree.sysfs).collect().infiniband}


def _net(tree: SimulatedNodeTree) -> dict[str, NetDeviceSample]:
    return {s.device: s for s in NetCollector(tree.procfs, tree.sysfs).collect().net}


def _host(tree: SimulatedNodeTree) -> HostSample:
    host = HostCollector(tree.procfs, tree.sysfs, ticks_per_second=100).collect().host
    assert host is not None
    return host


def test_counter_file_names_match_the_real_tree() -> None:
    assert sorted(IB_COUNTER_FILES) == sorted(p.name for p in (FIXTURE_PORT / "counters").iterdir())
    assert sorted(IB_HW_COUNTER_FILES) == sorted(
        p.name for p in (FIXTURE_PORT / "hw_counters").iterdir()
    )


def test_collectors_read_the_default_tree(tree: SimulatedNodeTree) -> None:
    ports = _ib(tree)
    assert list(ports) == [f"mlx5_{i}" for i in range(10)]
    assert tree.ib_devices == tuple(ports)
    for device, port in ports.items():
        rail = device in DEFAULT_IB_DEVICES  # mlx5_0..7; mlx5_8, mlx5_9 are storage (RoCE)
        assert port.port == 1
        assert port.state == 4
        assert port.phys_state == 5
        assert port.rate_bytes_per_second == (50e9 if rail else 25e9)
        assert port.link_layer == ("InfiniBand" if rail else "Ethernet")
        roce = 0 if rail else len(ROCE_HW_COUNTER_FILES)
        assert len(port.counters) == (
            len(IB_COUNTER_FILES) + len(IB_HW_COUNTER_FILES) - 1 + roce)

    net = _net(tree)
    assert list(net) == ["lo", "eno1", "ens1f0np0", "ens1f1np1"]
    assert net["lo"].speed_bytes_per_second is None
    assert net["lo"].mtu_bytes == 65536
    assert net["ens1f0np0"].speed_bytes_per_second == 25_000_000_000
    assert net["ens1f0np0"].carrier_up is True
    assert net["eno1"].mtu_bytes == 1500

    host = _host(tree)
    assert len(host.cpu_seconds_total) == 8
    assert host.memory_total_bytes is not None
    assert host.memory_available_bytes is not None
    assert host.memory_available_bytes < host.memory_total_bytes
    assert host.load1 is not None
    assert [s.domain for s in host.memory_bandwidth] == ["L3_00", "L3_01"]


def test_data_counters_are_written_in_words(tree: SimulatedNodeTree) -> None:
    tree.advance(1.0, 0.5)
    words = int((tree.sysfs / "class/infiniband/mlx5_3/ports/1/counters/port_rcv_data").read_text())
    assert words == tree.ib_counter("mlx5_3", "port_rcv_data")
    assert dict(_ib(tree)["mlx5_3"].counters)["received_bytes"] == 4 * words


@pytest.mark.parametrize("load", [0.0, 0.3, 1.0])
def test_counters_advance_monotonically(tree: SimulatedNodeTree, load: float) -> None:
    before_ib = _ib(tree)
    before_net = _net(tree)
    before_host = _host(tree)
    for _ in range(5):
        tree.advance(1.0, load)
    after_ib = _ib(tree)
    after_net = _net(tree)
    after_host = _host(tree)

    for device, port in after_ib.items():
        old = dict(before_ib[device].counters)
        new = dict(port.counters)
        assert old.keys() == new.keys()
        for stem, value in new.items():
            assert value >= old[stem], (device, stem)
        moved = new["received_bytes"] - old["received_bytes"]
        line_rate = port.rate_bytes_per_second
        assert line_rate is not None
        assert 0 < moved <= line_rate * 5 * 1.1  # never above line rate
        if load > 0:
            assert moved > line_rate * 5 * load * 0.5
        assert new["received_packets"] > old["received_packets"]
        assert new["symbol_errors"] == old["symbol_errors"]
        assert new["link_downed"] == old["link_downed"]

    for device, sample in after_net.items():
        old_net = before_net[device]
        assert sample.receive_bytes_total > old_net.receive_bytes_total
        assert sample.transmit_bytes_total > old_net.transmit_bytes_total
        assert sample.receive_packets_total > old_net.receive_packets_total

    old_cpu = dict(before_host.cpu_seconds_total)
    new_cpu = dict(after_host.cpu_seconds_total)
    assert all(new_cpu[mode] >= old_cpu[mode] for mode in old_cpu)
    assert sum(new_cpu.values()) - sum(old_cpu.values()) == pytest.approx(5 * 224, rel=0.01)
    for old_bw, new_bw in zip(
        before_host.memory_bandwidth, after_host.memory_bandwidth, strict=True
    ):
        assert new_bw.bytes_total > old_bw.bytes_total


def test_load_raises_the_load_average(tree: SimulatedNodeTree) -> None:
    for _ in range(12):
        tree.advance(10.0, 1.0)
    load1 = _host(tree).load1
    assert load1 is not None
    assert load1 > 100


def test_port_down_and_up(tree: SimulatedNodeTree) -> None:
    tree.set_ib_port_down("mlx5_2")
    port = _ib(tree)["mlx5_2"]
    assert (port.state, port.phys_state) == (1, 2)
    down = dict(port.counters)
    assert down["link_downed"] == 1

    tree.advance(1.0, 1.0)
    tree.set_ib_port_down("mlx5_2")  # already down: counted once
    still_down = dict(_ib(tree)["mlx5_2"].counters)
    assert still_down["received_bytes"] == down["received_bytes"]
    assert still_down["link_downed"] == 1
    assert dict(_ib(tree)["mlx5_3"].counters)["link_downed"] == 0

    tree.set_ib_port_up("mlx5_2")
    tree.advance(1.0, 1.0)
    port = _ib(tree)["mlx5_2"]
    assert (port.state, port.phys_state) == (4, 5)
    up = dict(port.counters)
    assert up["link_downed"] == 1
    assert up["received_bytes"] > down["received_bytes"]


def test_flap_ib_port(tree: SimulatedNodeTree) -> None:
    tree.flap_ib_port("mlx5_5")
    tree.flap_ib_port("mlx5_5")
    port = _ib(tree)["mlx5_5"]
    assert port.state == 4
    assert dict(port.counters)["link_downed"] == 2
    assert tree.ib_counter("mlx5_5", "link_downed") == 2


def test_symbol_errors(tree: SimulatedNodeTree) -> None:
    tree.add_ib_symbol_errors("mlx5_1", 7)
    tree.add_ib_symbol_errors("mlx5_1", 0)
    assert dict(_ib(tree)["mlx5_1"].counters)["symbol_errors"] == 7
    with pytest.raises(ValueError, match="backwards"):
        tree.add_ib_symbol_errors("mlx5_1", -1)


def test_flap_carrier(tree: SimulatedNodeTree) -> None:
    before = _net(tree)["ens1f1np1"].carrier_changes_total
    assert before is not None
    tree.flap_carrier("ens1f1np1")
    after = _net(tree)["ens1f1np1"]
    assert after.carrier_changes_total == before + 2
    assert after.carrier_up is True


def test_set_carrier(tree: SimulatedNodeTree) -> None:
    before = _net(tree)["ens1f0np0"]
    assert before.carrier_changes_total is not None
    tree.set_carrier("ens1f0np0", up=False)
    tree.advance(1.0, 1.0)
    down = _net(tree)["ens1f0np0"]
    assert down.carrier_up is False
    assert down.speed_bytes_per_second is None
    assert down.carrier_changes_total == before.carrier_changes_total + 1
    assert (tree.sysfs / "class/net/ens1f0np0/operstate").read_text() == "down\n"
    tree.set_carrier("ens1f0np0", up=True)
    assert _net(tree)["ens1f0np0"].carrier_changes_total == before.carrier_changes_total + 2


def test_unknown_devices(tree: SimulatedNodeTree) -> None:
    with pytest.raises(KeyError, match="mlx5_99"):
        tree.flap_ib_port("mlx5_99")
    with pytest.raises(KeyError, match="eth9"):
        tree.flap_carrier("eth9")


def test_node_without_infiniband(tmp_path: Path) -> None:
    tree = SimulatedNodeTree(tmp_path, ib_devices=[])
    tree.advance(1.0, 0.5)
    assert tree.ib_devices == ()
    with pytest.raises(SourceMissing):
        InfinibandCollector(tree.sysfs).collect()
    assert len(_net(tree)) == 4


def test_time_does_not_go_backwards(tree: SimulatedNodeTree) -> None:
    with pytest.raises(ValueError, match="backwards"):
        tree.advance(-1.0, 0.5)


def test_custom_devices_and_roce(tmp_path: Path) -> None:
    tree = SimulatedNodeTree(
        tmp_path, netdevs=["eth0"], ib_devices=["mlx5_0", "mlx5_bond_0"], seed=1
    )
    assert list(_net(tree)) == ["eth0"]
    ports = _ib(tree)
    assert ports["mlx5_bond_0"].link_layer == "Ethernet"
    assert ports["mlx5_bond_0"].rate_bytes_per_second == 25e9
    before = dict(ports["mlx5_bond_0"].counters)
    for name in ROCE_HW_COUNTER_FILES:
        assert name in before
    assert "np_cnp_sent" not in dict(ports["mlx5_0"].counters)
    tree.advance(1.0, 1.0)
    after = dict(_ib(tree)["mlx5_bond_0"].counters)
    assert after["np_ecn_marked_roce_packets"] > before["np_ecn_marked_roce_packets"]


def test_same_seed_same_tree(tmp_path: Path) -> None:
    a = SimulatedNodeTree(tmp_path / "a", seed=3)
    b = SimulatedNodeTree(tmp_path / "b", seed=3)
    for t in (a, b):
        t.advance(1.0, 0.4)
    for rel in (
        "proc/net/dev",
        "proc/stat",
        "sys/class/infiniband/mlx5_4/ports/1/counters/port_xmit_data",
    ):
        assert (a.root / rel).read_text() == (b.root / rel).read_text()


def test_no_temporary_files_left_in_the_tree(tree: SimulatedNodeTree) -> None:
    tree.advance(1.0, 0.5)
    tree.flap_ib_port("mlx5_0")
    names = [name for _, _, files in os.walk(tree.root) for name in files]
    assert not [n for n in names if n.endswith(".tmp")]


def test_only_changed_files_are_rewritten(tree: SimulatedNodeTree) -> None:
    counters = tree.sysfs / "class/infiniband/mlx5_0/ports/1/counters"
    unchanged = counters / "symbol_error"
    changed = counters / "port_rcv_data"
    state = counters.parent / "state"
    before = {p: p.stat().st_ino for p in (unchanged, changed, state)}
    tree.advance(1.0, 0.5)
    assert unchanged.stat().st_ino == before[unchanged]
    assert state.stat().st_ino == before[state]
    text = changed.read_text()
    tree.advance(1.0, 0.5)
    assert changed.read_text() != text
    assert changed.stat().st_ino == before[changed]  # a sysfs attribute: written in place
    netdev = tree.procfs / "net" / "dev"
    ino = netdev.stat().st_ino
    tree.advance(1.0, 0.5)
    assert netdev.stat().st_ino != ino  # /proc: replaced whole


def test_concurrent_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    tree = SimulatedNodeTree(tmp_path, ib_devices=[])
    netdev = tree.procfs / "net" / "dev"
    stop = threading.Event()
    bad: list[str] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            text = netdev.read_text()
            reads += 1
            if len(parse_netdev(text)) != 4 or not text.endswith("\n"):
                bad.append(text)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(100):
            tree.advance(0.01, 0.9)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert reads > 0
    assert bad == []


def test_a_sys_file_removed_behind_its_back_is_created_again(tree: SimulatedNodeTree) -> None:
    counter = tree.sysfs / "class/infiniband/mlx5_0/ports/1/counters/port_rcv_data"
    counter.unlink()
    tree.advance(1.0, 0.5)
    assert int(counter.read_text()) > 0
