"""RefreshedSource: a source asked on its own thread, the sample reading its last answer."""

from __future__ import annotations

import threading

import pytest

from sn_monitor.agent.workloads.model import DeviceAllocation, SourceUnavailable, Workload
from sn_monitor.agent.workloads.refreshed import RefreshedSource

GPU0 = DeviceAllocation(device="minor:0", resource="gres/gpu", source="slurm",
                        workload=Workload(slurm_job="7", user="alice"))


class CountingSource:
    """Answers GPU0, or fails, counting the asks and the threads that asked."""

    name = "slurm"

    def __init__(self) -> None:
        self.asks = 0
        self.threads: set[str] = set()
        self.failing: SourceUnavailable | None = None
        self.closed = False
        self.asked = threading.Event()

    def allocations(self) -> tuple[DeviceAllocation, ...]:
        self.asks += 1
        self.threads.add(threading.current_thread().name)
        self.asked.set()
        if self.failing is not None:
            raise self.failing
        return (GPU0,)

    def close(self) -> None:
        self.closed = True


def test_the_sample_reads_the_last_answer_and_asks_nothing() -> None:
    inner = CountingSource()
    source = RefreshedSource(inner, 30, threaded=False)
    assert source.name == "slurm"
    source.refresh()
    assert source.allocations() == (GPU0,)
    assert source.allocations() == (GPU0,)
    assert inner.asks == 1


def test_a_failed_refresh_shows_until_an_answer_comes_back() -> None:
    inner = CountingSource()
    source = RefreshedSource(inner, 30, threaded=False)
    source.refresh()
    inner.failing = SourceUnavailable("slurm", "squeue ran past 5s")
    source.refresh()
    with pytest.raises(SourceUnavailable, match="ran past"):
        source.allocations()
    inner.failing = None
    source.refresh()
    assert source.allocations() == (GPU0,)


def test_no_answer_yet_is_unavailable_not_a_wait_without_end() -> None:
    source = RefreshedSource(CountingSource(), 30, first_wait=0, threaded=False)
    with pytest.raises(SourceUnavailable, match="no answer yet"):
        source.allocations()


def test_the_thread_asks_off_the_sampling_thread_and_stops_at_close() -> None:
    inner = CountingSource()
    source = RefreshedSource(inner, 3600, first_wait=60)
    try:
        assert source.allocations() == (GPU0,)  # waits for the thread's first answer
        assert inner.threads == {"agent-source-slurm"}
    finally:
        source.close()
    assert inner.closed
    assert not any(t.name == "agent-source-slurm" for t in threading.enumerate())


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval"):
        RefreshedSource(CountingSource(), 0)
