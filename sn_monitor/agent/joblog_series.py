"""The job-log families: what reading and recognising the job's logs did.

Formats the snapshot's :class:`~sn_monitor.agent.snapshot.JobLogStats` only (nothing
when ``job_logs`` is off):

* ``sn_agent_log_lines_total{source}``, ``sn_agent_log_bytes_total{source}``: lines
  handed on and bytes read per configured source (``file:<job>``, ``containers``,
  ``journald:<unit>``);
* ``sn_agent_log_dropped_bytes_total{source,reason}`` (``rate``, ``too-long``) and
  ``sn_agent_log_dropped_lines_total{source,reason}`` (``queue``, ``unparsed``): what was
  never recognised, and why (a job printing faster than the read rate: ``rate``);
* ``sn_agent_log_rotations_total{source}``, ``sn_agent_log_truncations_total{source}``;
* ``sn_agent_log_open_files``, ``sn_agent_log_queued_lines``;
* ``sn_agent_log_cpu_seconds_total``: the reader thread's CPU time (reading and
  recognition), so its share of a core is ``rate()`` of it;
* ``sn_agent_log_findings_total{category}``: failures recognised (each one also a ``log``
  event to the controller); ``sn_agent_log_findings_dropped_total``: findings pushed out
  before a cycle took them;
* ``sn_agent_log_template_findings_total{kind}``: new and bursting templates;
* ``sn_agent_log_output_documents_total{result}``: ECS documents ``written``,
  ``dropped`` (queue full) and ``failed`` (disk), when an output is set.

``source``'s values are the configured sources, a bounded set; ``category`` the
catalogue's.
"""

from __future__ import annotations

from collections.abc import Iterator

from sn_monitor.agent.exposition import Family, counter, gauge
from sn_monitor.agent.snapshot import JobLogStats, NodeSnapshot


def job_log_families(snapshot: NodeSnapshot) -> Iterator[Family]:
    """The families of the snapshot's job-log figures (none when ``job_logs`` is off)."""
    stats = snapshot.job_logs
    if stats is None:
        return
    yield from _sources(stats)
    yield gauge("sn_agent_log_open_files", "Job log files the agent holds open.",
                value=stats.open_files)
    yield gauge("sn_agent_log_queued_lines",
                "Lines read and waiting for recognition.", value=stats.queued_lines)
    yield counter("sn_agent_log_cpu_seconds",
                  "CPU time of the agent's job-log thread (reading and recognition).",
                  value=stats.cpu_seconds)
    found = counter("sn_agent_log_findings",
                    "Failures recognised in the job's logs, each sent as a log event.",
                    labels=["category"])
    for category, count in stats.findings:
        found.add_metric([category], count)
    yield found
    yield counter("sn_agent_log_findings_dropped",
                  "Findings dropped before a sample took them (too many waiting).",
                  value=stats.findings_dropped)
    templates = counter("sn_agent_log_template_findings",
                        "Templates new in a job's history, or bursting.", labels=["kind"])
    for kind, count in stats.template_findings:
        templates.add_metric([kind], count)
    yield templates
    output = counter("sn_agent_log_output_documents",
                     "ECS documents of the job-log output: written, dropped (queue full), "
                     "failed (disk).", labels=["result"])
    for result, count in (("written", stats.output_written), ("dropped", stats.output_dropped),
                          ("failed", stats.output_failed)):
        output.add_metric([result], count)
    yield output


def _sources(stats: JobLogStats) -> Iterator[Family]:
    lines = counter("sn_agent_log_lines", "Job log lines read and handed on.",
                    labels=["source"])
    read = counter("sn_agent_log_bytes", "Job log bytes read.", labels=["source"])
    dropped_bytes = counter(
        "sn_agent_log_dropped_bytes",
        "Job log bytes never recognised: over the read rate (rate), past the longest "
        "line (too-long).", labels=["source", "reason"])
    dropped_lines = counter(
        "sn_agent_log_dropped_lines",
        "Job log lines read but never recognised: the queue was full (queue), not in "
        "their format (unparsed).", labels=["source", "reason"])
    rotations = counter("sn_agent_log_rotations", "Job log files followed through a "
                        "rotation.", labels=["source"])
    truncations = counter("sn_agent_log_truncations", "Job log files read again from "
                          "their start after a truncation.", labels=["source"])
    for source in stats.sources:
        name = source.source
        lines.add_metric([name], source.lines)
        read.add_metric([name], source.bytes)
        dropped_bytes.add_metric([name, "rate"], source.dropped_bytes_rate)
        dropped_bytes.add_metric([name, "too-long"], source.dropped_bytes_too_long)
        dropped_lines.add_metric([name, "queue"], source.dropped_lines_queue)
        dropped_lines.add_metric([name, "unparsed"], source.dropped_lines_unparsed)
        rotations.add_metric([name], source.rotations)
        truncations.add_metric([name], source.truncations)
    yield from (lines, read, dropped_bytes, dropped_lines, rotations, truncations)
