"""GPU and NVSwitch faults from the kernel log: XID, SXID and "fallen off the bus".

Parsing is pure and apart from reading. :func:`split_kmsg_record` takes one raw
``/dev/kmsg`` record apart, :func:`strip_dmesg_prefix` removes what ``dmesg`` and
syslog/journald put in front of a kernel line, and :func:`parse_kernel_line` turns one
line into a :class:`KernelFault` (or None, as for most of the log). A
:class:`KernelLogParser` adds what a stream needs and one line cannot see: the older
"fallen off the bus" message that dmesg prints over three lines, and the same GPU
reported off the bus twice in a row (an Xid 79 and the driver's own line after it).

An ``Xid 79`` line is an XID like any other (kind ``xid``, code 79), not a "fallen off
the bus" fault: NVML's event set reports the same XID 79, and the sampler joins the two
into one event (:class:`~sn_monitor.agent.sampler.XidLedger`). Were the two sources to
name one fault differently, the fault's rule would depend on which source the agent
happened to read first. ``gpu_fallen_off_bus`` is the driver's own sentence, when no
Xid 79 of the same GPU came just before it.

:class:`KmsgCollector` reads ``/dev/kmsg`` without blocking, or follows a regular text
file like ``tail -F`` (tests, or a dmesg / journald export), and hands the faults it
found since the last cycle to the sampler as events. It is the source's one reader: the
agent's kernel-log follower (:mod:`sn_monitor.agent.fastpath.kernel_follower`) calls the
same :meth:`KmsgCollector.collect` the moment the log has something new, under the
collector's lock, so the offsets stay whole and each fault is taken once. It never maps
a PCI address to a GPU index: the sampler does that with what NVML reports.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Literal

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.pci import canonical_bus_id
from sn_monitor.agent.snapshot import Collected
from sn_monitor.clock import Clock
from sn_monitor.model import Event

logger = logging.getLogger(__name__)

KernelFaultKind = Literal["xid", "sxid", "gpu_fallen_off_bus"]

#: The most records (device) or lines (file) one ``collect()`` reads; the rest wait for
#: the next cycle, so a log storm cannot stall the sampling loop.
DEFAULT_MAX_LINES_PER_COLLECT = 10_000

#: One /dev/kmsg read returns one record; the kernel refuses (EINVAL) a buffer smaller
#: than the record, and records are at most 8 KiB including their dictionary.
_KMSG_READ_SIZE = 16_384

#: Longer lines in a followed file are skipped (a kernel record is at most 8 KiB).
_MAX_LINE_BYTES = 65_536

#: The driver's "fallen off the bus" sentence within this many lines of an Xid 79, or of
#: another such sentence, for the same GPU is the same incident told twice (Xid 79
#: followed by "GPU 0000:3b:00.0: GPU has fallen off the bus.").
_FALLEN_OFF_DEDUP_LINES = 16

#: How many lines after "The NVIDIA GPU 0000:3b:00.0" dmesg may take to say "fallen off
#: the bus" (the driver prints the sentence over three lines).
_FALLEN_OFF_CONTINUATION_LINES = 3


# ---------------------------------------------------------------------------
# /dev/kmsg records


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    r"""One /dev/kmsg record: ``prio,seq,usec,flags[,...];text`` plus dictionary lines.

    ``priority`` is the raw syslog value (facility * 8 + level); ``fields`` holds the
    continuation lines (`` SUBSYSTEM=pci``, `` DEVICE=+pci:0000:18:00.0``) as pairs.
    ``text`` has the kernel's ``\xNN`` escapes undone, so it may contain newlines.
    """

    priority: int
    sequence: int
    kernel_time_seconds: float
    flags: str
    text: str
    fields: tuple[tuple[str, str], ...] = ()

    @property
    def level(self) -> int:
        """Syslog severity, 0 (emerg) .. 7 (debug)."""
        return self.priority & 7

    @property
    def facility(self) -> int:
        """Syslog facility: 0 for the kernel, 1 for lines written to /dev/kmsg by users."""
        return self.priority >> 3


_KMSG_HEADER = re.compile(
    r"^(?P<prio>\d{1,4}),(?P<seq>\d{1,20}),(?P<usec>\d{1,20})(?:,(?P<flags>[^,;]*))?[^;]*;"
)
_KMSG_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def _unescape_kmsg(text: str) -> str:
    r"""Undo /dev/kmsg's ``\xNN`` escaping of control characters and backslashes."""
    return _KMSG_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)


def split_kmsg_record(raw: str) -> KmsgRecord | None:
    """Split one raw /dev/kmsg record; None when ``raw`` is not one.

    The kernel escapes newlines inside a message, so the first real newline ends the
    text; lines after it that start with a space are the record's dictionary.
    """
    first, _, rest = raw.partition("\n")
    header = _KMSG_HEADER.match(first)
    if header is None:
        return None
    fields: list[tuple[str, str]] = []
    for line in rest.split("\n"):
        if not line.startswith(" "):
            continue
        key, sep, value = line[1:].partition("=")
        if sep:
            fields.append((key, value))
    return KmsgRecord(
        priority=int(header["prio"]),
        sequence=int(header["seq"]),
        kernel_time_seconds=int(header["usec"]) / 1e6,
        flags=header["flags"] or "-",
        text=_unescape_kmsg(first[header.end() :].rstrip("\r")),
        fields=tuple(fields),
    )


# ---------------------------------------------------------------------------
# dmesg / syslog / journald prefixes

_ISO_TS = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[,.]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
_SYSLOG_TS = r"[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}(?:\.\d+)?"
_CONSOLE_LEVEL = re.compile(r"^<\d{1,3}>")
_DECODE = re.compile(
    r"^(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7])"
    r"\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*: ?"
)
_JOURNAL = re.compile(rf"^(?:(?:{_SYSLOG_TS}|{_ISO_TS}) \S+ )?kernel: ")
_CTIME = re.compile(r"^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]?\d \d{2}:\d{2}:\d{2} \d{4}\] ?")
_ISO = re.compile(rf"^{_ISO_TS} ")
_MONOTONIC = re.compile(r"^\[\s*(?P<seconds>\d{1,12}\.\d{1,9})\] ?")


def strip_dmesg_prefix(line: str) -> tuple[str, float | None]:
    """Remove what dmesg, syslog or journald print before a kernel message.

    Returns the message and the kernel timestamp (seconds since boot) when the line
    carries one as ``[  123.456789]``. Handled, alone or stacked: ``<4>``,
    ``kern  :warn  : `` (``--decode``), ``Aug 10 15:36:05 host kernel: `` and
    ``kernel: `` (syslog, journald), ``[Mon Jan  8 12:34:56 2024] `` (``-T``),
    ``2024-05-13T10:24:32,123456+00:00 `` (``--time-format iso``) and ``[  123.456] ``.
    The indentation dmesg puts before the later lines of a multi-line message goes too.
    """
    text = line.rstrip("\r\n")
    text = _CONSOLE_LEVEL.sub("", text, count=1)
    text = _DECODE.sub("", text, count=1)
    text = _JOURNAL.sub("", text, count=1)
    text = _CTIME.sub("", text, count=1)
    text = _ISO.sub("", text, count=1)
    kernel_time: float | None = None
    monotonic = _MONOTONIC.match(text)
    if monotonic is not None:
        kernel_time = float(monotonic["seconds"])
        text = text[monotonic.end() :]
    return text.strip(), kernel_time


# ---------------------------------------------------------------------------
# Line parsers


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One ``NVRM: Xid (...)`` line.

    ``message`` is everything after ``<code>, `` (pid and name included, as the driver
    printed it); ``description`` is the same without the ``pid=`` / ``name=`` fields.
    ``link`` and ``fatal`` are filled where the line states them (Xid 74, NVLink5 Xid
    144-150); ``pid`` and ``process_name`` are None where the driver printed
    ``'<unknown>'``.
    """

    code: int
    message: str
    description: str
    pci_bus_id: str | None = None
    pid: int | None = None
    process_name: str | None = None
    link: int | None = None
    fatal: bool | None = None


@dataclass(frozen=True, slots=True)
class SxidEvent:
    """The first line of one NVSwitch SXid report (``..., Fatal, Link 40 ...``)."""

    code: int
    fatal: bool
    message: str
    pci_bus_id: str | None = None
    device: str | None = None
    link: int | None = None


@dataclass(frozen=True, slots=True)
class FallenOffBus:
    """A GPU that stopped answering on PCIe, in the driver's own sentence."""

    pci_bus_id: str | None
    message: str


@dataclass(frozen=True, slots=True)
class KernelFault:
    """One fault found in the kernel log, ready to become an :class:`Event`."""

    kind: KernelFaultKind
    message: str
    code: int | None = None
    pci_bus_id: str | None = None
    device: str | None = None
    kernel_time_seconds: float | None = None

    def to_event(self, time_seconds: float) -> Event:
        """The wire event; ``gpu`` stays None until the sampler maps the PCI address."""
        return Event(
            kind=self.kind,
            source="kmsg",
            time_seconds=time_seconds,
            message=self.message,
            pci_bus_id=self.pci_bus_id,
            code=self.code,
            device=self.device,
            kernel_time_seconds=self.kernel_time_seconds,
        )


_XID = re.compile(r"^NVRM: Xid \((?P<where>[^)]*)\): (?P<code>\d{1,5})(?:, ?(?P<rest>.*))?$")
_SXID = re.compile(
    r"^(?:(?P<device>nvidia-nvswitch\d+): )?SXid \((?P<where>[^)]*)\): "
    r"(?P<code>\d{1,6})(?:, ?(?P<rest>.*))?$"
)
_PID = re.compile(r"^pid=(?P<pid>'[^']*'|<[^>]*>|[^,]*),\s*")
_NAME = re.compile(r"^name=(?P<name>[^,]*),\s*")
_NVLINK5 = re.compile(r"^[A-Z][A-Z0-9_]*,? (?P<severity>Fatal|Nonfatal|Non-fatal)\b", re.IGNORECASE)
_LINK = re.compile(r"\blink (?P<link>-?\d+)", re.IGNORECASE)
_SXID_SEVERITY = re.compile(r"^(?P<severity>Fatal|Non-?fatal)\b,?\s*", re.IGNORECASE)
_FALLEN_OFF_SENTENCE = "fallen off the bus"
_GPU_FALLEN_OFF = re.compile(
    r"^NVRM: GPU (?:at )?(?:PCI:)?(?P<bus>[0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+(?:\.[0-7])?)"
    r":? (?:GPU )?has fallen off the bus"
)
_THE_NVIDIA_GPU = re.compile(
    r"^NVRM: The NVIDIA GPU (?:PCI:)?"
    r"(?P<bus>[0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+(?:\.[0-7])?)\b"
)
_CONTINUATION = re.compile(r"\s*\n\s*(?:NVRM: )?")


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0].strip()


def _bus_id(where: str) -> str | None:
    """``PCI:0000:18:00`` or ``PCI:0000:01:00 GPU-I:05`` (MIG) -> ``0000:18:00.0``."""
    token = where.split(maxsplit=1)[0] if where.strip() else ""
    return canonical_bus_id(token)


def _link(text: str) -> int | None:
    match = _LINK.search(text)
    if match is None:
        return None
    link = int(match["link"])
    return link if link >= 0 else None


def parse_xid_line(text: str) -> XidEvent | None:
    """Parse ``NVRM: Xid (PCI:0000:18:00): 79, pid=..., name=..., <message>``.

    Tolerant of what follows the code: the ``PCI:`` prefix may be missing, MIG adds
    ``GPU-I:`` / ``GPU-CI:`` to the address, ``pid=`` and ``name=`` come and go between
    driver versions, and NVLink5 (Xid 144-150) prints a unit, a severity and registers.
    """
    match = _XID.match(_first_line(text))
    if match is None:
        return None
    message = (match["rest"] or "").strip()
    description = message
    pid: int | None = None
    name: str | None = None
    pid_match = _PID.match(description)
    if pid_match is not None:
        raw_pid = pid_match["pid"].strip("'\" ")
        pid = int(raw_pid) if raw_pid.isascii() and raw_pid.isdigit() else None
        description = description[pid_match.end() :]
    name_match = _NAME.match(description)
    if name_match is not None:
        raw_name = name_match["name"].strip()
        name = None if raw_name.startswith("<") or not raw_name else raw_name
        description = description[name_match.end() :]
    code = int(match["code"])
    fatal: bool | None = None
    severity = _NVLINK5.match(description) if 144 <= code <= 150 else None
    if severity is not None:
        fatal = severity["severity"].lower() == "fatal"
    return XidEvent(
        code=code,
        message=message,
        description=description,
        pci_bus_id=_bus_id(match["where"]),
        pid=pid,
        process_name=name,
        link=_link(description),
        fatal=fatal,
    )


def parse_sxid_line(text: str) -> SxidEvent | None:
    """Parse ``nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 47 ...``.

    The driver follows the first line of an SXid report with detail lines for the same
    code (``28006, Severity 0 Engine instance 46 ...``, ``28006, Data {0x...}``). Only a
    line that states Fatal / Non-fatal starts a report; the others return None so that
    one report is one event.
    """
    match = _SXID.match(_first_line(text))
    if match is None:
        return None
    rest = (match["rest"] or "").strip()
    severity = _SXID_SEVERITY.match(rest)
    if severity is None:
        return None
    return SxidEvent(
        code=int(match["code"]),
        fatal=severity["severity"].lower() == "fatal",
        message=rest,
        pci_bus_id=_bus_id(match["where"]),
        device=match["device"],
        link=_link(rest[severity.end() :]),
    )


def parse_fallen_off_bus(text: str) -> FallenOffBus | None:
    """A GPU fell off the bus, in the driver's sentence in its two shapes.

    ``NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`` and ``NVRM: The NVIDIA GPU
    0000:3b:00.0 (PCI ID: 10de:2330) installed in this system has fallen off the bus
    and is not responding to commands.``; the latter is one kernel record printed over
    three ``NVRM:`` lines, which ``text`` may hold with its newlines.
    """
    joined = _CONTINUATION.sub(" ", text.strip())
    if _FALLEN_OFF_SENTENCE not in joined:
        return None
    match = _GPU_FALLEN_OFF.match(joined) or _THE_NVIDIA_GPU.match(joined)
    if match is None:
        return None
    message = joined.removeprefix("NVRM: ")
    return FallenOffBus(pci_bus_id=canonical_bus_id(match["bus"]), message=message)


def parse_kernel_line(text: str) -> KernelFault | None:
    """One kernel log line (prefixes allowed) -> the fault it reports, or None.

    Stateless: a stream should go through :class:`KernelLogParser`, which also joins
    the three-line form of "fallen off the bus" and drops a repeat of the same one.
    """
    message, kernel_time = strip_dmesg_prefix(text)
    if not message:
        return None
    fallen = parse_fallen_off_bus(message)
    if fallen is not None:
        return KernelFault(
            kind="gpu_fallen_off_bus",
            message=fallen.message,
            pci_bus_id=fallen.pci_bus_id,
            kernel_time_seconds=kernel_time,
        )
    xid = parse_xid_line(message)
    if xid is not None:
        return KernelFault(
            kind="xid",
            message=xid.message,
            code=xid.code,
            pci_bus_id=xid.pci_bus_id,
            kernel_time_seconds=kernel_time,
        )
    sxid = parse_sxid_line(message)
    if sxid is not None:
        return KernelFault(
            kind="sxid",
            message=sxid.message,
            code=sxid.code,
            pci_bus_id=sxid.pci_bus_id,
            device=sxid.device,
            kernel_time_seconds=kernel_time,
        )
    return None


class KernelLogParser:
    """Turns a stream of kernel lines into faults, one per incident.

    Two things need memory of earlier lines. dmesg prints the record "The NVIDIA GPU
    <addr> / (PCI ID: ...) installed in this system has / fallen off the bus ..." as
    three lines, and only the first names the GPU. And a GPU that falls off the bus is
    usually reported twice (Xid 79, then the driver's sentence): the second report of
    the same address within a few lines is dropped.
    """

    def __init__(self) -> None:
        self._line = 0
        self._pending: list[str] = []
        self._pending_time: float | None = None
        self._pending_left = 0
        self._fallen_at: dict[str | None, int] = {}

    def feed(self, line: str, kernel_time_seconds: float | None = None) -> KernelFault | None:
        """Parse the next line; ``kernel_time_seconds`` overrides a ``[seconds]`` prefix."""
        self._line += 1
        text, prefix_time = strip_dmesg_prefix(line)
        kernel_time = kernel_time_seconds if kernel_time_seconds is not None else prefix_time
        if self._pending:
            consumed, fault = self._continue_pending(text)
            if consumed:
                return fault
        if (
            _THE_NVIDIA_GPU.match(text) is not None
            and "\n" not in text
            and _FALLEN_OFF_SENTENCE not in text
        ):
            self._pending = [text]
            self._pending_time = kernel_time
            self._pending_left = _FALLEN_OFF_CONTINUATION_LINES
            return None
        fault = parse_kernel_line(text)
        if fault is None:
            return None
        return self._emit(replace(fault, kernel_time_seconds=kernel_time))

    def _continue_pending(self, text: str) -> tuple[bool, KernelFault | None]:
        """Add ``text`` to a pending "The NVIDIA GPU ..." record, or drop the record.

        Returns whether ``text`` was taken as a continuation, and the fault once the
        record is complete. A line that starts a report of its own (an Xid, another
        GPU) or is no ``NVRM:`` line ends the record unfinished; the caller parses it.
        """
        own_report = text.startswith(("NVRM: Xid", "NVRM: The NVIDIA GPU"))
        if own_report or (_FALLEN_OFF_SENTENCE not in text and not text.startswith("NVRM:")):
            self._pending = []
            return False, None
        self._pending.append(text)
        self._pending_left -= 1
        if _FALLEN_OFF_SENTENCE not in text:
            if self._pending_left <= 0:
                self._pending = []
            return True, None
        fallen = parse_fallen_off_bus("\n".join(self._pending))
        kernel_time = self._pending_time
        self._pending = []
        if fallen is None:
            return True, None
        fault = KernelFault(
            kind="gpu_fallen_off_bus",
            message=fallen.message,
            pci_bus_id=fallen.pci_bus_id,
            kernel_time_seconds=kernel_time,
        )
        return True, self._emit(fault)

    def _emit(self, fault: KernelFault) -> KernelFault | None:
        """``fault``, or None where it is the same fall off the bus told again.

        The driver's sentence after an Xid 79, or after the same sentence, of the same GPU
        is dropped; the Xid 79 itself always goes out (NVML reports it too).
        """
        told = fault.kind == "gpu_fallen_off_bus" or (fault.kind == "xid" and fault.code == 79)
        if not told:
            return fault
        if len(self._fallen_at) > 64:
            self._fallen_at = {
                bus: line
                for bus, line in self._fallen_at.items()
                if self._line - line <= _FALLEN_OFF_DEDUP_LINES
            }
        last = self._fallen_at.get(fault.pci_bus_id)
        self._fallen_at[fault.pci_bus_id] = self._line
        repeat = last is not None and self._line - last <= _FALLEN_OFF_DEDUP_LINES
        return None if repeat and fault.kind == "gpu_fallen_off_bus" else fault


# ---------------------------------------------------------------------------
# The collector


def _skip_rest_of_line(handle: BinaryIO) -> int:
    """Read past the newline that ends an overlong line; returns the bytes skipped."""
    skipped = 0
    while True:
        chunk = handle.readline(_MAX_LINE_BYTES)
        skipped += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return skipped


class KmsgCollector:
    """Faults from /dev/kmsg, or from a kernel log text file followed like ``tail -F``.

    A character device is read record by record without blocking; on the first open it
    starts at the end (``start_at_end``) so that an agent restart does not report the
    whole boot again. A regular file is followed from a remembered offset; a rotated
    (new inode) or truncated file is read again from its start. A file may hold dmesg
    or journald text, or raw ``prio,seq,usec,flags;text`` records. Thread-safe: the cycle
    and the kernel-log follower call :meth:`collect` one at a time.
    """

    name = "kmsg"

    def __init__(
        self,
        path: Path,
        clock: Clock,
        start_at_end: bool = True,
        max_lines_per_collect: int = DEFAULT_MAX_LINES_PER_COLLECT,
    ) -> None:
        if max_lines_per_collect < 1:
            raise ValueError("max_lines_per_collect must be at least 1")
        self._path = Path(path)
        self._clock = clock
        self._start_at_end = start_at_end
        self._max_lines = max_lines_per_collect
        self._parser = KernelLogParser()
        self._fd: int | None = None
        self._file: BinaryIO | None = None
        self._inode: tuple[int, int] | None = None
        self._offset = 0
        self._opened_before = False
        self._overrun_warned = False
        self._last_sequence: int | None = None
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        """The kernel log this collector reads (a character device or a file)."""
        return self._path

    @property
    def device_fd(self) -> int | None:
        """The open ``/dev/kmsg`` descriptor, to poll for new records (None: not open, a file).

        It stays open until :meth:`close`; the poller must not read it.
        """
        return self._fd

    def collect(self) -> Collected:
        """Return the faults logged since the last call (at most ``max_lines`` read)."""
        with self._lock:
            return self._collect()

    def _collect(self) -> Collected:
        if self._fd is None and self._file is None:
            self._open()
        faults = self._read_device(self._fd) if self._fd is not None else self._read_file()
        if not faults:
            return Collected()
        now = self._clock.time()
        return Collected(events=tuple(fault.to_event(now) for fault in faults))

    def close(self) -> None:
        """Close the device or file; a later ``collect()`` opens it again."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def _permission_error(self, device: bool) -> CollectorError:
        hint = "run as root or grant CAP_SYSLOG" if device else "run as root or grant read access"
        return CollectorError(f"cannot read {self._path}: permission denied; {hint}")

    def _open(self) -> None:
        try:
            st = os.stat(self._path)
        except FileNotFoundError as exc:
            raise SourceMissing(f"{self._path} does not exist") from exc
        except PermissionError as exc:
            raise self._permission_error(device=False) from exc
        if stat.S_ISCHR(st.st_mode):
            self._open_device()
        elif stat.S_ISREG(st.st_mode):
            self._open_file()
        else:
            raise CollectorError(f"{self._path} is neither a character device nor a file")

    def _open_device(self) -> None:
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError as exc:
            raise SourceMissing(f"{self._path} does not exist") from exc
        except PermissionError as exc:
            raise self._permission_error(device=True) from exc
        except OSError as exc:
            raise CollectorError(f"cannot open {self._path}: {exc.strerror}") from exc
        if self._start_at_end and not self._opened_before:
            os.lseek(fd, 0, os.SEEK_END)
        self._fd = fd
        self._opened_before = True

    def _open_file(self) -> None:
        try:
            handle = open(self._path, "rb")  # noqa: SIM115 - held open across cycles
        except FileNotFoundError as exc:
            raise SourceMissing(f"{self._path} does not exist") from exc
        except PermissionError as exc:
            raise self._permission_error(device=False) from exc
        except OSError as exc:
            raise CollectorError(f"cannot open {self._path}: {exc.strerror}") from exc
        opened = os.fstat(handle.fileno())
        self._inode = (opened.st_dev, opened.st_ino)
        self._offset = opened.st_size if self._start_at_end and not self._opened_before else 0
        self._file = handle
        self._opened_before = True

    def _read_device(self, fd: int) -> list[KernelFault]:
        faults: list[KernelFault] = []
        for _ in range(self._max_lines):
            try:
                chunk = os.read(fd, _KMSG_READ_SIZE)
            except BlockingIOError:
                break
            except BrokenPipeError:
                # The ring buffer wrapped past our position; the next read continues
                # with the oldest record still there.
                if not self._overrun_warned:
                    logger.warning(
                        "%s: kernel log records were overwritten before they were read",
                        self._path,
                    )
                    self._overrun_warned = True
                continue
            except OSError as exc:
                raise CollectorError(f"cannot read {self._path}: {exc.strerror}") from exc
            if not chunk:
                break
            record = split_kmsg_record(chunk.decode("utf-8", errors="replace"))
            if record is None:
                continue
            if self._last_sequence is not None and record.sequence <= self._last_sequence:
                continue  # reopened after close(): this record was reported already
            self._last_sequence = record.sequence
            fault = self._parser.feed(record.text, record.kernel_time_seconds)
            if fault is not None:
                faults.append(fault)
        return faults

    def _read_file(self) -> list[KernelFault]:
        faults: list[KernelFault] = []
        try:
            st: os.stat_result | None = os.stat(self._path)
        except FileNotFoundError:
            st = None
        except PermissionError as exc:
            raise self._permission_error(device=False) from exc
        budget = self._max_lines
        rotated = st is None or (st.st_dev, st.st_ino) != self._inode
        if rotated:
            budget -= self._read_lines(budget, faults)
            if budget <= 0:
                return faults  # the rest of the old file first, next cycle
            self._close()
            if st is None:
                if faults:
                    return faults
                raise SourceMissing(f"{self._path} does not exist")
            self._open_file()
        elif st is not None and st.st_size < self._offset:
            self._offset = 0
        self._read_lines(budget, faults)
        return faults

    def _read_lines(self, budget: int, faults: list[KernelFault]) -> int:
        """Read up to ``budget`` whole lines from the offset; returns how many were read.

        A partial last line waits for its newline. A line longer than
        ``_MAX_LINE_BYTES`` is skipped, so one runaway line cannot fill memory.
        """
        handle = self._file
        if handle is None:
            return 0
        read = 0
        try:
            handle.seek(self._offset)
            while read < budget:
                raw = handle.readline(_MAX_LINE_BYTES)
                if not raw.endswith(b"\n") and len(raw) < _MAX_LINE_BYTES:
                    break
                read += 1
                self._offset += len(raw)
                if not raw.endswith(b"\n"):
                    self._offset += _skip_rest_of_line(handle)
                    continue
                fault = self._feed_line(raw.decode("utf-8", errors="replace"))
                if fault is not None:
                    faults.append(fault)
        except OSError as exc:
            raise CollectorError(f"cannot read {self._path}: {exc.strerror}") from exc
        return read

    def _feed_line(self, line: str) -> KernelFault | None:
        record = split_kmsg_record(line) if _KMSG_HEADER.match(line) else None
        if record is not None:
            return self._parser.feed(record.text, record.kernel_time_seconds)
        return self._parser.feed(line)
