"""The ``job`` label of a node of a DistributedJob, and a node's job for the blast radius.

Rules that group by job (and the blast radius, which holds a fault on many nodes of one
job as one incident) read a node's ``job`` label. A label the agent sends itself wins;
the controller gives the nodes of the jobs it runs theirs, and takes it back when a
node leaves its job (an evicted node).
"""

from __future__ import annotations

from sn_monitor.controller.ingest.decode import NodeRegistry
from sn_monitor.controller.jobs.orchestrator import JobOrchestrator
from sn_monitor.rules.view import NodeView


class JobLabels:
    """The nodes' ``job`` labels, following the jobs' membership (module docstring)."""

    def __init__(self, jobs: JobOrchestrator, registry: NodeRegistry) -> None:
        self._jobs = jobs
        self._registry = registry
        self._membership_seen = -1

    def label(self, view: NodeView) -> None:
        """Give a node of a DistributedJob the ``job`` label, for rules that group by it.

        A ``job`` label the agent sends itself wins; the one the controller adds follows
        the job's membership (an evicted node loses it: :meth:`relabel`).
        """
        if view.report is not None and "job" in view.report.labels:
            return
        jobs = self._jobs.jobs_of_node(view.name)
        wanted = jobs[0] if jobs else None
        if view.labels.get("job") != wanted:
            labels = {k: v for k, v in view.labels.items() if k != "job"}
            view.labels = labels if wanted is None else {**labels, "job": wanted}

    def relabel(self) -> None:
        """A job's members changed: every node's ``job`` label follows, at once."""
        if self._jobs.membership_version == self._membership_seen:
            return
        self._membership_seen = self._jobs.membership_version
        for view in self._registry.views().values():
            self.label(view)

    def job_of(self, node: str) -> tuple[str, int] | None:
        """``node``'s job and its size: a job the controller runs, else its job label."""
        jobs = self._jobs.jobs_of_node(node)
        if jobs:
            status = self._jobs.job(jobs[0])
            return jobs[0], len(status.nodes) if status is not None else 0
        view = self._registry.get(node)
        label = view.labels.get("job") if view is not None else None
        if label is None:
            return None
        size = sum(1 for v in self._registry.views().values() if v.labels.get("job") == label)
        return label, size
