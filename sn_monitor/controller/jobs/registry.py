"""The jobs the controller watches, who runs them, and their spare pools.

A job's members are its listed nodes, or every known node whose labels match its
selector, or (no ``nodes`` at all) the nodes its ranks report progress from; plus the
spares it took, minus the nodes evicted from it and the spares still in its pool. A node
leaves a job only when its eviction has run (:meth:`JobRegistry.evict`); it comes back
only through :meth:`JobRegistry.return_to_pool`, as a spare. Every change of membership
bumps :attr:`JobRegistry.version`, so the controller relabels nodes at once.

Each job's row in the store carries its bookkeeping as a typed :class:`JobBook`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Literal

import msgspec

from sn_monitor.clock import Clock
from sn_monitor.config import ConfigError
from sn_monitor.controller.jobs.advisor import SaveTimes
from sn_monitor.controller.jobs.checkpoints import Checkpoint, CheckpointRegistry
from sn_monitor.controller.jobs.progress import JobProgress
from sn_monitor.controller.jobs.recovery_record import CheckpointRef
from sn_monitor.controller.jobs.settings import JobError, JobSettings, UnknownJob
from sn_monitor.controller.jobs.spec import DistributedJob, job_from_json, job_to_dict
from sn_monitor.controller.storage.store import JobRow, Store

log = logging.getLogger(__name__)

NodeLabels = Callable[[str], Mapping[str, str] | None]
#: What a node is to a job.
NodeRole = Literal["member", "spare", "evicted"]


class CheckpointAsk(msgspec.Struct, frozen=True, kw_only=True):
    """A checkpoint the controller asked a job for (satisfied by a newer complete one)."""

    id: str
    reason: str
    at: float
    #: Satisfied by a complete checkpoint of a step after this one.
    after_step: int
    #: The action's idempotency key (the same after a crash: submitted once).
    key: str
    incident_id: int | None = None
    rule: str | None = None
    action_id: str | None = None


class JobBook(msgspec.Struct, kw_only=True):
    """A job's bookkeeping, kept under its row's ``data``."""

    frontier: int | None = None
    frontier_time: float | None = None
    #: When the job started (its first step); None in rows from before it was kept.
    started_at: float | None = None
    productive: float = 0.0
    last_checkpoint: CheckpointRef | None = None
    last_checkpoint_at: float | None = None
    request: CheckpointAsk | None = None
    request_seq: int = 0
    last_request_at: float | None = None


class JobRecord:
    """One job in memory: its spec, its row's fields, progress and checkpoint catalogue."""

    def __init__(self, row: JobRow, job: DistributedJob, book: JobBook,
                 catalogue: CheckpointRegistry, progress: JobProgress) -> None:
        self.row = row
        self.job = job
        self.book = book
        self.catalogue = catalogue
        self.progress = progress
        #: The blocking save times its checkpoint reports gave (the interval advisor's).
        self.saves = SaveTimes()
        #: The latest complete checkpoint as last verified on disk (the scans').
        self.verified: Checkpoint | None = None
        self.last_scan = -math.inf
        self.last_saved = -math.inf
        self.dirty = False
        self._members: frozenset[str] = frozenset()
        self._members_of: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.row.nodes

    @property
    def pool(self) -> tuple[str, ...]:
        return self.row.pool

    @property
    def members(self) -> frozenset[str]:
        """The job's nodes as a set: asked for every node of the fleet on a relabel."""
        nodes = self.row.nodes
        if self._members_of is not nodes:
            self._members, self._members_of = frozenset(nodes), nodes
        return self._members

    @property
    def state(self) -> str:
        return self.row.state


class JobRegistry:
    """Every job, its members and spares; thread safety is the orchestrator's lock."""

    def __init__(self, store: Store, clock: Clock, settings: JobSettings,
                 node_labels: NodeLabels) -> None:
        self.store = store
        self.clock = clock
        self.settings = settings
        self._node_labels = node_labels
        self._jobs: dict[str, JobRecord] = {}
        self._labels: dict[str, dict[str, str]] = {}
        #: Bumped at every change of any job's members or pool.
        self.version = 0

    # ------------------------------------------------------------------ lifecycle

    def load(self) -> None:
        """The jobs and known nodes from the store; a row that cannot be read is skipped."""
        for node in self.store.list_nodes():
            self._labels[node.name] = dict(node.labels)
        for row in self.store.list_jobs():
            try:
                job = job_from_json(json.dumps(dict(row.spec)).encode())
                book = _book(row.data)
            except (ConfigError, msgspec.ValidationError) as err:
                log.error("job %s in the store cannot be read, skipped: %s", row.name, err)
                continue
            j = self._record(row, job, book)
            if book.last_checkpoint is not None:
                try:
                    j.catalogue.report(book.last_checkpoint.step, book.last_checkpoint.path)
                except (ValueError, OSError) as err:
                    log.warning("job %s: last checkpoint %s: %s", row.name,
                                book.last_checkpoint, err)
            self._jobs[row.name] = j

    def _record(self, row: JobRow, job: DistributedJob, book: JobBook) -> JobRecord:
        catalogue = CheckpointRegistry(job.name, job.spec.checkpoint_dir,
                                       job.spec.checkpoint_marker, clock=self.clock)
        progress = JobProgress(self.settings.max_ranks, float(self.settings.unknown_gap))
        ledger = progress.ledger
        if book.frontier is not None:
            ledger.frontier = book.frontier
            ledger.frontier_time = book.frontier_time or 0.0
        ledger.started = book.started_at
        ledger.productive = book.productive
        return JobRecord(row, job, book, catalogue, progress)

    def add(self, job: DistributedJob, source: str) -> JobRecord:
        """Watch ``job``; an existing one gets the new spec and keeps its state and spares."""
        now = self.clock.time()
        spec = job_to_dict(job)
        old = self._jobs.get(job.name)
        if old is None:
            row = JobRow(name=job.name, spec=spec, source=source, state="running",
                         created_at=now, updated_at=now, pool=tuple(job.spec.spares))
            j = self._record(row, job, JobBook())
        else:
            j = old
            used = set(j.row.added) | set(j.row.excluded) | set(j.row.pool)
            pool = (*j.row.pool, *(s for s in job.spec.spares if s not in used))
            if (job.spec.checkpoint_dir, job.spec.checkpoint_marker) != (
                    j.job.spec.checkpoint_dir, j.job.spec.checkpoint_marker):
                j.catalogue = CheckpointRegistry(job.name, job.spec.checkpoint_dir,
                                                 job.spec.checkpoint_marker, clock=self.clock)
            j.job = job
            j.row = replace(j.row, spec=spec, source=source, pool=pool)
        self._jobs[job.name] = j
        self.refresh(j)
        self.save(j)
        return j

    def remove(self, name: str) -> JobRecord | None:
        j = self._jobs.pop(name, None)
        if j is not None:
            self.store.delete_job(name)
            self.version += 1
        return j

    # ------------------------------------------------------------------ reading

    def get(self, name: str) -> JobRecord:
        j = self._jobs.get(name)
        if j is None:
            raise UnknownJob(f"no job {name!r}")
        return j

    def find(self, name: str) -> JobRecord | None:
        return self._jobs.get(name)

    def records(self) -> list[JobRecord]:
        return [j for _, j in sorted(self._jobs.items())]

    def jobs_of_node(self, node: str) -> list[str]:
        """The jobs running on ``node`` (not those holding it as a spare)."""
        # a copy (one C call, atomic under the GIL): callers need not hold the lock
        return sorted(name for name, j in tuple(self._jobs.items()) if node in j.members)

    def roles_of(self, node: str) -> dict[str, NodeRole]:
        """What ``node`` is to each job that knows it: a member, a spare, evicted."""
        roles: dict[str, NodeRole] = {}
        for name, j in self._jobs.items():
            if node in j.members:
                roles[name] = "member"
            elif node in j.row.pool:
                roles[name] = "spare"
            elif node in j.row.excluded:
                roles[name] = "evicted"
        return roles

    def members(self, j: JobRecord) -> tuple[str, ...]:
        spec = j.job.spec
        if spec.node_names is not None:
            base = list(spec.node_names)
        elif spec.nodes_from_progress:
            base = sorted({*j.row.nodes, *(r.node for r in j.progress.ranks.values())})
        else:
            selector = spec.node_selector or {}
            base = sorted(n for n in self._labels
                          if all(self._labels_of(n).get(k) == v for k, v in selector.items()))
        wanted = (set(base) | set(j.row.added)) - set(j.row.excluded) - set(j.row.pool)
        return tuple(dict.fromkeys(n for n in (*j.row.nodes, *base, *j.row.added)
                                   if n in wanted))

    def _labels_of(self, node: str) -> Mapping[str, str]:
        labels = self._node_labels(node)
        return labels if labels is not None else self._labels.get(node, {})

    # ------------------------------------------------------------------ membership

    def note_node(self, node: str, labels: Mapping[str, str]) -> None:
        """A node reported (new, or its labels changed): label selectors may pick it up."""
        if self._labels.get(node) == dict(labels):
            return
        self._labels[node] = dict(labels)
        for j in self._jobs.values():
            if j.job.spec.node_selector is not None:
                self.refresh(j)

    def refresh(self, j: JobRecord) -> bool:
        """Recompute the job's members; True when they changed."""
        members = self.members(j)
        if members == j.row.nodes:
            return False
        j.row = replace(j.row, nodes=members)
        j.dirty = True
        self.version += 1
        return True

    def evict(self, j: JobRecord, node: str) -> None:
        """``node``'s eviction ran: it is out of the job until it returns to the pool."""
        j.row = replace(j.row, excluded=tuple(dict.fromkeys((*j.row.excluded, node))),
                        added=tuple(n for n in j.row.added if n != node),
                        pool=tuple(n for n in j.row.pool if n != node))
        self.refresh(j)
        self.save(j)
        log.info("job %s: %s evicted, out of the job", j.name, node)

    def take(self, j: JobRecord, spares: tuple[str, ...], nodes: tuple[str, ...]) -> None:
        """A recovery's plan: ``spares`` leave the pool and join; the job runs on ``nodes``.

        Idempotent: applied again after a restart, it changes nothing more.
        """
        taken = set(spares)
        j.row = replace(j.row, pool=tuple(n for n in j.row.pool if n not in taken),
                        added=tuple(dict.fromkeys((*j.row.added, *spares))),
                        nodes=nodes or j.row.nodes)
        self.version += 1
        self.refresh(j)

    def spare_failed(self, j: JobRecord, node: str) -> None:
        """A spare of the job failed: out of the pool (until it returns to it)."""
        j.row = replace(j.row, pool=tuple(n for n in j.row.pool if n != node),
                        excluded=tuple(dict.fromkeys((*j.row.excluded, node))))
        self.version += 1
        self.save(j)

    def return_to_pool(self, j: JobRecord, node: str) -> None:
        """A failed node is healthy again (an operator says so): a spare of the job."""
        if node in j.row.pool:
            return
        if node in j.row.nodes:
            raise JobError(f"{node} is running job {j.name}, not a failed node")
        j.row = replace(j.row, excluded=tuple(n for n in j.row.excluded if n != node),
                        added=tuple(n for n in j.row.added if n != node),
                        pool=(*j.row.pool, node))
        self.version += 1
        self.refresh(j)
        self.save(j)

    # ------------------------------------------------------------------ saving

    def save(self, j: JobRecord, **changes: Any) -> None:
        """Write the job's row (durable): its fields, ``changes`` and the bookkeeping."""
        p = j.progress
        ledger = p.ledger
        j.book = msgspec.structs.replace(j.book, frontier=ledger.frontier,
                                         frontier_time=ledger.frontier_time,
                                         started_at=ledger.started,
                                         productive=ledger.productive)
        j.row = replace(j.row, **changes, data=msgspec.to_builtins(j.book),
                        updated_at=self.clock.time())
        self.store.save_job(j.row)
        j.dirty = False
        p.dirty = False
        j.last_saved = self.clock.monotonic()

    def save_if_due(self, j: JobRecord) -> None:
        """Save changed progress counters every ``save_interval`` (the hot path writes none)."""
        if (j.dirty or j.progress.dirty) and (
                self.clock.monotonic() - j.last_saved >= self.settings.save_interval):
            self.save(j)


def _book(data: Mapping[str, Any]) -> JobBook:
    """A row's bookkeeping; older rows kept the checkpoint request as a loose mapping."""
    raw = dict(data)
    request = raw.get("request")
    if isinstance(request, Mapping) and "key" not in request:
        raw["request"] = {**request, "key": f"job:checkpoint:{request.get('id', '')}"}
    return msgspec.convert(raw, JobBook, strict=False)
