"""How a simulated node's /proc and /sys files are written, so that readers never see half.

A /sys file keeps its identity once created, as a sysfs attribute does: it is rewritten
in place (one ``pwrite``, then the length), so a collector that keeps it open and reads
it again from offset 0 sees the new value, as on a real node (the agent steps the
simulation and samples in one thread: it never reads one half rewritten). A /proc file,
which readers open afresh each time, and any new file are replaced atomically (written
in ``<root>/.staging`` and moved into place): a reader sees the old contents or the new
ones, never half a file. Only files whose contents changed are rewritten.

What the files say is :mod:`sn_monitor.sim.node_tree`'s; this module only writes them.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path


class TreeFiles:
    """The files under ``root``: :meth:`write` them whole; ``sysfs`` ones in place.

    Not thread-safe: the tree calls it under its own lock.
    """

    def __init__(self, root: Path, sysfs: Path) -> None:
        self._sysfs = sysfs
        self._staging = root / ".staging"
        self._written: dict[Path, str] = {}
        self._tmp_names = itertools.count()
        self._staging.mkdir(parents=True, exist_ok=True)

    def write(self, path: Path, text: str) -> None:
        """``path`` holds ``text`` from now on: rewritten in place, created whole."""
        old = self._written.get(path)
        if old == text:
            return
        data = text.encode("ascii")
        if old is not None and path.is_relative_to(self._sysfs):
            try:
                fd = os.open(path, os.O_WRONLY)
            except FileNotFoundError:
                pass  # removed behind our back (a test's fault): created again below
            else:
                try:
                    os.pwrite(fd, data, 0)
                    if len(data) < len(old):
                        os.ftruncate(fd, len(data))
                finally:
                    os.close(fd)
                self._written[path] = text
                return
        tmp = self._staging / f"{next(self._tmp_names)}.tmp"
        tmp.write_bytes(data)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)
        self._written[path] = text

    def remove(self, path: Path) -> None:
        """``path`` is gone (a file that is not there is fine)."""
        path.unlink(missing_ok=True)
        self._written.pop(path, None)
