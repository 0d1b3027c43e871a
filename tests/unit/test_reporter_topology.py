"""The topology protocol: the digest on every report, the topology on the first, on change,
and when a reply asks; and the loop that collects it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sn_monitor.agent.daemon import build_agent
from sn_monitor.agent.nvml import NvmlError
from sn_monitor.agent.settings import AgentSettings, ControllerSettings
from sn_monitor.agent.topology_loop import TopologyLoop
from sn_monitor.clock import ManualClock, SystemClock
from sn_monitor.model import NicTopology, NodeTopology, topology_digest
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.node import SimulatedNode
from tests.drivers.servers import wait_until
from tests.support.harness import T0, Harness
from tests.support.ports import free_port
from tests.support.reporter import Controller, make_reporter, snapshot
from tests.support.reporter_stream import make_reporter as make_stream_reporter
from tests.support.tls import Server

ONE = NodeTopology(nics=[NicTopology(device="mlx5_0", role="rail", rail=0)], nvswitches=4)
TWO = NodeTopology(nics=[NicTopology(device="mlx5_0", role="rail", rail=0)], nvswitches=3)


@pytest.fixture
def controller() -> Iterator[Controller]:
    server = Controller()
    yield server
    server.close()


def carried(controller: Controller) -> list[tuple[str, bool]]:
    """Per report: its digest, and whether it carried the topology."""
    return [(r.topology_digest, r.topology is not None) for r in controller.reports()]


def test_the_topology_rides_on_the_first_report_and_on_change(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    reporter.report(snapshot(clock))  # none collected yet
    reporter.set_topology(ONE)
    reporter.report(snapshot(clock))
    reporter.report(snapshot(clock))
    reporter.set_topology(NodeTopology(nics=list(ONE.nics), nvswitches=4))  # the same again
    reporter.report(snapshot(clock))
    reporter.set_topology(TWO)
    reporter.report(snapshot(clock))
    reporter.report(snapshot(clock))
    one, two = topology_digest(ONE), topology_digest(TWO)
    assert carried(controller) == [("", False), (one, True), (one, False), (one, False),
                                   (two, True), (two, False)]
    assert controller.reports()[1].topology == ONE
    assert reporter.topology_sent == two
    reporter.close()


def test_a_reply_that_wants_the_topology_gets_it_with_the_next_report(controller, tmp_path):
    clock = ManualClock()
    reporter = make_reporter(controller.url, tmp_path, clock)
    reporter.set_topology(ONE)
    reporter.report(snapshot(clock))
    reporter.report(snapshot(clock))
    controller.script.append((200, {"sequence": 3, "topology_wanted": True}, {}))
    reporter.report(snapshot(clock))  # answered: the controller has none for its digest
    reporter.report(snapshot(clock))
    reporter.report(snapshot(clock))
    assert [has for _, has in carried(controller)] == [True, False, False, True, False]
    reporter.close()


def test_a_topology_whose_report_failed_goes_with_the_next_one(tmp_path):
    clock = ManualClock()
    port = free_port()
    reporter = make_reporter(f"http://127.0.0.1:{port}", tmp_path, clock)
    reporter.set_topology(ONE)
    reporter.report(snapshot(clock))  # nobody listening
    assert reporter.failures_total == 1
    assert reporter.topology_sent is None
    server = Controller(port)
    try:
        clock.advance(60.0)  # past the backoff
        reporter.report(snapshot(clock))
        reporter.report(snapshot(clock))
        assert [has for _, has in carried(server)] == [True, False]
    finally:
        server.close()
        reporter.close()


@pytest.fixture
def stream_clock() -> ManualClock:
    return ManualClock(T0)


def test_on_a_stream_the_report_carrying_the_topology_asks_for_an_answer(
        lane_server: Server, harness: Harness, stream_clock: ManualClock,
        tmp_path: Path) -> None:
    reporter = make_stream_reporter(lane_server.url, tmp_path, stream_clock)
    try:
        reporter.report(snapshot(stream_clock))  # the first on a stream asks anyway
        stream_clock.advance(1.0)
        reporter.set_topology(ONE)
        reporter.report(snapshot(stream_clock))  # asks because it carries the topology
        assert reporter.streaming
        assert reporter.topology_sent == topology_digest(ONE)
        view = harness.controller.registry.get("gpu-node-017")
        assert wait_until(lambda: view is not None and view.report is not None
                          and view.report.sequence == 2)
    finally:
        reporter.close()


def test_a_failed_collection_is_logged_and_the_last_topology_kept(caplog):
    results: list[NodeTopology | Exception] = [ONE, NvmlError("GPU 3: Timeout"), TWO]
    delivered: list[NodeTopology] = []

    def collect() -> NodeTopology:
        result = results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    loop = TopologyLoop(collect, delivered.append, node="gpu-node-017")
    with caplog.at_level(logging.WARNING):
        assert loop.collect_once() == ONE
        assert loop.collect_once() is None
        assert loop.latest == ONE
        assert "topology collection failed (NvmlError: GPU 3: Timeout); keeping the last one" \
            in caplog.text
        assert loop.collect_once() == TWO
    assert delivered == [ONE, TWO]


def test_the_loop_collects_at_start_and_stops_in_order():
    delivered = threading.Event()
    loop = TopologyLoop(lambda: ONE, lambda topology: delivered.set(), period=3600.0)
    loop.start()
    try:
        assert delivered.wait(timeout=10.0)
    finally:
        loop.stop(timeout=5.0)
    assert not any(t.name == "agent-topology" and t.is_alive() for t in threading.enumerate())


def test_the_simulated_agent_sends_its_hgx_topology(controller, tmp_path):
    """The wiring: the agent collects the topology after its first sample and reports it."""
    sim = SimulatedNode(tmp_path / "node")
    settings = sim.agent_settings(AgentSettings(
        node="gpu-node-017", listen=f"127.0.0.1:{free_port()}", interval=0.2,
        controller=ControllerSettings(url=controller.url)))
    agent = build_agent(settings, sim.nvml, SystemClock(), before_sample=sim.step)
    try:
        agent.start()
        assert wait_until(lambda: any(r.topology is not None for r in controller.reports()),
                          timeout=20.0)
    finally:
        agent.stop()
        fake_nvml.reset()
    reports = controller.reports()
    first = next(r for r in reports if r.topology is not None)
    assert first.topology is not None
    assert first.topology_digest == topology_digest(first.topology)
    assert first.topology.nvswitches == 4
    assert [n.rail for n in first.topology.nics] == [*range(8), None, None]
    assert all(r.topology is None for r in reports if r.sequence > first.sequence)
    assert all(r.topology_digest == first.topology_digest
               for r in reports if r.sequence > first.sequence)
