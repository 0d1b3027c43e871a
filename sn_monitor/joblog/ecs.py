"""Findings (and, when asked, the raw lines read) as Elastic Common Schema documents.

One document per finding or line, one JSON object per line of a file that Filebeat or
Vector ships to Elasticsearch or Loki (``deploy/logging/``). The fields follow ECS
9.4.0 (https://www.elastic.co/docs/reference/ecs, ``generated/csv/fields.csv`` in
github.com/elastic/ecs at tag v9.4.0); what ECS has no field for is under our own
namespace, ``sn_monitor.*``, as ECS asks of custom fields:

- ``@timestamp``: when the line says it was logged, else when it was read;
  ``event.created``: when it was read.
- ``message``: the line; ``log.file.path``: its file (or stream); ``log.level``: the
  finding's severity; ``log.origin.file.name``/``.line``: the source location a glog
  prefix names (``ProcessGroupNCCL.cpp:1234]``), where it has one.
- ``event.kind``: ``alert`` for a finding, ``event`` for a raw line; ``event.category``
  and ``event.type`` from ECS's allowed values (:data:`EVENT_CLASS`);
  ``event.dataset`` ``sn_monitor.joblog``, ``event.module`` ``sn_monitor``.
- ``rule.name``: the catalogue signature that matched ("the name of the rule or
  signature generating the event").
- ``host.name``: the node; ``orchestrator.*`` and ``container.name``: the pod, its
  namespace and container, where known.
- ``sn_monitor.category``, ``.root_candidate``, ``.rank``, ``.job``, ``.line``,
  ``.stream``, ``.params`` (a flat map of text: mapped as ``flattened``).
- A template finding (a template new in the job's history, or bursting): ``event.kind``
  ``event``, ``log.level`` ``info``, ``sn_monitor.category`` ``new-template`` or
  ``template-burst``, ``sn_monitor.template`` ``{id, text, count, window_count}``.

:class:`EcsOutput` is the agent's end of it: off unless configured
(:class:`EcsOutputOptions`), it hands each document to a
:class:`~sn_monitor.joblog.jsonlines.LineQueue` and never waits on the disk.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sn_monitor.clock import Clock
from sn_monitor.joblog.ecs_options import EcsOutputOptions
from sn_monitor.joblog.jsonlines import LineQueue, QueueCounts, RotatingFile
from sn_monitor.joblog.model import Finding
from sn_monitor.joblog.templates import TemplateFinding

#: The ECS release the documents follow.
ECS_VERSION: Final = "9.4.0"
DATASET: Final = "sn_monitor.joblog"
MODULE: Final = "sn_monitor"
#: Our namespace for what ECS has no field for.
NAMESPACE: Final = "sn_monitor"

#: ``event.category`` and ``event.type`` per finding category: each type is one ECS lists
#: as expected for each of the categories. A process that ended (killed, crashed, out of
#: memory) is ``end``; a failure it printed and may still be living with is ``info``.
EVENT_CLASS: Final[Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "nccl-timeout": (("network", "process"), ("info",)),
    "nccl-error": (("network", "process"), ("info",)),
    "network-error": (("network",), ("info",)),
    "rendezvous-error": (("network", "process"), ("info",)),
    "cuda-oom": (("process",), ("info",)),
    "cuda-error": (("process",), ("info",)),
    "ecc-error": (("host", "process"), ("info",)),
    "nan-loss": (("process",), ("info",)),
    "process-killed": (("process",), ("end",)),
    "segfault": (("process",), ("end",)),
    "host-oom": (("host", "process"), ("end",)),
    "app-bug": (("process",), ("info",)),
    "dataloader-error": (("process",), ("info",)),
}
#: A category not in :data:`EVENT_CLASS` (a template miner's finding), and a raw line.
OTHER_CLASS: Final = (("process",), ("info",))

#: A glog prefix's source location: ``E0321 02:07:08.408 1234 ProcessGroupNCCL.cpp:607]``,
#: torch's ``[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607]``, ``[E ProcessGroupNCCL.cpp:737]``.
_GLOG_ORIGIN = re.compile(r"(?:^|[\[\s:])[IWEF](?:\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?(?: +\d+)?)? "
                          r"(?P<file>[\w.+-]+\.\w+):(?P<line>\d+)\]")


@dataclass(frozen=True, slots=True)
class LineSource:
    """Where the lines come from beyond what a finding says: the job, node, pod, container.

    ``node`` is the agent's node (a finding's own node, from its path or line, wins);
    ``orchestrator`` the scheduler that runs the job (``kubernetes``, ``slurm``).
    """

    node: str | None = None
    job: str | None = None
    orchestrator: str | None = None
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    stream: str | None = None


def iso_time(seconds: float) -> str:
    """Seconds since the epoch as ECS's ``date``: ISO 8601 in UTC, milliseconds."""
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def finding_document(finding: Finding, source: LineSource, *, read_at: float) -> dict[str, Any]:
    """The ECS document of ``finding`` (an ``alert``), read at ``read_at``."""
    categories, types = EVENT_CLASS.get(finding.category, OTHER_CLASS)
    doc = _common(finding.text, finding.file, source, finding.node,
                  logged_at=finding.timestamp, read_at=read_at)
    doc["event"].update(kind="alert", category=list(categories), type=list(types))
    doc["log"]["level"] = finding.severity
    if finding.signature:
        doc["rule"] = {"name": finding.signature}
    ours = doc[NAMESPACE]
    ours.update(category=finding.category, root_candidate=finding.root_candidate,
                line=finding.line)
    if finding.rank is not None:
        ours["rank"] = finding.rank
    if finding.params:
        ours["params"] = {name: str(value) for name, value in finding.params.items()}
    return doc


def template_document(found: TemplateFinding, file: str, source: LineSource, *,
                      read_at: float) -> dict[str, Any]:
    """The ECS document of a template finding: the line that made it, and its template."""
    doc = line_document(found.line, file, source, read_at=read_at)
    doc["log"]["level"] = "info"
    doc[NAMESPACE].update(category=found.kind, template={
        "id": found.template_id, "text": found.template, "count": found.count,
        "window_count": found.window_count})
    return doc


def line_document(text: str, file: str, source: LineSource, *, read_at: float,
                  logged_at: float | None = None, rank: int | None = None,
                  node: str | None = None) -> dict[str, Any]:
    """The ECS document of a raw line (an ``event``, with no finding's fields)."""
    categories, types = OTHER_CLASS
    doc = _common(text, file, source, node, logged_at=logged_at, read_at=read_at)
    doc["event"].update(kind="event", category=list(categories), type=list(types))
    if rank is not None:
        doc[NAMESPACE]["rank"] = rank
    return doc


def _common(text: str, file: str, source: LineSource, node: str | None, *,
            logged_at: float | None, read_at: float) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "@timestamp": iso_time(logged_at if logged_at is not None else read_at),
        "ecs": {"version": ECS_VERSION},
        "message": text,
        "log": {"file": {"path": file}},
        "event": {"dataset": DATASET, "module": MODULE, "created": iso_time(read_at)},
    }
    origin = _GLOG_ORIGIN.search(text)
    if origin is not None:
        doc["log"]["origin"] = {"file": {"name": origin["file"], "line": int(origin["line"])}}
    host = node or source.node
    if host:
        doc["host"] = {"name": host}
    orchestrator = _orchestrator(source)
    if orchestrator:
        doc["orchestrator"] = orchestrator
    if source.container:
        doc["container"] = {"name": source.container}
    ours: dict[str, Any] = {}
    if source.job:
        ours["job"] = source.job
    if source.stream:
        ours["stream"] = source.stream
    doc[NAMESPACE] = ours
    return doc


def _orchestrator(source: LineSource) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if source.orchestrator:
        found["type"] = source.orchestrator
    if source.namespace:
        found["namespace"] = source.namespace
    if source.pod:
        found["resource"] = {"type": "pod", "name": source.pod}
    return found


def json_line(doc: Mapping[str, Any]) -> bytes:
    r"""One document as one line of UTF-8 JSON (a line break inside the text is escaped).

    A byte the reader could not decode (kept as a lone surrogate) is written as its JSON
    escape, ``\udc80``: the line stays valid UTF-8 and valid JSON.
    """
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"
    return text.encode("utf-8", "backslashreplace")


class EcsOutput:
    """Findings and lines to a file of ECS JSON lines, off the caller's thread."""

    def __init__(self, options: EcsOutputOptions, source: LineSource, clock: Clock) -> None:
        self.options = options
        self.source = source
        self._clock = clock
        self._queue = LineQueue(RotatingFile(Path(options.path), max_bytes=options.max_bytes,
                                             keep=options.keep),
                                capacity=options.queue_lines)

    @property
    def counts(self) -> QueueCounts:
        """Documents written, dropped (queue full) and failed (disk)."""
        return self._queue.counts

    def finding(self, finding: Finding, *, read_at: float | None = None) -> bool:
        """Queue ``finding``'s document; False when it was dropped."""
        stamp = self._clock.time() if read_at is None else read_at
        return self._queue.offer(json_line(finding_document(finding, self.source,
                                                            read_at=stamp)))

    def template(self, found: TemplateFinding, file: str, *,
                 read_at: float | None = None) -> bool:
        """Queue a template finding's document; False when it was dropped."""
        stamp = self._clock.time() if read_at is None else read_at
        return self._queue.offer(json_line(template_document(found, file, self.source,
                                                             read_at=stamp)))

    def line(self, text: str, file: str, *, read_at: float | None = None,
             logged_at: float | None = None, rank: int | None = None) -> bool:
        """Queue a raw line's document when ``raw_lines`` is on; False when it was not."""
        if not self.options.raw_lines:
            return False
        stamp = self._clock.time() if read_at is None else read_at
        return self._queue.offer(json_line(line_document(
            text, file, self.source, read_at=stamp, logged_at=logged_at, rank=rank)))

    def start(self) -> None:
        """Start writing in the background."""
        self._queue.start()

    def flush(self) -> int:
        """Write what is queued now, on this thread (tests, a command's last step)."""
        return self._queue.drain()

    def stop(self, timeout: float) -> bool:
        """Write what is queued and stop; False if the writer outlived ``timeout``."""
        return self._queue.stop(timeout)
