"""Where the parts of a simulated HGX H100 / H200 node sit: PCIe, NUMA, NVSwitches, NICs.

One layout serves the fake NVML (each GPU's NVLinks go to the four NVSwitches, 5 + 4 + 4 + 5
links), the simulated /sys (:func:`write_pci_tree`: the PCIe tree under ``/sys/devices``,
``/sys/bus/pci/devices`` and each RDMA device's ``device`` link, GUIDs and netdev) and the
fleet, which sends the same topology without a tree of its own.

The shape is a DGX / HGX H100 baseboard's: each GPU sits behind a PCIe switch on its own
root port, and the ConnectX-7 that serves rail *i* sits behind the same switch as GPU *i*
(``nvidia-smi topo -m`` says PIX); GPUs and NICs 0-3 are on NUMA node 0, 4-7 on node 1.
Two storage NICs (a 200 Gb/s Ethernet / RoCE pair) sit on root ports of their own, one per
socket, near no GPU.
"""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sn_monitor.agent.collectors.topology import collect_topology
from sn_monitor.agent.pci import canonical_bus_id
from sn_monitor.agent.snapshot import GpuLinks, NvLinkRemote
from sn_monitor.model import NodeTopology
from sn_monitor.sim.gpu_model import HGX_BUS_NUMBERS

#: The NVSwitches' PCI bus numbers (domain 0), as NVML names an NVLink's remote end.
NVSWITCH_BUSES = (0x05, 0x06, 0x07, 0x08)
#: Each H100's 18 NVLinks, in link order, to NVSwitch 0, 1, 2 and 3.
LINKS_PER_NVSWITCH = (5, 4, 4, 5)
RAIL_NICS = tuple(f"mlx5_{i}" for i in range(8))
STORAGE_NICS = ("mlx5_8", "mlx5_9")
#: The storage NICs' Ethernet interfaces, in the order of :data:`STORAGE_NICS`.
STORAGE_NETDEVS = ("ens1f0np0", "ens1f1np1")
# Root buses of NICs that no GPU sits near, one per socket in turn.
_LONE_ROOT_BUSES = (0x0B, 0x8B, 0x4B, 0xCB, 0x2F, 0xAF, 0x6F, 0xEF)
_CLASS_GPU = "0x030200"
_CLASS_INFINIBAND = "0x020700"
_CLASS_ETHERNET = "0x020000"
_CLASS_BRIDGE = "0x060400"
_VENDOR_NVIDIA = "0x10de"
_VENDOR_MELLANOX = "0x15b3"
_VENDOR_SWITCH = "0x1000"  # a Broadcom PEX switch


@dataclass(frozen=True, slots=True)
class PciPlace:
    """A PCI device and the bridges above it: ``path`` is its directory under /sys/devices."""

    path: tuple[str, ...]
    numa_node: int

    @property
    def bus_id(self) -> str:
        """``0000:18:00.0``, the kernel's spelling."""
        return self.path[-1]


@dataclass(frozen=True, slots=True)
class NicPlace:
    """One RDMA NIC: its PCI place, link layer, netdev and GUID."""

    device: str
    pci: PciPlace
    ethernet: bool
    netdev: str
    node_guid: str

    @property
    def rate_text(self) -> str:
        return "200 Gb/sec (2X NDR)" if self.ethernet else "400 Gb/sec (4X NDR)"


@dataclass(frozen=True, slots=True)
class NodeLayout:
    """Where a simulated node's GPUs (in NVML index order) and NICs sit."""

    gpus: tuple[PciPlace, ...]
    nics: tuple[NicPlace, ...]


def is_ethernet_nic(device: str) -> bool:
    """A RoCE device: a bond, or one of the storage NICs."""
    return "bond" in device or device in STORAGE_NICS


def hgx_gpu_bus_ids(count: int = 8) -> tuple[str, ...]:
    """The NVML bus ids of ``count`` GPUs, as the simulated GPUs have them by default."""
    return tuple(
        f"00000000:{HGX_BUS_NUMBERS[i] if i < len(HGX_BUS_NUMBERS) else (0x10 + i) % 0x100:02X}"
        ":00.0" for i in range(count)
    )


def nvswitch_bus_id(switch: int) -> str:
    """NVSwitch ``switch``'s bus id as NVML's remote PCI info spells it."""
    return f"00000000:{NVSWITCH_BUSES[switch]:02X}:00.0"


def nvswitch_of_link(link: int, links: int) -> int:
    """Which NVSwitch a GPU's NVLink ``link`` (of ``links``) goes to."""
    if links == sum(LINKS_PER_NVSWITCH):
        for switch, count in enumerate(LINKS_PER_NVSWITCH):
            if link < count:
                return switch
            link -= count
    return link * len(NVSWITCH_BUSES) // max(1, links)


def _bdf(domain: int, bus: int, device: int = 0, function: int = 0) -> str:
    return f"{domain:04x}:{bus % 0x100:02x}:{device:02x}.{function}"


def _parse_bus(nvml_bus_id: str) -> tuple[int, int]:
    domain, bus, _ = nvml_bus_id.split(":")
    return int(domain, 16), int(bus, 16)


def node_layout(
    gpu_bus_ids: Sequence[str] | None = None,
    ib_devices: Sequence[str] = RAIL_NICS + STORAGE_NICS,
    seed: int = 0,
) -> NodeLayout:
    """The layout of a node with these GPUs (NVML bus ids, index order) and RDMA devices.

    GPU *i* sits behind a PCIe switch on root port ``bus - 3``; the *i*-th device that is
    not Ethernet (:func:`is_ethernet_nic`) shares GPU *i*'s switch. The others get root
    ports of their own. The first half of the GPUs is on NUMA node 0, the rest on node 1.
    """
    if gpu_bus_ids is None:
        gpu_bus_ids = hgx_gpu_bus_ids()
    half = max(1, (len(gpu_bus_ids) + 1) // 2)
    gpus: list[PciPlace] = []
    for index, bus_id in enumerate(gpu_bus_ids):
        domain, bus = _parse_bus(bus_id)
        root = bus - 3
        gpus.append(PciPlace(
            path=(f"pci{domain:04x}:{root % 0x100:02x}", _bdf(domain, root, 1),
                  _bdf(domain, root + 1), _bdf(domain, root + 2), _bdf(domain, bus)),
            numa_node=0 if index < half else 1,
        ))
    rng = random.Random(f"hgx/{seed}")
    nics: list[NicPlace] = []
    rails = 0
    lone = 0
    for device in ib_devices:
        ethernet = is_ethernet_nic(device)
        guid = rng.getrandbits(32)
        node_guid = f"a088:c203:{guid >> 16:04x}:{guid & 0xFFFF:04x}"
        if not ethernet and rails < len(gpus):
            gpu = gpus[rails]
            domain, bus = _parse_bus(gpu_bus_ids[rails])
            place = PciPlace(path=(*gpu.path[:3], _bdf(domain, bus - 1, 1), _bdf(domain, bus + 1)),
                             numa_node=gpu.numa_node)
            rails += 1
            netdev = f"ibp{(bus + 1) % 0x100}s0"
        else:
            root = _LONE_ROOT_BUSES[lone % len(_LONE_ROOT_BUSES)] + 2 * (lone // 8)
            place = PciPlace(path=(f"pci0000:{root:02x}", _bdf(0, root, 1), _bdf(0, root + 1)),
                             numa_node=lone % 2)
            lone += 1
            storage = STORAGE_NICS.index(device) if device in STORAGE_NICS else -1
            if storage >= 0:
                netdev = STORAGE_NETDEVS[storage]
            else:
                netdev = f"{'enp' if ethernet else 'ibp'}{root + 1}s0{'np0' if ethernet else ''}"
        nics.append(NicPlace(device=device, pci=place, ethernet=ethernet, netdev=netdev,
                             node_guid=node_guid))
    return NodeLayout(gpus=tuple(gpus), nics=tuple(nics))


def write_pci_tree(sysfs: Path, layout: NodeLayout) -> None:
    """Write the layout's PCI devices under ``sysfs`` as the kernel shows them.

    ``devices/pci<domain>:<bus>/<bridge>/.../<device>/`` with ``numa_node``, ``vendor`` and
    ``class`` in every device and bridge; ``bus/pci/devices/<bdf>`` links to each; and for
    every NIC, ``class/infiniband/<device>/device`` (a relative link, like the kernel's),
    the netdev under ``device/net/``, ``node_guid`` and ``ports/1/gids/0``. Static: written
    once, before the counters.
    """
    devices = sysfs / "devices"
    bus_dir = sysfs / "bus" / "pci" / "devices"
    bus_dir.mkdir(parents=True, exist_ok=True)
    endpoints: dict[tuple[str, ...], tuple[str, str]] = {}
    for gpu in layout.gpus:
        endpoints[gpu.path] = (_VENDOR_NVIDIA, _CLASS_GPU)
    for nic in layout.nics:
        endpoints[nic.pci.path] = (
            _VENDOR_MELLANOX, _CLASS_ETHERNET if nic.ethernet else _CLASS_INFINIBAND)
    places = [*layout.gpus, *(nic.pci for nic in layout.nics)]
    for place in places:
        for depth in range(2, len(place.path) + 1):
            path = place.path[:depth]
            directory = devices.joinpath(*path)
            directory.mkdir(parents=True, exist_ok=True)
            vendor, pci_class = endpoints.get(path, (_VENDOR_SWITCH, _CLASS_BRIDGE))
            _put(directory / "numa_node", f"{place.numa_node}\n")
            _put(directory / "vendor", f"{vendor}\n")
            _put(directory / "class", f"{pci_class}\n")
            _link(bus_dir / path[-1], os.path.relpath(directory, bus_dir))
    for nic in layout.nics:
        device_dir = devices.joinpath(*nic.pci.path)
        (device_dir / "net" / nic.netdev).mkdir(parents=True, exist_ok=True)
        ib_dir = sysfs / "class" / "infiniband" / nic.device
        ib_dir.mkdir(parents=True, exist_ok=True)
        _link(ib_dir / "device", os.path.relpath(device_dir, ib_dir))
        _put(ib_dir / "node_guid", f"{nic.node_guid}\n")
        gid = f"fe80:0000:0000:0000:{nic.node_guid}"
        _put(ib_dir / "ports" / "1" / "gids" / "0", f"{gid}\n")


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")


def _link(path: Path, target: str) -> None:
    if path.is_symlink():
        if os.readlink(path) == target:
            return
        path.unlink()
    os.symlink(target, path)


def simulated_topology(gpus: Sequence[tuple[str, str, int]], seed: int = 0) -> NodeTopology:
    """What the topology collector reads on a simulated node, without NVML or a node tree.

    ``gpus``: (uuid, NVML bus id, NVLink count) per GPU in index order, every link up and
    on its NVSwitch as the fake NVML has it. The PCI tree is written to a temporary
    directory and read back by the agent's own collector, so the result is the same as a
    simulated agent's (the simulated fleet sends it for every node).
    """
    links = [
        GpuLinks(index, uuid, canonical_bus_id(bus_id) or bus_id, tuple(
            NvLinkRemote(link, True, "switch",
                         canonical_bus_id(nvswitch_bus_id(nvswitch_of_link(link, count))))
            for link in range(count)))
        for index, (uuid, bus_id, count) in enumerate(gpus)
    ]
    with tempfile.TemporaryDirectory(prefix="sn-topology-") as root:
        sysfs = Path(root) / "sys"
        layout = node_layout([bus_id for _, bus_id, _ in gpus], seed=seed)
        write_pci_tree(sysfs, layout)
        for nic in layout.nics:
            port = sysfs / "class" / "infiniband" / nic.device / "ports" / "1"
            _put(port / "rate", f"{nic.rate_text}\n")
            _put(port / "link_layer", "Ethernet\n" if nic.ethernet else "InfiniBand\n")
        return collect_topology(links, sysfs)
