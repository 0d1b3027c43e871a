"""Reaping what killed test runs left behind. The PostgreSQL server and the Slurm
cluster tests start write their owner's pid into their temporary directory; a later run
finds the directories whose owner is gone and stops what is left in them. The scan and
the liveness check are here, once; what "stop" means stays with each server."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphaned(prefix: str, owner_file: str) -> list[Path]:
    """The temporary directories named ``prefix*`` whose ``owner_file`` names a process
    that is gone (a file that cannot be read is not an orphan's: it is left alone)."""
    found = []
    for owner_path in Path(tempfile.gettempdir()).glob(f"{prefix}*/{owner_file}"):
        try:
            owner = int(owner_path.read_text().strip())
        except (OSError, ValueError):
            continue
        if not alive(owner):
            found.append(owner_path.parent)
    return found
