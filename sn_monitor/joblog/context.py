"""Where a log line comes from: its rank and node, from the file's path or the line itself.

Pure functions over text. From the path: torchrun's ``--log-dir`` layout
(``<dir>/.../attempt_N/<local rank>/stdout.log|stderr.log``) and the common names
``rank_3.log``, ``rank3.out``, ``node-a.rank3.log``. From the line: torchrun's ``--tee``
prefixes ``[rank3]:`` and ``[default3]:`` (the role and local rank), srun's ``-l``
prefix ``3: ``, ``[RANK 3]``, NCCL's ``host:pid:tid [local] NCCL ...`` (the node), and
ProcessGroupNCCL's ``[Rank 3]`` where nothing better says. A rank read from the line
beats one read from the path, which beats ``[Rank N]`` (a process group's rank).

Times: ISO-like stamps (``2024-09-11 17:52:11,320``, torchrun's ``2025-05-21_15:43:03``)
are read as UTC; glog stamps (``E0321 02:07:08.408271``, PyTorch's C++ and launcher
lines) carry no year, so the caller says which year (the agent: today's; the offline
command: the file's modification year).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from pathlib import PurePath

_ATTEMPT_DIR = re.compile(r"^attempt_\d+$")
_RANK_NAME = re.compile(r"(?:^|[._/-])rank[_-]?(?P<rank>\d+)(?:[._-]|$)", re.IGNORECASE)
_NODE_NAME = re.compile(r"^(?P<node>[A-Za-z][\w-]*?)[._]rank[_-]?\d+", re.IGNORECASE)

#: A ``--tee`` or ``srun -l`` prefix: the rank, and where the printed text starts.
_PREFIX = re.compile(r"^(?:\[(?:rank|default)(?P<rank>\d+)\]: ?|(?P<task>\d{1,5}): )")
_RANK_WORD = re.compile(r"\[RANK (?P<rank>\d+)\]|^RANK (?P<rank2>\d+)\b")
_PG_RANK = re.compile(r"\[(?:PG [^\]]*?)?Rank (?P<rank>\d+)\]")
_NCCL_HOST = re.compile(r"(?:^|\]:|\s)(?P<host>[A-Za-z][\w.-]*):\d+:\d+ \[\d+\] NCCL ")

_ISO = re.compile(r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})[ T_](?P<h>\d{2}):(?P<mi>\d{2})"
                  r":(?P<s>\d{2})(?:[.,](?P<frac>\d+))?")
_GLOG = re.compile(r"(?:^|[\[\s:])[IWEF](?P<mo>\d{1,2})(?P<d>\d{2}) (?P<h>\d{2}):(?P<mi>\d{2})"
                   r":(?P<s>\d{2})\.(?P<frac>\d+)")


@dataclass(frozen=True, slots=True)
class Origin:
    """What the path of a log says about it."""

    rank: int | None = None
    node: str | None = None


def origin_of(path: str) -> Origin:
    """The rank and node a log file's path names, where it names them."""
    parts = PurePath(path).parts
    rank: int | None = None
    if len(parts) >= 3 and parts[-2].isdigit() and _ATTEMPT_DIR.match(parts[-3]):
        rank = int(parts[-2])
    name = parts[-1] if parts else ""
    if rank is None:
        found = _RANK_NAME.search(name)
        if found is not None:
            rank = int(found["rank"])
    node_found = _NODE_NAME.match(name)
    return Origin(rank=rank, node=node_found["node"] if node_found else None)


def split_prefix(line: str) -> tuple[int | None, str]:
    """``[rank3]: text`` -> ``(3, "text")``; a line with no rank prefix -> ``(None, line)``.

    Prefixes nest (``[default2]:[rank2]: ...``, torchrun's ``--tee`` around the rank's
    own); up to three are split off, and a ``[rankN]`` (the global rank) wins over the
    others (a local rank, an srun task).
    """
    rank: int | None = None
    global_rank: int | None = None
    rest = line
    for _ in range(3):
        found = _PREFIX.match(rest)
        if found is None:
            break
        if found["rank"] is not None and found.group(0).startswith("[rank"):
            global_rank = int(found["rank"])
        if rank is None:
            rank = int(found["rank"] or found["task"])
        rest = rest[found.end():]
    return (global_rank if global_rank is not None else rank), rest


def line_rank(line: str, fallback: int | None) -> int | None:
    """The rank a line names (prefix, ``[RANK n]``), else ``fallback``, else ``[Rank n]``."""
    prefixed, _ = split_prefix(line)
    if prefixed is not None:
        return prefixed
    found = _RANK_WORD.search(line)
    if found is not None:
        return int(found["rank"] or found["rank2"])
    if fallback is not None:
        return fallback
    pg = _PG_RANK.search(line)
    return int(pg["rank"]) if pg is not None else None


def line_node(line: str, fallback: str | None) -> str | None:
    """The node a line names (NCCL's ``host:pid:tid [dev] NCCL``), else ``fallback``."""
    found = _NCCL_HOST.search(line)
    return found["host"] if found is not None else fallback


def line_time(line: str, year: int) -> float | None:
    """Seconds since the epoch of the first time stamp in ``line``, or None.

    ISO-like stamps are read as UTC; a glog stamp (no year) is read in ``year``.
    """
    found = _ISO.search(line)
    if found is not None:
        return _epoch(int(found["y"]), found)
    found = _GLOG.search(line)
    if found is not None:
        return _epoch(year, found)
    return None


def _epoch(year: int, found: re.Match[str]) -> float | None:
    try:
        seconds = calendar.timegm((year, int(found["mo"]), int(found["d"]), int(found["h"]),
                                   int(found["mi"]), int(found["s"]), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    if not (1 <= int(found["mo"]) <= 12 and 1 <= int(found["d"]) <= 31):
        return None
    frac = found["frac"]
    return seconds + (float(f"0.{frac}") if frac else 0.0)
