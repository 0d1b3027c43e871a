"""The JSON-lines file: whole lines, rotation bounded by size and count, a queue never waiting."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from sn_monitor.joblog.jsonlines import LineQueue, RotatingFile


def line(number: int) -> bytes:
    return (json.dumps({"n": number, "message": "x" * 40}) + "\n").encode()


def files_of(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + "*"))


def test_rotation_keeps_at_most_keep_files_each_within_max_bytes(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "joblog.ndjson"
    out = RotatingFile(path, max_bytes=500, keep=2)
    for number in range(100):
        out.append(line(number))
    out.close()
    assert [p.name for p in files_of(path)] == [
        "joblog.ndjson", "joblog.ndjson.1", "joblog.ndjson.2"]
    assert all(p.stat().st_size <= 500 for p in files_of(path))
    kept = [json.loads(text)["n"] for p in (path.with_name("joblog.ndjson.2"),
                                            path.with_name("joblog.ndjson.1"), path)
            for text in p.read_text().splitlines()]
    assert kept == list(range(100 - len(kept), 100))  # the newest, in order, whole


def test_keep_zero_starts_the_file_again(tmp_path: Path) -> None:
    path = tmp_path / "j.ndjson"
    out = RotatingFile(path, max_bytes=200, keep=0)
    for number in range(10):
        out.append(line(number))
    assert files_of(path) == [path]
    assert path.stat().st_size <= 200


def test_a_line_longer_than_max_bytes_is_written_whole_in_a_file_of_its_own(
        tmp_path: Path) -> None:
    path = tmp_path / "j.ndjson"
    out = RotatingFile(path, max_bytes=60, keep=3)
    out.append(b"short\n")
    out.append(b"y" * 100 + b"\n")
    out.append(b"after\n")
    assert path.with_name("j.ndjson.2").read_bytes() == b"short\n"
    assert path.with_name("j.ndjson.1").read_bytes() == b"y" * 100 + b"\n"
    assert path.read_bytes() == b"after\n"


def test_an_existing_file_counts_towards_its_size(tmp_path: Path) -> None:
    path = tmp_path / "j.ndjson"
    path.write_bytes(b"z" * 90 + b"\n")
    out = RotatingFile(path, max_bytes=100, keep=1)
    out.append(b"0123456789\n")
    assert path.read_bytes() == b"0123456789\n"
    assert path.with_name("j.ndjson.1").read_bytes() == b"z" * 90 + b"\n"


def test_a_full_queue_drops_new_lines_and_counts_them(tmp_path: Path) -> None:
    queue = LineQueue(RotatingFile(tmp_path / "j", max_bytes=1 << 20, keep=1), capacity=3)
    assert [queue.offer(line(n)) for n in range(5)] == [True, True, True, False, False]
    assert queue.drain() == 3
    assert (queue.counts.written, queue.counts.dropped) == (3, 2)
    assert [json.loads(t)["n"] for t in (tmp_path / "j").read_text().splitlines()] == [0, 1, 2]


def test_the_writer_thread_writes_everything_queued_before_it_stops(tmp_path: Path) -> None:
    queue = LineQueue(RotatingFile(tmp_path / "j", max_bytes=1 << 20, keep=1), capacity=1000)
    queue.start()
    for number in range(500):
        assert queue.offer(line(number))
    assert queue.stop(timeout=30.0)
    assert len((tmp_path / "j").read_text().splitlines()) == 500 == queue.counts.written


def test_a_disk_that_refuses_is_counted_and_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "j").mkdir()  # the path is a directory: every open fails
    queue = LineQueue(RotatingFile(tmp_path / "j", max_bytes=1000, keep=1), capacity=10)
    for number in range(4):
        queue.offer(line(number))
    with caplog.at_level(logging.ERROR, logger="sn_monitor.joblog.jsonlines"):
        queue.drain()
    assert (queue.counts.written, queue.counts.failed) == (0, 4)
    assert len(caplog.records) == 1
    assert "cannot write" in caplog.records[0].getMessage()


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="max_bytes must be"):
        RotatingFile(Path("x"), max_bytes=0, keep=1)
    with pytest.raises(ValueError, match="capacity must be"):
        LineQueue(RotatingFile(Path("x"), max_bytes=1, keep=1), capacity=0)
