"""Root-cause ordering: which rank (or node) failed first, and why, across a job's logs.

When a job dies every rank prints something; the first failure is buried in the
cascade. :func:`order` picks it from the findings of many files, ranks and nodes (and,
in the controller, of many agents), plus the faults seen on nodes by other means:

1. A node fault (an XID on node N) is the root cause unless a rank's own failure is
   strictly earlier in time: NCCL timeouts everywhere after an XID on N -> N.
2. Else the earliest *root candidate* (a line that points at the rank that printed it:
   a CUDA error, an OOM, a NaN loss, a traceback, a SIGKILL named by torchrun). Ordered
   by time when every candidate has a time stamp; else by severity, then by position in
   its own file (ranks start together), then rank. A rank's first failure says what
   happened to it: a candidate that follows a cascade line of the same rank in the same
   file (an abort after its collective timed out) is a consequence, not a candidate.
3. Else only the cascade is left (timeouts, closed connections): the job hung or a rank
   vanished without a word. The suspect is the rank with no failure of its own while
   the others time out (a rank that hangs prints nothing), else the rank whose
   collective sequence number is behind the others', else the earliest cascade line.

torchrun's "Root Cause (first observed failure)" names the first rank to *exit*; after a
hang that is a rank that merely timed out, so its exit-code-1 report is cascade (see the
catalogue) and never outranks the rules above.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Final

from sn_monitor.joblog.model import SEVERITIES, Finding, NodeFault, Participant, RootCause

#: The categories that say "a collective waited for someone" or "a peer is gone".
CASCADE_CATEGORIES: Final = frozenset({"nccl-timeout", "network-error", "nccl-error"})
#: The category a hang (a silent rank, a rank behind) is reported under.
HANG_CATEGORY: Final = "nccl-timeout"
#: Params that say how far a rank got in its collectives (NCCL's watchdog lines).
_PROGRESS_PARAMS: Final = ("last_completed", "seq", "work")


def order(findings: Iterable[Finding], faults: Iterable[NodeFault] = (),
          participants: Iterable[Participant] = ()) -> RootCause | None:
    """The root cause of a job's failure, or None when nothing failed."""
    failures = [f for f in findings if f.severity != "info"]
    candidates = _own_first(failures)
    first = _earliest(candidates)
    fault = _earliest_fault(list(faults))
    if fault is not None and not (first is not None and _before(first, fault)):
        return RootCause(category=fault.category, file=None, line=None, rank=None,
                         node=fault.node, fault=fault,
                         reason=f"a fault on node {fault.node} came before any rank's own "
                                "failure")
    if first is not None:
        return _from(first, "the earliest failure a rank reported of its own")
    if not failures:
        return None
    return (_silent(failures, list(participants)) or _behind(failures)
            or dataclasses.replace(_from(_earliest(failures) or failures[0],
                                         "only the cascade was seen: its earliest line"),
                                   pinpointed=False))


def _own_first(failures: Sequence[Finding]) -> list[Finding]:
    """The root candidates not preceded, in their file, by a cascade line of their rank."""
    first_cascade: dict[tuple[str, int], int] = {}
    for f in failures:
        if not f.root_candidate and f.rank is not None and f.severity in ("critical", "error"):
            key = (f.file, f.rank)
            first_cascade[key] = min(first_cascade.get(key, f.line), f.line)
    return [f for f in failures if f.root_candidate
            and (f.rank is None or f.line < first_cascade.get((f.file, f.rank), f.line + 1))]


def _from(finding: Finding, reason: str, category: str | None = None) -> RootCause:
    return RootCause(category=category or finding.category, file=finding.file,
                     line=finding.line, rank=finding.rank, node=finding.node,
                     reason=reason, finding=finding)


def _earliest(findings: Sequence[Finding]) -> Finding | None:
    """By time when all have a time; else by severity, line in its file, rank, file."""
    if not findings:
        return None
    if all(f.timestamp is not None for f in findings):
        return min(findings, key=lambda f: (f.timestamp, _severity(f), f.line,
                                            _rank_key(f), f.file))
    return min(findings, key=lambda f: (_severity(f), f.line, _rank_key(f), f.file))


def _severity(finding: Finding) -> int:
    return SEVERITIES.index(finding.severity)


def _rank_key(finding: Finding) -> float:
    return math.inf if finding.rank is None else finding.rank


def _earliest_fault(faults: Sequence[NodeFault]) -> NodeFault | None:
    if not faults:
        return None
    return min(faults, key=lambda f: (math.inf if f.timestamp is None else f.timestamp,
                                      f.node))


def _before(finding: Finding, fault: NodeFault) -> bool:
    return (finding.timestamp is not None and fault.timestamp is not None
            and finding.timestamp < fault.timestamp)


def _silent(failures: Sequence[Finding], participants: Sequence[Participant]) -> RootCause | None:
    """A hang: the ranks time out, one rank has no failure of its own — it is the suspect."""
    failed = {f.rank for f in failures
              if f.rank is not None and f.severity in ("critical", "error")}
    if not failed or not any(f.category in CASCADE_CATEGORIES for f in failures):
        return None
    silent = sorted((p for p in participants if p.rank not in failed),
                    key=lambda p: (p.rank, p.shared, p.file))  # its own file, stderr first
    if not silent or len({p.rank for p in silent}) >= len(failed):
        return None
    suspect = silent[0]
    return RootCause(category=HANG_CATEGORY, file=suspect.file,
                     line=suspect.lines or None, rank=suspect.rank, node=suspect.node,
                     reason=f"ranks {_ranks(failed)} timed out or lost their peers; rank "
                            f"{suspect.rank} reported no failure of its own (it hung)")


def _behind(failures: Sequence[Finding]) -> RootCause | None:
    """A rank whose collective sequence number is behind every other rank's."""
    for param in _PROGRESS_PARAMS:
        progress: dict[int, tuple[float, Finding]] = {}
        for finding in failures:
            value = finding.number(param)
            if value is None or finding.rank is None:
                continue
            if finding.rank not in progress or value < progress[finding.rank][0]:
                progress[finding.rank] = (value, finding)
        if len(progress) < 2:
            continue
        lowest = min(v for v, _ in progress.values())
        behind = [f for v, f in progress.values() if v == lowest]
        if len(behind) < len(progress) and len(behind) == 1:
            return _from(behind[0], f"rank {behind[0].rank}'s collectives ({param} "
                                    f"{lowest:g}) are behind the other ranks'",
                         category=HANG_CATEGORY)
    return None


def _ranks(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))
