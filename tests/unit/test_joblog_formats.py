"""The formats of job logs: CRI container logs and names, ``journalctl -o json`` entries."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import pytest

from sn_monitor.agent.joblogs.build import cri_decoders
from sn_monitor.agent.joblogs.cri import CriDecoder, parse_cri_line
from sn_monitor.agent.joblogs.journal import journal_lines, parse_journal_entry
from sn_monitor.agent.joblogs.lines import LineContext
from sn_monitor.agent.joblogs.paths import CriName, parse_cri_name
from sn_monitor.agent.joblogs.stats import SourceCounters
from tests.conftest import ROOT
from tests.support.joblogs import Files, append

CAPTURE = ROOT / "tests" / "fixtures" / "joblogs" / "journald" / "capture.json"
CONTAINER_ID = "4d8f0e5b0c2a" + "0" * 52
POD_LOG = f"train-worker-3_ml_pytorch-{CONTAINER_ID}.log"


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@pytest.mark.parametrize(("raw", "expected"), [
    (b"2016-10-06T00:17:09.669794202Z stdout F hello world",
     (_at("2016-10-06T00:17:09.669794+00:00"), "stdout", False, b"hello world")),
    (b"2016-10-06T00:17:10.113242941Z stderr P part ",
     (_at("2016-10-06T00:17:10.113242+00:00"), "stderr", True, b"part ")),
    (b"2024-03-01T10:00:00.000000001+08:00 stdout F x",
     (_at("2024-03-01T02:00:00+00:00"), "stdout", False, b"x")),
    (b"2016-10-06T00:17:09.669794202Z stdout F ", (_at("2016-10-06T00:17:09.669794+00:00"),
                                                   "stdout", False, b"")),
    (b"2016-10-06T00:17:09.669794202Z stdout F", (_at("2016-10-06T00:17:09.669794+00:00"),
                                                  "stdout", False, b"")),
])
def test_a_cri_line_is_read(raw: bytes, expected: tuple[float, str, bool, bytes]) -> None:
    line = parse_cri_line(raw)
    assert line is not None
    assert (line.logged_at, line.stream, line.partial, line.content) == pytest.approx(expected)


@pytest.mark.parametrize("raw", [
    b"plain text, not CRI",
    b"2016-10-06T00:17:09Z stdin F x",
    b"2016-10-06T00:17:09Z stdout X x",
    b"yesterday stdout F x",
    b"",
])
def test_a_line_not_in_the_cri_format_is_none(raw: bytes) -> None:
    assert parse_cri_line(raw) is None


def _decoder(max_line: int = 4096) -> tuple[CriDecoder, SourceCounters]:
    counters = SourceCounters()
    context = LineContext(kind="container", source="containers", origin="x.log")
    return CriDecoder(context, max_line, counters), counters


def test_partial_cri_lines_are_joined_per_stream() -> None:
    decoder, _ = _decoder()
    out = [decoder.decode(raw, False, 5.0) for raw in (
        b"2016-10-06T00:17:09.000000000Z stdout P first ",
        b"2016-10-06T00:17:09.100000000Z stderr F an error line",
        b"2016-10-06T00:17:09.200000000Z stdout P second ",
        b"2016-10-06T00:17:09.300000000Z stdout F third")]
    assert out[0] is None
    assert out[2] is None
    assert out[1] is not None
    assert (out[1].text, out[1].stream) == ("an error line", "stderr")
    joined = out[3]
    assert joined is not None
    assert (joined.text, joined.stream, joined.cut) == ("first second third", "stdout", False)
    assert joined.logged_at == pytest.approx(_at("2016-10-06T00:17:09+00:00"))
    assert joined.read_at == 5.0


def test_a_joined_cri_line_is_bounded() -> None:
    decoder, counters = _decoder(max_line=10)
    assert decoder.decode(b"2016-10-06T00:17:09Z stdout P 0123456", False, 0.0) is None
    assert decoder.decode(b"2016-10-06T00:17:09Z stdout P 789abc", False, 0.0) is None
    line = decoder.decode(b"2016-10-06T00:17:09Z stdout F def", False, 0.0)
    assert line is not None
    assert (line.text, line.cut) == ("0123456789", True)
    assert counters.dropped_bytes_too_long == 6


def test_an_unparsed_cri_line_is_counted() -> None:
    decoder, counters = _decoder()
    assert decoder.decode(b"not a CRI line", False, 0.0) is None
    assert counters.dropped_lines_unparsed == 1


def test_a_cri_name_gives_pod_namespace_container() -> None:
    assert parse_cri_name(f"/var/log/containers/{POD_LOG}") == CriName(
        "train-worker-3", "ml", "pytorch", CONTAINER_ID)
    cut = "a" * 200 + "_ns_c-" + "0123abcd"  # a name past 255 bytes is cut by the kubelet
    assert parse_cri_name(cut + ".log") == CriName("a" * 200, "ns", "c", "0123abcd")
    assert parse_cri_name("/var/log/containers/kube-proxy.log") is None
    assert parse_cri_name("/var/log/syslog") is None


def _pod_log(tmp_path: Path) -> tuple[Path, Path]:
    """A kubelet-style tree: the pod's 0.log and its link in containers/."""
    pod_dir = tmp_path / "pods" / "ml_train-worker-3_uid" / "pytorch"
    pod_dir.mkdir(parents=True)
    target = pod_dir / "0.log"
    append(target, "")
    containers = tmp_path / "containers"
    containers.mkdir()
    (containers / POD_LOG).symlink_to(target)
    (containers / "not-a-cri-name.log").symlink_to(target)
    return containers, target


def test_container_logs_are_followed_through_their_links(tmp_path: Path) -> None:
    containers, target = _pod_log(tmp_path)
    counters = SourceCounters()
    files = Files([str(containers / "*.log")], decoder_for=cri_decoders(4096, counters),
                  counters=counters)
    files.poll()
    append(target, "2016-10-06T00:17:09.669794202Z stdout F step 1 loss 2.3\n"
                   "2016-10-06T00:17:09.700000000Z stderr P NCCL WARN \n")
    assert files.poll() == ["step 1 loss 2.3"]
    append(target, "2016-10-06T00:17:09.800000000Z stderr F timeout\n")
    assert files.poll() == ["NCCL WARN timeout"]
    line = files.lines[-1]
    assert (line.context.pod, line.context.namespace, line.context.container) == (
        "train-worker-3", "ml", "pytorch")
    assert line.stream == "stderr"
    assert line.context.kind == "container"
    assert files.set.open_count == 1  # the same file under a name that is not CRI's: once


def test_the_kubelets_rotation_of_a_container_log_is_followed(tmp_path: Path) -> None:
    containers, target = _pod_log(tmp_path)
    counters = SourceCounters()
    files = Files([str(containers / "*.log")], decoder_for=cri_decoders(4096, counters),
                  counters=counters)
    files.poll()
    append(target, "2016-10-06T00:17:09Z stdout F before\n")
    os.rename(target, target.with_name("0.log.20161006-001710"))
    append(target, "2016-10-06T00:17:10Z stdout F after\n")
    assert files.later() == ["before", "after"]


def _capture() -> list[str]:
    return CAPTURE.read_text(encoding="utf-8").splitlines()


def test_captured_journalctl_json_is_read() -> None:
    entries = [parse_journal_entry(line) for line in _capture()]
    assert all(entry is not None for entry in entries)
    nccl = entries[2]
    assert nccl is not None
    assert "Watchdog caught collective operation timeout" in nccl.message
    assert nccl.cursor is not None
    assert nccl.cursor.startswith("s=ff6cc528")
    assert nccl.logged_at == pytest.approx(1796612530.619278)
    assert nccl.pid == 11464


def test_a_multiline_journal_message_is_a_line_each() -> None:
    entry = parse_journal_entry(_capture()[3])
    assert entry is not None
    context = LineContext(kind="journald", source="journald:train.service",
                          origin="train.service")
    lines, cut = journal_lines(entry, context, 7.0, 4096)
    assert [line.text for line in lines] == [
        "Traceback (most recent call last):", '  File "train.py", line 12, in <module>',
        "    main()", "RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert cut == 0
    assert {line.logged_at for line in lines} == {entry.logged_at}


def test_a_journal_message_that_is_not_utf8_is_decoded_with_replacement() -> None:
    entry = parse_journal_entry(_capture()[4])
    assert entry is not None
    assert entry.message == "loss \ufffd\ufffd 2.31 step 10"


def test_a_long_journal_line_is_cut() -> None:
    entry = parse_journal_entry('{"MESSAGE": "0123456789", "__CURSOR": "c"}')
    assert entry is not None
    context = LineContext(kind="journald", source="journald:u", origin="u")
    lines, cut = journal_lines(entry, context, 0.0, 4)
    assert [(line.text, line.cut) for line in lines] == [("0123", True)]
    assert cut == 6


@pytest.mark.parametrize("raw", [
    "", "not json", "[1, 2]", '{"MESSAGE": null}', '{"MESSAGE": 5}', '{"PRIORITY": "6"}',
    b'{"MESSAGE": "\xff"}',
])
def test_what_is_not_a_journal_entry_is_none(raw: str | bytes) -> None:
    assert parse_journal_entry(raw) is None


def test_a_field_written_twice_gives_its_first_value() -> None:
    entry = parse_journal_entry('{"MESSAGE": ["first", "second"], "_PID": ["12", "13"]}')
    assert entry is not None
    assert (entry.message, entry.pid) == ("first", 12)


