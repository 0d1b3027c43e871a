"""The controller's runtime: supervised workers, restarts with backoff, an ordered stop."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sn_monitor.clock import SystemClock
from sn_monitor.config import ConfigError
from sn_monitor.controller.settings import load_controller_settings
from sn_monitor.controller.supervision.runtime import Runtime, Worker, every
from tests.drivers.servers import wait_until

#: Every wait below is bounded by this (a busy machine is slow, never this slow).
WAIT = 30.0


def _until(condition: Callable[[], object], what: str) -> None:
    assert wait_until(condition, timeout=WAIT), f"not within {WAIT:g}s: {what}"


def _runtime() -> Runtime:
    return Runtime(SystemClock(), backoff=0.01, max_backoff=0.05)


def test_a_worker_that_raises_is_logged_and_started_again(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    runs: list[int] = []

    def flaky(stop: threading.Event) -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError("boom")
        stop.wait()

    runtime = _runtime()
    runtime.add(Worker("sweep", flaky))
    with caplog.at_level(logging.WARNING, logger="sn_monitor.controller.supervision.runtime"):
        runtime.start()
        try:
            _until(lambda: len(runs) == 3 and runtime.up() == {"sweep": True},
                   "the third run up")
            assert runtime.restarts() == {"sweep": 2}
            assert not runtime.stopping.is_set()
        finally:
            assert runtime.stop(time.monotonic() + WAIT) == []
    failures = [r for r in caplog.records if r.getMessage() == "worker sweep failed"]
    assert len(failures) == 2
    assert all(r.exc_info for r in failures)  # with the traceback
    assert runtime.up() == {"sweep": False}


def test_a_worker_that_returns_by_itself_counts_as_failed() -> None:
    runs: list[int] = []

    def quits(stop: threading.Event) -> None:
        runs.append(1)
        if len(runs) > 1:
            stop.wait()

    runtime = _runtime()
    runtime.add(Worker("writer", quits))
    runtime.start()
    try:
        _until(lambda: runtime.restarts() == {"writer": 1}, "restarted once")
    finally:
        runtime.stop(time.monotonic() + WAIT)


def test_a_worker_whose_failure_stops_the_process_stops_it_once() -> None:
    told: list[str] = []

    def renew(stop: threading.Event) -> None:
        raise ConnectionError("the lease store went away")

    runtime = _runtime()
    runtime.on_failure = told.append
    runtime.add(Worker("lease", renew, on_crash="stop"))
    runtime.add(Worker("sweep", lambda stop: stop.wait() and None))
    runtime.start()
    try:
        _until(runtime.stopping.is_set, "the runtime stopping")
        assert told == ["worker lease failed"]
        assert runtime.failure == "worker lease failed"
        assert runtime.restarts()["lease"] == 0
    finally:
        assert runtime.stop(time.monotonic() + WAIT) == []


def test_workers_stop_in_the_order_they_were_added() -> None:
    stopped: list[str] = []

    def worker(name: str) -> Worker:
        def run(stop: threading.Event) -> None:
            stop.wait()
            stopped.append(name)
        return Worker(name, run)

    runtime = _runtime()
    for name in ("sweep", "actions", "writer", "lease"):
        runtime.add(worker(name))
    runtime.start()
    _until(lambda: all(runtime.up().values()), "all up")
    assert runtime.stop(time.monotonic() + WAIT) == []
    assert stopped == ["sweep", "actions", "writer", "lease"]


def test_a_worker_stuck_past_the_deadline_is_named(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()

    def stuck(stop: threading.Event) -> None:
        release.wait(WAIT)  # ignores ``stop``: a driver call on a dead mount

    runtime = _runtime()
    runtime.add(Worker("checkpoints", stuck))
    runtime.start()
    try:
        with caplog.at_level(logging.ERROR, logger="sn_monitor.controller.supervision.runtime"):
            assert runtime.stop(time.monotonic() + 0.2) == ["checkpoints"]
        message = next(r.getMessage() for r in caplog.records)
        assert "worker checkpoints did not stop within the deadline" in message
        assert "release.wait" in message  # its stack says where it waits
    finally:
        release.set()
        _until(lambda: not runtime.up()["checkpoints"], "the stuck worker gone")


def test_every_ticks_until_stopped() -> None:
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        ticks.append(time.monotonic())
        if len(ticks) == 3:
            stop.set()

    every(0.01, tick)(stop)
    assert len(ticks) == 3


def test_a_worker_name_is_added_once() -> None:
    runtime = _runtime()
    runtime.add(Worker("sweep", lambda stop: None))
    with pytest.raises(ValueError, match="sweep added twice"):
        runtime.add(Worker("sweep", lambda stop: None))


def test_a_driver_timeout_past_the_stop_deadline_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "controller.yaml"
    config.write_text("sweep_interval: 1s\nrunner:\n  timeout: 20s\n")
    with pytest.raises(ConfigError) as refused:
        load_controller_settings(config)
    message = str(refused.value)
    assert message.startswith(f"{config}:3: runner.timeout: ")
    assert "below the controller's stop deadline of 20s" in message
