"""The job's logs as a collector: the reader and recognition, their findings each cycle.

The reader thread (``agent-joblogs``) reads and recognises; each sampling cycle,
:meth:`JobLogCollector.collect` only takes the findings waiting (as ``log`` events, at
most :data:`EVENTS_PER_CYCLE`) and the counters, so the sample's cost does not grow with
the logs' rate. The thread starts on the first collect and stops at close, with the ECS
output's writer.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

from sn_monitor.agent.joblogs.build import build_reader
from sn_monitor.agent.joblogs.findings import LogRecognition
from sn_monitor.agent.joblogs.reader import JobLogReader
from sn_monitor.agent.settings import AgentSettings
from sn_monitor.agent.snapshot import Collected, JobLogStats
from sn_monitor.clock import Clock
from sn_monitor.joblog.ecs import EcsOutput, LineSource
from sn_monitor.joblog.recognition import Recognizer

log = logging.getLogger(__name__)

#: Findings one cycle hands on: a report carries at most 1000 events of every kind.
EVENTS_PER_CYCLE: Final = 200
#: How long close waits for the reader thread and the output's writer, each.
STOP_SECONDS: Final = 5.0


class JobLogCollector:
    """Findings in the job's logs, read and recognised on the ``agent-joblogs`` thread."""

    name = "joblogs"

    def __init__(self, reader: JobLogReader, recognition: LogRecognition,
                 output: EcsOutput | None = None) -> None:
        self._reader = reader
        self._recognition = recognition
        self._output = output
        self._started = False

    def collect(self) -> Collected:
        if not self._started:
            self._started = True
            if self._output is not None:
                self._output.start()
            self._reader.start()
        return Collected(events=tuple(self._recognition.drain(EVENTS_PER_CYCLE)),
                         job_logs=self.stats())

    def stats(self) -> JobLogStats:
        """The reader's counters with the findings' and the output's."""
        read = self._reader.stats()
        found, templates, dropped = self._recognition.counts()
        written = self._output.counts if self._output is not None else None
        return JobLogStats(
            sources=read.sources, open_files=read.open_files, queued_lines=read.queued_lines,
            cpu_seconds=read.cpu_seconds, findings=found, template_findings=templates,
            findings_dropped=dropped,
            output_written=written.written if written else 0,
            output_dropped=written.dropped if written else 0,
            output_failed=written.failed if written else 0)

    def close(self) -> None:
        if not self._reader.stop(STOP_SECONDS):
            log.error("the job-log reader did not stop within %gs", STOP_SECONDS)
        if self._output is not None and not self._output.stop(STOP_SECONDS):
            log.error("the job-log output's writer did not stop within %gs", STOP_SECONDS)


def build_job_log_collector(settings: AgentSettings, clock: Clock) -> JobLogCollector:
    """The collector of the ``job_logs`` settings (its thread starts on the first collect)."""
    chosen = settings.job_logs
    output = None
    if chosen.output is not None:
        output = EcsOutput(chosen.output, LineSource(node=settings.node), clock)
    recognition = LogRecognition(Recognizer(), settings.node, clock,
                                 templates=chosen.templates, output=output)
    reader = build_reader(chosen, clock, Path(settings.state_dir), recognition.consume)
    return JobLogCollector(reader, recognition, output)
