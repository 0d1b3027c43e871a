"""InfiniBand / RoCE ports from /sys/class/infiniband/<device>/ports/<port>/.

The pure parts (:func:`parse_ib_counters`, :func:`parse_port_state`, :func:`parse_rate`)
turn kernel file contents into our units and metric stems; :class:`InfinibandCollector`
reads the files. ``port_rcv_data`` and ``port_xmit_data`` count 4-byte words (the IB
spec's PortRcvData / PortXmitData "octets divided by 4"): they are multiplied by 4 here,
so every ``*_bytes`` stem is in bytes.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.snapshot import Collected, IbPortSample

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


def parse_ib_counters(files: Mapping[str, str]) -> tuple[tuple[str, int], ...]:
    """Counter file name -> contents, to ``(stem, value)`` pairs sorted by stem.

    Data counters are converted from 4-byte words to bytes. A file whose contents are
    not a non-negative integer is skipped (logged at debug level), as are non-counters
    (``lifespan``) and a second file that maps to a stem already seen.
    """
    result: dict[str, int] = {}
    for file_name, text in files.items():
        if file_name in NOT_COUNTERS:
            continue
        stem = counter_stem(file_name)
        if stem is None:
            log.debug("skipping counter file with unusable name %r", file_name)
            continue
        try:
            value = int(text.strip())
        except ValueError:
            log.debug("skipping non-numeric counter %s: %r", file_name, text)
            continue
        if value < 0:
            log.debug("skipping negative counter %s: %r", file_name, text)
            continue
        if stem in result:
            log.debug("skipping counter %s: stem %s already taken", file_name, stem)
            continue
        if file_name in _WORD_COUNTERS:
            value *= 4
        result[stem] = value
    return tuple(sorted(result.items()))


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


def _natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """``mlx5_2`` before ``mlx5_10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part
    )


def _read(path: str) -> str | None:
    """One small sysfs file; raw ``os.read`` because a port has ~50 and we read every second."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        log.debug("cannot open %s: %s", path, exc)
        return None
    try:
        data = os.read(fd, 4096)
    except OSError as exc:
        log.debug("cannot read %s: %s", path, exc)
        return None
    finally:
        os.close(fd)
    return data.decode("ascii", errors="replace").strip()


def _read_dir(path: str) -> dict[str, str]:
    """Every readable file in a counter directory; unreadable ones are left out."""
    files: dict[str, str] = {}
    try:
        entries = list(os.scandir(path))
    except OSError as exc:
        log.debug("cannot list %s: %s", path, exc)
        return files
    for entry in entries:
        if entry.name.startswith("."):
            continue
        text = _read(entry.path)
        if text is not None:
            files[entry.name] = text
    return files


class InfinibandCollector:
    """Every port of every device under ``<sysfs>/class/infiniband``."""

    name = "infiniband"

    def __init__(self, sysfs: Path) -> None:
        self._root = Path(sysfs) / "class" / "infiniband"

    def collect(self) -> Collected:
        if not self._root.is_dir():
            raise SourceMissing(f"{self._root} does not exist")
        try:
            devices = sorted(
                (e.name for e in os.scandir(self._root) if not e.name.startswith(".")),
                key=_natural_key,
            )
        except OSError as exc:
            raise CollectorError(f"cannot list {self._root}: {exc}") from exc
        samples: list[IbPortSample] = []
        for device in devices:
            samples.extend(self._device(device))
        return Collected(infiniband=tuple(samples))

    def close(self) -> None:
        """Nothing is held between cycles."""

    def _device(self, device: str) -> list[IbPortSample]:
        ports_dir = self._root / device / "ports"
        try:
            ports = sorted(int(e.name) for e in os.scandir(ports_dir) if e.name.isdigit())
        except OSError as exc:
            log.debug("cannot list %s: %s", ports_dir, exc)
            return []
        return [self._port(device, port, os.path.join(ports_dir, str(port))) for port in ports]

    @staticmethod
    def _port(device: str, port: int, base: str) -> IbPortSample:
        state = _parse_or_none(parse_port_state, _read(os.path.join(base, "state")))
        phys_state = _parse_or_none(parse_port_state, _read(os.path.join(base, "phys_state")))
        rate = _parse_or_none(parse_rate, _read(os.path.join(base, "rate")))
        link_layer = _read(os.path.join(base, "link_layer")) or None
        # counters/ first: it wins should a name (or stem) ever appear in both.
        files = _read_dir(os.path.join(base, "counters"))
        for name, text in _read_dir(os.path.join(base, "hw_counters")).items():
            files.setdefault(name, text)
        return IbPortSample(
            device=device,
            port=port,
            state=state,
            phys_state=phys_state,
            rate_bytes_per_second=rate,
            link_layer=link_layer,
            counters=parse_ib_counters(files),
        )


def _parse_or_none(parse: Callable[[str], _T], text: str | None) -> _T | None:
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError:
        log.debug("cannot parse %r", text)
        return None
