"""The job's log files: start, partial and long lines, rotation, truncation, rate, bounds."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sn_monitor.agent.joblogs.framing import PlainDecoder
from sn_monitor.agent.joblogs.lines import LineContext
from sn_monitor.agent.joblogs.paths import TORCHRUN_PATTERN, path_context
from tests.support.joblogs import Files, append, limits, truncate


def test_a_file_already_there_is_read_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "old 1\nold 2\n")
    files = Files([str(log)])
    assert files.poll() == []
    append(log, "new 1\n")
    assert files.poll() == ["new 1"]


def test_from_start_reads_what_is_there(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "old 1\nold 2\n")
    files = Files([str(log)], follow=limits(from_start=True))
    assert files.poll() == ["old 1", "old 2"]


def test_a_file_that_appears_later_is_read_from_its_start(tmp_path: Path) -> None:
    files = Files([str(tmp_path / "*.log")])
    assert files.poll() == []
    append(tmp_path / "rank1.log", "first\nsecond\n")
    assert files.poll() == []  # not rescanned yet
    assert files.later() == ["first", "second"]


def test_a_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "")
    files = Files([str(log)])
    files.poll()
    append(log, "step 1 loss 2.")
    assert files.poll() == []
    append(log, "31\r\nstep 2")
    assert files.poll() == ["step 1 loss 2.31"]
    append(log, "\n")
    assert files.poll() == ["step 2"]


def test_a_long_line_is_cut_and_the_rest_skipped(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "")
    files = Files([str(log)], follow=limits(max_line=8))
    files.poll()
    append(log, "0123456789abcdef\nshort\n")
    assert files.poll() == ["01234567", "short"]
    assert [line.cut for line in files.lines] == [True, False]
    assert files.counters.dropped_bytes_too_long == 8


def test_a_long_line_without_its_newline_is_cut_and_skipped_to_it(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "")
    files = Files([str(log)], follow=limits(max_line=8))
    files.poll()
    append(log, "0123456789")
    assert files.poll() == ["01234567"]
    append(log, "abcdef")
    assert files.poll() == []
    append(log, "gh\nnext\n")
    assert files.poll() == ["next"]
    assert files.counters.dropped_bytes_too_long == 2 + 6 + 3  # "89", "abcdef", "gh\n"


def test_bytes_that_are_not_utf8_are_replaced(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "")
    files = Files([str(log)])
    files.poll()
    append(log, b"loss \xff\xfe nan\n\x00\x01\n")
    assert files.poll() == ["loss \ufffd\ufffd nan", "\x00\x01"]


def test_rename_rotation_finishes_the_old_file_then_reads_the_new(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "")
    files = Files([str(log)])
    files.poll()
    with log.open("ab") as old:
        old.write(b"a\n")
        old.flush()
        log.rename(tmp_path / "train.log.1")
        append(log, "new 1\n")
        old.write(b"b (written after the rename)\n")
    assert files.later() == ["a", "b (written after the rename)", "new 1"]
    assert files.counters.rotations == 1
    assert files.set.open_count == 2
    files.later()
    assert files.set.open_count == 1  # the old one, at its end a rescan long, is closed


def test_a_renamed_file_the_glob_still_matches_is_not_read_twice(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "")
    files = Files([str(tmp_path / "train.log*")])
    files.poll()
    append(log, "a\n")
    log.rename(tmp_path / "train.log.1")
    append(log, "b\n")
    assert files.later() == ["a", "b"]
    append(tmp_path / "train.log.1", "c\n")
    assert files.later() == ["c"]
    assert files.counters.rotations == 0


def test_copytruncate_starts_over_and_is_counted(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "")
    files = Files([str(log)])
    files.poll()
    append(log, "a long line before the copy\n")
    assert files.poll() == ["a long line before the copy"]
    (tmp_path / "train.log.1").write_bytes(log.read_bytes())  # logrotate's copytruncate
    truncate(log)
    append(log, "after\n")
    assert files.poll() == ["after"]
    assert files.counters.truncations == 1


def test_a_partial_line_is_forgotten_when_the_file_is_truncated(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "")
    files = Files([str(log)])
    files.poll()
    append(log, "complete\nhalf of a li")
    assert files.poll() == ["complete"]
    truncate(log, 4)
    assert files.poll() == []
    append(log, "-start\n")
    assert files.poll() == ["comp-start"]
    assert files.counters.truncations == 1


def test_torchrun_log_dir_gives_the_local_rank_and_stream(tmp_path: Path) -> None:
    base = LineContext(kind="file", source="file:job", origin="", job="job")
    path = str(tmp_path / "run_abc" / "attempt_1" / "3" / "stderr.log")
    context = path_context(base, path, re.compile(TORCHRUN_PATTERN))
    assert (context.local_rank, context.rank, context.stream, context.node) == (
        3, None, "stderr", None)
    assert context.origin == path
    assert context.job == "job"


def test_a_rank_pattern_gives_rank_and_node(tmp_path: Path) -> None:
    base = LineContext(kind="file", source="file:job", origin="", job="job")
    pattern = re.compile(r"(?P<node>node-\d+)/rank-(?P<rank>\d+)\.log$")
    context = path_context(base, "/shared/logs/node-07/rank-12.log", pattern)
    assert (context.rank, context.node, context.local_rank) == (12, "node-07", None)
    assert path_context(base, "/shared/other.log", pattern) == base.__class__(
        kind="file", source="file:job", origin="/shared/other.log", job="job")


def test_lines_carry_the_context_of_their_path(tmp_path: Path) -> None:
    pattern = re.compile(TORCHRUN_PATTERN)
    base = LineContext(kind="file", source="file:job", origin="", job="job")
    worker = tmp_path / "run" / "attempt_0" / "5"
    worker.mkdir(parents=True)
    append(worker / "stdout.log", "step 1\n")
    files = Files([str(tmp_path / "run" / "attempt_*" / "*" / "std*.log")],
                  decoder_for=lambda p: PlainDecoder(path_context(base, p, pattern)),
                  follow=limits(from_start=True))
    assert files.poll() == ["step 1"]
    (line,) = files.lines
    assert (line.context.local_rank, line.stream, line.context.job) == (5, "stdout", "job")
    assert line.read_at == files.clock.time()
    assert line.logged_at is None


def test_over_its_rate_a_file_skips_its_oldest_bytes(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "")
    files = Files([str(log)], follow=limits(rate=100))
    files.poll()
    written = "".join(f"line {i:04}\n" for i in range(100))  # 10 bytes a line
    append(log, written)
    assert files.poll() == [f"line {i:04}" for i in range(90, 100)]  # the newest 100 bytes
    assert files.counters.dropped_bytes_rate == 900
    assert files.counters.bytes == 100
    append(log, "".join(f"line {i:04}\n" for i in range(100, 200)))
    got = files.later(0.5)  # 50 bytes refilled: the last 5 lines
    assert got == [f"line {i:04}" for i in range(195, 200)]
    assert files.counters.bytes + files.counters.dropped_bytes_rate == 2 * len(written)


def test_a_skip_that_lands_inside_a_line_drops_that_line(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    append(log, "")
    files = Files([str(log)], follow=limits(rate=15))
    files.poll()
    append(log, "line 0000\nline 0001\n")  # 20 bytes, 15 allowed: starts mid-line
    assert files.poll() == ["line 0001"]
    # 15 bytes read; 10 never handed on: 5 unread, 5 read ("0000\n", a line's end)
    assert (files.counters.bytes, files.counters.dropped_bytes_rate) == (15, 10)


def test_the_shared_rate_bounds_every_file_together(tmp_path: Path) -> None:
    files = Files([str(tmp_path / "*.log")], shared_rate=100)
    files.poll()
    for rank in range(3):
        append(tmp_path / f"{rank}.log", "".join(f"r{rank} {i:05}\n" for i in range(100)))
    got = files.later()
    assert files.counters.bytes == 100
    assert {text.split()[0] for text in got} == {"r0", "r1", "r2"}  # each its share
    assert files.counters.dropped_bytes_rate == 3 * 900 - len(got) * 9  # 9 bytes a line


def test_past_max_open_files_the_longest_idle_file_is_closed(tmp_path: Path) -> None:
    for name in ("a", "b"):
        append(tmp_path / f"{name}.log", "")
    files = Files([str(tmp_path / "*.log")], open_files=2)
    files.poll()
    assert files.set.open_count == 2
    append(tmp_path / "a.log", "a1\n")
    files.later(1.0)
    append(tmp_path / "c.log", "c1\n")
    assert files.later(1.0) == ["c1"]  # b, idle the longest, was closed for c
    assert files.open_files.count == 2
    append(tmp_path / "a.log", "a2\n")
    assert files.poll() == ["a2"]


def test_a_closed_file_that_grows_again_is_resumed_not_reread(tmp_path: Path) -> None:
    append(tmp_path / "a.log", "a0\n")
    files = Files([str(tmp_path / "*.log")], open_files=1)
    files.poll()
    append(tmp_path / "b.log", "b1\n")
    assert files.later() == ["b1"]  # a (at its end) made room for b
    append(tmp_path / "a.log", "a1\n")
    append(tmp_path / "b.log", "b2\n")
    # one slot, two growing files: they take turns, each resumed where it was left
    assert sorted(files.later() + files.later()) == ["a1", "b2"]
    assert files.later() == []


def test_a_fifo_or_directory_matched_by_the_glob_is_not_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.log")
    (tmp_path / "dir.log").mkdir()
    files = Files([str(tmp_path / "*.log")])
    assert files.poll() == []
    assert files.set.open_count == 0


def test_a_file_that_cannot_be_opened_is_warned_of_once_and_tried_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "train.log"
    append(log, "a\n")
    real_open = os.open

    def refuse(path: str, flags: int, *args: int) -> int:
        if path == str(log):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args)
    monkeypatch.setattr(os, "open", refuse)
    files = Files([str(log)], follow=limits(from_start=True))
    files.poll()
    files.later()
    monkeypatch.setattr(os, "open", real_open)
    assert files.later() == ["a"]  # readable now: read from its start, it was not there before
    warned = [r.levelname for r in caplog.records if "cannot open log" in r.getMessage()]
    assert warned.count("WARNING") == 1
