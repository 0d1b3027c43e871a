"""Each job's checkpoints: reported by the training client or found on disk, verified.

Only a complete checkpoint counts (see :func:`sn_monitor.dcp.is_complete`): a
newer one still being written is listed with the reason it does not count, and never
chosen for a restore.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from sn_monitor.clock import Clock, SystemClock
from sn_monitor.dcp import METADATA_FILE, is_complete

Source = Literal["reported", "scanned"]

#: Checkpoint directory names: step_000123, step-123, checkpoint-123 (Hugging Face),
#: global_step123 (DeepSpeed), iter_0000123 (Megatron), ckpt_123, ...
_STEP_NAME = re.compile(
    r"(?:global_step|checkpoint|ckpt|step|iter|iteration)[-_]?(\d+)", re.IGNORECASE)
#: Directory walks for sizes stop after this many files (a checkpoint is a flat dir).
_MAX_FILES = 100_000


def parse_step(name: str) -> int | None:
    """The training step a checkpoint directory name carries, or None."""
    match = _STEP_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    source: Source
    complete: bool
    reason: str
    found_at: float
    size_bytes: int
    #: When it was finished on disk (mtime of .metadata or the marker), if known.
    written_at: float | None = None


class CheckpointRegistry:
    """The checkpoints of one job, newest ``keep`` by step, safe to share between threads."""

    def __init__(self, job_name: str, directory: Path | None, marker: str | None = None,
                 clock: Clock | None = None, keep: int = 100) -> None:
        if keep < 1:
            raise ValueError("keep at least one checkpoint")
        self.job_name = job_name
        self.directory = directory
        self.marker = marker
        self.clock: Clock = clock or SystemClock()
        self.keep = keep
        self.last_scan_error: str | None = None
        self._by_path: dict[Path, Checkpoint] = {}
        self._lock = threading.Lock()

    # --- input ---------------------------------------------------------------------------

    def report(self, step: int, path: str | Path, complete_hint: bool = True) -> Checkpoint:
        """The training client says it wrote ``step`` to ``path``; verified before it counts.

        A relative ``path`` is taken inside the job's checkpoint directory. A checkpoint
        the client reports as unfinished (``complete_hint=False``), or that is not
        complete on disk, is recorded with the reason and does not count (a later
        :meth:`scan` or report may find it finished).
        """
        if step < 0:
            raise ValueError(f"a step is not negative, got {step}")
        where = Path(path)
        if not where.is_absolute() and self.directory is not None:
            where = self.directory / where
        record = self._verify(step, where, "reported")
        if not complete_hint and record.complete:
            record = replace(record, complete=False,
                             reason="reported as not finished by the training client")
        with self._lock:
            self._by_path[where] = record
            self._trim()
        return record

    def scan(self) -> list[Checkpoint]:
        """Look through the checkpoint directory; return what is there, oldest step first.

        Known complete checkpoints are only checked to still exist; incomplete ones are
        verified again (a writer may have finished). Checkpoints that vanished from disk
        (deleted by the job's retention) are forgotten.
        """
        found, seen = self._scan_directory()
        self._recheck_known(seen)
        return self._keep_scanned(found, seen)

    def _scan_directory(self) -> tuple[list[Checkpoint], set[Path]]:
        """The directory's checkpoints (oldest step first), and every step folder in it."""
        found: list[Checkpoint] = []
        seen: set[Path] = set()
        if self.directory is None:
            return found, seen
        candidates = []
        for child in self._listing(self.directory):
            step = parse_step(child.name)
            if step is not None and child.is_dir():
                seen.add(child)
                candidates.append((step, child))
        # Newest first; stop after ``keep`` once one complete is found, so that a
        # directory of thousands of old checkpoints costs ``keep`` checks a scan.
        have_complete = False
        for step, child in sorted(candidates, key=lambda c: c[0], reverse=True):
            if len(found) >= self.keep and have_complete:
                break
            record = self._refresh(step, child, "scanned")
            have_complete = have_complete or record.complete
            found.append(record)
        found.reverse()
        return found, seen

    def _listing(self, directory: Path) -> list[Path]:
        """The directory's entries, sorted; none if it cannot be listed (see last_scan_error)."""
        try:
            children = sorted(directory.iterdir())
        except OSError as err:
            self.last_scan_error = f"cannot list {directory}: {err.strerror or err}"
            return []
        self.last_scan_error = None
        return children

    def _recheck_known(self, seen: set[Path]) -> None:
        """Checks again the known checkpoints the scan did not see; forgets those gone.

        Reported ones outside the directory, or not named by step.
        """
        with self._lock:
            known = list(self._by_path.values())
        for old in known:
            if old.path not in seen:
                if old.path.exists():
                    self._refresh(old.step, old.path, old.source)
                else:
                    with self._lock:
                        self._by_path.pop(old.path, None)

    def _keep_scanned(self, found: list[Checkpoint], seen: set[Path]) -> list[Checkpoint]:
        """The last ``keep`` checkpoints in the directory, what the scan ``found`` taken in.

        A reported one stays reported; scanned ones that left the directory are forgotten.
        """
        with self._lock:
            for record in found:
                current = self._by_path.get(record.path)
                if current is not None and current.source == "reported":
                    record = replace(record, source="reported", found_at=current.found_at)
                self._by_path[record.path] = record
            for path in [p for p, r in self._by_path.items()
                         if r.source == "scanned" and p not in seen]:
                del self._by_path[path]
            self._trim()
            return sorted((r for r in self._by_path.values() if r.path in seen),
                          key=lambda r: (r.step, r.found_at))[-self.keep:]

    # --- output --------------------------------------------------------------------------

    def checkpoints(self) -> list[Checkpoint]:
        """Everything known, newest step first (incomplete ones included, with reasons)."""
        with self._lock:
            return sorted(self._by_path.values(), key=lambda r: (r.step, r.found_at),
                          reverse=True)

    def latest_complete(self, verify: bool = False) -> Checkpoint | None:
        """The newest complete checkpoint; never a newer one still being written.

        ``verify=True`` (for a restore) checks it on disk again first and falls back to
        the next one if it has since broken or gone.
        """
        for record in self.checkpoints():
            if not record.complete:
                continue
            if verify:
                checked = self._refresh(record.step, record.path, record.source)
                if not checked.complete:
                    continue
                return checked
            return record
        return None

    def age_seconds(self) -> float | None:
        """Seconds since the latest complete checkpoint was written (None: there is none)."""
        latest = self.latest_complete()
        if latest is None:
            return None
        since = latest.written_at if latest.written_at is not None else latest.found_at
        return max(0.0, self.clock.time() - since)

    # --- internals -----------------------------------------------------------------------

    def _refresh(self, step: int, path: Path, source: Source) -> Checkpoint:
        with self._lock:
            known = self._by_path.get(path)
        if (known is not None and known.complete and known.step == step
                and self._finish_file(path).exists()):  # finished checkpoints do not change
            return known
        record = self._verify(step, path, source)
        if known is not None:
            record = replace(record, found_at=known.found_at, source=known.source)
            if known.reason == "reported as not finished by the training client" and (
                    record.complete):
                record = replace(record, reason=record.reason + " (finished after the report)")
        with self._lock:
            if path in self._by_path:
                self._by_path[path] = record
        return record

    def _verify(self, step: int, path: Path, source: Source) -> Checkpoint:
        verdict = is_complete(path, self.marker)
        written_at: float | None = None
        if verdict.complete:
            try:
                written_at = self._finish_file(path).stat().st_mtime
            except OSError:
                written_at = None
        return Checkpoint(step=step, path=path, source=source, complete=verdict.complete,
                          reason=verdict.reason, found_at=self.clock.time(),
                          size_bytes=_size(path), written_at=written_at)

    def _finish_file(self, path: Path) -> Path:
        return path / (self.marker if self.marker is not None else METADATA_FILE)

    def _trim(self) -> None:
        """Keep the newest ``keep`` by step, and always the latest complete one."""
        if len(self._by_path) <= self.keep:
            return
        ordered = sorted(self._by_path.values(), key=lambda r: (r.step, r.found_at))
        newest_complete = next((r for r in reversed(ordered) if r.complete), None)
        excess = len(ordered) - self.keep
        for record in ordered:
            if excess <= 0:
                break
            if record is newest_complete:
                continue
            del self._by_path[record.path]
            excess -= 1


def _size(path: Path) -> int:
    total = 0
    try:
        for count, item in enumerate(path.rglob("*")):
            if count >= _MAX_FILES:
                break
            try:
                if item.is_file():
                    total += item.stat().st_size
            except OSError:
                continue
    except OSError:
        return total
    return total


__all__ = ["Checkpoint", "CheckpointRegistry", "Source", "parse_step"]
