"""The thread-leak guard: a test that leaves a thread running fails.

After a test's teardown, every thread that was not alive before its setup and is still
alive (joined first, for up to ``GRACE_SECONDS`` in all: a stopping thread may need a
moment on a busy machine) is a leak, and the test errors at teardown with each thread's
name, daemon flag, where it was started and where it sits now.

A thread started while a fixture of wider scope (class, module, package, session) was
being set up belongs to that fixture, and so does one a test started while it used such a
fixture (a call into a module's server may start a thread the server keeps): it is
checked when the fixture is torn down, in the teardown of the last test that uses it,
which is the test that errors; the message names the fixture or the test that started
it. The last test of the session (of each xdist worker) also checks every thread started
since the session began, at import or collection included. Every check runs in one
test's teardown, so it works the same in one process and under ``pytest-xdist --dist
loadfile`` (a worker runs whole files).

``@pytest.mark.leaks_threads(reason=...)`` turns a test's leak into a ``ThreadLeakWarning``:
only for a leak in production code that is known and being fixed, never for a fixture
of the tests (stop the server, close the client, join the thread instead).

Registered by tests/conftest.py (``install``); tests/unit/test_thread_guard.py tests it.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Generator, Iterable
from typing import Any

import pytest

GRACE_SECONDS = 5.0

# Process-wide threads that libraries start lazily and keep on purpose: (name pattern for
# re.fullmatch, why it may outlive a test). Never a name sn_monitor gives its own threads
# (sn-action_*, sn-driver-*, lease-*, agent-*, sn-monitor-client): whoever starts those
# stops them. Empty: no library in the suite keeps one (anyio's idle workers stop with
# their event loop, within the grace).
ALLOWED: tuple[tuple[str, str], ...] = ()

MARKER = "leaks_threads"


class ThreadLeakWarning(pytest.PytestWarning):
    """A leak in a test marked ``leaks_threads``."""


def install(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(reason): the test is known to leave a thread running (a bug "
        "in sn_monitor being fixed); the thread-leak guard warns instead of failing it")
    config.pluginmanager.register(ThreadGuard(), "thread-guard")


# Where each thread was started, recorded by Thread.start while the guard is installed.
_origins: weakref.WeakKeyDictionary[threading.Thread, traceback.StackSummary] = (
    weakref.WeakKeyDictionary())
_original_start = threading.Thread.start


def _recording_start(self: threading.Thread) -> None:
    _origins[self] = traceback.extract_stack(sys._getframe(1), limit=8)
    _original_start(self)


def _running(thread: threading.Thread) -> bool:
    if isinstance(thread, threading._DummyThread):  # not started by threading: never "ends"
        return thread.ident in sys._current_frames()
    return thread.is_alive()


def _allowed(thread: threading.Thread) -> bool:
    return any(re.fullmatch(pattern, thread.name) for pattern, _reason in ALLOWED)


def _frames(stack: Iterable[traceback.FrameSummary], keep: int) -> str:
    rows = [f for f in stack if not (f.name.startswith("_bootstrap")
                                     or re.search(r"/(_pytest|pluggy)/", f.filename))]
    if len(rows) > keep:
        rows = rows[:2] + rows[-(keep - 2):]
    return "".join(traceback.format_list(rows)).rstrip()


def describe(thread: threading.Thread, owner: str) -> str:
    lines = [f"thread {thread.name!r} (daemon={thread.daemon}), started by {owner}"]
    origin = _origins.get(thread)
    if origin is not None:
        lines += ["  started at:", _frames(origin, keep=8)]
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is not None:
        lines += ["  now at:", _frames(traceback.extract_stack(frame), keep=10)]
    return "\n".join(lines)


class ThreadGuard:
    def __init__(self) -> None:
        self._session_start: set[threading.Thread] = set()
        self._before: set[threading.Thread] = set()
        self._live: set[pytest.FixtureDef[Any]] = set()  # of wider scope, not torn down yet
        # Threads whose check waits for fixtures of wider scope to be torn down: those
        # fixtures (the check comes when none is left), and who started the thread.
        self._owned: dict[threading.Thread, tuple[set[pytest.FixtureDef[Any]], str]] = {}
        # Threads whose fixtures were torn down in the current teardown: to check now.
        self._ended: dict[threading.Thread, str] = {}
        self._reported: weakref.WeakSet[threading.Thread] = weakref.WeakSet()

    def pytest_configure(self) -> None:
        threading.Thread.start = _recording_start  # type: ignore[method-assign]

    def pytest_unconfigure(self) -> None:
        threading.Thread.start = _original_start  # type: ignore[method-assign]

    def pytest_sessionstart(self) -> None:
        self._session_start = set(threading.enumerate())

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self) -> Generator[None, None, None]:
        self._before = set(threading.enumerate())
        return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]
                             ) -> Generator[None, object, object]:
        if fixturedef.scope == "function":
            return (yield)
        before = set(threading.enumerate())
        try:
            return (yield)
        finally:
            self._live.add(fixturedef)
            who = (f"the {fixturedef.scope}-scoped fixture {fixturedef.argname!r}, checked "
                   "once it was torn down")
            for thread in set(threading.enumerate()) - before:
                self._owned[thread] = ({fixturedef}, who)

    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef[Any]) -> None:
        self._live.discard(fixturedef)
        for thread, (fixtures, who) in list(self._owned.items()):
            fixtures.discard(fixturedef)
            if not fixtures:
                del self._owned[thread]
                self._ended[thread] = who

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Generator[None, None, None]:
        try:
            yield
        except BaseException as failure:  # the teardown's own error: the leak goes with it
            self._report(item, nextitem, failure)
            raise
        self._report(item, nextitem, None)

    def _report(self, item: pytest.Item, nextitem: pytest.Item | None,
                failure: BaseException | None) -> None:
        message = self._check(item, last=nextitem is None)
        if message and item.get_closest_marker(MARKER) is not None:
            warnings.warn(ThreadLeakWarning(message), stacklevel=1)
        elif message and failure is not None:
            failure.add_note(message)
        elif message:
            pytest.fail(message, pytrace=False)

    def _check(self, item: pytest.Item, last: bool) -> str:
        running = set(threading.enumerate())
        new = {t for t in running - self._before if t not in self._owned}
        # A test's call into a wider-scoped fixture's object (a server, a controller) may
        # start a thread that object keeps: checked when those fixtures are torn down.
        using = {f for f in self._live if f.argname in getattr(item, "fixturenames", ())}
        if using:
            names = ", ".join(sorted(f"{f.scope}-scoped {f.argname!r}" for f in using))
            who = f"{item.nodeid} while it used {names}, checked once they were torn down"
            self._owned.update((t, (set(using), who)) for t in new)
            new = set()
        suspects = dict.fromkeys(new, "the test")
        if last:  # the session's end: whatever it started, wherever
            suspects = dict.fromkeys(running - self._session_start,
                                     "the session (an import, a plugin, a fixture)") | suspects
        suspects.update(self._ended)
        self._ended = {}
        for thread in [t for t in self._owned if not t.is_alive()]:
            del self._owned[thread]
        suspects = {t: who for t, who in suspects.items()
                    if t not in self._reported and t is not threading.current_thread()
                    and not _allowed(t)}
        deadline = time.monotonic() + GRACE_SECONDS
        for thread in suspects:
            remaining = deadline - time.monotonic()
            if remaining > 0 and not isinstance(thread, threading._DummyThread):
                thread.join(remaining)
        leaked = {t: who for t, who in suspects.items() if _running(t)}
        if not leaked:
            return ""
        self._reported.update(leaked)
        return "\n".join([f"{len(leaked)} thread(s) still running {GRACE_SECONDS:g} s after "
                          "teardown (stop, close or join what started them):"]
                         + [describe(t, who) for t, who in leaked.items()])
