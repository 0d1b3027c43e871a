"""The lines read, recognised: findings become ``log`` events for the controller.

Runs on the ``agent-joblogs`` thread, after each poll (never on the sampling thread).
Consecutive lines of one file or unit are fed to its
:class:`~sn_monitor.joblog.recognition.LogStream` as one chunk, so the catalogue's
prefilter searches them at C speed and only the lines it hits cost Python; a stream
keeps its open blocks (a traceback, torchrun's "Root Cause") across polls. Each finding
becomes an :class:`~sn_monitor.model.Event` of kind ``log`` (its line the message, its
category, rank, file and line in its :class:`~sn_monitor.model.JobLogFinding`), waiting
in a bounded queue for the collector to hand it to the sampler (full: the oldest is
dropped and counted).

A finding's line number counts the lines this agent read from the file: with
``from_start`` off (the default), from where the agent began following it.

Optional, each from its own setting: the template miner per job
(:class:`~sn_monitor.joblog.templates.JobTemplates`, ``job_logs.templates``), whose new
and bursting templates are findings of their own in the ECS output and counted on
/metrics (they are no failure, so they are not sent to the controller); and the ECS
output (``job_logs.output``), which gets every finding and, when asked, every line.
"""

from __future__ import annotations

import datetime
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from typing import Final

from sn_monitor.agent.joblogs.lines import LineContext, LogLine
from sn_monitor.clock import Clock
from sn_monitor.joblog.context import Origin
from sn_monitor.joblog.ecs import EcsOutput
from sn_monitor.joblog.model import Finding
from sn_monitor.joblog.recognition import LogStream, Recognizer
from sn_monitor.joblog.template_settings import TemplateSettings
from sn_monitor.joblog.templates import JobTemplates
from sn_monitor.model import MAX_PARAMS, Event, JobLogFinding

#: Findings waiting for the collector; at one sample a second, far more than a cascade
#: of every rank's lines in a second needs.
MAX_PENDING: Final = 1000
#: Files (or units) whose streams are kept at once: the least recently read is closed
#: (its open blocks forgotten) past it.
MAX_STREAMS: Final = 1024
#: Jobs whose template miners are kept at once (the least recently fed is dropped).
MAX_TEMPLATE_JOBS: Final = 64
#: The template miner's job for lines of no job.
NO_JOB: Final = ""


class LogRecognition:
    """Recognises the lines the reader hands on; findings wait as ``log`` events."""

    def __init__(self, recognizer: Recognizer, node: str, clock: Clock, *,
                 templates: TemplateSettings | None = None,
                 output: EcsOutput | None = None,
                 max_pending: int = MAX_PENDING) -> None:
        self._recognizer = recognizer
        self._node = node
        self._clock = clock
        self._templates_settings = templates
        self._output = output
        self._streams: OrderedDict[LineContext, LogStream] = OrderedDict()
        self._templates: OrderedDict[str, JobTemplates] = OrderedDict()
        self._pending: deque[Event] = deque()
        self._max_pending = max_pending
        self._lock = threading.Lock()
        self._found: Counter[str] = Counter()
        self._template_found: Counter[str] = Counter()
        self._dropped = 0

    def consume(self, lines: Sequence[LogLine]) -> None:
        """Recognise ``lines`` (in the order read); on the reader's thread."""
        start = 0
        for end in range(1, len(lines) + 1):
            if end == len(lines) or lines[end].context is not lines[start].context:
                self._chunk(lines[start:end])
                start = end

    def drain(self, limit: int) -> list[Event]:
        """Up to ``limit`` waiting events, oldest first (any thread)."""
        with self._lock:
            count = min(limit, len(self._pending))
            return [self._pending.popleft() for _ in range(count)]

    def counts(self) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...], int]:
        """Findings by category, template findings by kind, findings dropped (any thread)."""
        with self._lock:
            return (tuple(sorted(self._found.items())),
                    tuple(sorted(self._template_found.items())), self._dropped)

    def _chunk(self, lines: Sequence[LogLine]) -> None:
        """Lines of one file or unit, in order: one feed of its stream."""
        context = lines[0].context
        stream = self._stream(context)
        first = stream.lines
        found = stream.feed("\n".join(line.text for line in lines) + "\n")
        events = [self._event(finding, lines[max(0, min(len(lines) - 1,
                                                        finding.line - first - 1))])
                  for finding in found]
        if self._output is not None:
            for finding, event in zip(found, events, strict=True):
                self._output.finding(finding, read_at=event.time_seconds)
            if self._output.options.raw_lines:
                for line in lines:
                    self._output.line(line.text, context.origin, read_at=line.read_at,
                                      logged_at=line.logged_at, rank=context.rank)
        if self._templates_settings is not None:
            self._mine(context.job or NO_JOB, lines)
        with self._lock:
            for event in events:
                if len(self._pending) >= self._max_pending:
                    self._pending.popleft()
                    self._dropped += 1
                self._pending.append(event)
            self._found.update(finding.category for finding in found)

    def _stream(self, context: LineContext) -> LogStream:
        stream = self._streams.get(context)
        if stream is not None:
            self._streams.move_to_end(context)
            return stream
        if len(self._streams) >= MAX_STREAMS:
            self._streams.popitem(last=False)
        year = datetime.datetime.fromtimestamp(self._clock.time(), tz=datetime.UTC).year
        stream = self._recognizer.stream(context.origin, Origin(
            rank=context.rank, node=context.node or self._node), year=year)
        self._streams[context] = stream
        return stream

    def _event(self, finding: Finding, line: LogLine) -> Event:
        return Event(
            kind="log", source="joblog", time_seconds=line.read_at, message=finding.text,
            finding=JobLogFinding(
                category=finding.category, severity=finding.severity,
                root_candidate=finding.root_candidate, file=finding.file,
                line=finding.line, job=line.context.job, rank=finding.rank,
                signature=finding.signature,
                line_time_seconds=(finding.timestamp if finding.timestamp is not None
                                   else line.logged_at),
                params=tuple((name, str(value)) for name, value
                             in list(finding.params.items())[:MAX_PARAMS])))

    def _mine(self, job: str, lines: Sequence[LogLine]) -> None:
        assert self._templates_settings is not None
        miner = self._templates.get(job)
        if miner is None:
            if len(self._templates) >= MAX_TEMPLATE_JOBS:
                self._templates.popitem(last=False)
            miner = self._templates[job] = JobTemplates(self._templates_settings)
        else:
            self._templates.move_to_end(job)
        for line in lines:
            for found in miner.observe(line.text, at=line.read_at):
                with self._lock:
                    self._template_found[found.kind] += 1
                if self._output is not None:
                    self._output.template(found, line.context.origin, read_at=line.read_at)
