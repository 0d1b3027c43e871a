"""Host CPU, memory and load from /proc; memory bandwidth from resctrl MBM where mounted.

resctrl's ``mbm_total_bytes`` counts traffic between the L3 cache and memory caused by
the CPUs of one monitoring domain (an L3 cache, usually a socket). It does not see
device DMA, so GPU <-> host copies are not in it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.snapshot import Collected, HostSample, MemoryBandwidthSample

log = logging.getLogger(__name__)

# The modes of the aggregate "cpu" line of /proc/stat, in order. "guest" and
# "guest_nice" follow them but are already counted in "user" and "nice": they are left
# out so that the modes add up to the CPU time that passed.
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

_DEFAULT_TICKS_PER_SECOND = 100
_MBM_PREFIX = "mon_"


def parse_proc_stat(
    text: str, ticks_per_second: int = _DEFAULT_TICKS_PER_SECOND
) -> tuple[tuple[str, float], ...]:
    """The aggregate ``cpu`` line of /proc/stat -> seconds per mode (all CPUs together).

    Old kernels print fewer modes; those present are returned. An absent or malformed
    ``cpu`` line gives an empty tuple.
    """
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] != "cpu":
            continue
        try:
            ticks = [int(field) for field in fields[1 : 1 + len(CPU_MODES)]]
        except ValueError:
            log.debug("malformed cpu line in /proc/stat: %r", line)
            return ()
        return tuple(
            (mode, tick / ticks_per_second) for mode, tick in zip(CPU_MODES, ticks, strict=False)
        )
    return ()


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> value per key, in bytes where the kernel says ``kB`` (KiB).

    Keys without a unit (``HugePages_Total``) are plain counts. Malformed lines are
    skipped.
    """
    result: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        key = key.strip()
        fields = rest.split()
        if not sep or not key or not fields or len(fields) > 2:
            continue
        try:
            value = int(fields[0])
        except ValueError:
            continue
        if len(fields) == 2:
            if fields[1] != "kB":
                continue
            value *= 1024
        result[key] = value
    return result


def parse_loadavg(text: str) -> float | None:
    """/proc/loadavg -> the one-minute load average, None if malformed."""
    fields = text.split()
    if not fields:
        return None
    try:
        return float(fields[0])
    except ValueError:
        return None


def parse_mbm_domain(dir_name: str) -> str | None:
    """``mon_L3_00`` -> ``L3_00``; None for a name that is not a monitoring domain."""
    if not dir_name.startswith(_MBM_PREFIX):
        return None
    return dir_name.removeprefix(_MBM_PREFIX) or None


def parse_mbm_bytes(text: str) -> int | None:
    """``mbm_total_bytes`` contents -> bytes.

    The kernel writes ``Unavailable`` (no counter assigned yet) or ``Error`` instead of
    a number; those, and anything else not a non-negative integer, give None.
    """
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def _ticks_per_second() -> int:
    try:
        ticks = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return _DEFAULT_TICKS_PER_SECOND
    return ticks if ticks > 0 else _DEFAULT_TICKS_PER_SECOND


class HostCollector:
    """CPU seconds, memory, load and resctrl memory bandwidth of the host.

    A missing /proc file leaves its values out; all three missing is
    :class:`SourceMissing`. A missing or unreadable resctrl tree gives no bandwidth
    samples.
    """

    name = "host"

    def __init__(self, procfs: Path, sysfs: Path, ticks_per_second: int | None = None) -> None:
        self._procfs = Path(procfs)
        self._mon_data = Path(sysfs) / "fs" / "resctrl" / "mon_data"
        self._ticks = ticks_per_second if ticks_per_second is not None else _ticks_per_second()

    def collect(self) -> Collected:
        stat = self._read_proc("stat")
        meminfo = self._read_proc("meminfo")
        loadavg = self._read_proc("loadavg")
        if stat is None and meminfo is None and loadavg is None:
            raise SourceMissing(f"no stat, meminfo or loadavg under {self._procfs}")
        memory = parse_meminfo(meminfo) if meminfo is not None else {}
        return Collected(
            host=HostSample(
                cpu_seconds_total=parse_proc_stat(stat, self._ticks) if stat is not None else (),
                memory_total_bytes=memory.get("MemTotal"),
                memory_available_bytes=memory.get("MemAvailable"),
                load1=parse_loadavg(loadavg) if loadavg is not None else None,
                memory_bandwidth=self._memory_bandwidth(),
            )
        )

    def close(self) -> None:
        """Nothing is held between cycles."""

    def _read_proc(self, name: str) -> str | None:
        path = self._procfs / name
        try:
            return path.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            log.debug("%s does not exist", path)
            return None
        except OSError as exc:
            raise CollectorError(f"cannot read {path}: {exc}") from exc

    def _memory_bandwidth(self) -> tuple[MemoryBandwidthSample, ...]:
        try:
            entries = sorted(e.name for e in os.scandir(self._mon_data))
        except OSError as exc:
            log.debug("no resctrl monitoring at %s: %s", self._mon_data, exc)
            return ()
        samples: list[MemoryBandwidthSample] = []
        for entry in entries:
            domain = parse_mbm_domain(entry)
            if domain is None:
                continue
            path = self._mon_data / entry / "mbm_total_bytes"
            try:
                text = path.read_text(encoding="ascii", errors="replace")
            except OSError as exc:
                log.debug("cannot read %s: %s", path, exc)
                continue
            value = parse_mbm_bytes(text)
            if value is None:
                log.debug("no value in %s: %r", path, text.strip())
                continue
            samples.append(MemoryBandwidthSample(domain=domain, bytes_total=value))
        return tuple(samples)
