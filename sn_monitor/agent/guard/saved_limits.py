"""The operator's power limits the guard saved before changing them: ``state_dir/guard.json``.

Written atomically (fsynced) *before* a limit is touched, so that a release, a stop or
the next start after a crash puts the operator's limit back. Should the file not be
writable, the limits are kept in memory (logged once until a write succeeds again); an
unreadable file is moved aside to ``guard.json.bad``. Imports nothing of the package.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from sn_monitor.durable import write_atomically

log = logging.getLogger(__package__)  # the guard's one logger, named as before the split

STATE_FILE = "guard.json"
_STATE_VERSION = 1


class SavedLimits:
    """The saved original limits by GPU, and their file under ``state_dir``."""

    def __init__(self, state_dir: Path) -> None:
        self._state_dir = Path(state_dir)
        self.path = self._state_dir / STATE_FILE
        self._originals: dict[int, float] = {}
        self._persist_failing = False

    def __contains__(self, gpu: int) -> bool:
        return gpu in self._originals

    def get(self, gpu: int) -> float | None:
        """GPU ``gpu``'s saved original limit (None: none saved)."""
        return self._originals.get(gpu)

    def all(self) -> dict[int, float]:
        """Every saved original limit, by GPU (a copy)."""
        return dict(self._originals)

    def save(self, gpu: int, watts: float) -> None:
        """Keep ``watts`` as GPU ``gpu``'s original and write the file."""
        self._originals[gpu] = watts
        self._write()

    def adopt(self, gpu: int, watts: float) -> None:
        """Keep ``watts``, read from the file by :meth:`load`, without writing it again."""
        self._originals[gpu] = watts

    def forget(self, gpu: int) -> None:
        """Drop GPU ``gpu``'s original (restored, or never changed) and write the file."""
        if self._originals.pop(gpu, None) is not None:
            self._write()

    def load(self) -> dict[int, float]:
        """The limits a previous run left in the file (an unreadable file is set aside)."""
        try:
            doc = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            self._set_aside(f"unreadable: {err}")
            return {}
        limits = doc.get("original_power_limits_watts") if isinstance(doc, dict) else None
        if not isinstance(limits, dict):
            self._set_aside("no original_power_limits_watts")
            return {}
        saved: dict[int, float] = {}
        for key, value in limits.items():
            if not str(key).isdigit() or not isinstance(value, int | float):
                log.error("%s: ignoring entry %r: %r", self.path, key, value)
                continue
            saved[int(key)] = float(value)
        return saved

    def _write(self) -> None:
        """Write the saved originals (or remove the file when there are none)."""
        try:
            if self._originals:
                doc = {
                    "version": _STATE_VERSION,
                    "original_power_limits_watts": {
                        str(gpu): watts for gpu, watts in sorted(self._originals.items())
                    },
                }
                self._state_dir.mkdir(parents=True, exist_ok=True)
                write_atomically(self.path, json.dumps(doc, indent=1).encode())
            else:
                self.path.unlink(missing_ok=True)
        except OSError as err:
            if not self._persist_failing:
                log.error("cannot write %s: %s; original power limits are kept in memory "
                          "only and a crash would lose them", self.path, err)
            self._persist_failing = True
            return
        self._persist_failing = False

    def _set_aside(self, why: str) -> None:
        bad = self.path.with_name(STATE_FILE + ".bad")
        log.error("%s is %s: moved to %s; operator power limits cannot be restored from it",
                  self.path, why, bad.name)
        try:
            self.path.replace(bad)
        except OSError as err:
            log.error("cannot move %s aside: %s", self.path, err)
