"""A simulated node's /proc and /sys: files shaped like a real 8x H100 node's.

The agent's net, infiniband and host collectors read it exactly as they read the real
tree (point ``procfs`` at :attr:`SimulatedNodeTree.procfs` and ``sysfs`` at
:attr:`SimulatedNodeTree.sysfs`). :meth:`SimulatedNodeTree.advance` moves the counters
as traffic would; the fault hooks take ports down, flap them and add errors.

Processes: ``/proc/<pid>/stat`` and ``cgroup`` of a few system processes (systemd,
sshd, the agent), and of processes a fault leaves stuck in ``D`` state
(:meth:`SimulatedNodeTree.add_stuck_process`), which never use CPU time again.

The files are written as :mod:`sn_monitor.sim.tree_files` says (in place in /sys,
atomically in /proc, only when changed); the host's CPU, load and memory counters are
:mod:`sn_monitor.sim.host_model`'s.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sn_monitor.sim.hgx import (
    RAIL_NICS,
    STORAGE_NICS,
    NodeLayout,
    is_ethernet_nic,
    node_layout,
    write_pci_tree,
)
from sn_monitor.sim.host_model import SimulatedHost
from sn_monitor.sim.tree_files import TreeFiles

# Counter file names as the mlx5 driver creates them, copied from the real tree in
# tests/fixtures/h100-node/sys/class/infiniband/mlx5_0/ports/1/.
IB_COUNTER_FILES = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
)
IB_HW_COUNTER_FILES = (
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rx_atomic_requests",
    "rx_dct_connect",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
)
# RoCE congestion control counters, present on Ethernet (RoCE) ports.
ROCE_HW_COUNTER_FILES = (
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "rp_cnp_handled",
    "rp_cnp_ignored",
)

_HW_COUNTERS = frozenset(IB_HW_COUNTER_FILES + ROCE_HW_COUNTER_FILES)

DEFAULT_NETDEVS = ("lo", "eno1", "ens1f0np0", "ens1f1np1")
#: The rail NICs (InfiniBand, 400 Gb/s), one beside each GPU.
DEFAULT_IB_DEVICES = RAIL_NICS
#: The storage NICs (Ethernet / RoCE, 200 Gb/s), near no GPU.
STORAGE_IB_DEVICES = STORAGE_NICS

_STATE_ACTIVE = "4: ACTIVE"
_STATE_DOWN = "1: DOWN"
_PHYS_LINK_UP = "5: LinkUp"
_PHYS_POLLING = "2: Polling"
_IB_MTU_BYTES = 4096
# (pid, name, state, cgroup path) of the processes every simulated node runs.
_BASE_PROCESSES = (
    (1, "systemd", "S", "/init.scope"),
    (1234, "sshd", "S", "/system.slice/ssh.service"),
    (2345, "sn-monitor", "S", "/system.slice/sn-monitor-agent.service"),
)
_FIRST_STUCK_PID = 50_000
_NETDEV_WIDTHS = (8, 7, 4, 4, 4, 5, 10, 9, 8, 7, 4, 4, 4, 5, 7, 10)
_NETDEV_HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast"
    "|bytes    packets errs drop fifo colls carrier compressed\n"
)


def congestion_share(factor: float) -> float:
    """The share of its data a port congested ``factor`` times (its wait) still moves."""
    return max(0.5, 1.0 - 0.005 * factor)


@dataclass
class PortFailSlow:
    """What a fail-slow fault holds on a port (at rest: a healthy port).

    ``wait_factor`` multiplies ``port_xmit_wait`` (and ECN marks / CNPs on RoCE ports by
    ten times as much); ``throughput_share`` scales the data moved; ``rate_gbps`` is the
    link's trained rate when below its maximum (None: the maximum).
    """

    wait_factor: float = 1.0
    throughput_share: float = 1.0
    rate_gbps: float | None = None


@dataclass
class _IbPort:
    device: str
    ethernet: bool
    counters: dict[str, int]
    up: bool = True
    dirty: set[str] = field(default_factory=set)
    fail_slow: PortFailSlow = field(default_factory=lambda: PortFailSlow())

    def bump(self, name: str, delta: int) -> None:
        if delta > 0:
            self.counters[name] += delta
            self.dirty.add(name)


@dataclass
class _NetDev:
    name: str
    speed_mbit: int | None
    mtu: int
    share: float  # fraction of line rate used at full load
    idle_bytes_per_second: float
    operstate_up: str
    carrier_up: bool = True
    carrier_changes: int = 0
    counters: list[int] = field(default_factory=lambda: [0] * 16)


class SimulatedNodeTree:
    """Writes and advances ``<root>/proc`` and ``<root>/sys`` of one simulated node.

    ``netdevs`` and ``ib_devices`` name the interfaces and RDMA devices (defaults: four
    interfaces; the rail NICs ``mlx5_0``..``mlx5_7`` at 400 Gb/s NDR and the storage NICs
    ``mlx5_8``, ``mlx5_9``; a storage NIC or a device with ``bond`` in its name is a
    200 Gb/s RoCE port). ``gpu_bus_ids`` (NVML's spelling, NVML index order; default the
    eight of an HGX baseboard, as the fake NVML's GPUs have them) place the GPUs in the
    PCIe tree (:mod:`sn_monitor.sim.hgx`), which the topology collector reads. ``seed``
    makes the starting values, the GUIDs and the jitter of :meth:`advance` reproducible.
    Safe to call from several threads.
    """

    def __init__(
        self,
        root: Path,
        netdevs: Sequence[str] | None = None,
        ib_devices: Sequence[str] | None = None,
        seed: int = 0,
        cpus: int = 224,
        gpu_bus_ids: Sequence[str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.procfs = self.root / "proc"
        self.sysfs = self.root / "sys"
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._files = TreeFiles(self.root, self.sysfs)
        self.host = SimulatedHost(self._rng, cpus)
        if netdevs is None:
            netdevs = DEFAULT_NETDEVS
        if ib_devices is None:
            ib_devices = DEFAULT_IB_DEVICES + STORAGE_IB_DEVICES
        #: Where the node's GPUs and NICs sit on PCIe (written under ``sysfs``).
        self.layout: NodeLayout = node_layout(gpu_bus_ids, ib_devices, seed)
        self._netdevs = {name: self._new_netdev(name) for name in netdevs}
        self._ports = {device: self._new_port(device) for device in ib_devices}
        self._stuck: list[int] = []
        with self._lock:
            write_pci_tree(self.sysfs, self.layout)
            for pid, name, state, cgroup in _BASE_PROCESSES:
                self._write_process(pid, name, state, cgroup)
            self._write_static()
            for port in self._ports.values():
                port.dirty.update(port.counters)
                self._write_port(port)
            self._write_dynamic()

    # ----- public API -----

    @property
    def ib_devices(self) -> tuple[str, ...]:
        return tuple(self._ports)

    @property
    def netdevs(self) -> tuple[str, ...]:
        return tuple(self._netdevs)

    def ib_counter(self, device: str, name: str) -> int:
        """The current value of a counter file (``counters/`` or ``hw_counters/`` name)."""
        with self._lock:
            return self._port(device).counters[name]

    def advance(self, dt_seconds: float, load: float) -> None:
        """Move every counter forward by ``dt_seconds`` of traffic at ``load`` (0..1).

        IB data counters advance in 4-byte words, as the hardware counts them. A port or
        interface that is down moves nothing.
        """
        if dt_seconds < 0:
            raise ValueError("time does not go backwards")
        load = min(max(load, 0.0), 1.0)
        with self._lock:
            for port in self._ports.values():
                self._advance_port(port, dt_seconds, load)
                self._write_port(port)
            for dev in self._netdevs.values():
                self._advance_netdev(dev, dt_seconds, load)
            self.host.advance(dt_seconds, load)
            self._write_dynamic()

    @property
    def stuck_processes(self) -> tuple[int, ...]:
        """The pids :meth:`add_stuck_process` left in D state."""
        with self._lock:
            return tuple(self._stuck)

    def add_stuck_process(self, name: str = "python", count: int = 1) -> None:
        """``count`` new processes in D state that never run again (a hung NFS read).

        Their pids are in :attr:`stuck_processes`.
        """
        if count < 1:
            raise ValueError("count must be >= 1")
        if not name or any(c in name for c in "\n\0/") or len(name) > 15:
            raise ValueError(f"not a process name (comm, at most 15 characters): {name!r}")
        with self._lock:
            first = _FIRST_STUCK_PID + len(self._stuck)
            pids = tuple(range(first, first + count))
            for pid in pids:
                self._write_process(pid, name, "D", "/system.slice/stuck.service")
            self._stuck.extend(pids)

    def add_gpu_process(self, pid: int, argv: Sequence[str], *, uid: int = 0,
                        cgroup: str = "/system.slice/training.service") -> None:
        """A GPU process's /proc files: ``stat``, ``cgroup``, ``cmdline``, ``status``.

        ``uid`` is its real uid (in ``status``). The fake NVML lists it once a GPU is
        given it (:meth:`~sn_monitor.sim.gpu_model.SimulatedGpu.set_processes`).
        """
        if pid <= 0 or not argv:
            raise ValueError("a GPU process needs a pid > 0 and an argv")
        name = argv[0].rsplit("/", 1)[-1][:15]
        with self._lock:
            self._write_process(pid, name, "S", cgroup)
            self._files.write(self.procfs / str(pid) / "cmdline", "".join(f"{a}\0" for a in argv))
            self._files.write(self.procfs / str(pid) / "status",
                              f"Name:\t{name}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")

    def clear_stuck_processes(self) -> None:
        """The stuck processes are gone (the mount came back, or the node rebooted)."""
        with self._lock:
            for pid in self._stuck:
                self._files.remove(self.procfs / str(pid) / "stat")
                self._files.remove(self.procfs / str(pid) / "cgroup")
                (self.procfs / str(pid)).rmdir()
            self._stuck.clear()

    def set_ib_port_down(self, device: str) -> None:
        """The link of ``device`` port 1 goes down (``link_downed`` counts it)."""
        with self._lock:
            port = self._port(device)
            if port.up:
                port.up = False
                port.bump("link_downed", 1)
            self._write_port(port)

    def set_ib_port_up(self, device: str) -> None:
        """The link of ``device`` port 1 trains up again."""
        with self._lock:
            port = self._port(device)
            port.up = True
            self._write_port(port)

    def flap_ib_port(self, device: str) -> None:
        """The link goes down and up again within one sample interval.

        ``link_downed`` goes up by one; the state files pass through DOWN and read ACTIVE
        again when this returns, so only the counter shows what happened.
        """
        with self._lock:
            port = self._port(device)
            port.up = False
            port.bump("link_downed", 1)
            self._write_port(port)
            port.up = True
            self._write_port(port)

    def add_ib_symbol_errors(self, device: str, n: int) -> None:
        """``n`` more physical-layer symbol errors on ``device`` port 1."""
        if n < 0:
            raise ValueError("a counter does not go backwards")
        with self._lock:
            port = self._port(device)
            port.bump("symbol_error", n)
            self._write_port(port)

    def congest_ib_port(self, device: str, factor: float) -> None:
        """``device`` port 1 congested: it waits ``factor`` times as long to send.

        ``port_xmit_wait`` climbs that much faster (RoCE: ECN marks and CNPs too) and the
        port moves less.
        """
        if factor < 1.0:
            raise ValueError(f"a congestion factor is at least 1, got {factor}")
        with self._lock:
            port = self._port(device)
            port.fail_slow.wait_factor = factor
            port.fail_slow.throughput_share = congestion_share(factor)

    def degrade_ib_port(self, device: str, rate_gbps: float) -> None:
        """``device`` port 1 trains again at ``rate_gbps`` (fewer lanes, a lower speed).

        The ``rate`` file says so, the data moved is capped by it, the port waits more.
        """
        with self._lock:
            port = self._port(device)
            if not 0 < rate_gbps < _port_gbps(port):
                raise ValueError(f"a degraded rate is below {_port_gbps(port):g} Gb/s")
            port.fail_slow.rate_gbps = rate_gbps
            port.fail_slow.wait_factor = 4.0
            self._files.write(self._port_dir(port) / "rate", _rate_text(port))

    def clear_ib_port_fail_slow(self, device: str) -> None:
        """``device`` port 1 back at its full rate, uncongested."""
        with self._lock:
            port = self._port(device)
            port.fail_slow = PortFailSlow()
            self._files.write(self._port_dir(port) / "rate", _rate_text(port))

    def flap_carrier(self, netdev: str) -> None:
        """The interface loses carrier and gets it back: ``carrier_changes`` += 2."""
        with self._lock:
            dev = self._netdev(netdev)
            dev.carrier_changes += 2
            self._write_netdev(dev)

    def set_carrier(self, netdev: str, up: bool) -> None:
        """The interface loses (or regains) carrier and stays so."""
        with self._lock:
            dev = self._netdev(netdev)
            if dev.carrier_up != up:
                dev.carrier_up = up
                dev.carrier_changes += 1
            self._write_netdev(dev)

    # ----- construction -----

    def _new_port(self, device: str) -> _IbPort:
        ethernet = is_ethernet_nic(device)
        names: tuple[str, ...] = IB_COUNTER_FILES + IB_HW_COUNTER_FILES
        if ethernet:
            names += ROCE_HW_COUNTER_FILES
        counters = dict.fromkeys(names, 0)
        # A node that has been up a while: tens to hundreds of TiB moved.
        rcv_words = self._rng.randrange(10**13, 3 * 10**14)
        xmit_words = int(rcv_words * self._rng.uniform(0.97, 1.03))
        counters["port_rcv_data"] = rcv_words
        counters["port_xmit_data"] = xmit_words
        for direction, words in (("rcv", rcv_words), ("xmit", xmit_words)):
            packets = words * 4 // _IB_MTU_BYTES
            counters[f"port_{direction}_packets"] = packets
            counters[f"unicast_{direction}_packets"] = packets
        counters["port_xmit_wait"] = self._rng.randrange(10**9, 5 * 10**9)
        counters["rx_write_requests"] = rcv_words * 4 // 65536
        counters["rx_read_requests"] = rcv_words * 4 // (65536 * 400)
        counters["rx_dct_connect"] = self._rng.randrange(10**5, 10**6)
        counters["lifespan"] = 12
        return _IbPort(device=device, ethernet=ethernet, counters=counters)

    def _new_netdev(self, name: str) -> _NetDev:
        if name == "lo":
            dev = _NetDev(name, None, 65536, 0.0, 20_000.0, "unknown")
        elif name.startswith("eno"):
            dev = _NetDev(name, 1000, 1500, 0.05, 5_000.0, "up")
        else:
            dev = _NetDev(name, 200_000, 9000, 0.2, 50_000.0, "up")
        dev.carrier_changes = 2 if dev.speed_mbit is not None else 0
        start = self._rng.randrange(10**9, 10**12)
        dev.counters[0] = start
        dev.counters[1] = start // max(dev.mtu, 1500)
        dev.counters[8] = int(start * self._rng.uniform(0.9, 1.1))
        dev.counters[9] = dev.counters[8] // max(dev.mtu, 1500)
        return dev

    def _port(self, device: str) -> _IbPort:
        try:
            return self._ports[device]
        except KeyError:
            raise KeyError(f"no simulated InfiniBand device {device!r}") from None

    def _netdev(self, name: str) -> _NetDev:
        try:
            return self._netdevs[name]
        except KeyError:
            raise KeyError(f"no simulated network interface {name!r}") from None

    # ----- advancing -----

    def _jitter(self) -> float:
        return self._rng.uniform(0.9, 1.1)

    def _advance_port(self, port: _IbPort, dt: float, load: float) -> None:
        if not port.up:
            return
        slow = port.fail_slow
        rate = (slow.rate_gbps or _port_gbps(port)) * 1e9 / 8
        utilization = (0.001 + 0.85 * load) * slow.throughput_share
        for direction in ("rcv", "xmit"):
            nbytes = rate * utilization * dt * self._jitter()
            port.bump(f"port_{direction}_data", int(nbytes / 4))
            packets = int(nbytes / _IB_MTU_BYTES)
            port.bump(f"port_{direction}_packets", packets)
            port.bump(f"unicast_{direction}_packets", packets)
            if direction == "rcv":
                port.bump("rx_write_requests", int(nbytes / 65536))
                port.bump("rx_read_requests", int(nbytes / (65536 * 400)))
        # Congestion grows faster than load: the send queue waits, RoCE marks ECN.
        congestion = load * load * dt * self._jitter() * slow.wait_factor
        port.bump("port_xmit_wait", int(congestion * 2e6))
        if port.ethernet:
            marked = int(congestion * 5e3 * (1.0 + 10.0 * (slow.wait_factor - 1.0)))
            port.bump("np_ecn_marked_roce_packets", marked)
            port.bump("np_cnp_sent", marked)
            port.bump("rp_cnp_handled", marked)

    def _advance_netdev(self, dev: _NetDev, dt: float, load: float) -> None:
        if not dev.carrier_up:
            return
        line_rate = dev.speed_mbit * 125_000 if dev.speed_mbit else 0
        packet = dev.mtu if dev.mtu < 65536 else 16384
        for offset in (0, 8):
            nbytes = int((dev.idle_bytes_per_second + line_rate * dev.share * load) * dt)
            nbytes = int(nbytes * self._jitter())
            dev.counters[offset] += nbytes
            dev.counters[offset + 1] += -(-nbytes // packet)  # at least one per burst

    # ----- writing -----

    def _write_process(self, pid: int, name: str, state: str, cgroup: str) -> None:
        """``/proc/<pid>/stat`` as the kernel writes it (52 fields), and ``cgroup``."""
        # ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
        # cutime cstime priority nice threads itrealvalue starttime ...
        fields = [1, pid, pid, 0, -1, 4194560, 1000, 0, 10, 0, 100 + pid % 97, 20, 0, 0,
                  20, 0, 1, 0, 2500 + pid, 10**8, 4000]
        rest = " ".join(map(str, fields)) + " 18446744073709551615" + " 0" * 30
        self._files.write(self.procfs / str(pid) / "stat", f"{pid} ({name}) {state} {rest}\n")
        self._files.write(self.procfs / str(pid) / "cgroup", f"0::{cgroup}\n")

    def _write_static(self) -> None:
        for port in self._ports.values():
            dev_dir = self.sysfs / "class" / "infiniband" / port.device
            hca, fw = ("MT41692", "32.38.3056") if port.ethernet else ("MT4129", "28.41.1000")
            self._files.write(dev_dir / "hca_type", f"{hca}\n")
            self._files.write(dev_dir / "fw_ver", f"{fw}\n")
            self._files.write(dev_dir / "board_id", "MT_0000000838\n")
            port_dir = dev_dir / "ports" / "1"
            self._files.write(port_dir / "rate", _rate_text(port))
            layer = "Ethernet" if port.ethernet else "InfiniBand"
            self._files.write(port_dir / "link_layer", f"{layer}\n")
        for dev in self._netdevs.values():
            self._write_netdev(dev)
            self._files.write(self.sysfs / "class" / "net" / dev.name / "mtu", f"{dev.mtu}\n")

    def _port_dir(self, port: _IbPort) -> Path:
        return self.sysfs / "class" / "infiniband" / port.device / "ports" / "1"

    def _write_port(self, port: _IbPort) -> None:
        port_dir = self.sysfs / "class" / "infiniband" / port.device / "ports" / "1"
        files = self._files
        files.write(port_dir / "state", f"{_STATE_ACTIVE if port.up else _STATE_DOWN}\n")
        files.write(port_dir / "phys_state", f"{_PHYS_LINK_UP if port.up else _PHYS_POLLING}\n")
        for name in port.dirty:
            sub = "hw_counters" if name in _HW_COUNTERS else "counters"
            self._files.write(port_dir / sub / name, f"{port.counters[name]}\n")
        port.dirty.clear()

    def _write_netdev(self, dev: _NetDev) -> None:
        base = self.sysfs / "class" / "net" / dev.name
        self._files.write(base / "carrier", f"{1 if dev.carrier_up else 0}\n")
        self._files.write(base / "carrier_changes", f"{dev.carrier_changes}\n")
        operstate = dev.operstate_up if dev.carrier_up else "down"
        self._files.write(base / "operstate", f"{operstate}\n")
        if dev.speed_mbit is None:
            self._files.remove(base / "speed")  # virtual: reading speed fails with EINVAL
        else:
            self._files.write(base / "speed", f"{dev.speed_mbit if dev.carrier_up else -1}\n")

    def _write_dynamic(self) -> None:
        self._files.write(self.procfs / "net" / "dev", _netdev_text(self._netdevs.values()))
        self._files.write(self.procfs / "stat", self.host.stat_text())
        self._files.write(self.procfs / "meminfo", self.host.meminfo_text())
        self._files.write(self.procfs / "loadavg", self.host.loadavg_text())
        mon_data = self.sysfs / "fs" / "resctrl" / "mon_data"
        for domain, value in self.host.mbm_bytes.items():
            self._files.write(mon_data / f"mon_{domain}" / "mbm_total_bytes", f"{value}\n")


def _port_gbps(port: _IbPort) -> float:
    """The port's full rate: 200 Gb/s RoCE, 400 Gb/s NDR InfiniBand."""
    return 200.0 if port.ethernet else 400.0


def _rate_text(port: _IbPort) -> str:
    """The ``rate`` file: ``400 Gb/sec (4X NDR)``; lanes of 100 Gb/s (NDR) each."""
    gbps = port.fail_slow.rate_gbps or _port_gbps(port)
    return f"{gbps:g} Gb/sec ({max(1, round(gbps / 100))}X NDR)\n"


def _netdev_text(devs: Iterable[_NetDev]) -> str:
    """The kernel's ``"%6s:%8llu %7llu ..."``: wide counters run into the colon."""
    rows = [
        f"{dev.name:>6}:"
        + " ".join(f"{v:{w}d}" for v, w in zip(dev.counters, _NETDEV_WIDTHS, strict=True))
        for dev in devs
    ]
    return _NETDEV_HEADER + "\n".join(rows) + "\n"
