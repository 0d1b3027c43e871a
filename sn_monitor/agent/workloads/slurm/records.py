"""Pure parsers of what ``squeue`` and ``scontrol show job -d -o`` print.

Job names are user text and may hold anything Slurm prints as a field (``JobName=x
UserId=root(0) Nodes=g1 GRES=gpu:8(IDX:0-7)``), so nothing is read out of ``scontrol``'s
``Key=Value`` words where a name could stand in for it:

* a job's id, user, partition, state and name come from ``squeue`` with
  :data:`QUEUE_FORMAT`, the name last: everything after the fifth ``|`` (ids, user
  and partition names, states hold no ``|``);
* a job's GPUs on a node come from ``scontrol show job -d -o <id>``, whose line must
  start with the id, the name and the user ``squeue`` gave (``JobId=<id> JobName=<name>
  UserId=<user>(<uid>) GroupId=``); after them, the ``-d`` node
  groups (``Nodes=<hostlist> CPU_IDs=... Mem=... GRES=gpu:2(IDX:0-1)``) stand between
  ``JOB_GRES=`` and ``MinCPUsNode=``, before any other user text (``Command=``,
  ``WorkDir=``, ``Comment=``). ``IDX`` is a GPU's position among the node's GPUs in
  gres.conf (see :mod:`.allocations` for the device it means).

A job whose name holds a line break gets no GPUs here (both tools print it as is).
The layout is Slurm 22.05's (Debian 12's slurm-wlm, which the integration tests run);
a Slurm that prints the node groups elsewhere gives no GPUs rather than wrong ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: ``squeue --format``: job id (the raw id, not an array's ``<id>_<task>``), user id,
#: user, partition, state (long form), name.
QUEUE_FORMAT = "%A|%U|%u|%P|%T|%j"
#: Job states in which a job holds its nodes' GPUs.
HOLDING_STATES = ("RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING")

#: One ``-d`` node group.
_NODE_GROUP = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=\S* Mem=\S* GRES=(\S*)")
#: One GRES of a node group: ``gpu:2(IDX:0-1)``, ``gpu:a100:2(IDX:0,2)``.
_GRES = re.compile(r"([A-Za-z0-9_]+)(?::[^(,]*)?\(IDX:([0-9,\-]*)\)")
#: One bracket group of a hostlist: ``n[1-3,5]``.
_BRACKET = re.compile(r"\[([^\]]*)\]")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as ``squeue`` lists it; None where Slurm has nothing (``(null)``)."""

    job_id: str
    uid: int | None
    user: str | None
    partition: str | None
    state: str | None
    name: str | None

    @property
    def holds_devices(self) -> bool:
        """The job's state is one that holds its allocation (running, suspended, ...)."""
        return self.state in HOLDING_STATES


def parse_queue(text: str) -> list[JobRecord]:
    """``squeue --noheader --format=`` :data:`QUEUE_FORMAT` -> its jobs.

    A line that is not such a record (a name's second line) is skipped, and so is every
    record of a job id listed twice (a name's second line that looks like a record).
    """
    records: dict[str, JobRecord] = {}
    repeated: set[str] = set()
    for line in text.splitlines():
        parts = line.split("|", 5)
        if len(parts) != 6 or not parts[0].isdigit():
            continue
        job_id, uid, user, partition, state, name = parts
        if job_id in records:
            repeated.add(job_id)
        records[job_id] = JobRecord(job_id, int(uid) if uid.isdigit() else None, _known(user),
                                    _known(partition), _known(state), _known(name))
    return [record for job_id, record in records.items() if job_id not in repeated]


def node_gpus(detail: str, job: JobRecord, node: str) -> tuple[int, ...]:
    """The GRES indices of ``job``'s GPUs on ``node`` from its ``scontrol -d -o`` line.

    Empty when the line is not that job's (its head differs: see the module).
    """
    head = (f"JobId={job.job_id} JobName={job.name or ''} UserId={job.user or ''}"
            f"({job.uid}) GroupId=")
    if not detail.startswith(head):
        return ()
    rest = detail[len(head):]
    start = rest.find(" JOB_GRES=")
    end = rest.find(" MinCPUsNode=", start)
    if start < 0 or end < 0:
        return ()
    for nodes, gres in _NODE_GROUP.findall(rest[start:end]):
        if node in expand_hostlist(nodes):
            return gpu_indices(gres)
    return ()


def parse_indices(text: str) -> tuple[int, ...]:
    """``0-1,3`` -> (0, 1, 3); empty for text that is not such a list."""
    indices: list[int] = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            return ()
        indices.extend(range(int(low), int(high) + 1) if sep else (int(low),))
    return tuple(indices)


def gpu_indices(gres: str) -> tuple[int, ...]:
    """The indices of the ``gpu`` GRES in a ``-d`` node group's ``GRES=`` value."""
    indices: list[int] = []
    for match in _GRES.finditer(gres):
        if match.group(1) == "gpu":
            indices.extend(parse_indices(match.group(2)))
    return tuple(sorted(set(indices)))


def expand_hostlist(expression: str) -> list[str]:
    """A Slurm hostlist (``n[01-03,7],gpu1``) -> its names (``n01 n02 n03 n7 gpu1``)."""
    names: list[str] = []
    for item in _split_top_level(expression):
        names.extend(_expand_one(item))
    return names


def _split_top_level(expression: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(expression):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(expression[start:i])
            start = i + 1
    items.append(expression[start:])
    return [item.strip() for item in items if item.strip()]


def _expand_one(item: str) -> list[str]:
    match = _BRACKET.search(item)
    if match is None:
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    names = []
    for part in match.group(1).split(","):
        low, sep, high = part.partition("-")
        if not sep:
            numbers = [low]
        elif low.isdigit() and high.isdigit():
            numbers = [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
        else:
            return [item]  # not a hostlist we understand: the text as a name
        for number in numbers:
            names.extend(_expand_one(f"{head}{number}{tail}"))
    return names


def _known(value: str) -> str | None:
    return None if value in ("", "(null)") else value
