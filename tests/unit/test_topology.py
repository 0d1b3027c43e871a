"""The topology collector: NVLink peers from the NVML adapter, NICs and PCIe affinity from /sys.

On the real captured H100 tree (InfiniBand class only: no PCI devices) and on the
simulated HGX H100 node (fake NVML + the simulated /sys), whose layout is the contract's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from sn_monitor.agent.collectors.topology import (
    PciLocation,
    collect_topology,
    nvlink_peers,
    parse_port_guid,
    pci_affinity,
)
from sn_monitor.agent.nvml import NvmlError, NvmlLibrary
from sn_monitor.agent.snapshot import GpuLinks, NvLinkRemote
from sn_monitor.model import NodeTopology, topology_digest
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import H100_SXM, GpuProfile, SimulatedGpu, make_gpus
from sn_monitor.sim.hgx import simulated_topology
from sn_monitor.sim.node import SimulatedNode

FIXTURE_SYS = Path(__file__).resolve().parents[1] / "fixtures" / "h100-node" / "sys"

GPU0 = ("pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0")


@pytest.mark.parametrize(
    ("nic_path", "gpu_numa", "nic_numa", "expected"),
    [
        # beside the GPU, under the same PCIe switch
        (("pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:01.0", "0000:19:00.0"),
         0, 0, "PIX"),
        # another function of the GPU's own device
        ((*GPU0[:-1], "0000:18:00.1"), 0, 0, "PIX"),
        # under a second switch below the GPU's switch
        (("pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:01.0", "0000:19:00.0",
          "0000:1a:00.0", "0000:1b:00.0"), 0, 0, "PXB"),
        # another switch on the same root port
        (("pci0000:15", "0000:15:01.0", "0000:20:00.0", "0000:21:00.0", "0000:22:00.0"),
         0, 0, "PXB"),
        # another root port of the same host bridge
        (("pci0000:15", "0000:15:02.0", "0000:30:00.0"), 0, 0, "PHB"),
        # another host bridge, same socket / the other socket
        (("pci0000:0b", "0000:0b:01.0", "0000:0c:00.0"), 0, 0, "NODE"),
        (("pci0000:8b", "0000:8b:01.0", "0000:8c:00.0"), 0, 1, "SYS"),
        (("pci0000:8b", "0000:8b:01.0", "0000:8c:00.0"), -1, -1, "NODE"),
        (("pci0000:8b", "0000:8b:01.0", "0000:8c:00.0"), 0, None, None),
    ],
)
def test_pci_affinity(nic_path: tuple[str, ...], gpu_numa: int | None, nic_numa: int | None,
                      expected: str | None) -> None:
    gpu = PciLocation(GPU0, gpu_numa)
    nic = PciLocation(nic_path, nic_numa)
    assert pci_affinity(gpu, nic) == expected
    assert pci_affinity(nic, gpu) == expected


@pytest.mark.parametrize(
    ("gid", "node_guid", "expected"),
    [
        ("fe80:0000:0000:0000:a088:c203:0042:1a3c", None, "a088:c203:0042:1a3c"),
        ("fe80:0:0:0:A088:C203:42:1A3C\n", "ffff:ffff:ffff:ffff", "a088:c203:0042:1a3c"),
        (None, "a088:c203:0042:1a3c\n", "a088:c203:0042:1a3c"),
        ("garbage", "also garbage", ""),
        (None, None, ""),
    ],
)
def test_parse_port_guid(gid: str | None, node_guid: str | None, expected: str) -> None:
    assert parse_port_guid(gid, node_guid) == expected


def test_nvlink_peers_group_links_by_the_device_at_their_far_end() -> None:
    links = (
        NvLinkRemote(0, True, "gpu", "0000:2a:00.0"),
        NvLinkRemote(1, True, "gpu", "0000:2a:00.0"),
        NvLinkRemote(2, True, "switch", "0000:05:00.0"),
        NvLinkRemote(3, False),
        NvLinkRemote(4, True, "cpu", "0000:00:00.0"),
        NvLinkRemote(5, True, None, None),
        NvLinkRemote(6, None),
    )
    peers = nvlink_peers(GpuLinks(0, "GPU-a", "0000:18:00.0", links), {"0000:2a:00.0": 1})
    by_kind = {(p.kind, p.pci_bus_id): (p.links, p.gpu) for p in peers}
    assert by_kind == {
        ("gpu", "0000:2a:00.0"): (2, 1),
        ("switch", "0000:05:00.0"): (1, None),
        ("cpu", "0000:00:00.0"): (1, None),
        ("unknown", ""): (1, None),
    }


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimulatedNode]:
    node = SimulatedNode(tmp_path / "node", seed=3)
    yield node
    fake_nvml.reset()


def _library() -> NvmlLibrary:
    library = NvmlLibrary(fake_nvml)
    library.init()
    return library


def test_the_simulated_node_is_an_hgx_h100(node: SimulatedNode) -> None:
    library = _library()
    try:
        topology = collect_topology(library.nvlink_topology(), node.tree.sysfs)
    finally:
        library.close()
    assert topology.nvswitches == 4
    assert [g.index for g in topology.gpus] == list(range(8))
    for gpu, simulated in zip(topology.gpus, node.gpus, strict=True):
        assert gpu.uuid == simulated.uuid
        assert gpu.pci_bus_id == simulated.pci_bus_id.lower()[4:]  # 8 hex domain digits -> 4
        assert gpu.numa_node == (0 if gpu.index < 4 else 1)
        assert gpu.nvlinks == 18
        assert [(p.kind, p.links) for p in gpu.peers] == [
            ("switch", 5), ("switch", 4), ("switch", 4), ("switch", 5)]
        assert gpu.nics[f"mlx5_{gpu.index}"] == "PIX"
        for other in range(8):
            if other != gpu.index:
                same_socket = (other < 4) == (gpu.index < 4)
                assert gpu.nics[f"mlx5_{other}"] == ("NODE" if same_socket else "SYS")
        assert gpu.nics["mlx5_8"] == ("NODE" if gpu.index < 4 else "SYS")
        assert gpu.nics["mlx5_9"] == ("SYS" if gpu.index < 4 else "NODE")
    switches = {p.pci_bus_id for g in topology.gpus for p in g.peers}
    assert len(switches) == 4
    nics = {nic.device: nic for nic in topology.nics}
    assert list(nics) == [f"mlx5_{i}" for i in range(10)]
    guids = set()
    for i in range(8):
        nic = nics[f"mlx5_{i}"]
        assert (nic.role, nic.rail) == ("rail", i)
        assert nic.numa_node == (0 if i < 4 else 1)
        assert nic.netdev.startswith("ibp")
        assert nic.pci_bus_id
        [port] = nic.ports
        assert (port.port, port.link_layer, port.rate_bytes_per_second) == (
            1, "InfiniBand", 50e9)
        guids.add(port.guid)
    for device, netdev in (("mlx5_8", "ens1f0np0"), ("mlx5_9", "ens1f1np1")):
        nic = nics[device]
        assert (nic.role, nic.rail, nic.netdev) == ("storage", None, netdev)
        [port] = nic.ports
        assert (port.link_layer, port.rate_bytes_per_second) == ("Ethernet", 25e9)
        guids.add(port.guid)
    assert len(guids) == 10
    assert all(len(guid) == 19 for guid in guids)
    # What the wire carries: it round-trips, and its digest is stable.
    wire = msgspec.json.encode(topology)
    assert msgspec.json.decode(wire, type=NodeTopology) == topology
    assert topology_digest(msgspec.json.decode(wire, type=NodeTopology)) == (
        topology_digest(topology))


def test_the_fleets_topology_is_what_a_simulated_agent_collects(node: SimulatedNode) -> None:
    library = _library()
    try:
        collected = collect_topology(library.nvlink_topology(), node.tree.sysfs)
    finally:
        library.close()
    built = simulated_topology(
        [(g.uuid, g.pci_bus_id, len(g.nvlinks)) for g in node.gpus], seed=3)
    assert built == collected


def test_the_device_links_are_relative_like_the_kernels(node: SimulatedNode) -> None:
    link = node.tree.sysfs / "class" / "infiniband" / "mlx5_0" / "device"
    assert not os.readlink(link).startswith("/")
    bus_link = node.tree.sysfs / "bus" / "pci" / "devices" / "0000:18:00.0"
    assert not os.readlink(bus_link).startswith("/")
    assert (bus_link / "numa_node").read_text() == "0\n"


def test_the_captured_h100_tree_has_nics_without_affinity() -> None:
    """The real tree has only class/infiniband: ports and rates, no PCI place, no GUIDs."""
    fake_nvml.configure(make_gpus(8))
    library = _library()
    try:
        topology = collect_topology(library.nvlink_topology(), FIXTURE_SYS)
    finally:
        library.close()
        fake_nvml.reset()
    devices = [nic.device for nic in topology.nics]
    assert devices == ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8",
                       "mlx5_9", "mlx5_bond_0"]
    for nic in topology.nics:
        assert (nic.role, nic.rail, nic.pci_bus_id, nic.numa_node, nic.netdev) == (
            "other", None, "", None, "")
        [port] = nic.ports
        expected = ("Ethernet", 25e9) if nic.device == "mlx5_bond_0" else ("InfiniBand", 50e9)
        assert (port.link_layer, port.rate_bytes_per_second) == expected
        assert port.guid == ""
    for gpu in topology.gpus:
        assert gpu.nics == {}
        assert gpu.numa_node is None
        assert gpu.nvlinks == 18  # NVML still knows the NVLinks


def test_no_gpus_and_no_sysfs_is_an_empty_topology(tmp_path: Path) -> None:
    assert collect_topology((), tmp_path) == NodeTopology()


def test_a_missing_numa_node_file_leaves_only_that_value_out(node: SimulatedNode) -> None:
    (node.tree.sysfs / "bus/pci/devices/0000:18:00.0/numa_node").unlink()
    library = _library()
    try:
        topology = collect_topology(library.nvlink_topology(), node.tree.sysfs)
    finally:
        library.close()
    gpu = topology.gpus[0]
    assert gpu.numa_node is None
    assert gpu.nics["mlx5_0"] == "PIX"
    assert "mlx5_4" not in gpu.nics  # NODE or SYS: the NUMA node is needed to tell
    assert topology.gpus[1].numa_node == 0


def _configure(profile: GpuProfile) -> None:
    fake_nvml.configure([SimulatedGpu(i, profile) for i in range(2)])


def test_gpus_without_nvlink_have_no_peers() -> None:
    _configure(GpuProfile(name="NVIDIA L40S", memory_total_bytes=48 * 2**30, nvlink_count=0))
    library = _library()
    try:
        gpus = library.nvlink_topology()
    finally:
        library.close()
        fake_nvml.reset()
    assert [(g.index, g.links) for g in gpus] == [(0, ()), (1, ())]


def test_a_driver_without_remote_info_gives_unknown_peers() -> None:
    _configure(GpuProfile(
        name=H100_SXM.name, memory_total_bytes=H100_SXM.memory_total_bytes,
        unsupported=frozenset({"nvmlDeviceGetNvLinkRemoteDeviceType",
                               "nvmlDeviceGetNvLinkRemotePciInfo"})))
    library = _library()
    try:
        gpus = library.nvlink_topology()
        again = library.nvlink_topology()
        asked = fake_nvml.call_count("nvmlDeviceGetNvLinkRemoteDeviceType")
    finally:
        library.close()
        fake_nvml.reset()
    assert gpus == again
    peers = nvlink_peers(gpus[0], {})
    assert [(p.kind, p.links, p.pci_bus_id) for p in peers] == [("unknown", 18, "")]
    # NotSupported is remembered: asked once per GPU, not per link and collection
    assert asked == 2


def test_a_transient_nvml_error_fails_the_collection() -> None:
    _configure(H100_SXM)
    library = _library()
    fake_nvml.inject_error(1, "nvmlDeviceGetNvLinkRemotePciInfo", fake_nvml.NVML_ERROR_TIMEOUT,
                           times=1)
    try:
        with pytest.raises(NvmlError, match="GPU 1"):
            library.nvlink_topology()
        assert len(library.nvlink_topology()) == 2  # the next collection succeeds
    finally:
        library.close()
        fake_nvml.reset()


def test_a_lost_gpu_fails_the_collection() -> None:
    _configure(H100_SXM)
    library = _library()
    fake_nvml.simulated_gpus()[0].fall_off_bus()
    try:
        with pytest.raises(NvmlError, match="GPU 0"):
            library.nvlink_topology()
    finally:
        library.close()
        fake_nvml.reset()


def test_nvml_not_initialized() -> None:
    with pytest.raises(NvmlError):
        NvmlLibrary(fake_nvml).nvlink_topology()
