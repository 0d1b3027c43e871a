"""The thread-leak guard (tests/threads.py), on small suites run by pytester in a process
of their own: which tests it fails, what it says, and what it lets pass."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
import threading
import pytest
import tests.threads
from tests.threads import install

def pytest_configure(config):
    install(config)

def grace(seconds):
    tests.threads.GRACE_SECONDS = seconds

def parked(name, stop):
    thread = threading.Thread(target=stop.wait, name=name, daemon=True)
    thread.start()
    return thread
"""

SUITE = """
import threading
import time
import pytest
from conftest import grace, parked

@pytest.fixture
def joined():
    stop = threading.Event()
    thread = parked("joined-worker", stop)
    yield
    stop.set()
    thread.join()

def test_joined(joined):
    grace(0.1)

def test_ends_soon_after_teardown():
    grace(60)   # ends 0.2 s after the test: within the grace, however busy the machine
    threading.Thread(target=time.sleep, args=(0.2,), name="short-lived").start()

def test_leaks():
    grace(0.1)
    parked("forgotten-worker", threading.Event())

@pytest.mark.leaks_threads(reason="a known bug")
def test_leaks_known():
    grace(0.1)
    parked("known-worker", threading.Event())
"""

MODULE_SCOPE = """
import threading
import pytest
from conftest import grace, parked

@pytest.fixture(scope="module")
def shared():
    stop = threading.Event()
    thread = parked("shared-worker", stop)
    yield
    stop.set()
    thread.join()

@pytest.fixture(scope="module")
def never_stopped():
    parked("module-leak", threading.Event())

class Pool:  # starts a thread when asked (as a controller's pool does)
    def __init__(self):
        self.stop, self.threads = threading.Event(), []

    def work(self, name):
        self.threads.append(parked(name, self.stop))

@pytest.fixture(scope="module")
def pool():
    pool = Pool()
    yield pool
    pool.stop.set()
    for thread in pool.threads:
        thread.join()

@pytest.fixture(scope="module")
def leaky_pool():
    return Pool()

def test_first(shared, never_stopped, pool, leaky_pool):
    grace(0.1)
    pool.work("pool-worker")
    leaky_pool.work("leaky-pool-worker")

def test_second(shared):
    pass

def test_last(shared):
    pass
"""


@pytest.fixture
def guarded(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # hypothesis alone takes 4 s
    pytester.makeconftest(CONFTEST)
    return pytester


@pytest.mark.parametrize("how", [[], ["-p", "xdist.plugin", "-n", "2", "--dist", "loadfile"]],
                         ids=["one-process", "xdist"])
def test_leaked_threads_fail_their_test(guarded: pytest.Pytester, how: list[str]) -> None:
    guarded.makepyfile(test_suite=SUITE, test_module_scope=MODULE_SCOPE)
    result = guarded.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *how)
    result.assert_outcomes(passed=7, errors=2, warnings=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_leaks*",
        "*thread 'forgotten-worker' (daemon=True), started by the test*",
        "*started at:*", "*in parked*", "*now at:*", "*in wait*",
    ], consecutive=False)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_last*",
        "*thread 'module-leak' (daemon=True), started by the module-scoped fixture "
        "'never_stopped', checked once it was torn down*",
    ], consecutive=False)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_last*",
        "*thread 'leaky-pool-worker' (daemon=True), started by "
        "test_module_scope.py::test_first while it used module-scoped 'leaky_pool', "
        "module-scoped 'never_stopped', module-scoped 'pool', module-scoped 'shared', "
        "checked once they were torn down*",
    ], consecutive=False)
    result.stdout.fnmatch_lines(["*ThreadLeakWarning*", "*'known-worker'*"], consecutive=False)
    for fine in ("joined-worker", "short-lived", "shared-worker", "pool-worker"):
        assert f"'{fine}'" not in out


def test_a_thread_started_at_import_fails_the_last_test(guarded: pytest.Pytester) -> None:
    guarded.makepyfile(test_import="""
        import threading
        from conftest import grace, parked
        parked("import-worker", threading.Event())

        def test_one():
            grace(0.1)

        def test_two():
            pass
    """)
    result = guarded.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_two*",
        "*thread 'import-worker' (daemon=True), started by the session*",
    ], consecutive=False)


def test_a_teardown_error_keeps_its_traceback_and_names_the_leak(
        guarded: pytest.Pytester) -> None:
    guarded.makepyfile(test_broken="""
        import threading
        import pytest
        from conftest import grace, parked

        @pytest.fixture
        def broken():
            yield
            raise RuntimeError("the fixture's own error")

        def test_it(broken):
            grace(0.1)
            parked("orphan", threading.Event())
    """)
    result = guarded.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*RuntimeError: the fixture's own error*",
                                 "*thread 'orphan' (daemon=True), started by the test*"],
                                consecutive=False)
