"""Kernel log parsing (XID, SXID, fallen off the bus) and the kmsg collector.

The line table uses lines in the shapes real drivers print them (from NVIDIA's driver
source comments, gpud's captured logs and tests, NVIDIA forum and GitHub reports).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sn_monitor.agent.collectors import kmsg
from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.collectors.kmsg import (
    KernelFault,
    KernelLogParser,
    KmsgCollector,
    parse_fallen_off_bus,
    parse_kernel_line,
    parse_sxid_line,
    parse_xid_line,
    split_kmsg_record,
    strip_dmesg_prefix,
)
from sn_monitor.clock import ManualClock

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernel-log"
RAW_NVSWITCH = FIXTURES / "dev-kmsg-raw-nvswitch.log"
ISO_XID_13_43 = FIXTURES / "dmesg-iso-xid-13-43-oom.log"
CTIME_XID_119 = FIXTURES / "dmesg-xid-119-gsp-timeout.log"

needs_fixtures = pytest.mark.skipif(
    not FIXTURES.is_dir(), reason="tests/fixtures/kernel-log is missing"
)

XID = "xid"
SXID = "sxid"
OFF = "gpu_fallen_off_bus"

# (line, (kind, code, pci_bus_id, device)); None = no fault on this line.
Expected = tuple[str, int | None, str | None, str | None]
LINES: list[tuple[str, Expected | None]] = [
    # Xid 79, with and without pid/name, in the shapes of several driver versions.
    (
        "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.",
        (XID, 79, "0000:18:00.0", None),
    ),
    (
        "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.",
        (XID, 79, "0000:91:00.0", None),
    ),
    (
        "NVRM: Xid (PCI:0000:04:00): 79, GPU has fallen off the bus",
        (XID, 79, "0000:04:00.0", None),
    ),
    (
        "NVRM: Xid (PCI:0000:b3:00.0): 79, GPU has fallen off the bus and is not responding "
        "to commands.",
        (XID, 79, "0000:b3:00.0", None),
    ),
    # Without the PCI: prefix (older drivers).
    (
        "NVRM: Xid (0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception on "
        "(GPC 0, TPC 1, SM 0): Out Of Range Address",
        (XID, 13, "0000:3b:00.0", None),
    ),
    # dmesg -T, with the GSP RPC timeout.
    (
        "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, "
        "name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! "
        "Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
        (XID, 119, "0000:9b:00.0", None),
    ),
    (
        "NVRM: Xid (PCI:0000:9a:00): 119, pid='<unknown>', name=<unknown>, Timeout after 6s "
        "of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
        "(0x20801813 0x4c).",
        (XID, 119, "0000:9a:00.0", None),
    ),
    # Double bit ECC error.
    (
        "NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable double bit error (DBE) has been "
        "detected on GPU in the framebuffer at partition 6, subpartition 0.",
        (XID, 48, "0000:18:00.0", None),
    ),
    # Contained / uncontained ECC (Ampere+), plain and under MIG.
    (
        "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). "
        "RST: No, D-RST: No",
        (XID, 94, "0000:01:00.0", None),
    ),
    (
        "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). "
        "RST: No, D-RST: No",
        (XID, 94, "0000:01:00.0", None),
    ),
    (
        "NVRM: Xid (PCI:0000:37:00): 95, pid=5171, Uncontained: FBHUB. RST: Yes, D-RST: No",
        (XID, 95, "0000:37:00.0", None),
    ),
    # Row remapping, via syslog and journald.
    (
        "May 19 07:08:57 ip-26-0-146-100 kernel: [680111.646286] NVRM: Xid (PCI:0000:10:1c): "
        "63, pid=1850, Row Remapper: New row marked for remapping, reset gpu to activate",
        (XID, 63, "0000:10:1c.0", None),
    ),
    (
        "[2397166.923949] NVRM: Xid (PCI:0000:0f:00): 64, pid='<unknown>', name=<unknown>, "
        "Row Remapper Error: (0x00000002eebc4100) - All reserved rows for bank are remapped",
        (XID, 64, "0000:0f:00.0", None),
    ),
    # NVLink (Hopper) on a non-zero PCI domain (Grace Hopper).
    (
        "[449410.332316] NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, "
        "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        (XID, 74, "0003:00:00.0", None),
    ),
    # NVLink5 (Blackwell) Xid 144-150 with unit, severity, link and registers.
    (
        "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 "
        "0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",
        (XID, 144, "0000:01:00.0", None),
    ),
    (
        "NVRM: Xid (PCI:0000:05:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 12 (0x00000004 "
        "0x00000000 0x00000000 0x00000000)",
        (XID, 145, "0000:05:00.0", None),
    ),
    (
        "NVRM: Xid (PCI:0000:00:1e): 146, TLW_RX_PIPE1 Nonfatal XC0 i0 Link 03 (0x00000010 "
        "0x00000020 0x00000030 0x00000040)",
        (XID, 146, "0000:00:1e.0", None),
    ),
    (
        "kernel: NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 "
        "(0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        (XID, 149, "0000:00:00.0", None),
    ),
    (
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 "
        "0x00000000 0x00000000 0x00000000 0x00000000)",
        (XID, 149, "0019:01:00.0", None),
    ),
    # dmesg --decode --time-format iso.
    (
        "kern  :warn  : 2025-01-21T04:41:44,287197+00:00 NVRM: Xid (PCI:0000:38:00): 43, "
        "pid=2924364, name=pt_main_thread, Ch 00000008",
        (XID, 43, "0000:38:00.0", None),
    ),
    # NVSwitch SXids.
    (
        "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 47 egress "
        "non-posted PRIV error (First)",
        (SXID, 12028, "0000:86:00.0", "nvidia-nvswitch3"),
    ),
    (
        "[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 40 "
        "LTSSM Fault Up",
        (SXID, 20034, "0000:05:00.0", "nvidia-nvswitch0"),
    ),
    (
        "kernel: [123.456791] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 "
        "sourcetrack timeout error",
        (SXID, 24007, "0000:c3:00.0", "nvidia-nvswitch0"),
    ),
    (
        "SXid (PCI:0000:ab:00.0): 22013, Non-fatal, Link 12 SAW_MVB error",
        (SXID, 22013, "0000:ab:00.0", None),
    ),
    # The detail lines after an SXid are part of the same report.
    (
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Severity 0 Engine instance 46 "
        "Sub-engine instance 00",
        None,
    ),
    (
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Data {0x00140004, 0x00100000, "
        "0x00140004, 0x00000000}",
        None,
    ),
    # The driver's own "fallen off the bus" sentences.
    (
        "[6781741.548783] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        (OFF, None, "0000:91:00.0", None),
    ),
    (
        "NVRM: The NVIDIA GPU 0000:0e:00.0 (PCI ID: 10de:1b06) installed in this system has "
        "fallen off the bus and is not responding to commands.",
        (OFF, None, "0000:0e:00.0", None),
    ),
    # Lines around faults that are not faults.
    (
        "NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d",
        None,
    ),
    ("NVRM: GPU Board Serial Number: 1650124014249", None),
    (
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024",
        None,
    ),
    (
        "NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of "
        "every 30).  The GPU likely needs to be reset.",
        None,
    ),
    ("NVRM: GPU4 RPC history (CPU -> GSP):", None),
    ("nvidia-nvswitch2: open (major=510)", None),
    (
        "python[4412]: grep found NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
        None,
    ),
    ('audit: type=1400 comm="xid-checker" Xid 13 seen', None),
    (
        "Memory cgroup out of memory: Killed process 51807 (oxide) total-vm:123kB",
        None,
    ),
    ("Out of memory: Killed process 123, UID 48, (httpd).", None),
    (
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=x.scope,mems_allowed=0-1",
        None,
    ),
    ("", None),
]


@pytest.mark.parametrize(("line", "expected"), LINES)
def test_parse_kernel_line_table(line: str, expected: Expected | None) -> None:
    fault = parse_kernel_line(line)
    if expected is None:
        assert fault is None
        return
    assert fault is not None
    assert (fault.kind, fault.code, fault.pci_bus_id, fault.device) == expected
    assert fault.message


def test_xid_fields_pid_name_and_message() -> None:
    xid = parse_xid_line(
        "NVRM: Xid (PCI:0000:38:00): 43, pid=2924364, name=pt_main_thread, Ch 00000008"
    )
    assert xid is not None
    assert xid.pid == 2924364
    assert xid.process_name == "pt_main_thread"
    assert xid.message == "pid=2924364, name=pt_main_thread, Ch 00000008"
    assert xid.description == "Ch 00000008"
    assert xid.link is None
    assert xid.fatal is None


@pytest.mark.parametrize("pid", ["'<unknown>'", "<unknown>", "<n/a>", "...", "\u00b2"])
def test_xid_unknown_pid_is_none(pid: str) -> None:
    xid = parse_xid_line(f"NVRM: Xid (PCI:0000:3b:00): 13, pid={pid}, name=<unknown>, Boom")
    assert xid is not None
    assert xid.pid is None
    assert xid.process_name is None
    assert xid.description == "Boom"


@pytest.mark.parametrize(
    ("line", "link", "fatal"),
    [
        (
            "NVRM: Xid (PCI:0000:05:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 12 (0x00000004 "
            "0x00000000)",
            12,
            False,
        ),
        (
            "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6)",
            0,
            True,
        ),
        ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406)", None, True),
        (
            "NVRM: Xid (PCI:0000:b9:00): 145, RLW, nonfatal, cross-contain=0, injected=0, "
            "Link 3 (0x00000004 0x00000001)",
            3,
            False,
        ),
        (
            "NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal "
            "error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
            14,
            None,
        ),
    ],
)
def test_xid_nvlink_link_and_severity(line: str, link: int | None, fatal: bool | None) -> None:
    xid = parse_xid_line(line)
    assert xid is not None
    assert xid.link == link
    assert xid.fatal is fatal


def test_xid_message_is_everything_after_the_code() -> None:
    line = (
        "NVRM: Xid (PCI:0000:05:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 12 "
        "(0x00000004 0x00000000 0x00000000 0x00000000)"
    )
    xid = parse_xid_line(line)
    assert xid is not None
    assert xid.message == line.split("145, ", 1)[1]


def test_sxid_fields() -> None:
    sxid = parse_sxid_line(
        "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 47 egress "
        "non-posted PRIV error (First)"
    )
    assert sxid is not None
    assert (sxid.code, sxid.fatal, sxid.link, sxid.device) == (
        12028,
        False,
        47,
        "nvidia-nvswitch3",
    )
    fatal = parse_sxid_line("SXid (PCI:0000:05:00.0): 20034, Fatal, Link 40 LTSSM Fault Up")
    assert fatal is not None
    assert (fatal.fatal, fatal.link, fatal.device, fatal.pci_bus_id) == (
        True,
        40,
        None,
        "0000:05:00.0",
    )


def test_an_xid_79_line_is_an_xid_not_the_drivers_sentence() -> None:
    """NVML reports the same XID 79: both sources must name it alike, or the rule that
    fires would depend on which one the agent read first."""
    assert parse_fallen_off_bus("NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, Boom") is None
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    assert parse_fallen_off_bus(line) is None
    fault = parse_kernel_line(line)
    assert fault is not None
    assert (fault.kind, fault.code, fault.pci_bus_id) == ("xid", 79, "0000:3b:00.0")


@pytest.mark.parametrize(
    ("line", "text", "kernel_time"),
    [
        ("[  123.456789] NVRM: hi", "NVRM: hi", 123.456789),
        ("[Mon Jan  8 12:34:56 2024] NVRM: hi", "NVRM: hi", None),
        ("2024-05-13T10:24:32,123456+00:00 NVRM: hi", "NVRM: hi", None),
        ("kern  :warn  : [  123.456] NVRM: hi", "NVRM: hi", 123.456),
        ("kern  :err   : 2025-01-21T04:41:44,283302+00:00 NVRM: hi", "NVRM: hi", None),
        ("kernel: NVRM: hi", "NVRM: hi", None),
        ("Aug 10 15:36:05 gpu-node-a kernel: NVRM: hi", "NVRM: hi", None),
        ("May  9 07:08:57 host kernel: [680111.646286] NVRM: hi", "NVRM: hi", 680111.646286),
        ("Aug 10 15:36:05.123456 node kernel: NVRM: hi", "NVRM: hi", None),
        ("2025-01-21T04:41:44+0000 gpu-node-a kernel: NVRM: hi", "NVRM: hi", None),
        ("<4>[   12.5] NVRM: hi", "NVRM: hi", 12.5),
        ("               NVRM: (PCI ID: 10de:26b5) has", "NVRM: (PCI ID: 10de:26b5) has", None),
        ("NVRM: hi\n", "NVRM: hi", None),
    ],
)
def test_strip_dmesg_prefix(line: str, text: str, kernel_time: float | None) -> None:
    assert strip_dmesg_prefix(line) == (text, kernel_time)


def test_split_kmsg_record_with_dictionary() -> None:
    record = split_kmsg_record(
        "3,1502,6781741548779,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n"
    )
    assert record is not None
    assert (record.priority, record.level, record.facility) == (3, 3, 0)
    assert record.sequence == 1502
    assert record.kernel_time_seconds == pytest.approx(6781741.548779)
    assert record.flags == "-"
    assert record.text.startswith("NVRM: Xid (PCI:0000:18:00): 79,")
    assert record.fields == (("SUBSYSTEM", "pci"), ("DEVICE", "+pci:0000:18:00.0"))


def test_split_kmsg_record_unescapes_and_accepts_extra_header_fields() -> None:
    record = split_kmsg_record("12,7,5000000,c,caller=T1;a\\x5cb\\x0ac\n")
    assert record is not None
    assert record.facility == 1
    assert record.flags == "c"
    assert record.kernel_time_seconds == 5.0
    assert record.text == "a\\b\nc"


@pytest.mark.parametrize(
    "raw", ["", "hello", "6,x,1,-;text", "[  1.0] NVRM: hi", " SUBSYSTEM=pci", "6,1;text"]
)
def test_split_kmsg_record_rejects_other_text(raw: str) -> None:
    assert split_kmsg_record(raw) is None


def test_multiline_fallen_off_bus_record_from_kmsg() -> None:
    record = split_kmsg_record(
        "3,812,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) "
        "installed in this system has\\x0aNVRM: fallen off the bus and is not responding to "
        "commands.\\x0a\n"
    )
    assert record is not None
    fault = KernelLogParser().feed(record.text, record.kernel_time_seconds)
    assert fault == KernelFault(
        kind="gpu_fallen_off_bus",
        message="The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system "
        "has fallen off the bus and is not responding to commands.",
        pci_bus_id="0000:b3:00.0",
        kernel_time_seconds=1843.308145,
    )


def test_multiline_fallen_off_bus_from_dmesg_lines_is_one_event() -> None:
    parser = KernelLogParser()
    lines = [
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "               NVRM: fallen off the bus and is not responding to commands.",
        "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).",
    ]
    faults = [f for f in (parser.feed(line) for line in lines) if f is not None]
    assert len(faults) == 1
    assert faults[0].kind == "gpu_fallen_off_bus"
    assert faults[0].pci_bus_id == "0000:b3:00.0"
    assert faults[0].kernel_time_seconds == 1843.308145


def test_fallen_off_bus_told_twice_is_one_event() -> None:
    parser = KernelLogParser()
    lines = [
        "[6781741.548768] NVRM: GPU at PCI:0000:91:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
        "[6781741.548776] NVRM: GPU Board Serial Number: 1653723052734",
        "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.",
        "[6781741.548783] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        "[6781741.548786] NVRM: GPU 0000:91:00.0: GPU serial number is 1653723052734.",
        "[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 40 "
        "LTSSM Fault Up",
    ]
    faults = [f for f in (parser.feed(line) for line in lines) if f is not None]
    assert [(f.kind, f.code, f.pci_bus_id) for f in faults] == [
        ("xid", 79, "0000:91:00.0"),
        ("sxid", 20034, "0000:06:00.0"),
    ]
    assert faults[0].kernel_time_seconds == 6781741.548779


def test_the_drivers_sentence_alone_is_a_fall_off_the_bus_and_xid_79s_are_never_dropped(
) -> None:
    parser = KernelLogParser()
    lines = [
        "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
        "the bus.",
        "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
        "the bus.",
        "NVRM: GPU 0000:92:00.0: GPU has fallen off the bus.",
    ]
    faults = [f for f in (parser.feed(line) for line in lines) if f is not None]
    assert [(f.kind, f.code, f.pci_bus_id) for f in faults] == [
        ("gpu_fallen_off_bus", None, "0000:91:00.0"),
        ("xid", 79, "0000:91:00.0"),
        ("xid", 79, "0000:91:00.0"),
        ("gpu_fallen_off_bus", None, "0000:92:00.0"),
    ]


def test_an_xid_ends_an_unfinished_fallen_off_bus_record() -> None:
    parser = KernelLogParser()
    assert parser.feed("NVRM: The NVIDIA GPU 0000:b3:00.0") is None
    fault = parser.feed("NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error")
    assert fault is not None
    assert (fault.kind, fault.code) == ("xid", 48)


def test_sxid_report_with_detail_lines_is_one_event() -> None:
    parser = KernelLogParser()
    lines = [
        "[ 8812.100200] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS "
        "crumbstore MCTO (First)",
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Severity 0 Engine instance 46 "
        "Sub-engine instance 00",
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Data {0x00140004, 0x00100000}",
    ]
    faults = [f for f in (parser.feed(line) for line in lines) if f is not None]
    assert [(f.kind, f.code, f.device) for f in faults] == [("sxid", 28006, "nvidia-nvswitch3")]


# ---------------------------------------------------------------------------
# The shared fixtures, end to end through the collector


def _collect_all(path: Path) -> list[object]:
    collector = KmsgCollector(path, ManualClock(), start_at_end=False)
    try:
        return list(collector.collect().events)
    finally:
        collector.close()


@needs_fixtures
def test_fixture_iso_xid_13_43_oom() -> None:
    collector = KmsgCollector(ISO_XID_13_43, ManualClock(100.0), start_at_end=False)
    events = collector.collect().events
    collector.close()
    assert [e.code for e in events] == [13] * 16 + [43]
    assert {e.kind for e in events} == {"xid"}
    assert {e.pci_bus_id for e in events} == {"0000:38:00.0"}
    assert {e.source for e in events} == {"kmsg"}
    assert {e.time_seconds for e in events} == {100.0}
    assert all(e.gpu is None and e.kernel_time_seconds is None for e in events)
    assert events[-1].message == "pid=2924364, name=pt_main_thread, Ch 00000008"


@needs_fixtures
def test_fixture_xid_119_gsp_timeout() -> None:
    collector = KmsgCollector(CTIME_XID_119, ManualClock(), start_at_end=False)
    events = collector.collect().events
    collector.close()
    assert [(e.kind, e.code, e.pci_bus_id) for e in events] == [("xid", 119, "0000:9b:00.0")] * 5
    assert "Expected function 103 (GSP_RM_ALLOC)" in events[0].message


@needs_fixtures
def test_fixture_xid_119_rpc_history_dump_is_one_event() -> None:
    lines = CTIME_XID_119.read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if "</TASK>" in line)
    parser = KernelLogParser()
    faults = [f for f in (parser.feed(line) for line in lines[: end + 1]) if f is not None]
    assert len(faults) == 1
    assert faults[0].code == 119


@needs_fixtures
def test_fixture_raw_kmsg_records() -> None:
    lines = RAW_NVSWITCH.read_text().splitlines()
    records = [split_kmsg_record(line) for line in lines]
    assert len(records) == 47
    assert all(r is not None for r in records)
    first, last = records[0], records[-1]
    assert first is not None
    assert last is not None
    assert (first.sequence, first.kernel_time_seconds, first.level) == (3964, 206.764307, 6)
    assert first.text == "nvidia-nvswitch2: open (major=510)"
    assert last.sequence == 4010
    assert [r.sequence for r in records if r is not None] == list(range(3964, 4011))
    assert all(parse_kernel_line(r.text) is None for r in records if r is not None)
    assert _collect_all(RAW_NVSWITCH) == []


@needs_fixtures
def test_raw_kmsg_file_gives_kernel_time(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.log"
    path.write_bytes(RAW_NVSWITCH.read_bytes() + b"\n")
    collector = KmsgCollector(path, ManualClock(), start_at_end=True)
    assert collector.collect().events == ()
    with path.open("a") as f:
        f.write(
            "3,4011,57700000000,-;nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, "
            "Non-fatal, Link 47 egress non-posted PRIV error (First)\n"
        )
    (event,) = collector.collect().events
    collector.close()
    assert (event.kind, event.code, event.device) == ("sxid", 12028, "nvidia-nvswitch3")
    assert event.kernel_time_seconds == 57700.0


# ---------------------------------------------------------------------------
# File-follow mode

XID_13 = "[  100.5] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, Graphics Exception\n"
XID_79 = "[  101.0] NVRM: Xid (PCI:0000:3c:00): 79, pid=1, name=a, GPU has fallen off the bus.\n"
NOISE = "[  100.6] IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready\n"


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def test_follow_starts_at_end_and_reads_appends(tmp_path: Path) -> None:
    path = tmp_path / "dmesg.log"
    path.write_text(XID_13 + NOISE)
    clock = ManualClock(1000.0)
    collector = KmsgCollector(path, clock)
    assert collector.collect().events == ()
    _append(path, NOISE + XID_13)
    clock.advance(1.0)
    (event,) = collector.collect().events
    assert (event.kind, event.code, event.pci_bus_id) == ("xid", 13, "0000:3b:00.0")
    assert event.time_seconds == 1001.0
    assert event.kernel_time_seconds == 100.5
    assert collector.collect().events == ()
    collector.close()


def test_follow_from_start_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "dmesg.log"
    path.write_text(XID_13 + NOISE + XID_79)
    collector = KmsgCollector(path, ManualClock(), start_at_end=False)
    events = collector.collect().events
    collector.close()
    assert [(e.kind, e.code) for e in events] == [("xid", 13), ("xid", 79)]


def test_follow_waits_for_a_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "dmesg.log"
    path.write_text("")
    collector = KmsgCollector(path, ManualClock())
    assert collector.collect().events == ()
    _append(path, XID_13[:30])
    assert collector.collect().events == ()
    _append(path, XID_13[30:])
    (event,) = collector.collect().events
    assert event.code == 13
    collector.close()


def test_follow_truncation_reads_from_start(tmp_path: Path) -> None:
    path = tmp_path / "dmesg.log"
    path.write_text(NOISE * 5)
    collector = KmsgCollector(path, ManualClock())
    assert collector.collect().events == ()
    path.write_text(XID_79)
    (event,) = collector.collect().events
    assert (event.kind, event.code, event.pci_bus_id) == ("xid", 79, "0000:3c:00.0")
    collector.close()


def test_follow_rotation_drains_old_file_then_reads_new_from_start(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(NOISE)
    collector = KmsgCollector(path, ManualClock())
    assert collector.collect().events == ()
    _append(path, XID_13)
    path.rename(tmp_path / "kern.log.1")
    path.write_text(XID_79)
    events = collector.collect().events
    assert [e.code for e in events] == [13, 79]
    collector.close()


def test_follow_rotated_away_then_recreated(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text(NOISE)
    collector = KmsgCollector(path, ManualClock())
    collector.collect()
    path.rename(tmp_path / "kern.log.1")
    with pytest.raises(SourceMissing):
        collector.collect()
    path.write_text(XID_13)
    (event,) = collector.collect().events
    assert event.code == 13
    collector.close()


def test_follow_reads_at_most_max_lines_per_collect(tmp_path: Path) -> None:
    path = tmp_path / "dmesg.log"
    path.write_text(XID_13 * 5)
    collector = KmsgCollector(path, ManualClock(), start_at_end=False, max_lines_per_collect=2)
    counts = [len(collector.collect().events) for _ in range(4)]
    collector.close()
    assert counts == [2, 2, 1, 0]


def test_follow_skips_an_overlong_line(tmp_path: Path) -> None:
    path = tmp_path / "dmesg.log"
    path.write_text("")
    collector = KmsgCollector(path, ManualClock())
    collector.collect()
    _append(path, "x" * 200_000 + "\n" + XID_13)
    events = collector.collect().events
    collector.close()
    assert [e.code for e in events] == [13]


def test_follow_rotation_shares_the_line_budget(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_text("")
    collector = KmsgCollector(path, ManualClock(), max_lines_per_collect=2)
    collector.collect()
    _append(path, XID_13 * 3)
    path.rename(tmp_path / "kern.log.1")
    path.write_text(XID_79)
    counts = [[e.code for e in collector.collect().events] for _ in range(3)]
    collector.close()
    assert counts == [[13, 13], [13, 79], []]


def test_missing_path_is_source_missing(tmp_path: Path) -> None:
    collector = KmsgCollector(tmp_path / "nope", ManualClock())
    with pytest.raises(SourceMissing):
        collector.collect()


def test_directory_is_a_collector_error(tmp_path: Path) -> None:
    collector = KmsgCollector(tmp_path, ManualClock())
    with pytest.raises(CollectorError, match="neither"):
        collector.collect()


def test_collector_name() -> None:
    assert KmsgCollector(Path("/nonexistent"), ManualClock()).name == "kmsg"


# ---------------------------------------------------------------------------
# Character-device mode, on /dev/null with scripted reads

DEV_NULL = Path("/dev/null")
needs_dev_null = pytest.mark.skipif(not DEV_NULL.is_char_device(), reason="no /dev/null")


@needs_dev_null
def test_device_reads_records_until_eagain_and_survives_epipe(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    script: list[bytes | OSError] = [
        b"6,1,1000000,-;nvidia-nvswitch2: open (major=510)\n",
        BrokenPipeError(errno.EPIPE, "overwritten"),
        b"4,9,2500000,-;NVRM: Xid (PCI:0000:18:00): 48, An uncorrectable double bit error\n"
        b" SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n",
        BrokenPipeError(errno.EPIPE, "overwritten"),
        BlockingIOError(errno.EAGAIN, "again"),
        b"4,10,3000000,-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a, Boom\n",
        BlockingIOError(errno.EAGAIN, "again"),
    ]

    def fake_read(fd: int, size: int) -> bytes:
        item = script.pop(0)
        if isinstance(item, OSError):
            raise item
        return item

    collector = KmsgCollector(DEV_NULL, ManualClock(5.0))
    monkeypatch.setattr(os, "read", fake_read)
    with caplog.at_level("WARNING", logger=kmsg.__name__):
        first = collector.collect().events
        second = collector.collect().events
    collector.close()
    assert [(e.code, e.kernel_time_seconds, e.time_seconds) for e in first] == [(48, 2.5, 5.0)]
    assert [e.code for e in second] == [13]
    assert script == []
    assert len([r for r in caplog.records if "overwritten" in r.getMessage()]) == 1


@needs_dev_null
def test_device_reopened_after_close_skips_records_already_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    xid = b"4,%d,1000000,-;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a, Boom\n"
    again = BlockingIOError(errno.EAGAIN, "again")
    script: list[bytes | OSError] = [xid % 1, xid % 2, again, xid % 1, xid % 2, xid % 3, again]

    def fake_read(fd: int, size: int) -> bytes:
        item = script.pop(0)
        if isinstance(item, OSError):
            raise item
        return item

    collector = KmsgCollector(DEV_NULL, ManualClock(), start_at_end=False)
    monkeypatch.setattr(os, "read", fake_read)
    assert len(collector.collect().events) == 2
    collector.close()
    assert len(collector.collect().events) == 1
    collector.close()


@needs_dev_null
def test_device_permission_denied_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    def deny(path: object, flags: int) -> int:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "open", deny)
    collector = KmsgCollector(DEV_NULL, ManualClock())
    with pytest.raises(CollectorError, match="permission denied; run as root or grant CAP_SYSLOG"):
        collector.collect()


@needs_dev_null
def test_device_empty_read_ends_the_cycle() -> None:
    collector = KmsgCollector(DEV_NULL, ManualClock())
    assert collector.collect().events == ()
    collector.close()


def test_max_lines_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        KmsgCollector(Path("/dev/kmsg"), ManualClock(), max_lines_per_collect=0)


# ---------------------------------------------------------------------------
# Robustness


@given(st.text())
def test_parse_kernel_line_never_raises(text: str) -> None:
    parse_kernel_line(text)
    split_kmsg_record(text)


@given(st.lists(st.text(), max_size=20))
def test_stream_parser_never_raises(lines: list[str]) -> None:
    parser = KernelLogParser()
    for line in lines:
        parser.feed(line)


@given(
    st.sampled_from(
        [
            "NVRM: Xid (",
            "nvidia-nvswitch0: SXid (",
            "NVRM: GPU ",
            "NVRM: The NVIDIA GPU ",
            "6,1,2,-;",
        ]
    ),
    st.text(alphabet="0123456789abcdefPCI:.(), -'<>=\n\\x", max_size=60),
)
def test_parsers_never_raise_on_near_misses(head: str, tail: str) -> None:
    parse_kernel_line(head + tail)
    split_kmsg_record(head + tail)
    KernelLogParser().feed(head + tail)
