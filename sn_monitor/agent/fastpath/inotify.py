"""Linux inotify through ctypes: one directory watched for files written, created, moved in.

A followed log file is watched through its directory, so that a rotated log (renamed
away, a new file created or moved in under the name) is seen as well as a write.
:func:`parse_events` is pure; :class:`DirectoryWatch` is the few lines of I/O around it.
No inotify (not Linux, the C library without it, the per-user limits reached) is
:class:`InotifyUnavailable`; a missing directory is :class:`FileNotFoundError`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IN_MODIFY = 0x00000002
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000

#: What a followed file's directory is watched for: a write, a new file, a file moved in.
FOLLOW_MASK = IN_MODIFY | IN_CREATE | IN_MOVED_TO

_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then name
_READ_SIZE = 64 * 1024


class InotifyUnavailable(Exception):
    """inotify cannot be used here (no such call, or the per-user limits are reached)."""


@dataclass(frozen=True, slots=True)
class InotifyEvent:
    """One ``struct inotify_event``: the watch, what happened, the file's name in it."""

    watch: int
    mask: int
    cookie: int
    name: str


def parse_events(buffer: bytes) -> list[InotifyEvent]:
    """The events in what one ``read()`` of an inotify descriptor returned."""
    events: list[InotifyEvent] = []
    offset = 0
    while offset + _HEADER.size <= len(buffer):
        watch, mask, cookie, length = _HEADER.unpack_from(buffer, offset)
        offset += _HEADER.size
        raw = buffer[offset:offset + length]
        offset += length
        name = raw.split(b"\0", 1)[0].decode("utf-8", errors="surrogateescape")
        events.append(InotifyEvent(watch, mask, cookie, name))
    return events


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init, add = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError) as err:
        raise InotifyUnavailable(f"no inotify in the C library: {err}") from err
    init.argtypes, init.restype = [ctypes.c_int], ctypes.c_int
    add.argtypes, add.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
    return libc


class DirectoryWatch:
    """An inotify descriptor watching ``directory`` for ``mask``; non-blocking, close-on-exec.

    Poll :meth:`fileno` for POLLIN, then :meth:`read` the events. A context manager.
    """

    def __init__(self, directory: Path, mask: int = FOLLOW_MASK) -> None:
        libc = _libc()
        fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:
            code = ctypes.get_errno()
            raise InotifyUnavailable(f"inotify_init1: {os.strerror(code)}")
        watch = int(libc.inotify_add_watch(fd, os.fsencode(directory), mask))
        if watch < 0:
            code = ctypes.get_errno()
            os.close(fd)
            if code in (errno.ENOENT, errno.ENOTDIR):
                raise FileNotFoundError(code, os.strerror(code), str(directory))
            raise InotifyUnavailable(f"inotify_add_watch {directory}: {os.strerror(code)}")
        self._fd: int | None = fd
        self.directory = directory

    def fileno(self) -> int:
        if self._fd is None:
            raise ValueError("the watch is closed")
        return self._fd

    def read(self) -> list[InotifyEvent]:
        """The events queued now (none when nothing is; never blocks)."""
        try:
            buffer = os.read(self.fileno(), _READ_SIZE)
        except BlockingIOError:
            return []
        return parse_events(buffer)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirectoryWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
