"""InfiniBand / RoCE ports from /sys/class/infiniband/<device>/ports/<port>/.

The pure parts (:func:`counter_stem`, :func:`parse_port_state`, :func:`parse_rate`)
turn kernel file names and contents into our metric stems and units;
:class:`InfinibandCollector` reads the files, keeping them open between cycles.
``port_rcv_data`` and ``port_xmit_data`` count 4-byte words (the IB spec's PortRcvData /
PortXmitData "octets divided by 4"): they are multiplied by 4 here, so every ``*_bytes``
stem is in bytes.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import resource
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final, TypeVar

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.collectors.sysfs import read_attribute, read_raw
from sn_monitor.agent.snapshot import Collected, IbPortSample
from sn_monitor.natural import natural_key

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# Kernel counter file (ports/N/counters/) -> our stem. The exporter emits
# sn_infiniband_port_<stem>_total.
COUNTER_STEMS: Mapping[str, str] = {
    "port_rcv_data": "received_bytes",
    "port_xmit_data": "transmitted_bytes",
    "port_rcv_packets": "received_packets",
    "port_xmit_packets": "transmitted_packets",
    "unicast_rcv_packets": "unicast_received_packets",
    "unicast_xmit_packets": "unicast_transmitted_packets",
    "multicast_rcv_packets": "multicast_received_packets",
    "multicast_xmit_packets": "multicast_transmitted_packets",
    "symbol_error": "symbol_errors",
    "link_downed": "link_downed",
    "link_error_recovery": "link_error_recovery",
    "port_rcv_errors": "receive_errors",
    "port_xmit_discards": "transmit_discards",
    "port_rcv_remote_physical_errors": "receive_remote_physical_errors",
    "port_rcv_switch_relay_errors": "receive_switch_relay_errors",
    "local_link_integrity_errors": "local_link_integrity_errors",
    "excessive_buffer_overrun_errors": "excessive_buffer_overrun_errors",
    "VL15_dropped": "vl15_dropped",
    "port_xmit_wait": "transmit_wait",
    "port_rcv_constraint_errors": "receive_constraint_errors",
    "port_xmit_constraint_errors": "transmit_constraint_errors",
}

# Counters that count 4-byte words, not bytes.
_WORD_COUNTERS = frozenset({"port_rcv_data", "port_xmit_data"})

# Files under hw_counters/ that are not counters: ``lifespan`` is how long (ms) the
# driver caches counter values, a setting that must not become a ``_total`` series.
NOT_COUNTERS = frozenset({"lifespan"})

_UNSAFE = re.compile(r"[^a-z0-9_]+")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([GM])b/sec\b")


def counter_stem(file_name: str) -> str | None:
    """The metric stem for a counter file: mapped if known, else its sanitized name.

    A stem is lower case ``[a-z0-9_]`` without a trailing ``_total`` (the exporter adds
    it). None when nothing usable is left of the name.
    """
    stem = COUNTER_STEMS.get(file_name)
    if stem is not None:
        return stem
    stem = _UNSAFE.sub("_", file_name.lower()).strip("_")
    stem = stem.removesuffix("_total")
    return stem or None


def parse_port_state(text: str) -> int:
    """``"4: ACTIVE"`` -> 4 (also for ``phys_state``: ``"5: LinkUp"`` -> 5).

    Raises ValueError when the text does not start with a number.
    """
    number, _, _ = text.partition(":")
    return int(number.strip())


def parse_rate(text: str) -> float:
    """``"400 Gb/sec (4X NDR)"`` -> 5e10 bytes per second.

    Raises ValueError when the text is not a rate.
    """
    match = _RATE.match(text)
    if match is None:
        raise ValueError(f"not an InfiniBand rate: {text!r}")
    scale = 1e9 if match.group(2) == "G" else 1e6
    return float(match.group(1)) * scale / 8


def _listing(path: str) -> list[str]:
    """The visible names in a directory; none when it cannot be listed."""
    try:
        return [e.name for e in os.scandir(path) if not e.name.startswith(".")]
    except OSError as exc:
        log.debug("cannot list %s: %s", path, exc)
        return []


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


#: Open counter files the collector keeps at most (the rest are opened at each read):
#: a node with many RoCE ports must not run the agent out of file descriptors. Never
#: more than a quarter of the process's limit (1024 is systemd's default soft limit).
MAX_OPEN_FILES: Final = 1024


def open_file_budget() -> int:
    """:data:`MAX_OPEN_FILES`, or a quarter of ``RLIMIT_NOFILE``'s soft limit if less."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_FILES
    return max(0, min(MAX_OPEN_FILES, soft // 4))


#: A kept file that fails with one of these belongs to a device that went away.
_GONE: Final = frozenset({errno.ENODEV, errno.ENXIO, errno.ESTALE, errno.ENOENT})
#: Cycles between two re-reads of every port's layout (a counter file that appeared).
RELIST_EVERY: Final = 300


class _File:
    """One sysfs attribute, kept open and re-read with ``pread`` at offset 0.

    A sysfs attribute is generated afresh on every read from offset 0 (seq_file), so an
    open file descriptor gives the current value without an ``open``/``close`` a cycle
    (most of the collector's cost when each port has ~50 files). Past the budget, or
    when the open fails, the file is opened at each read instead.
    """

    __slots__ = ("fd", "path")

    def __init__(self, path: str, keep_open: bool) -> None:
        self.path = path
        self.fd: int | None = None
        if keep_open:
            try:
                self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                log.debug("cannot open %s: %s", path, exc)

    def read(self) -> bytes | None:
        """The file's contents, or None: the value is skipped.

        Raises OSError with an errno of :data:`_GONE` when the device went away (its
        port is listed again).
        """
        if self.fd is None:
            return read_raw(self.path)
        try:
            return os.pread(self.fd, 4096, 0)
        except OSError as exc:
            log.debug("cannot read %s: %s", self.path, exc)
            if exc.errno in _GONE:
                raise
            return None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        """A collector dropped without ``close`` lets go of its files all the same."""
        self.close()


class _OpenBudget:
    """The files a layout may still keep open; past it, :class:`_File` opens at each read."""

    def __init__(self, left: int) -> None:
        self.left = left

    def file(self, path: str) -> _File:
        f = _File(path, keep_open=self.left > 0)
        if f.fd is not None:
            self.left -= 1
        return f


class _Port:
    """What one port's directory holds, listed once: its files, each counter's stem."""

    def __init__(self, device: str, port: int, base: str, budget: _OpenBudget) -> None:
        self.device = device
        self.port = port
        self.base = base
        self.inode = _inode(base)
        self.link_layer = read_attribute(os.path.join(base, "link_layer")) or None
        self.state = budget.file(os.path.join(base, "state"))
        self.phys_state = budget.file(os.path.join(base, "phys_state"))
        self.rate = budget.file(os.path.join(base, "rate"))  # a link may train again slower
        # counters/ first: it wins should a name (or stem) ever appear in both.
        stems: dict[str, tuple[_File, int]] = {}
        for sub in ("counters", "hw_counters"):
            directory = os.path.join(base, sub)
            for name in sorted(_listing(directory)):
                stem = None if name in NOT_COUNTERS else counter_stem(name)
                if stem is None or stem in stems:
                    continue
                stems[stem] = (budget.file(os.path.join(directory, name)),
                               4 if name in _WORD_COUNTERS else 1)
        self.counters = sorted((stem, f, scale) for stem, (f, scale) in stems.items())
        self.failed = False

    def sample(self) -> IbPortSample:
        counters: list[tuple[str, int]] = []
        for stem, f, scale in self.counters:
            data = self._read(f)
            if data is None:
                continue
            try:
                value = int(data)
            except ValueError:
                log.debug("skipping non-numeric counter %s: %r", f.path, data)
                continue
            if value < 0:
                log.debug("skipping negative counter %s: %r", f.path, data)
                continue
            counters.append((stem, value * scale))
        return IbPortSample(
            device=self.device,
            port=self.port,
            state=_parse_or_none(parse_port_state, self._text(self.state)),
            phys_state=_parse_or_none(parse_port_state, self._text(self.phys_state)),
            rate_bytes_per_second=_parse_or_none(parse_rate, self._text(self.rate)),
            link_layer=self.link_layer,
            counters=tuple(counters),
        )

    def _read(self, f: _File) -> bytes | None:
        try:
            return f.read()
        except OSError:
            self.failed = True
            return None

    def _text(self, f: _File) -> str | None:
        data = self._read(f)
        return None if data is None else data.decode("ascii", errors="replace").strip()

    def close(self) -> None:
        for f in (self.state, self.phys_state, self.rate, *(f for _, f, _ in self.counters)):
            f.close()


class InfinibandCollector:
    """Every port of every device under ``<sysfs>/class/infiniband``.

    The ports' layout (which files, which stems) is listed once and their files kept
    open; a port is listed again when its directory changed (a device that went away and
    came back), when one of its files could not be read, and every
    :data:`RELIST_EVERY` cycles. ``link_layer`` is read with the layout.
    """

    name = "infiniband"

    def __init__(self, sysfs: Path, max_open_files: int | None = None) -> None:
        self._root = str(Path(sysfs) / "class" / "infiniband")
        self._max_open = open_file_budget() if max_open_files is None else max_open_files
        self._ports: dict[tuple[str, int], _Port] = {}
        self._devices: list[str] | None = None
        self._cycles = 0

    def collect(self) -> Collected:
        if not os.path.isdir(self._root):
            self.close()
            raise SourceMissing(f"{self._root} does not exist")
        try:
            devices = sorted(
                (e.name for e in os.scandir(self._root) if not e.name.startswith(".")),
                key=natural_key,
            )
        except OSError as exc:
            raise CollectorError(f"cannot list {self._root}: {exc}") from exc
        self._cycles += 1
        if (devices != self._devices or self._cycles % RELIST_EVERY == 0
                or any(p.failed or _inode(p.base) != p.inode for p in self._ports.values())):
            self._relist(devices)
        return Collected(infiniband=tuple(p.sample() for p in self._ports.values()))

    def _relist(self, devices: list[str]) -> None:
        self.close()
        budget = _OpenBudget(self._max_open)
        for device in devices:
            ports_dir = os.path.join(self._root, device, "ports")
            numbers = sorted(int(n) for n in _listing(ports_dir) if n.isdigit())
            for number in numbers:
                self._ports[(device, number)] = _Port(
                    device, number, os.path.join(ports_dir, str(number)), budget)
        self._devices = devices

    def close(self) -> None:
        """Close the files kept open; the next cycle lists the ports again."""
        for port in self._ports.values():
            port.close()
        self._ports.clear()
        self._devices = None


def _parse_or_none(parse: Callable[[str], _T], text: str | None) -> _T | None:
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError:
        log.debug("cannot parse %r", text)
        return None
