"""Network interfaces: counters from /proc/net/dev, link facts from /sys/class/net.

``parse_netdev`` is the pure part; :class:`NetCollector` reads the files around it. A
sysfs value that cannot be read (``carrier`` fails with EINVAL on an interface that is
administratively down, ``speed`` on virtual devices) leaves that one value out, never
the device or the sample.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.collectors.sysfs import read_attribute
from sn_monitor.agent.snapshot import Collected, NetDeviceSample

log = logging.getLogger(__name__)

# Fields after "<name>:" on a /proc/net/dev line; the kernel prints 16 (8 rx, 8 tx).
_NETDEV_FIELDS = 16
# /sys/class/net/<dev>/speed is in Mb/s (10^6 bits); we export bytes per second.
_BYTES_PER_SECOND_PER_MBIT = 1_000_000 // 8


@dataclass(frozen=True, slots=True)
class NetDevCounters:
    """The cumulative counters of one interface as /proc/net/dev lists them."""

    receive_bytes: int
    receive_packets: int
    receive_errors: int
    receive_drops: int
    transmit_bytes: int
    transmit_packets: int
    transmit_errors: int
    transmit_drops: int


def parse_netdev(text: str) -> dict[str, NetDevCounters]:
    """Parse /proc/net/dev into counters per interface, in the file's order.

    The kernel prints ``"%6s:%8llu ..."``, so a counter wider than eight digits runs into
    the colon (``ens1f0np0:918273645501234``); the name is everything before the last
    colon. Header lines and malformed lines are skipped (logged at debug level).
    """
    result: dict[str, NetDevCounters] = {}
    for line in text.splitlines():
        if "|" in line or not line.strip():
            continue
        name, sep, rest = line.rpartition(":")
        name = name.strip()
        fields = rest.split()
        if not sep or not name or len(fields) < _NETDEV_FIELDS:
            log.debug("skipping malformed /proc/net/dev line %r", line)
            continue
        try:
            values = [int(field) for field in fields[:_NETDEV_FIELDS]]
        except ValueError:
            log.debug("skipping non-numeric /proc/net/dev line %r", line)
            continue
        if any(value < 0 for value in values):
            log.debug("skipping negative counters in /proc/net/dev line %r", line)
            continue
        result[name] = NetDevCounters(
            receive_bytes=values[0],
            receive_packets=values[1],
            receive_errors=values[2],
            receive_drops=values[3],
            transmit_bytes=values[8],
            transmit_packets=values[9],
            transmit_errors=values[10],
            transmit_drops=values[11],
        )
    return result


def parse_speed(text: str) -> int | None:
    """``/sys/class/net/<dev>/speed`` (Mb/s) -> bytes per second; -1 (unknown) -> None."""
    try:
        mbits = int(text.strip())
    except ValueError:
        return None
    if mbits < 0:
        return None
    return mbits * _BYTES_PER_SECOND_PER_MBIT


def _compile(pattern: str | None, what: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"net collector: invalid {what} regex {pattern!r}: {exc}") from exc


def _read_int(path: str) -> int | None:
    text = read_attribute(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        log.debug("not an integer in %s: %r", path, text)
        return None


class NetCollector:
    """Counters and link state of every network interface, filtered by name.

    ``include`` and ``exclude`` are regular expressions that must match the whole
    interface name; an interface is collected when it matches ``include`` (or there is
    none) and does not match ``exclude``.
    """

    name = "net"

    def __init__(
        self,
        procfs: Path,
        sysfs: Path,
        include: str | None = None,
        exclude: str | None = None,
    ) -> None:
        self._netdev = Path(procfs) / "net" / "dev"
        self._class_net = os.path.join(sysfs, "class", "net")
        self._include = _compile(include, "include")
        self._exclude = _compile(exclude, "exclude")

    def wanted(self, device: str) -> bool:
        """Whether the include/exclude filters let ``device`` through."""
        if self._include is not None and self._include.fullmatch(device) is None:
            return False
        return self._exclude is None or self._exclude.fullmatch(device) is None

    def collect(self) -> Collected:
        try:
            text = self._netdev.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError as exc:
            raise SourceMissing(f"{self._netdev} does not exist") from exc
        except OSError as exc:
            raise CollectorError(f"cannot read {self._netdev}: {exc}") from exc
        samples = [
            self._sample(device, counters)
            for device, counters in parse_netdev(text).items()
            if self.wanted(device)
        ]
        return Collected(net=tuple(samples))

    def close(self) -> None:
        """Nothing is held between cycles."""

    def _sample(self, device: str, counters: NetDevCounters) -> NetDeviceSample:
        carrier_up: bool | None = None
        carrier_changes: int | None = None
        speed: int | None = None
        mtu: int | None = None
        # The kernel never names an interface "." or ".." or with a "/"; a garbled
        # /proc/net/dev must not make us read outside /sys/class/net.
        if "/" not in device and device not in (".", ".."):
            base = os.path.join(self._class_net, device)
            carrier_up = self._carrier(base)
            carrier_changes = _read_int(os.path.join(base, "carrier_changes"))
            speed_text = read_attribute(os.path.join(base, "speed"))
            speed = parse_speed(speed_text) if speed_text is not None else None
            mtu = _read_int(os.path.join(base, "mtu"))
        return NetDeviceSample(
            device=device,
            receive_bytes_total=counters.receive_bytes,
            receive_packets_total=counters.receive_packets,
            receive_errors_total=counters.receive_errors,
            receive_drops_total=counters.receive_drops,
            transmit_bytes_total=counters.transmit_bytes,
            transmit_packets_total=counters.transmit_packets,
            transmit_errors_total=counters.transmit_errors,
            transmit_drops_total=counters.transmit_drops,
            carrier_up=carrier_up,
            carrier_changes_total=carrier_changes,
            speed_bytes_per_second=speed,
            mtu_bytes=mtu,
        )

    @staticmethod
    def _carrier(base: str) -> bool | None:
        """``carrier`` is 1 or 0; on an interface that is down reading it fails (EINVAL).

        Then ``operstate`` decides: ``down`` means no carrier, anything else is unknown.
        """
        value = _read_int(os.path.join(base, "carrier"))
        if value is not None:
            return value != 0
        if read_attribute(os.path.join(base, "operstate")) == "down":
            return False
        return None
