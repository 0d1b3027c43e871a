"""A job that stopped making progress, and the ranks that stopped first.

Every rank has reported in this generation, and the job's step has not advanced for its
hang timeout (``hangTimeout``, else ten median step times, at least two minutes): the
ranks whose last progress is the oldest are named, with their nodes. When every node
stopped together there is no culprit, and the job restarts in place.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sn_monitor.controller.jobs.registry import JobRecord
from sn_monitor.controller.jobs.views import HangFinding

log = logging.getLogger(__name__)


def find_hang(j: JobRecord, now: float) -> HangFinding | None:
    """The job's hang, once per stall (None: it progresses, or was already reported)."""
    p = j.progress
    if p.hang_reported or p.last_advance is None or not p.all_reported():
        return None
    timeout = j.job.spec.effective_hang_timeout(p.median_step_time())
    stalled = now - p.last_advance
    if stalled < timeout:
        return None
    p.hang_reported = True
    first = p.first_stopped()
    ranks = tuple(rank for rank, _ in first)
    nodes = tuple(sorted({r.node for _, r in first}))
    culprit = set(nodes) != {r.node for r in p.ranks.values()}
    step = min(r.step for _, r in first)
    if culprit:
        message = (f"job {j.name} hung: no progress for {stalled:.0f}s (timeout "
                   f"{timeout:.0f}s); rank(s) {_ranks(ranks)} on {', '.join(nodes)} "
                   f"stopped first, at step {step}")
    else:
        message = (f"job {j.name} hung: no progress for {stalled:.0f}s (timeout "
                   f"{timeout:.0f}s); every rank stopped at step {step} together")
    log.warning("%s", message)
    return HangFinding(job=j.name, generation=j.row.generation, ranks=ranks,
                       nodes=nodes if culprit else (), step=step,
                       stopped_at=min(r.time for _, r in first), stalled_seconds=stalled,
                       timeout_seconds=timeout, detected_at=now, message=message)


def _ranks(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8])
    return shown + (f" (+{len(ranks) - 8} more)" if len(ranks) > 8 else "")
