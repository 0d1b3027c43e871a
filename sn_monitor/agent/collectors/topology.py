"""The node's topology: GPUs' NVLink peers, NICs' ports, and how close each GPU is to each NIC.

Read about once a minute (NIC rates, port states and NVLinks may change), off the sampling
cycle, by :class:`~sn_monitor.agent.topology_loop.TopologyLoop`. The NVLink half comes from
the NVML adapter (:meth:`~sn_monitor.agent.nvml.NvmlLibrary.nvlink_topology`); the rest
from /sys:

* a GPU's NUMA node: ``bus/pci/devices/<bdf>/numa_node``;
* each RDMA NIC under ``class/infiniband/<device>``: its ``device`` link (PCI address and
  place in the PCIe tree), ``device/numa_node``, the netdev in ``device/net/``, and per
  port ``link_layer``, ``rate`` and the GUID (the low 64 bits of ``gids/0``, else
  ``node_guid``);
* GPU <-> NIC affinity from where the two sit under ``/sys/devices``
  (:func:`pci_affinity`), as ``nvidia-smi topo -m`` says it.

A NIC close to a GPU (PIX or PXB) serves a rail; rails are numbered in the natural order of
the NICs' names (``mlx5_2`` before ``mlx5_10``). A NIC no
GPU is close to is a storage NIC; one whose distance to the GPUs is unknown (no ``device``
link) or on a node without GPUs is ``other``. A missing file leaves that value out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sn_monitor.agent.collectors.infiniband import parse_rate
from sn_monitor.agent.collectors.sysfs import read_attribute
from sn_monitor.agent.pci import canonical_bus_id
from sn_monitor.agent.snapshot import GpuLinks
from sn_monitor.model import (
    MAX_GPUS,
    MAX_NICS,
    MAX_NVLINK_PEERS,
    GpuAffinity,
    GpuTopology,
    NicPortTopology,
    NicRole,
    NicTopology,
    NodeTopology,
    NvLinkPeer,
    NvLinkPeerKind,
)
from sn_monitor.natural import natural_key

_ROOT_COMPLEX = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_PEER_KINDS: frozenset[str] = frozenset({"gpu", "switch", "cpu", "unknown"})
_MAX_PORTS_PER_NIC = 16


@dataclass(frozen=True, slots=True)
class PciLocation:
    """A PCI device's directory under /sys/devices, as path components, and its NUMA node.

    ``path[0]`` is the root complex (``pci0000:15``), then the bridges, then the device.
    """

    path: tuple[str, ...]
    numa_node: int | None = None


def pci_affinity(gpu: PciLocation, nic: PciLocation) -> GpuAffinity | None:
    """How close two PCI devices are, as ``nvidia-smi topo -m`` names it.

    Under one PCIe switch, each at most one bridge below it (PIX); under one tree of
    switches below a root port (PXB); under the same root complex only (PHB); under
    different root complexes of one NUMA node (NODE) or of two (SYS). None when the NUMA
    nodes needed to tell NODE from SYS are unknown.
    """
    common = 0
    for a, b in zip(gpu.path, nic.path, strict=False):
        if a != b:
            break
        common += 1
    if common == 0:
        if gpu.numa_node is None or nic.numa_node is None:
            return None
        return "NODE" if gpu.numa_node == nic.numa_node else "SYS"
    if common == 1:
        return "PHB"
    # Bridges below the common one on each side (the device itself not counted).
    below = max(len(gpu.path) - common - 1, len(nic.path) - common - 1)
    return "PIX" if below <= 1 and common > 2 else "PXB"


def parse_port_guid(gid: str | None, node_guid: str | None) -> str:
    """``fe80:0000:0000:0000:a088:c203:0042:1a3c`` -> ``a088:c203:0042:1a3c`` (the port GUID).

    Falls back on ``node_guid`` (already in that form); "" when neither is usable.
    """
    if gid:
        groups = gid.strip().lower().split(":")
        if len(groups) == 8 and all(re.fullmatch(r"[0-9a-f]{1,4}", g) for g in groups):
            return ":".join(g.zfill(4) for g in groups[4:])
    if node_guid:
        text = node_guid.strip().lower()
        if re.fullmatch(r"[0-9a-f]{4}(:[0-9a-f]{4}){3}", text):
            return text
    return ""


def nvlink_peers(gpu: GpuLinks, gpu_by_bus: dict[str, int]) -> list[NvLinkPeer]:
    """The GPU's links that are up, grouped by the device at their far end.

    A remote GPU is named by its index on this node (``gpu_by_bus``); links whose far end
    NVML does not tell are one ``unknown`` peer.
    """
    counts: dict[tuple[str, str], int] = {}
    for link in gpu.links:
        if link.up is not True:
            continue
        kind = link.remote_kind if link.remote_kind in _PEER_KINDS else "unknown"
        key = (kind or "unknown", link.remote_pci_bus_id or "")
        counts[key] = counts.get(key, 0) + 1
    peers: list[NvLinkPeer] = []
    for (kind, bus_id), links in sorted(counts.items(), key=lambda item: item[0][::-1]):
        peer_kind: NvLinkPeerKind = _peer_kind(kind)
        peers.append(NvLinkPeer(
            kind=peer_kind, links=links, pci_bus_id=bus_id,
            gpu=gpu_by_bus.get(bus_id) if peer_kind == "gpu" else None,
        ))
    return peers[:MAX_NVLINK_PEERS]


def _peer_kind(kind: str) -> NvLinkPeerKind:
    if kind == "gpu":
        return "gpu"
    if kind == "switch":
        return "switch"
    if kind == "cpu":
        return "cpu"
    return "unknown"


# ------------------------------------------------------------------ reading /sys


@dataclass(frozen=True, slots=True)
class _Nic:
    device: str
    location: PciLocation | None
    netdev: str
    ports: tuple[NicPortTopology, ...]


def pci_location(sysfs: Path, link: Path) -> PciLocation | None:
    """Where the device ``link`` points at sits under ``<sysfs>/devices``; None if elsewhere."""
    try:
        target = Path(os.path.realpath(link, strict=True))
    except OSError:
        return None
    try:
        relative = target.relative_to(os.path.realpath(sysfs / "devices"))
    except ValueError:
        return None
    parts = relative.parts
    if len(parts) < 2 or not _ROOT_COMPLEX.match(parts[0]):
        return None
    return PciLocation(parts, _numa_node(target / "numa_node"))


def _numa_node(path: Path) -> int | None:
    text = read_attribute(str(path))
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _read_nic(sysfs: Path, device: str) -> _Nic:
    base = sysfs / "class" / "infiniband" / device
    location = pci_location(sysfs, base / "device")
    netdevs = sorted(_listing(base / "device" / "net")) if location is not None else []
    node_guid = read_attribute(str(base / "node_guid"))
    ports: list[NicPortTopology] = []
    for name in sorted(_listing(base / "ports"), key=natural_key):
        if not name.isdigit():
            continue
        port_dir = base / "ports" / name
        rate_text = read_attribute(str(port_dir / "rate"))
        try:
            rate = None if rate_text is None else parse_rate(rate_text)
        except ValueError:
            rate = None
        ports.append(NicPortTopology(
            port=min(int(name), 255),
            guid=parse_port_guid(read_attribute(str(port_dir / "gids" / "0")), node_guid),
            link_layer=(read_attribute(str(port_dir / "link_layer")) or "")[:32],
            rate_bytes_per_second=rate,
        ))
    return _Nic(device, location, netdevs[0][:64] if netdevs else "",
                tuple(ports[:_MAX_PORTS_PER_NIC]))


def _listing(path: Path) -> list[str]:
    try:
        return [entry.name for entry in os.scandir(path) if not entry.name.startswith(".")]
    except OSError:
        return []


def collect_topology(gpus: Sequence[GpuLinks], sysfs: Path) -> NodeTopology:
    """The node's topology from its GPUs' NVLinks (NVML) and its /sys."""
    sysfs = Path(sysfs)
    devices = sorted(_listing(sysfs / "class" / "infiniband"), key=natural_key)[:MAX_NICS]
    nics = [_read_nic(sysfs, device) for device in devices]
    gpu_places = [_gpu_place(sysfs, gpu) for gpu in gpus]
    affinities = [_nics_near(place, nics) for place in gpu_places]
    roles = _roles(nics, affinities)
    gpu_topologies, switches = _gpu_topologies(gpus, gpu_places, affinities)
    nic_topologies = [_nic_topology(nic, *roles[nic.device]) for nic in nics]
    return NodeTopology(gpus=gpu_topologies[:MAX_GPUS], nics=nic_topologies,
                        nvswitches=min(64, len(switches)))


def _gpu_place(sysfs: Path, gpu: GpuLinks) -> PciLocation | None:
    """Where the GPU sits in the PCI tree (None: no usable bus id)."""
    bus_id = canonical_bus_id(gpu.pci_bus_id) if gpu.pci_bus_id else None
    if bus_id is None:
        return None
    return pci_location(sysfs, sysfs / "bus" / "pci" / "devices" / bus_id)


def _nics_near(place: PciLocation | None, nics: Sequence[_Nic]) -> dict[str, GpuAffinity]:
    """The GPU's PCI affinity to each NIC whose place and the GPU's are known."""
    near: dict[str, GpuAffinity] = {}
    for nic in nics:
        if place is not None and nic.location is not None:
            affinity = pci_affinity(place, nic.location)
            if affinity is not None:
                near[nic.device] = affinity
    return near


def _gpu_topologies(
    gpus: Sequence[GpuLinks],
    places: Sequence[PciLocation | None],
    affinities: Sequence[dict[str, GpuAffinity]],
) -> tuple[list[GpuTopology], set[str]]:
    """Each GPU's topology, and the NVSwitches (by bus id) its NVLinks reach."""
    gpu_by_bus = {canonical_bus_id(g.pci_bus_id) or g.pci_bus_id: g.index for g in gpus}
    topologies: list[GpuTopology] = []
    switches: set[str] = set()
    for gpu, place, near in zip(gpus, places, affinities, strict=True):
        peers = nvlink_peers(gpu, gpu_by_bus)
        switches.update(p.pci_bus_id for p in peers if p.kind == "switch" and p.pci_bus_id)
        topologies.append(GpuTopology(
            index=gpu.index,
            uuid=gpu.uuid[:96],
            pci_bus_id=(canonical_bus_id(gpu.pci_bus_id) or gpu.pci_bus_id)[:32],
            numa_node=_numa_bound(place.numa_node if place is not None else None),
            nvlinks=min(64, sum(1 for link in gpu.links if link.up is True)),
            peers=peers,
            nics=near,
        ))
    return topologies, switches


def _nic_topology(nic: _Nic, role: NicRole, rail: int | None) -> NicTopology:
    return NicTopology(
        device=nic.device[:64],
        pci_bus_id=nic.location.path[-1][:32] if nic.location is not None else "",
        numa_node=_numa_bound(nic.location.numa_node) if nic.location is not None else None,
        netdev=nic.netdev,
        role=role,
        rail=rail,
        ports=list(nic.ports),
    )


def _numa_bound(node: int | None) -> int | None:
    """The kernel's -1 (no NUMA) stays; anything out of the wire's range is unknown."""
    return node if node is not None and -1 <= node <= 1024 else None


def _roles(
    nics: Sequence[_Nic], affinities: Sequence[dict[str, GpuAffinity]]
) -> dict[str, tuple[NicRole, int | None]]:
    """Each NIC's role and rail (see the module docstring)."""
    near = sorted(
        (nic.device for nic in nics
         if any(a.get(nic.device) in ("PIX", "PXB") for a in affinities)),
        key=natural_key,
    )
    roles: dict[str, tuple[NicRole, int | None]] = {
        device: ("rail", rail) for rail, device in enumerate(near[:256])}
    for nic in nics:
        if nic.device in roles:
            continue
        known = any(nic.device in a for a in affinities)
        roles[nic.device] = ("storage", None) if known else ("other", None)
    return roles
