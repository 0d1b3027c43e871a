"""The files of ``/proc/<pid>/`` that say who a process is, parsed: pure functions, no I/O.

* :func:`parse_cgroup`: ``cgroup`` -> the container and the Kubernetes pod.
* :func:`parse_proc_stat_line`: ``stat`` -> pid, name, state, CPU ticks, start time (the
  start time tells a reused pid from the process that had it before).
* :func:`parse_status_uid`: ``status`` -> the real uid.
* :func:`parse_cmdline_command`: ``cmdline`` -> argv[0]'s base name.

Readers: :mod:`sn_monitor.agent.workloads.processes` (who each GPU process is) and
``agent/collectors/processes.py`` (the D-state scan).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CONTAINER_ID = re.compile(
    r"(?:^|/)(?:(?:docker|cri-containerd|crio|libpod)-)?([0-9a-f]{64})(?:\.scope)?(?=/|$)"
)
_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """The container and the Kubernetes pod a process runs in; None where none."""

    container_id: str | None = None
    pod_uid: str | None = None


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What the agent needs from one ``/proc/<pid>/stat``."""

    pid: int
    name: str
    state: str
    cpu_ticks: int
    start_ticks: int


def cgroup_paths(text: str) -> list[str]:
    """``/proc/<pid>/cgroup``'s paths, the cgroup v2 one (``0::``) first.

    Lines are ``hierarchy:controllers:path``; a malformed line is skipped.
    """
    paths: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths.insert(0, parts[2])
        else:
            paths.append(parts[2])
    return paths


def parse_cgroup(text: str) -> CgroupIdentity:
    """``/proc/<pid>/cgroup`` -> the innermost container id and the pod UID, if any.

    Lines are ``hierarchy:controllers:path``; the cgroup v2 line (``0::``) is looked at
    first, then the others. A container id is a 64-hex path component, bare (cgroupfs
    driver: ``/docker/<id>``, ``/kubepods/burstable/pod<uid>/<id>``) or as a systemd scope
    (``docker-<id>.scope``, ``cri-containerd-<id>.scope``, ``crio-<id>.scope``,
    ``libpod-<id>.scope``); CRI-O's ``crio-conmon-<id>.scope`` is the monitor, not the
    container. The last one in a path wins (kind: a pod's container inside a docker
    node). A pod UID is ``pod<uid>`` with dashes, or with underscores under systemd
    (``kubepods-besteffort-pod<uid>.slice``); it is returned with dashes.
    """
    for path in cgroup_paths(text):
        containers = _CONTAINER_ID.findall(path)
        pods = _POD_UID.findall(path)
        if containers or pods:
            return CgroupIdentity(
                container_id=containers[-1] if containers else None,
                pod_uid=pods[-1].replace("_", "-") if pods else None,
            )
    return CgroupIdentity()


def parse_proc_stat_line(text: str) -> ProcStat | None:
    """``/proc/<pid>/stat`` -> pid, name, state, CPU ticks (user + system), start time.

    The name (``comm``) is in parentheses and may itself hold spaces and parentheses,
    so the fields are taken after the *last* ``)``. None when malformed.
    """
    head, sep, tail = text.rpartition(")")
    pid_text, _, name = head.partition(" (")
    fields = tail.split()
    if not sep or len(fields) < 20:
        return None
    try:
        return ProcStat(
            pid=int(pid_text),
            name=name,
            state=fields[0],
            cpu_ticks=int(fields[11]) + int(fields[12]),
            start_ticks=int(fields[19]),
        )
    except ValueError:
        return None


def parse_status_uid(text: str) -> int | None:
    """``/proc/<pid>/status`` -> the real uid (the first of the ``Uid:`` line); None if absent."""
    for line in text.splitlines():
        if line.startswith("Uid:"):
            fields = line[4:].split()
            return int(fields[0]) if fields and fields[0].isdigit() else None
    return None


def parse_cmdline_command(raw: bytes) -> str | None:
    """``/proc/<pid>/cmdline`` (NUL-separated argv) -> argv[0]'s base name; None if empty.

    A kernel thread, a zombie or a process that cleared its argv has an empty cmdline.
    """
    argv0 = raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")
    command = argv0.rsplit("/", 1)[-1].strip()
    return command or None
