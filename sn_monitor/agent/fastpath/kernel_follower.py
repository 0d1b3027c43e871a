"""The kernel-log follower: a thread that makes the kmsg collector read the moment a line lands.

It never reads the log itself: it waits until the source has something new and calls the
collector's :meth:`~sn_monitor.agent.collectors.kmsg.KmsgCollector.collect` (the one
reader, under its lock, so the offsets stay whole), then hands the faults found on.

* ``/dev/kmsg`` (a character device): ``poll()`` for POLLIN on the collector's own open
  descriptor, which its reads drain (a descriptor of our own would stay readable).
* A regular file (a dmesg or journald export, the simulator's log, tests): inotify on its
  directory for writes, creations and moves in, filtered by the file's name, so a rotated
  log is followed too. Where inotify cannot be had, a look every
  :data:`FALLBACK_INTERVAL_SECONDS`, logged once.

Stopping writes to a pipe that is in the same poll set: idle, the thread makes no
wakeups at all. A source that is not there yet (the collector has not opened the device,
the file's directory is missing) is looked at again every :data:`RETRY_SECONDS`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, Protocol

from sn_monitor.agent.collectors.base import CollectorError, SourceMissing
from sn_monitor.agent.fastpath.inotify import (
    IN_IGNORED,
    IN_Q_OVERFLOW,
    DirectoryWatch,
    InotifyUnavailable,
)
from sn_monitor.agent.snapshot import Collected
from sn_monitor.model import Event

log = logging.getLogger(__name__)

#: Between two looks at a followed file where inotify cannot be had.
FALLBACK_INTERVAL_SECONDS = 0.1
#: Between two looks for a source that is not there yet, or after a failed read.
RETRY_SECONDS = 5.0

Deliver = Callable[[Sequence[Event]], None]
SourceKind = Literal["device", "file", "absent"]


class FollowedLog(Protocol):
    """What the follower needs of the kmsg collector."""

    @property
    def path(self) -> Path: ...

    @property
    def device_fd(self) -> int | None: ...

    def collect(self) -> Collected: ...


def source_kind(path: Path) -> SourceKind:
    """A character device, a file (or its directory, awaiting the file), or neither."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "file" if path.parent.is_dir() else "absent"
    except OSError:
        return "absent"
    if stat.S_ISCHR(mode):
        return "device"
    return "file" if stat.S_ISREG(mode) else "absent"


class KernelLogFollower:
    """Follows ``source`` on a thread of its own, handing what it reads to ``deliver``."""

    def __init__(self, source: FollowedLog, deliver: Deliver, *, node: str = "",
                 fallback_interval: float = FALLBACK_INTERVAL_SECONDS,
                 retry: float = RETRY_SECONDS) -> None:
        self._source = source
        self._deliver = deliver
        self._node = node
        self._fallback_interval = fallback_interval
        self._retry = retry
        self._stopping = threading.Event()
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._fallback_logged = False
        self._thread = threading.Thread(target=self._run, name="agent-kmsg-follow",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether its thread is alive (started and not yet ended)."""
        return self._thread.is_alive()

    def stop(self, timeout: float) -> None:
        """Wake the thread and wait up to ``timeout`` seconds for it to end."""
        self._stopping.set()
        with contextlib.suppress(BlockingIOError):  # the pipe is full of wakeups already
            os.write(self._wake_write, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
        if not self._thread.is_alive():
            os.close(self._wake_read)
            os.close(self._wake_write)
        else:
            log.error("the kernel-log follower did not stop within %.1f s", timeout,
                      extra={"node": self._node})

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                kind = source_kind(self._source.path)
                if kind == "device":
                    self._follow_device()
                elif kind == "file":
                    self._follow_file()
                else:
                    self._pause(self._retry)
        except Exception:  # the cycle still reads the log; the thread's end is logged
            log.exception("the kernel-log follower failed: kernel faults wait for the "
                          "sampling cycle", extra={"node": self._node})

    def _read(self) -> bool:
        """Make the collector read what is new and hand its faults on; False: it failed."""
        try:
            collected = self._source.collect()
        except (CollectorError, SourceMissing) as err:
            # The cycle's own collect reports the collector's status and errors.
            log.debug("kernel-log follower: %s", err, extra={"node": self._node})
            return False
        if collected.events:
            self._deliver(collected.events)
        return True

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or until stopped."""
        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        poller.poll(seconds * 1000)

    def _wait(self, poller: select.poll) -> list[tuple[int, int]] | None:
        """Block until ``poller`` has something; None when stopping."""
        ready = poller.poll()
        if self._stopping.is_set() or any(fd == self._wake_read for fd, _ in ready):
            return None
        return ready

    def _follow_device(self) -> None:
        """Poll the collector's /dev/kmsg descriptor until stopped or it changes."""
        fd = self._source.device_fd
        if fd is None:  # the collector has not opened it (yet): it reports why
            self._pause(self._retry)
            return
        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        poller.register(fd, select.POLLIN)
        while (ready := self._wait(poller)) is not None:
            if any(revents & select.POLLNVAL for _, revents in ready):
                return  # closed under us: look again
            if not self._read():
                self._pause(self._retry)
            if self._source.device_fd != fd:
                return

    def _follow_file(self) -> None:
        """Wait on inotify for the file's name in its directory (or look every so often)."""
        path = self._source.path
        try:
            watch = DirectoryWatch(path.parent)
        except FileNotFoundError:
            self._pause(self._retry)
            return
        except InotifyUnavailable as err:
            self._follow_by_looking(err)
            return
        with watch:
            poller = select.poll()
            poller.register(self._wake_read, select.POLLIN)
            poller.register(watch.fileno(), select.POLLIN)
            self._read()  # what landed before the watch was set
            while self._wait(poller) is not None:
                events = watch.read()
                if any(e.name == path.name or e.mask & IN_Q_OVERFLOW for e in events):
                    self._read()
                if any(e.mask & IN_IGNORED for e in events):
                    return  # the directory went away: watch it again when it is back

    def _follow_by_looking(self, why: InotifyUnavailable) -> None:
        """No inotify: read every ``fallback_interval`` until stopped."""
        if not self._fallback_logged:
            self._fallback_logged = True
            log.warning("no inotify for %s (%s): the kernel-log follower looks every %.1f s",
                        self._source.path, why, self._fallback_interval,
                        extra={"node": self._node})
        while not self._stopping.is_set():
            self._pause(self._fallback_interval)
            if not self._stopping.is_set():
                self._read()
