"""Which of a job's checkpoints counts as its latest, and when its directory is scanned.

:func:`latest` is file system work (the job's checkpoint directory scanned, the latest
checkpoint verified on disk) on shared storage that may be slow: it runs with no lock
held. :func:`freshest` and :func:`scan_due` only read and write the job's record.

Imports the registry's records and the checkpoint catalogue only.
"""

from __future__ import annotations

from sn_monitor.controller.jobs.checkpoints import Checkpoint
from sn_monitor.controller.jobs.registry import JobRecord

#: While a recovery waits for a checkpoint, its job's directory is scanned this often.
CHECKPOINTING_SCAN_SECONDS = 5.0


def scan_due(j: JobRecord, every: float, mono: float) -> bool:
    """Whether the job's directory is due a scan at monotonic ``mono``; if so, it is now."""
    if mono - j.last_scan < every:
        return False
    j.last_scan = mono
    return True


def freshest(j: JobRecord) -> Checkpoint | None:
    """The newer of the last scan's verified checkpoint and the newest one reported since.

    A reported checkpoint was verified on disk when it was reported (memory only here):
    a restore decided between two scans must not take an older one.
    """
    known = j.catalogue.latest_complete()
    if known is not None and (j.verified is None or known.step > j.verified.step):
        return known
    return j.verified


def latest(j: JobRecord, *, scan: bool) -> Checkpoint | None:
    """The job's latest complete checkpoint, verified on disk (file system work: no lock)."""
    if scan:
        j.catalogue.scan()
    return j.catalogue.latest_complete(verify=True)
