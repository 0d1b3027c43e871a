"""What a log file's path says: rank and node (a pattern per glob), pod and container.

Pure functions of the path.

**Rank pattern.** A regular expression searched in the path; its named groups ``rank``,
``local_rank``, ``node`` and ``stream`` (``stdout`` or ``stderr``) fill the line's
context, other groups are ignored. The default, :data:`TORCHRUN_PATTERN`, reads
torchrun's ``--log-dir`` layout, ``<dir>/<run>/attempt_<N>/<local rank>/stdout.log``
(and ``stderr.log``): torchrun names each worker's folder by its *local* rank.

**CRI names.** The kubelet links each container's log as
``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log`` (pod, namespace
and container names cannot hold ``_``; a name longer than 255 bytes is cut, so the id may
be short).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import PurePath

from sn_monitor.agent.joblogs.lines import LineContext

#: torchrun's ``--log-dir`` layout: ``attempt_<N>/<local rank>/stdout.log|stderr.log``.
TORCHRUN_PATTERN = r"attempt_\d+/(?P<local_rank>\d+)/(?P<stream>stdout|stderr)\.log$"
#: The groups a rank pattern may name.
CONTEXT_GROUPS = frozenset({"rank", "local_rank", "node", "stream"})

_CRI_NAME = re.compile(
    r"(?P<pod>[^_/]+)_(?P<namespace>[^_/]+)_(?P<container>[^_/]+)-(?P<id>[0-9a-f]+)\.log")


def path_context(base: LineContext, path: str, pattern: re.Pattern[str] | None) -> LineContext:
    """``base`` with the rank, local rank, node and stream that ``pattern`` finds in ``path``."""
    found = pattern.search(path) if pattern is not None else None
    groups = {k: v for k, v in (found.groupdict() if found else {}).items()
              if k in CONTEXT_GROUPS and v is not None}
    stream = groups.get("stream")
    return replace(
        base, origin=path,
        rank=_integer(groups.get("rank")), local_rank=_integer(groups.get("local_rank")),
        node=groups.get("node") or base.node,
        stream="stdout" if stream == "stdout" else "stderr" if stream == "stderr" else None)


def _integer(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


@dataclass(frozen=True, slots=True)
class CriName:
    """The pod, namespace, container and container id a CRI log file's name gives."""

    pod: str
    namespace: str
    container: str
    container_id: str


def parse_cri_name(path: str) -> CriName | None:
    """``<pod>_<namespace>_<container>-<id>.log`` (the file's name) -> its parts, or None."""
    found = _CRI_NAME.fullmatch(PurePath(path).name)
    if found is None:
        return None
    return CriName(found["pod"], found["namespace"], found["container"], found["id"])


def cri_context(base: LineContext, path: str) -> LineContext | None:
    """``base`` with the pod, namespace and container of CRI log ``path``; None: not one."""
    name = parse_cri_name(path)
    if name is None:
        return None
    return replace(base, origin=path, pod=name.pod, namespace=name.namespace,
                   container=name.container)
