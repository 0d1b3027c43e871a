"""Pure parsers of ``scontrol show job -o`` (``-d``): a job's fields and its GPUs per node.

``-o`` prints one job per line as ``Key=Value`` words. Values may hold spaces
(``JobName=my job``, ``Command=...``): a value runs to the next word that starts a key.
``-d`` adds, per group of nodes, ``Nodes=<hostlist> CPU_IDs=... Mem=...
GRES=gpu:2(IDX:0-1)``; ``IDX`` is the position of each GPU among the node's GPUs as
gres.conf lists them (see :mod:`.allocations` for how that becomes a device).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

#: A key starts a word: ``JobId=``, ``AllocNode:Sid=``, ``CPUs/Task=``.
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/]*)=")
#: One GRES of a node group: ``gpu:2(IDX:0-1)``, ``gpu:a100:2(IDX:0,2)``.
_GRES = re.compile(r"([A-Za-z0-9_]+)(?::[^(,]*)?\(IDX:([0-9,\-]*)\)")
#: ``UserId=alice(1000)``.
_USER = re.compile(r"^(.*?)\(\d+\)$")
#: One bracket group of a hostlist: ``n[1-3,5]``.
_BRACKET = re.compile(r"\[([^\]]*)\]")

#: Job states in which a job holds its nodes' GPUs.
HOLDING_STATES = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING", "COMPLETING"})


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What the agent uses of one ``scontrol show job`` record; None where Slurm has none.

    ``gpus``: per node name, the GRES indices of the ``gpu`` GRES the job holds there
    (from ``-d``; empty without it).
    """

    job_id: str
    user: str | None = None
    partition: str | None = None
    name: str | None = None
    state: str | None = None
    gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def holds_devices(self) -> bool:
        """The job's state is one that holds its allocation (running, suspended, ...)."""
        return self.state in HOLDING_STATES


def parse_fields(line: str) -> list[tuple[str, str]]:
    """The ``Key=Value`` words of one ``-o`` line, in order (keys may repeat)."""
    found = list(_KEY.finditer(line))
    fields = []
    for i, match in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(line)
        fields.append((match.group(1), line[match.end():end].strip()))
    return fields


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


def parse_job_line(line: str) -> JobRecord | None:
    """One ``scontrol show job -o [-d]`` line -> its record; None without ``JobId=``."""
    fields = parse_fields(line)
    values: dict[str, str] = {}
    gpus: dict[str, tuple[int, ...]] = {}
    nodes: list[str] = []
    for key, value in fields:
        if key == "Nodes":
            nodes = expand_hostlist(value)
        elif key == "GRES" and nodes:
            for node in nodes:
                gpus[node] = gpu_indices(value)
            nodes = []
        else:
            values.setdefault(key, value)
    job_id = values.get("JobId")
    if not job_id:
        return None
    user = values.get("UserId")
    if user is not None:
        named = _USER.match(user)
        user = named.group(1) if named else user
    return JobRecord(job_id=job_id, user=_known(user), partition=_known(values.get("Partition")),
                     name=_known(values.get("JobName")), state=_known(values.get("JobState")),
                     gpus={node: found for node, found in gpus.items() if found})


def parse_jobs(text: str) -> list[JobRecord]:
    """Every record of ``scontrol show job -o [-d]`` output (one per line)."""
    records = (parse_job_line(line) for line in text.splitlines() if line.strip())
    return [record for record in records if record is not None]


def _known(value: str | None) -> str | None:
    return None if value in (None, "", "(null)") else value
