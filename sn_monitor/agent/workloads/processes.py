"""Who a GPU process is: its command, user, container and pod, read from /proc.

NVML lists a GPU's processes by pid (in the host's PID namespace, so an agent in a
container needs the host's /proc: ``hostPID``, or the host's /proc mounted and
``paths.procfs`` pointed at it). :class:`ProcessIdentities` reads ``<procfs>/<pid>/``
(``stat``, ``cmdline``, ``status``, ``cgroup``; parsed by
:mod:`~sn_monitor.agent.workloads.procfs`) once per process and keeps the answer while
the process lives. A process is known by (pid, start time): a pid the kernel hands to a
new process has another start time, so it is read afresh and never inherits the previous
owner's identity. Each cycle costs one ``stat`` read per GPU process (to learn the start
time); the cache holds only the processes of the latest cycle.
"""

from __future__ import annotations

import logging
import pwd
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sn_monitor.agent.workloads.model import Workload
from sn_monitor.agent.workloads.procfs import (
    CgroupIdentity,
    ProcStat,
    parse_cgroup,
    parse_cmdline_command,
    parse_proc_stat_line,
    parse_status_uid,
)

logger = logging.getLogger(__name__)

#: uid -> name answers kept at most (a node has few users; past it, the memory starts over).
MAX_KNOWN_USERS = 1024
#: A command name is cut to this many characters (it becomes a label value).
MAX_COMMAND_CHARS = 64

UserName = Callable[[int], str]


def passwd_user_name(uid: int) -> str:
    """The uid's name in the password database; the uid as text where it has none.

    In a container the database is the agent image's, not the host's: a host user
    unknown there shows as its number.
    """
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


#: The scheduler's job of a pid (Slurm's: :class:`~.slurm.SlurmProcessJobs`), None when
#: it is in none; read once per (pid, start time) with the rest of the identity.
JobOf = Callable[[int], Workload | None]


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """Who one process is; each field None where /proc did not say (gone, denied)."""

    pid: int
    command: str | None = None
    user: str | None = None
    container_id: str | None = None
    pod_uid: str | None = None
    #: The scheduler's job the process belongs to (Slurm), None outside one.
    job: Workload | None = None


class ProcessIdentities:
    """Each GPU process's identity, read from ``procfs`` once per (pid, start time).

    ``user_name`` turns a uid into a name (default: the password database), asked once
    per uid. :meth:`identify` is called during a cycle (once per GPU, or once for all),
    and :meth:`end_cycle` at its end forgets every process the cycle did not ask about.
    """

    def __init__(self, procfs: Path, user_name: UserName = passwd_user_name,
                 job_of: JobOf | None = None) -> None:
        self._root = str(procfs)
        self._job_of = job_of
        self._user_name = user_name
        self._users: dict[int, str] = {}
        self._known: dict[tuple[int, int], ProcessIdentity] = {}
        self._asked: dict[tuple[int, int], ProcessIdentity] = {}

    def identify(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]:
        """The identity of each pid (its start time read anew: a reused pid is another)."""
        out: dict[int, ProcessIdentity] = {}
        for pid in pids:
            if pid in out:
                continue
            stat = self._stat(pid)
            if stat is None:  # gone since NVML listed it, or not ours to read
                out[pid] = ProcessIdentity(pid)
                continue
            key = (pid, stat.start_ticks)
            identity = self._asked.get(key) or self._known.get(key) or self._read(pid, stat)
            if identity is not None:
                self._asked[key] = identity
            out[pid] = identity or ProcessIdentity(pid)
        return out

    def end_cycle(self) -> None:
        """Keep for the next cycle only the processes this one asked about."""
        self._known, self._asked = self._asked, {}

    def _stat(self, pid: int) -> ProcStat | None:
        text = self._text(pid, "stat")
        return parse_proc_stat_line(text) if text is not None else None

    def _read(self, pid: int, stat: ProcStat) -> ProcessIdentity | None:
        """Read the process's files; None if the pid changed hands while they were read."""
        cmdline = self._bytes(pid, "cmdline")
        command = (parse_cmdline_command(cmdline) if cmdline else None) or stat.name
        status = self._text(pid, "status")
        uid = parse_status_uid(status) if status is not None else None
        cgroup = self._text(pid, "cgroup")
        where = parse_cgroup(cgroup) if cgroup is not None else CgroupIdentity()
        again = self._stat(pid)
        if again is None or again.start_ticks != stat.start_ticks:
            return None
        return ProcessIdentity(
            pid=pid,
            command=command[:MAX_COMMAND_CHARS] or None,
            user=None if uid is None else self._user(uid),
            container_id=where.container_id,
            pod_uid=where.pod_uid,
            job=self._job_of(pid) if self._job_of is not None else None,
        )

    def _user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            if len(self._users) >= MAX_KNOWN_USERS:
                self._users.clear()
            name = self._users[uid] = self._user_name(uid)
        return name

    def _bytes(self, pid: int, name: str) -> bytes | None:
        path = f"{self._root}/{pid}/{name}"  # a str, not a Path: read every cycle
        try:
            with open(path, "rb") as file:
                return file.read()
        except OSError as exc:  # gone since NVML listed it, or not ours to read
            logger.debug("cannot read %s: %s", path, exc)
            return None

    def _text(self, pid: int, name: str) -> str | None:
        raw = self._bytes(pid, name)
        return None if raw is None else raw.decode("utf-8", errors="replace")
