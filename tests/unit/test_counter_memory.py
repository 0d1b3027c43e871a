"""A counter that rises while the agent restarts is judged: the restart gap is closed.

The controller leaves node-local rules (an increase of the uncorrectable ECC counter) to
the agent, whose reports then carry no counters. The agents here are the real reporter
with its rules and its state directory, against the real controller over the reports'
lane (conftest's ``lane_server``); a restart is a new reporter on the same directory.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from sn_monitor.agent.counter_memory import CounterMemory
from sn_monitor.agent.report import build_report
from sn_monitor.agent.reporter import Reporter
from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot
from sn_monitor.agent.spool import EventSpool
from sn_monitor.clock import ManualClock
from sn_monitor.model import Report
from tests.support.api import AGENT
from tests.support.harness import T0, Harness, make_harness, rules_from
from tests.support.tls import Server

NODE = "gpu-node-017"
ECC_RULE = """
- name: ecc-uncorrectable
  metric: gpu_ecc_uncorrected_errors_total
  increase: {window: 5m}
  above: 1
  severity: critical
  actions: [alert]
"""


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = make_harness(tmp_path / "controller", rules_from(ECC_RULE))
    yield h
    h.controller.close()
    h.store.close()


def ecc(clock: ManualClock, errors: int) -> NodeSnapshot:
    gpu = GpuSample(index=0, uuid="GPU-0", name="H100", pci_bus_id="0000:18:00.0",
                    temperature_celsius=60.0, ecc_uncorrected_errors_total=errors)
    return NodeSnapshot(NODE, clock.time(), gpus=(gpu,))


class Node:
    """One node's agent (a reporter with its rules), started and restarted on one state dir."""

    def __init__(self, url: str, state: Path, clock: ManualClock) -> None:
        self.url, self.state, self.clock = url, state, clock
        self.reporter: Reporter | None = None

    def start(self) -> Reporter:
        self.reporter = Reporter(
            self.url, AGENT, NODE, {"supernode": "sn0"}, self.clock,
            EventSpool(self.state / "spool", clock=self.clock), timeout=10.0,
            rng=random.Random(0), counter_memory=CounterMemory(self.state / "counters.json"),
            streams=False)  # each report answered: the controller has judged it on return
        return self.reporter

    def report(self, errors: int) -> None:
        assert self.reporter is not None
        self.reporter.report(ecc(self.clock, errors))
        self.clock.advance(1.0)

    def stop(self) -> None:
        if self.reporter is not None:
            self.reporter.close()
            self.reporter = None


@pytest.fixture
def node(lane_server: Server, tmp_path: Path) -> Iterator[Node]:
    n = Node(lane_server.url, tmp_path / "agent", ManualClock(T0))
    yield n
    n.stop()


def open_incidents(harness: Harness) -> list[str]:
    return [i["rule"] for i in harness.controller.list_incidents("open", NODE, 100)]


def test_a_counter_that_rose_during_an_agent_restart_fires_its_increase_rule(
        node: Node, harness: Harness) -> None:
    reporter = node.start()
    for _ in range(3):
        node.report(errors=4)
    assert reporter.rules is not None  # the node evaluates the rule itself
    node.stop()
    node.clock.advance(5.0)  # the restart; an uncorrectable error meanwhile
    reporter = node.start()
    node.report(errors=5)  # the first report of the new start: full, judged by the controller
    node.report(errors=5)  # the first judged by the new start's rules
    assert reporter.rules is not None
    assert open_incidents(harness) == ["ecc-uncorrectable"]
    [incident] = harness.controller.list_incidents("open", NODE, 100)
    assert "increased by 1" in incident["message"]


def test_a_restart_without_a_rise_fires_nothing_and_a_reset_counter_starts_over(
        node: Node, harness: Harness) -> None:
    node.start()
    for _ in range(3):
        node.report(errors=4)
    node.stop()
    node.start()
    for _ in range(3):
        node.report(errors=4)  # the same count: no increase
    node.stop()
    node.start()
    for _ in range(3):
        node.report(errors=0)  # the driver reset its counters (a reboot): no increase
    assert open_incidents(harness) == []
    node.report(errors=1)  # a new error after the reset is seen
    assert open_incidents(harness) == ["ecc-uncorrectable"]


def kept_report(clock: ManualClock, errors: int) -> Report:
    return build_report(ecc(clock, errors), instance="i", sequence=1, labels={},
                        interval=1.0, events=(), command_results=(),
                        guard_throttled=frozenset())


def test_counters_are_written_only_when_they_change_and_a_bad_file_is_ignored(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "counters.json"
    path.write_bytes(b"{not json")
    memory = CounterMemory(path)
    assert memory.recall() is None
    assert "the node-local rules start afresh" in caplog.text
    clock = ManualClock(T0)
    memory.keep(kept_report(clock, 3))
    path.write_bytes(path.read_bytes() + b" ")  # a mark: an unchanged value leaves it
    clock.advance(1.0)
    memory.keep(kept_report(clock, 3))
    assert path.read_bytes().endswith(b" ")
    memory.keep(kept_report(clock, 4))
    kept = CounterMemory(path).recall()
    assert kept is not None
    assert [g.ecc_uncorrected_errors_total for g in kept.gpus] == [4]
    assert kept.sample_time_seconds == clock.time()
