"""The data of training-log recognition: findings, node faults, participants, a root cause.

Plain frozen dataclasses, shared by recognition, root-cause ordering, the offline command
and (later) the agent's log sources and the controller. A finding's ``category`` is one
of :data:`CATEGORIES`; its ``params`` hold what its signature read from the line (an
exit code, a collective's sequence number, a loss scale), as text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

#: The failure categories of issue 33: what a finding says went wrong.
CATEGORIES: Final[tuple[str, ...]] = (
    "nccl-timeout", "nccl-error", "network-error", "cuda-oom", "cuda-error", "ecc-error",
    "nan-loss", "process-killed", "segfault", "app-bug", "rendezvous-error",
    "dataloader-error", "host-oom",
)

Severity = Literal["critical", "error", "warning", "info"]

#: Severities from the worst down; a finding at ``info`` is never a failure.
SEVERITIES: Final[tuple[Severity, ...]] = ("critical", "error", "warning", "info")

@dataclass(frozen=True, slots=True)
class Finding:
    """One failure line (or block) recognised in a job's log."""

    #: The log file (or stream) it was read from, as given.
    file: str
    #: 1-based line number of the line that says it (a block: its deciding line).
    line: int
    category: str
    severity: Severity
    #: Whether the line points at the rank that printed it (its own failure) rather than
    #: the cascade of another rank's failure (a timeout, a peer's closed connection).
    root_candidate: bool
    rank: int | None
    node: str | None
    #: The line as printed, without its line break.
    text: str
    #: The catalogue entry that matched.
    signature: str = ""
    #: What the signature read from the line: named regex groups, block fields.
    params: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Seconds since the epoch, where the line carries a time (glog times: see
    #: :mod:`sn_monitor.joblog.context`).
    timestamp: float | None = None

    def number(self, name: str) -> float | None:
        """The parameter ``name`` as a number, or None when absent or not numeric."""
        value = self.params.get(name)
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class NodeFault:
    """A fault seen on a node by other means (an XID in the kernel log, a lost GPU)."""

    node: str
    #: What it is, e.g. ``"xid-79"``; it becomes the root cause's category.
    category: str
    timestamp: float | None = None
    text: str = ""


@dataclass(frozen=True, slots=True)
class Participant:
    """A rank whose log was read, with or without a failure of its own."""

    rank: int
    file: str
    node: str | None = None
    #: How many lines were read from it (a silent rank is blamed at its last line).
    lines: int = 0
    #: Whether the file holds several ranks' output (a torchrun --tee console).
    shared: bool = False


@dataclass(frozen=True, slots=True)
class RootCause:
    """The first failure of a job: where, which rank and node, why, and how it was chosen."""

    category: str
    file: str | None
    line: int | None
    rank: int | None
    node: str | None
    #: One sentence: which rule chose it (earliest root candidate, silent rank, ...).
    reason: str
    #: The finding it rests on, where there is one.
    finding: Finding | None = None
    fault: NodeFault | None = None
    #: False when only the cascade was seen (timeouts, lost peers): its rank and node
    #: are where the first such line was read, not where the failure was.
    pinpointed: bool = True
