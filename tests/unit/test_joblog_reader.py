"""The job-log reader: its bounds, its settings, its thread, and journald through journalctl."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from sn_monitor.agent.joblogs.bounds import LineQueue, TokenBucket
from sn_monitor.agent.joblogs.build import build_reader, cursor_path, limits_of
from sn_monitor.agent.joblogs.fileset import OpenFiles
from sn_monitor.agent.joblogs.journalctl import RESTART_SECONDS, JournalUnit
from sn_monitor.agent.joblogs.lines import LineContext, LogLine
from sn_monitor.agent.joblogs.reader import THREAD_NAME, JobLogReader
from sn_monitor.agent.joblogs.stats import JobLogCounters, SourceCounters
from sn_monitor.agent.settings import (
    AgentSettings,
    JobLogSettings,
    JournaldLogSettings,
    agent_settings_from,
)
from sn_monitor.clock import ManualClock, SystemClock
from sn_monitor.config import ConfigError, bind, parse_yaml
from tests.conftest import ROOT
from tests.support.joblogs import append, fake_journalctl, limits, wait_for

CAPTURE = ROOT / "tests" / "fixtures" / "joblogs" / "journald" / "capture.json"
LAST_CURSOR = ("s=ff6cc5283a37461a827997208212515b;i=6;b=b34cd37441dd4ce4a6d49c5718162e7b;"
               "m=79ec84095;t=6620273afc518;x=47183fff53c333f")


def _line(text: str, source: str = "file:a") -> LogLine:
    return LogLine(LineContext(kind="file", source=source, origin="x"), text, 0.0)


def test_a_full_queue_drops_its_oldest_line_and_says_whose() -> None:
    dropped: list[str] = []
    queue = LineQueue(3, lambda line: dropped.append(line.text))
    for i in range(5):
        queue.put(_line(f"l{i}"))
    assert len(queue) == 3
    assert dropped == ["l0", "l1"]
    assert [line.text for line in queue.take(2)] == ["l2", "l3"]
    assert [line.text for line in queue.take(10)] == ["l4"]
    assert queue.take(10) == []


def test_a_token_bucket_refills_at_its_rate_up_to_its_capacity() -> None:
    clock = ManualClock()
    bucket = TokenBucket(100, 150, clock)
    assert bucket.available() == 150
    bucket.take(150)
    assert bucket.available() == 0
    clock.advance(0.5)
    assert bucket.available() == 50
    clock.advance(10)
    assert bucket.available() == 150
    bucket.take(1000)
    assert bucket.available() == 0


def test_job_logs_are_off_by_default_and_read_from_yaml() -> None:
    assert not AgentSettings().job_logs.enabled
    doc = parse_yaml("""
job_logs:
  enabled: true
  files:
    - {glob: /scratch/job-7/logs/attempt_*/*/std*.log, job: llama-7}
    - glob: /shared/logs/node-*/rank-*.log
      job: gpt
      rank_pattern: 'node-(?P<node>\\d+)/rank-(?P<rank>\\d+)\\.log$'
  containers: {enabled: true}
  journald: {units: [train.service]}
  max_bytes_per_second: 2097152
  poll_interval: 100ms
""", "agent.yaml")
    settings = agent_settings_from(doc).job_logs
    assert settings.enabled
    assert settings.files[1].job == "gpt"
    assert settings.containers.dir == "/var/log/containers"
    assert settings.journald.units == ["train.service"]
    assert (settings.max_bytes_per_second, settings.poll_interval) == (2097152, 0.1)


@pytest.mark.parametrize(("text", "message"), [
    ("job_logs: {files: [{job: x}]}", "missing required key 'glob'"),
    ("job_logs: {files: [{glob: x, rank_pattern: '('}]}", "invalid regular expression"),
    ("job_logs: {files: [{glob: x, rank_pattern: 'r(\\d+)'}]}", "names none of the groups"),
    ("job_logs: {max_line_bytes: 0}", "must be from 64 to 1048576 bytes"),
    ("job_logs: {journald: {units: ['']}}", "is not a systemd unit name"),
    ("job_logs: {queue_line: 5}", "did you mean queue_lines"),
])
def test_bad_job_log_settings_say_where(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        agent_settings_from(parse_yaml(text, "agent.yaml"))
    assert caught.value.line == 1


def _settings(tmp_path: Path, queue_lines: int = 8192) -> JobLogSettings:
    doc = parse_yaml(f"""
enabled: true
files: [{{glob: "{tmp_path}/job/attempt_*/*/std*.log", job: llama}}]
containers: {{enabled: true, dir: "{tmp_path}/containers"}}
queue_lines: {queue_lines}
from_start: true
""", "agent.yaml")
    return bind(JobLogSettings, doc)


def _job_tree(tmp_path: Path) -> None:
    worker = tmp_path / "job" / "attempt_0" / "1"
    worker.mkdir(parents=True)
    append(worker / "stderr.log", "[rank1]: RuntimeError: CUDA error: out of memory\n")
    (tmp_path / "containers").mkdir()
    append(tmp_path / "containers" / f"w-0_ml_pytorch-{'ab' * 32}.log",
           "2016-10-06T00:17:09.669794202Z stdout F step 3 loss 2.1\n")


def test_the_reader_polls_every_source_and_counts(tmp_path: Path) -> None:
    _job_tree(tmp_path)
    reader = build_reader(_settings(tmp_path), ManualClock())
    reader.poll_once()
    lines = reader.take(100)
    by_source = {line.context.source: line for line in lines}
    assert by_source["file:llama"].text == "[rank1]: RuntimeError: CUDA error: out of memory"
    assert by_source["file:llama"].context.local_rank == 1
    assert by_source["containers"].context.pod == "w-0"
    stats = reader.stats()
    assert stats.open_files == 2
    assert stats.queued_lines == 0
    llama = stats.source("file:llama")
    assert llama is not None
    assert (llama.lines, llama.bytes) == (1, 49)
    assert reader.stop(timeout=1.0)  # never started: closes the files
    assert reader.stats().open_files == 0


def test_lines_pushed_out_of_the_queue_are_counted_per_source(tmp_path: Path) -> None:
    _job_tree(tmp_path)
    append(tmp_path / "job" / "attempt_0" / "1" / "stderr.log", "two\nthree\n")
    reader = build_reader(_settings(tmp_path, queue_lines=2), ManualClock())
    reader.poll_once()
    assert len(reader.take(100)) == 2
    stats = reader.stats()
    assert sum(s.dropped_lines_queue for s in stats.sources) == 2
    assert sum(s.lines for s in stats.sources) == 4
    reader.close()


def test_the_thread_reads_and_stops(tmp_path: Path) -> None:
    _job_tree(tmp_path)
    reader = build_reader(_settings(tmp_path), SystemClock())
    reader.start()
    try:
        assert THREAD_NAME in {t.name for t in threading.enumerate()}
        got = wait_for(lambda: reader.take(100), "the first lines")
        append(tmp_path / "job" / "attempt_0" / "1" / "stderr.log", "later\n")

        def later_read() -> bool:
            # a take may still hold lines of the first read: gather until "later" comes
            got.extend(reader.take(100))
            return "later" in [line.text for line in got]
        wait_for(later_read, "the line written later")
    finally:
        assert reader.stop(timeout=30.0)
    assert THREAD_NAME not in {t.name for t in threading.enumerate()}
    assert reader.stats().open_files == 0
    assert reader.stats().cpu_seconds > 0


def _journal_unit(tmp_path: Path, clock: ManualClock, counters: SourceCounters,
                  cursor_file: Path | None = None) -> JournalUnit:
    context = LineContext(kind="journald", source="journald:train.service",
                          origin="train.service")
    return JournalUnit("train.service", context, counters, limits(), clock,
                       cursor_file=cursor_file)


@pytest.fixture
def journalctl_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in journalctl first on PATH; the file its arguments are written to."""
    bin_dir = tmp_path / "bin"
    fake_journalctl(bin_dir)
    argv_file = tmp_path / "argv"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_JOURNALCTL_ARGV", str(argv_file))
    monkeypatch.setenv("FAKE_JOURNALCTL_OUTPUT", str(CAPTURE))
    return argv_file


def test_a_unit_is_read_through_journalctl_and_resumed_after_its_cursor(
        tmp_path: Path, journalctl_on_path: Path) -> None:
    clock, counters = ManualClock(), SourceCounters()
    cursor_file = tmp_path / "state" / "train.service.cursor"
    unit = _journal_unit(tmp_path, clock, counters, cursor_file)
    lines: list[LogLine] = []

    def poll() -> int:
        unit.poll(TokenBucket(1 << 30, 1 << 30, clock), lines.append)
        return len(lines)
    # 6 entries, the traceback 4 lines: 9 lines; then journalctl exits (the stand-in does)
    wait_for(lambda: poll() >= 9 and unit.cursor == LAST_CURSOR, "the captured entries")
    assert lines[5].text == "    main()"
    assert lines[5].context.origin == "train.service"
    assert journalctl_on_path.read_text().splitlines() == [
        "--follow --output=json --no-pager --unit=train.service --lines=0"]
    wait_for(lambda: poll() == 9 and not unit.running, "journalctl's end")
    clock.advance(RESTART_SECONDS)
    wait_for(lambda: poll() >= 18, "the entries again, from the restarted journalctl")
    assert journalctl_on_path.read_text().splitlines()[1].endswith(
        f"--after-cursor={LAST_CURSOR}")
    unit.close()
    assert cursor_file.read_text().strip() == LAST_CURSOR
    again = _journal_unit(tmp_path, clock, SourceCounters(), cursor_file)
    assert again.argv()[-1] == f"--after-cursor={LAST_CURSOR}"  # an agent restart too
    assert counters.dropped_lines_unparsed == 0
    assert counters.bytes > 0


def test_journalctl_is_stopped_with_the_reader(
        tmp_path: Path, journalctl_on_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_JOURNALCTL_STAY", "1")
    settings = replace(JobLogSettings(), enabled=True,
                       journald=JournaldLogSettings(units=["train.service"]))
    reader = build_reader(settings, SystemClock(), state_dir=tmp_path / "state")
    reader.start()
    wait_for(lambda: reader.take(100), "lines from journalctl")
    assert reader.stop(timeout=5.0)
    assert cursor_path(tmp_path / "state", "train.service").read_text().strip() == LAST_CURSOR


def test_a_missing_journalctl_is_retried_not_fatal(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    context = LineContext(kind="journald", source="journald:u", origin="u")
    unit = JournalUnit("u", context, SourceCounters(), limits(), clock,
                       journalctl=str(tmp_path / "no-such-journalctl"))
    for _ in range(3):  # at 0 s, 5 s: two tries; at 9 s too early for a third
        unit.poll(TokenBucket(100, 100, clock), lambda line: None)
        clock.advance(RESTART_SECONDS * 0.9 if _ else RESTART_SECONDS)
    tries = [r for r in caplog.records if "cannot run" in r.getMessage()]
    assert len(tries) == 2
    unit.close()


def test_each_stream_bursts_at_most_a_second_of_its_rate() -> None:
    follow = limits_of(JobLogSettings(stream_bytes_per_second=1000, max_line_bytes=4096))
    assert (follow.bytes_per_second, follow.burst_bytes) == (1000, 4096)


class _FailsOnce:
    """A source whose first poll raises (a bug), then yields one line a poll."""

    def __init__(self) -> None:
        self.polls = 0
        self.closed = False

    def poll(self, shared: TokenBucket, emit: Callable[[LogLine], None]) -> None:
        self.polls += 1
        if self.polls == 1:
            raise RuntimeError("a bug in one poll")
        emit(_line(f"poll {self.polls}"))

    def close(self) -> None:
        self.closed = True


def test_the_thread_outlives_a_failed_poll_and_closes_its_sources(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = SystemClock()
    source = _FailsOnce()
    reader = JobLogReader([source], 10, TokenBucket(100, 100, clock), OpenFiles(1),
                          JobLogCounters(), poll_interval=0.01)
    reader.start()
    got = wait_for(lambda: reader.take(10), "a line after the failed poll")
    assert got[0].text == "poll 2"
    assert reader.stop(timeout=5.0)
    assert source.closed
    assert [r.levelname for r in caplog.records if "failed" in r.getMessage()] == ["ERROR"]
