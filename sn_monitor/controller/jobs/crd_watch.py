"""DistributedJob custom resources become the controller's jobs; their status goes back.

With ``kubernetes: {watch_jobs: true}`` in the controller's config, two supervised
workers (runtime.py) run this:

* ``job-watch`` (:meth:`JobWatch.run`): list the DistributedJobs, then watch from the
  list's resourceVersion (bookmarks keep it fresh); every object goes through the same
  loader as a job file (:func:`~.jobs.spec.parse_job`), and creates, updates (its spec
  changed) or deletes the controller's job. A 410 Gone re-lists at once; a broken stream
  or an unreachable API server re-lists after a backoff (1 s doubling to 30 s). A re-list
  converges: jobs from Kubernetes whose object is gone are removed.
* ``job-status`` (:meth:`JobWatch.write_statuses`, every ``status_interval``): each
  object's status (state, generation, nodes, failures, ETTR, last checkpoint,
  conditions) through the status subresource, only when it changed, at most once per
  ``status_interval`` per object.

A job's ``source`` says where it came from: ``kubernetes:<namespace>/<name>`` for these.
Jobs from files or the API are never touched; an object named like one of them is
refused with a condition (``Accepted: False, reason NameTaken``). A bad object is
never a crash: a warning naming the object and the field, and ``Accepted: False, reason
InvalidSpec`` with the loader's message (a job already running from the object keeps its
last good spec).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sn_monitor.clock import Clock
from sn_monitor.config import ConfigError, Document
from sn_monitor.controller.jobs.spec import DistributedJob, job_to_dict, parse_job
from sn_monitor.controller.jobs.views import JobStatus
from sn_monitor.controller.k8s.watch import Gone, ObjectList, WatchApi, WatchError, WatchEvent

log = logging.getLogger(__name__)

SOURCE_PREFIX = "kubernetes:"
BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
_STATE_REASONS = {"pending": "Pending", "running": "Running", "recovering": "Recovering",
                  "awaiting_approval": "AwaitingApproval", "failed": "Failed"}


class Jobs(Protocol):
    """What the watch needs of the job orchestrator."""

    def add_job(self, job: DistributedJob, source: str) -> JobStatus: ...

    def remove_job(self, name: str) -> bool: ...

    def jobs(self) -> list[JobStatus]: ...

    def job(self, name: str) -> JobStatus | None: ...


def source_of(namespace: str, name: str) -> str:
    """A job's ``source`` when it comes from the object ``namespace/name``."""
    return f"{SOURCE_PREFIX}{namespace}/{name}"


def job_from_object(obj: Mapping[str, Any]) -> DistributedJob:
    """The job an object describes, through the file loader (raises ConfigError).

    Only ``metadata.name`` and ``metadata.labels`` are the job's: the rest of the
    metadata (uid, resourceVersion, managedFields...) is the API server's.
    """
    meta = obj.get("metadata") or {}
    data = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "metadata": {k: meta[k] for k in ("name", "labels") if k in meta},
            "spec": obj.get("spec")}
    where = f"DistributedJob {meta.get('namespace', '')}/{meta.get('name', '')}"
    return parse_job(Document(path=where, data=data, lines={}))


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def rfc3339(seconds: float) -> str:
    """``metav1.Time``: UTC, whole seconds, ``Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


@dataclass
class _Object:
    """What the watch knows of one DistributedJob object."""

    namespace: str
    name: str
    generation: int | None
    #: Why the object is not (or no longer) the job's spec: (reason, message), or None.
    refused: tuple[str, str] | None = None
    #: The last status written (lastTransitionTime included), and when (monotonic).
    written: dict[str, Any] | None = None
    written_at: float | None = None
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return source_of(self.namespace, self.name)


class JobWatch:
    """The DistributedJob watch and status writer (see the module docstring)."""

    def __init__(self, api: WatchApi, jobs: Jobs, clock: Clock, *,
                 status_interval: float = 5.0, backoff: float = BACKOFF_SECONDS,
                 max_backoff: float = MAX_BACKOFF_SECONDS) -> None:
        self.api = api
        self.jobs = jobs
        self.clock = clock
        self.status_interval = status_interval
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], _Object] = {}
        #: One status write at a time (the watch and the status worker both write).
        self._write_lock = threading.Lock()
        #: Lists made (the first, and one per 410 or broken stream): for tests, a metric.
        self.lists = 0

    # -- the watch -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """List, watch, re-list on 410 or a broken stream; until ``stop`` is set."""
        done = threading.Event()
        closer = threading.Thread(target=self._close_on_stop, args=(stop, done),
                                  name="sn-job-watch-closer", daemon=True)
        closer.start()
        failures = 0
        try:
            while not stop.is_set():
                try:
                    version = self.relist(self.api.list())
                    failures = 0
                    while not stop.is_set():
                        for event in self.api.watch(version):
                            if stop.is_set():
                                return
                            version = self.apply(event) or version
                        # the server ended the watch (its timeout): go on from there
                except Gone as err:
                    log.info("DistributedJob watch: %s: listing again", err)
                except WatchError as err:
                    if stop.is_set():
                        return
                    failures += 1
                    delay = min(self.max_backoff, self.backoff * 2 ** (failures - 1))
                    log.warning("DistributedJob watch: %s: listing again in %.0f s",
                                err, delay)
                    if stop.wait(delay):
                        return
        finally:
            done.set()
            closer.join()

    def _close_on_stop(self, stop: threading.Event, done: threading.Event) -> None:
        while not done.is_set():
            if stop.wait(0.05):
                self.api.close()
                return

    def relist(self, listed: ObjectList) -> str:
        """Apply a list: every object, and remove the jobs whose object is gone."""
        self.lists += 1
        seen = set()
        for obj in listed.items:
            seen.add(_key(obj))
            self._apply_object(obj)
        with self._lock:
            gone = [k for k in self._objects if k not in seen]
            for key in gone:
                del self._objects[key]
        ours = {source_of(*k) for k in seen}
        for status in self.jobs.jobs():
            if status.source.startswith(SOURCE_PREFIX) and status.source not in ours:
                log.info("job %s: its DistributedJob (%s) is gone: removed", status.name,
                         status.source)
                self.jobs.remove_job(status.name)
        self.write_statuses()
        return listed.resource_version

    def apply(self, event: WatchEvent) -> str | None:
        """One event; the resourceVersion to watch from next."""
        if event.type == "DELETED":
            self._delete(event.object)
        elif event.type in ("ADDED", "MODIFIED"):
            self._apply_object(event.object)
            self._write_status(_key(event.object))
        return event.resource_version

    def _apply_object(self, obj: Mapping[str, Any]) -> None:
        namespace, name = _key(obj)
        meta = obj.get("metadata") or {}
        generation = meta.get("generation")
        with self._lock:
            known = self._objects.get((namespace, name))
            if known is None:
                known = self._objects[(namespace, name)] = _Object(namespace, name, None)
            known.generation = generation if isinstance(generation, int) else None
        source = known.source
        try:
            job = job_from_object(obj)
        except ConfigError as err:
            where = f"{err.key}: " if err.key else ""
            log.warning("DistributedJob %s/%s refused: %s%s", namespace, name, where,
                        err.message)
            running = self.jobs.job(name)
            kept = (" (the job runs on with its last good spec)"
                    if running is not None and running.source == source else "")
            known.refused = ("InvalidSpec", f"{where}{err.message}{kept}")
            return
        existing = self.jobs.job(job.name)
        if existing is not None and existing.source != source:
            log.warning("DistributedJob %s/%s refused: a job named %s already comes from %s",
                        namespace, name, job.name, existing.source)
            known.refused = ("NameTaken",
                             f"a job named {job.name} already comes from {existing.source}")
            return
        known.refused = None
        if existing is not None and dict(existing.spec) == job_to_dict(job):
            return
        self.jobs.add_job(job, source)
        log.info("job %s %s from DistributedJob %s/%s", job.name,
                 "updated" if existing is not None else "created", namespace, name)

    def _delete(self, obj: Mapping[str, Any]) -> None:
        namespace, name = _key(obj)
        with self._lock:
            self._objects.pop((namespace, name), None)
        existing = self.jobs.job(name)
        if existing is not None and existing.source == source_of(namespace, name):
            self.jobs.remove_job(name)
            log.info("job %s removed: its DistributedJob %s/%s was deleted", name,
                     namespace, name)

    # -- status --------------------------------------------------------------------------

    def write_statuses(self) -> None:
        """Write every object's status that changed (throttled per object)."""
        with self._lock:
            keys = list(self._objects)
        for key in keys:
            self._write_status(key)

    def _write_status(self, key: tuple[str, str]) -> None:
        with self._write_lock:
            self._write_status_locked(key)

    def _write_status_locked(self, key: tuple[str, str]) -> None:
        with self._lock:
            known = self._objects.get(key)
        if known is None:
            return
        job = self.jobs.job(known.name)
        if job is not None and job.source != known.source:
            job = None
        status = self._status(known, job)
        if known.written == status:
            return
        now = self.clock.monotonic()
        if known.written_at is not None and now - known.written_at < self.status_interval:
            return  # throttled: the next round writes it
        try:
            self.api.patch_status(known.namespace, known.name, status)
        except WatchError as err:
            log.warning("DistributedJob %s/%s: %s", known.namespace, known.name, err)
            return
        known.written, known.written_at = status, now

    def _status(self, known: _Object, job: JobStatus | None) -> dict[str, Any]:
        status: dict[str, Any] = {}
        if known.generation is not None:
            status["observedGeneration"] = known.generation
        if job is not None:
            status.update(state=job.state, reason=job.state_reason,
                          generation=job.generation, nodes=len(job.nodes),
                          failures=job.failures)
            if job.effective_training_ratio is not None:
                status["ettr"] = round(job.effective_training_ratio, 3)
            if job.checkpoint is not None:
                status["lastCheckpoint"] = {"step": job.checkpoint["step"],
                                            "path": job.checkpoint["path"]}
        elif known.refused is not None:
            status.update(state="Invalid", reason=known.refused[1])
        wanted = [("Accepted",) + (("False", *known.refused) if known.refused is not None
                                   else ("True", "Watching", "the controller runs the job"))]
        if job is not None:
            running = job.state == "running"
            wanted.append(("Running", "True" if running else "False",
                           _STATE_REASONS.get(job.state, "Unknown"),
                           job.state_reason or job.state))
        conditions = []
        for type_, value, reason, message in wanted:
            since = known.transitions.get(type_)
            if since is None or since[0] != value:
                since = (value, rfc3339(self.clock.time()))
                known.transitions[type_] = since
            condition: dict[str, Any] = {"type": type_, "status": value, "reason": reason,
                                         "message": message, "lastTransitionTime": since[1]}
            if known.generation is not None:
                condition["observedGeneration"] = known.generation
            conditions.append(condition)
        status["conditions"] = conditions
        return status


__all__ = ["SOURCE_PREFIX", "JobWatch", "Jobs", "job_from_object", "source_of"]
