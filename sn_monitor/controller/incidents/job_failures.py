"""A job's failure, once the triage names its root cause, as one incident of the job.

The incident is the job's (``job:<name>``, like a hang with no node to name): its
message says which rank and node failed first, why, and the line; its only action is the
alert, whose labels are the job's own (``metadata.labels``, with its ``owner``), so a
failure of the application pages the job's owner. It takes no node: a node fault that
caused it has its own incident (the XID's), whose rule acts on the node; an application
failure has none. The incident closes once the job makes progress again.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

from sn_monitor.clock import Clock
from sn_monitor.controller.incidents.pipeline import IncidentPipeline
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.controller.jobs.triage import JobRootCause, JobTriage
from sn_monitor.rules.engine import Finding

log = logging.getLogger(__name__)

#: The rule name of a job failure's incident (and its alert's ``alertname``).
JOB_FAILURE_RULE = "job-failure"


class JobFailureIncidents:
    """Root causes the triage decides become job incidents; progress closes them."""

    def __init__(self, triage: JobTriage, pipeline: IncidentPipeline, jobs: JobOrchestrator,
                 clock: Clock) -> None:
        self._triage = triage
        self._pipeline = pipeline
        self._jobs = jobs
        self._clock = clock
        self._lock = threading.Lock()
        #: Open failure incidents by job, with the job's step when it failed.
        self._open: dict[str, tuple[Finding, int | None]] = {}

    def tick(self) -> None:
        """New root causes open their job's incident; a job that progresses closes its."""
        for cause in self._triage.due():
            self._failed(cause)
        self._close_recovered()

    def _failed(self, cause: JobRootCause) -> None:
        status = self._jobs.job(cause.job)
        now = self._clock.time()
        what = ("the application's own failure: no node is taken, the job's owner is paged"
                if cause.application else "its node's incident acts on the node"
                if cause.rank is None and cause.node is not None else "")
        finding = Finding(
            rule=JOB_FAILURE_RULE, kind="job_failure", node=f"job:{cause.job}",
            subject=f"job:{cause.job}", gpu=None, status="firing", severity="critical",
            actions=("alert",), dry_run=False, value=None,
            message=cause.summary() + (f" [{what}]" if what else ""),
            observed_wall=min(now, cause.at) if cause.at is not None else now,
            detected_wall=now)
        with self._lock:
            previous = self._open.pop(cause.job, None)
            self._open[cause.job] = (finding, status.last_step if status else None)
        if previous is not None:  # an earlier failure never closed: this one replaces it
            self._pipeline.take([replace(previous[0], status="resolved", detected_wall=now)])
        log.warning("job %s: root cause %s (%s)", cause.job, cause.category, cause.reason)
        self._pipeline.take([finding])

    def _close_recovered(self) -> None:
        with self._lock:
            failed = dict(self._open)
        for job, (finding, step) in failed.items():
            status = self._jobs.job(job)
            if status is not None and (status.state != "running" or status.last_step is None
                                       or (step is not None and status.last_step <= step)):
                continue
            with self._lock:
                if self._open.get(job, (None, None))[0] is not finding:
                    continue
                del self._open[job]
            self._pipeline.take([replace(finding, status="resolved",
                                         detected_wall=self._clock.time())])
            self._triage.recovered(job)
