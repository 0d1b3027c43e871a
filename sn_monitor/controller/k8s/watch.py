"""A Kubernetes list + watch as data: events, their parsing, and the errors of a watch.

Plain data and pure functions (no client imported): :mod:`.job_api` reads the stream
from the API server, :mod:`sn_monitor.controller.jobs.crd_watch` acts on the events.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
_TYPES = ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")


class WatchError(Exception):
    """The API server could not be asked, or the stream broke: re-list after a backoff."""


class Gone(WatchError):
    """410 Gone: the resourceVersion is too old to watch from; re-list at once."""


@dataclass(frozen=True)
class ObjectList:
    """A list's objects and the resourceVersion to watch from."""

    items: list[dict[str, Any]]
    resource_version: str


@dataclass(frozen=True)
class WatchEvent:
    """One event of a watch stream (a BOOKMARK carries only a resourceVersion)."""

    type: EventType
    object: dict[str, Any]

    @property
    def resource_version(self) -> str | None:
        meta = self.object.get("metadata")
        value = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return value if isinstance(value, str) else None


def parse_event(line: str | bytes) -> WatchEvent:
    """One line of a watch stream; an ERROR event raises Gone (410) or WatchError."""
    try:
        doc = json.loads(line)
    except ValueError as err:
        raise WatchError(f"a watch event that is not JSON: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("object"), dict):
        raise WatchError(f"a watch event without an object: {str(doc)[:200]}")
    kind, obj = doc.get("type"), doc["object"]
    if kind == "ERROR":
        code, message = obj.get("code"), obj.get("message", "")
        if code == 410:
            raise Gone(f"410 Gone: {message}")
        raise WatchError(f"the watch ended with an error ({code}): {message}")
    if kind not in _TYPES:
        raise WatchError(f"unknown watch event type {kind!r}")
    return WatchEvent(type=kind, object=obj)


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The newline-ended lines of a chunked stream (a chunk may end mid-line)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


class WatchApi(Protocol):
    """What a watch loop needs of the API server for one kind of object."""

    def list(self) -> ObjectList: ...

    def watch(self, resource_version: str) -> Iterator[WatchEvent]:
        """Events after ``resource_version``; ends when the server ends the stream."""
        ...

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Break off the watch under way (another thread is stopping the loop)."""
        ...


__all__ = ["EventType", "Gone", "ObjectList", "WatchApi", "WatchError", "WatchEvent",
           "parse_event", "split_lines"]
