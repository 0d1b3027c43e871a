"""Why a job died: its ranks' log findings and its nodes' faults, ordered into a root cause.

Agents send what they recognise in a job's log as ``log`` events (a
:class:`sn_monitor.joblog.model.Finding` on the wire); faults on nodes come as events too
(an XID, a GPU lost or fallen off the bus, a link down), and a node that stopped
reporting is one (:meth:`JobTriage.node_lost`). The triage keeps, per job, the findings
of its current failure, an *episode* (from its first finding until ``quiet`` seconds pass
without one, or the job trains again after it was reported: :meth:`JobTriage.recovered`),
and the recent faults of the nodes it ran on when they happened (its recovery may have
replaced the node since). ``settle`` seconds (the controller's
``recovery.failure_settle``) after an episode's first finding (time for the cascade to
come in from every agent, in any order) :func:`sn_monitor.joblog.rootcause.order` names
the root cause from:

- the faults on the job's nodes from ``lookback`` seconds before the first finding (NCCL
  gives up on a collective only after its timeout, ten minutes by default) up to the
  last one, or to the first a rank reported of its own failure: an XID on node N, then
  timeouts on every rank, is N's XID;
- the findings, ordered by the line's own time stamp where every one has one, else as
  ``sn-monitor logs analyze`` orders them (severity, line, rank): when an agent read a
  line says little of when it was printed;
- the ranks the job's progress reports name, so that a rank that hung in silence while
  the others timed out is the suspect, not them.

Findings that come later in the episode refine the root cause the API shows; the
incident is due once per episode (:meth:`JobTriage.due`).

A root cause in :data:`APPLICATION_CATEGORIES` is the job's own failure, not its node's:
nothing here takes a node, and the hang handling reads :meth:`JobTriage.root_cause` and
suspects no node either. The XIDs NVIDIA's catalogue puts down to the application (13,
31, 43: ``RESTART_APP``, ``IGNORE``) are no node faults here.

Bounded: :data:`MAX_FINDINGS` per episode (then root candidates only), :data:`MAX_FAULTS`
per job, findings and faults only for jobs the controller knows (a removed job's are
forgotten). In memory: a restart forgets it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol

from sn_monitor.clock import Clock
from sn_monitor.joblog.model import Finding, NodeFault, Participant, RootCause
from sn_monitor.joblog.rootcause import order
from sn_monitor.model import EventRecord
from sn_monitor.rules.xid_catalog import XidCatalog

#: Root-cause categories that are the job's own doing, never a node's: a bug in its
#: code, its numerics diverging (a NaN loss: its learning rate, its data; a GPU that
#: corrupts data silently is found by the GPU checks, not by blaming the node of the
#: first NaN), memory it asked for (CUDA or host OOM), its data loading.
APPLICATION_CATEGORIES: Final = frozenset({
    "app-bug", "nan-loss", "cuda-oom", "host-oom", "dataloader-error",
})
#: Event kinds that are a fault of the node itself, and the category each becomes.
FAULT_CATEGORIES: Final = MappingProxyType({
    "gpu_lost": "gpu-lost", "gpu_fallen_off_bus": "gpu-fallen-off-bus",
    "link_down": "link-down",
})
#: XID resolutions that mean the application's fault, the GPU healthy.
_APPLICATION_XID_RESOLUTIONS: Final = frozenset({"RESTART_APP", "IGNORE"})
MAX_FINDINGS: Final = 4096
MAX_FAULTS: Final = 64


class JobMembership(Protocol):
    """What the triage reads of the jobs (the orchestrator)."""

    def jobs_of_node(self, node: str) -> list[str]: ...

    def exists(self, name: str) -> bool: ...

    def ranks_by_node(self, name: str) -> dict[str, list[int]]: ...


@dataclass(frozen=True)
class JobRootCause:
    """A job's first failure as the API, the incident and the alert tell it."""

    job: str
    category: str
    node: str | None
    rank: int | None
    file: str | None
    line: int | None
    #: The line(s) it rests on, as printed.
    excerpt: str
    #: When it happened (controller clock, seconds since the epoch), where known.
    at: float | None
    #: Which rule of the ordering chose it.
    reason: str
    #: Findings the episode holds.
    findings: int
    #: False when only the cascade was seen: ``node`` and ``rank`` are not the failure's.
    pinpointed: bool = True

    @property
    def application(self) -> bool:
        """The job's own failure (:data:`APPLICATION_CATEGORIES`): no node is to blame."""
        return self.category in APPLICATION_CATEGORIES

    def summary(self) -> str:
        """One sentence: what failed first, where, why."""
        where = " ".join(p for p in (
            f"rank {self.rank}" if self.rank is not None else "",
            f"on {self.node}" if self.node else "") if p) or "somewhere unknown"
        said = f": {self.excerpt}" if self.excerpt else ""
        return f"job {self.job} failed first at {where} ({self.category}){said}"

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "node": self.node, "rank": self.rank,
                "category": self.category, "excerpt": self.excerpt, "file": self.file,
                "line": self.line, "at": self.at, "reason": self.reason,
                "application": self.application, "findings": self.findings,
                "pinpointed": self.pinpointed}


@dataclass
class _Episode:
    """One failure of one job: its findings, from its first one until it goes quiet."""

    started: float  # controller monotonic clock
    last: float
    #: When the agents read its first and last line (controller wall clock).
    read: tuple[float, float]
    #: When they read the first line of a rank's own failure (None: none yet).
    own: float | None = None
    findings: list[Finding] = field(default_factory=list)
    decided: JobRootCause | None = None
    reported: bool = False
    changed: bool = True
    #: The job trained again after the failure was reported: the next finding is another.
    over: bool = False


class JobTriage:
    """Findings and node faults in, each job's root cause out (module docstring)."""

    def __init__(self, jobs: JobMembership, clock: Clock, xids: XidCatalog | None = None,
                 *, settle: float = 30.0, quiet: float = 600.0,
                 lookback: float = 900.0) -> None:
        self._jobs = jobs
        self._clock = clock
        self._xids = xids
        self._settle = settle
        self._quiet = quiet
        self._lookback = lookback
        self._lock = threading.Lock()
        self._episodes: dict[str, _Episode] = {}
        #: By job: the faults on the nodes it ran on when they happened (a recovery may
        #: have replaced the node since).
        self._faults: dict[str, deque[NodeFault]] = {}
        self._seen: dict[str, tuple[str, int]] = {}  # node -> (agent instance, highest id)
        self._lost: dict[tuple[str, str], float] = {}  # (job, node) -> lost since (noted)

    def take(self, node: str, instance: str, events: Iterable[EventRecord]) -> None:
        """One report's events (dated by the controller's clock): findings and faults kept.

        An event the agent sends again (its id not above the highest taken from that
        agent instance, until the answer acknowledged it) is taken once.
        """
        with self._lock:
            seen = self._seen.get(node)
            highest = seen[1] if seen is not None and seen[0] == instance else -1
            fresh = [e for e in events if e.id > highest]
            if fresh:
                self._seen[node] = (instance, max(e.id for e in fresh))
        for event in fresh:
            if event.kind == "log":
                self._take_finding(node, event)
            else:
                fault = self._fault(node, event)
                if fault is not None:
                    self._take_fault(fault)

    def node_lost(self, job: str, node: str, since: float) -> None:
        """``job``'s ``node`` stopped reporting at ``since``: a fault of the job, noted once."""
        with self._lock:
            if self._lost.get((job, node)) == since:
                return
            self._lost[(job, node)] = since
            self._faults.setdefault(job, deque(maxlen=MAX_FAULTS)).append(NodeFault(
                node=node, category="node-lost", timestamp=since,
                text=f"{node} stopped reporting"))

    def due(self) -> list[JobRootCause]:
        """Root causes decided now: each episode's once, ``settle`` seconds after it began.

        Episodes already reported are refined with the findings that came since.
        """
        now = self._clock.monotonic()
        self._forget_removed_jobs()
        with self._lock:
            ready = [(job, ep) for job, ep in self._episodes.items()
                     if ep.changed and now - ep.started >= self._settle]
            for _, ep in ready:
                ep.changed = False  # a finding taken while it is decided: decided again
        out = []
        for job, ep in ready:
            decided = self._decide(job, ep)
            with self._lock:
                ep.decided = decided
                if decided is not None and not ep.reported:
                    ep.reported = True
                    out.append(decided)
        return out

    def _forget_removed_jobs(self) -> None:
        with self._lock:
            jobs = {*self._episodes, *self._faults}
        gone = {job for job in jobs if not self._jobs.exists(job)}
        if gone:
            with self._lock:
                for job in gone:
                    self._episodes.pop(job, None)
                    self._faults.pop(job, None)
                self._lost = {k: v for k, v in self._lost.items() if k[0] not in gone}

    def root_cause(self, job: str) -> JobRootCause | None:
        """The job's latest root cause (None: no failure decided since the start)."""
        with self._lock:
            ep = self._episodes.get(job)
            return None if ep is None else ep.decided

    def recovered(self, job: str) -> None:
        """The job trains again after its reported failure: its next finding begins another.

        Without it a second failure within ``quiet`` of the first would join the first's
        episode and be told as the first.
        """
        with self._lock:
            ep = self._episodes.get(job)
            if ep is not None and ep.reported:
                ep.over = True

    def cause_so_far(self, job: str) -> JobRootCause | None:
        """The root cause from the findings in so far: the decided one, else one decided now.

        For a decision that cannot wait for the settle (the hang handling: a job whose
        ranks died of its own bug is found hung by its progress, and the hang must not
        suspect the node of the first rank that stopped). Reported nowhere, refined later.
        """
        with self._lock:
            ep = self._episodes.get(job)
            if ep is None:
                return None
            if ep.decided is not None and not ep.changed:
                return ep.decided
        return self._decide(job, ep)

    def causes(self) -> list[JobRootCause]:
        """The latest root cause of each job the controller still knows."""
        with self._lock:
            decided = [ep.decided for ep in self._episodes.values() if ep.decided is not None]
        return [cause for cause in decided if self._jobs.exists(cause.job)]

    # ------------------------------------------------------------------ intake

    def _take_finding(self, node: str, event: EventRecord) -> None:
        if event.severity in (None, "info") or event.category is None:
            return
        job = self._job_of(node, event.job)
        if job is None:
            return
        finding = Finding(
            file=event.file or node, line=event.line or 1, category=event.category,
            severity=event.severity, root_candidate=bool(event.root_candidate),
            rank=event.rank, node=node, text=event.message, signature=event.signature or "",
            params=MappingProxyType(dict(event.params)), timestamp=event.line_time_seconds)
        now = self._clock.monotonic()
        with self._lock:
            ep = self._episodes.get(job)
            if ep is None or (ep.reported and (ep.over or now - ep.last >= self._quiet)):
                ep = self._episodes[job] = _Episode(
                    started=now, last=now, read=(event.time_seconds, event.time_seconds))
            ep.last = now
            ep.changed = True
            ep.read = (min(ep.read[0], event.time_seconds), max(ep.read[1], event.time_seconds))
            if finding.root_candidate:
                ep.own = event.time_seconds if ep.own is None else min(ep.own,
                                                                        event.time_seconds)
            if len(ep.findings) < MAX_FINDINGS or (
                    finding.root_candidate and len(ep.findings) < 2 * MAX_FINDINGS):
                ep.findings.append(finding)

    def _take_fault(self, fault: NodeFault) -> None:
        jobs = self._jobs.jobs_of_node(fault.node)
        with self._lock:
            for job in jobs:
                self._faults.setdefault(job, deque(maxlen=MAX_FAULTS)).append(fault)

    def _job_of(self, node: str, named: str | None) -> str | None:
        """The finding's job: the one it names, if known; else the one on its node."""
        if named is not None:
            return named if self._jobs.exists(named) else None
        jobs = sorted(self._jobs.jobs_of_node(node))
        return jobs[0] if jobs else None

    def _fault(self, node: str, event: EventRecord) -> NodeFault | None:
        if event.kind in ("xid", "sxid"):
            if event.code is None or (event.kind == "xid" and self._application_xid(event.code)):
                return None
            category = f"{event.kind}-{event.code}"
        elif event.kind in FAULT_CATEGORIES:
            category = FAULT_CATEGORIES[event.kind]
        else:
            return None
        return NodeFault(node=node, category=category, timestamp=event.time_seconds,
                         text=event.message)

    def _application_xid(self, code: int) -> bool:
        entry = self._xids.get(code) if self._xids is not None else None
        return entry is not None and (entry.category == "application"
                                      or entry.resolution in _APPLICATION_XID_RESOLUTIONS)

    # ------------------------------------------------------------------ decision

    def _decide(self, job: str, ep: _Episode) -> JobRootCause | None:
        ranks = self._jobs.ranks_by_node(job)
        with self._lock:
            findings = list(ep.findings)
            faults = self._faults_around(self._faults.get(job, ()), findings, ep)
        participants = [Participant(rank=rank, file="", node=node)
                        for node, node_ranks in ranks.items() for rank in node_ranks]
        cause = order(findings, faults, participants)
        return None if cause is None else _told(job, cause, len(findings))

    def _faults_around(self, faults: Iterable[NodeFault], findings: Sequence[Finding],
                       ep: _Episode) -> list[NodeFault]:
        """The faults from ``lookback`` before the first finding to the last one.

        Not after a rank's own failure was read: a fault that came later did not cause
        it (its line may have no time stamp to tell, then the fault would win).
        """
        times = [*ep.read, *(f.timestamp for f in findings if f.timestamp is not None)]
        since, until = min(times) - self._lookback, max(times)
        if ep.own is not None:
            until = min(until, ep.own)
        return [fault for fault in faults
                if fault.timestamp is not None and since <= fault.timestamp <= until]


def _told(job: str, cause: RootCause, findings: int) -> JobRootCause:
    """The ordering's root cause as the job's."""
    if cause.finding is not None:
        excerpt, at = cause.finding.text, cause.finding.timestamp
    elif cause.fault is not None:
        excerpt, at = cause.fault.text, cause.fault.timestamp
    else:
        excerpt, at = "", None
    return JobRootCause(job=job, category=cause.category, node=cause.node, rank=cause.rank,
                        file=cause.file or None, line=cause.line, excerpt=excerpt, at=at,
                        reason=cause.reason, findings=findings, pinpointed=cause.pinpointed)
