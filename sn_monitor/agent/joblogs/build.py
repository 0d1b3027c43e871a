"""The job-log reader from the ``job_logs`` settings, with the bounds they give.

One source per files entry, one for the containers' logs, one per journald unit.

Source names (the ``source`` label of the counters): ``file:<job>`` (``file:<glob>``
without a job), ``containers``, ``journald:<unit>``. A journald unit's cursor is kept in
``<state_dir>/joblogs/<unit>.cursor``.
"""

from __future__ import annotations

import re
from pathlib import Path

from sn_monitor.agent.joblogs.bounds import FollowLimits, TokenBucket
from sn_monitor.agent.joblogs.cri import CriDecoder
from sn_monitor.agent.joblogs.fileset import DecoderFactory, FileSet, OpenFiles
from sn_monitor.agent.joblogs.framing import Decoder, PlainDecoder
from sn_monitor.agent.joblogs.journalctl import JournalUnit
from sn_monitor.agent.joblogs.lines import LineContext
from sn_monitor.agent.joblogs.paths import TORCHRUN_PATTERN, cri_context, path_context
from sn_monitor.agent.joblogs.reader import Consumer, JobLogReader, LogSource
from sn_monitor.agent.joblogs.stats import JobLogCounters, SourceCounters
from sn_monitor.agent.settings import JobLogFileSettings, JobLogSettings
from sn_monitor.clock import Clock

#: The name of the containers' source.
CONTAINERS = "containers"


def limits_of(settings: JobLogSettings) -> FollowLimits:
    """Each stream's bounds: its rate, a burst of one second of it (at least a line)."""
    rate = float(settings.stream_bytes_per_second)
    return FollowLimits(bytes_per_second=rate,
                        burst_bytes=max(rate, float(settings.max_line_bytes)),
                        max_line_bytes=settings.max_line_bytes,
                        rescan_seconds=float(settings.rescan_interval),
                        from_start=settings.from_start)


def plain_decoders(entry: JobLogFileSettings, source: str) -> DecoderFactory:
    """A files entry's decoder per path: plain text, rank and node from the path."""
    pattern = re.compile(entry.rank_pattern or TORCHRUN_PATTERN)
    base = LineContext(kind="file", source=source, origin="", job=entry.job)

    def decoder_for(path: str) -> Decoder:
        return PlainDecoder(path_context(base, path, pattern))
    return decoder_for


def cri_decoders(max_line_bytes: int, counters: SourceCounters) -> DecoderFactory:
    """The containers' decoder per path: the CRI format, pod and container from the name."""
    base = LineContext(kind="container", source=CONTAINERS, origin="")

    def decoder_for(path: str) -> Decoder | None:
        context = cri_context(base, path)
        return None if context is None else CriDecoder(context, max_line_bytes, counters)
    return decoder_for


def cursor_path(state_dir: Path, unit: str) -> Path:
    """Where unit ``unit``'s journal cursor is kept."""
    return state_dir / "joblogs" / f"{re.sub(r'[^A-Za-z0-9@_.:-]', '_', unit)}.cursor"


def build_reader(settings: JobLogSettings, clock: Clock,
                 state_dir: Path | None = None,
                 consumer: Consumer | None = None) -> JobLogReader:
    """The reader of every configured source (not started).

    ``state_dir``: where the journal cursors are kept (None: in memory only);
    ``consumer``: what takes the lines after each poll, on the reader's thread.
    """
    counters = JobLogCounters()
    limits = limits_of(settings)
    open_files = OpenFiles(settings.max_open_files)
    sources: list[LogSource] = []
    for entry in settings.files:
        name = f"file:{entry.job or entry.glob}"
        sources.append(FileSet([entry.glob], plain_decoders(entry, name), counters.of(name),
                               open_files, limits, clock))
    if settings.containers.enabled:
        cri_counters = counters.of(CONTAINERS)
        sources.append(FileSet([str(Path(settings.containers.dir) / "*.log")],
                               cri_decoders(settings.max_line_bytes, cri_counters),
                               cri_counters, open_files, limits, clock))
    for unit in settings.journald.units:
        name = f"journald:{unit}"
        context = LineContext(kind="journald", source=name, origin=unit)
        sources.append(JournalUnit(
            unit, context, counters.of(name), limits, clock,
            journalctl=settings.journald.journalctl,
            cursor_file=None if state_dir is None else cursor_path(state_dir, unit)))
    rate = float(settings.max_bytes_per_second)
    shared = TokenBucket(rate, max(rate, float(settings.max_line_bytes)), clock)
    return JobLogReader(sources, settings.queue_lines, shared, open_files, counters,
                        float(settings.poll_interval), consumer)
