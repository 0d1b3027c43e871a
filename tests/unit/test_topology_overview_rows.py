"""The overview kept between builds answers what a whole build answers, through changes.

:class:`OverviewRows` judges again only the nodes whose inputs changed; every step of a
fleet's life here (a port down, a GPU lost, a node lost, an incident opened and closed, a
job moved, a rail's best rate moved, a node gone) is compared with
:func:`fleet_overview` of the same fabric, and a seeded random walk mixes them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.fabric.book import TopologyBook
from sn_monitor.controller.fabric.meter import FabricMeter, GpuValues, NodeValues, PortValues
from sn_monitor.controller.fabric.overview import fleet_overview
from sn_monitor.controller.fabric.overview_rows import OverviewRows
from sn_monitor.controller.fabric.view import FleetFabric, JobOnFabric
from sn_monitor.controller.ingest.decode import NodeRegistry
from sn_monitor.controller.service.topology_desk import TopologyDesk
from sn_monitor.model import (
    GpuReport,
    GpuTopology,
    IbPortReport,
    NicPortTopology,
    NicTopology,
    NodeTopology,
    Report,
    topology_digest,
)
from sn_monitor.rules.view import NodeView
from tests.support.api import AGENT, Api, bearer, make_api

RAILS = 2
GPUS = 2
RATE = 5e10


def topology(rails: int = RAILS) -> NodeTopology:
    return NodeTopology(
        gpus=[GpuTopology(index=i, uuid=f"u{i}", pci_bus_id=f"0000:0{i}:00.0")
              for i in range(GPUS)],
        nics=[NicTopology(device=f"mlx5_{i}", role="rail", rail=i, ports=[NicPortTopology(
            port=1, guid=f"g{i}", link_layer="InfiniBand", rate_bytes_per_second=RATE)])
              for i in range(rails)])


def port(device: str, state: int = 4, rate: float | None = RATE,
         errors: float | None = 0.0) -> PortValues:
    return PortValues(device, 1, state, rate, 1e9, 1e9, 0.2, 0.0, None, None, errors)


def gpu(index: int, lost: bool = False, reasons: tuple[str, ...] = ()) -> GpuValues:
    return GpuValues(index, 0.5, 60.0, 1.9e9, 2e9, reasons, 1, 0, lost, 1e9, 0.0)


@dataclass
class Node:
    """One node's inputs, as the controller holds them; new objects when they change."""

    view: NodeView
    state: str = "healthy"
    ports: dict[str, PortValues] = field(default_factory=dict)
    gpus: dict[int, GpuValues] = field(default_factory=dict)
    readings: NodeValues | None = None

    def remake(self) -> None:
        """New frozen readings (the meter makes them again when the rates change)."""
        self.readings = NodeValues({(d, 1): p for d, p in self.ports.items()}, dict(self.gpus))

    def report(self) -> None:
        """A new report naming the node's GPUs and ports (new lists, as every decode)."""
        self.view.report = Report(
            node=self.view.name, instance="i", sequence=1, sample_time_seconds=0.0,
            gpus=[GpuReport(index=i, uuid=f"u{i}") for i in self.gpus],
            infiniband=[IbPortReport(device=d, port=1, state=p.state)
                        for d, p in self.ports.items()])


class Fleet:
    """A fleet whose inputs a test changes between builds."""

    def __init__(self, nodes: int) -> None:
        self.book = TopologyBook()
        self.nodes: dict[str, Node] = {}
        self.incidents: list[dict[str, Any]] = []
        self.jobs: dict[str, list[str]] = {}
        self.fail_slow: list[dict[str, Any]] = []
        self.next_incident = 1
        for i in range(nodes):
            self.add(f"gpu-{i:02d}", rack=f"r{i // 4}")

    def add(self, name: str, rack: str) -> None:
        node = self.nodes[name] = Node(NodeView(name=name, labels={"supernode": "sn0",
                                                                   "rack": rack}))
        self.book.put(name, topology())
        node.ports = {f"mlx5_{r}": port(f"mlx5_{r}") for r in range(RAILS)}
        node.gpus = {i: gpu(i) for i in range(GPUS)}
        node.remake()
        node.report()

    def open_incident(self, node: str, severity: str = "critical",
                      gpu_index: int | None = None) -> int:
        number = self.next_incident
        self.next_incident += 1
        self.incidents.append({"id": number, "node": node, "rule": "r", "severity": severity,
                               "gpu": gpu_index, "message": "m"})
        return number

    def close_incident(self, number: int) -> None:
        self.incidents = [i for i in self.incidents if i["id"] != number]

    def fabric(self) -> FleetFabric:
        return FleetFabric(
            now=0.0, views={n: node.view for n, node in self.nodes.items()},
            states={n: node.state for n, node in self.nodes.items()},
            incidents=list(self.incidents), wirings=self.book.wirings(),
            readings={n: node.readings for n, node in self.nodes.items()
                      if node.readings is not None},
            jobs=[JobOnFabric(name=j, state="running", nodes=tuple(members))
                  for j, members in sorted(self.jobs.items())],
            fail_slow=list(self.fail_slow))


def same(rows: OverviewRows, fleet: Fleet, jobs: tuple[str | None, ...] = (None, "llm")
         ) -> None:
    """Both builds answer the same for the fabric as it is now, whole and per job."""
    fabric = fleet.fabric()
    for job in jobs:
        kept, whole = rows.overview(fabric, job), fleet_overview(fabric, job)
        assert kept == whole, job
        assert list(kept.rows) == list(whole.rows)  # the same order, too


def test_each_kind_of_change_is_shown_as_a_whole_build_shows_it() -> None:
    fleet = Fleet(8)
    fleet.jobs["llm"] = ["gpu-00", "gpu-01"]
    rows = OverviewRows()
    same(rows, fleet)
    a, b, c = fleet.nodes["gpu-01"], fleet.nodes["gpu-02"], fleet.nodes["gpu-03"]

    a.ports["mlx5_1"] = port("mlx5_1", state=1)  # a port down
    a.remake()
    same(rows, fleet)
    b.gpus[1] = gpu(1, lost=True)  # a GPU failed
    b.remake()
    same(rows, fleet)
    c.state = "lost"  # a node lost
    same(rows, fleet)
    number = fleet.open_incident("gpu-04", "warning", gpu_index=0)
    same(rows, fleet)
    fleet.close_incident(number)
    same(rows, fleet)
    fleet.jobs["llm"] = ["gpu-05"]  # a job moved
    fleet.jobs["aaa"] = ["gpu-01"]  # a job before it by name: the row's job changes
    same(rows, fleet)
    fleet.fail_slow.append({"node": "gpu-06", "link": "gpu1/nvlink"})
    same(rows, fleet)
    fleet.nodes["gpu-07"].ports["mlx5_0"] = port("mlx5_0", errors=0.5)
    fleet.nodes["gpu-07"].remake()
    same(rows, fleet)
    faster = fleet.nodes["gpu-00"]  # a faster port: the rail's other ports are slow now
    faster.ports["mlx5_0"] = port("mlx5_0", rate=2 * RATE)
    faster.remake()
    same(rows, fleet)
    del fleet.nodes["gpu-00"]  # and gone: the rail's best is as it was
    same(rows, fleet)
    fleet.nodes["gpu-05"].view.report = None
    same(rows, fleet)


def test_only_the_nodes_whose_inputs_changed_are_judged_again() -> None:
    fleet = Fleet(8)
    rows = OverviewRows()
    same(rows, fleet, (None,))
    assert rows.judged == 8
    for node in fleet.nodes.values():  # new readings and reports, the same health
        node.remake()
        node.report()
    same(rows, fleet, (None,))
    assert rows.judged == 8
    assert rows.looked_at == 16  # every report and reading new: every node looked at
    same(rows, fleet, (None,))
    assert (rows.judged, rows.looked_at) == (8, 16)  # nothing new: none looked at
    fleet.nodes["gpu-03"].state = "lost"
    fleet.open_incident("gpu-05")
    same(rows, fleet, (None,))
    assert (rows.judged, rows.looked_at) == (10, 18)  # only those two looked at
    slow = fleet.nodes["gpu-01"]
    slow.ports["mlx5_0"] = port("mlx5_0", rate=2 * RATE)  # rail 0's best: all judged again
    slow.remake()
    same(rows, fleet, (None,))
    assert rows.judged == 18


def change(fleet: Fleet, rng: random.Random) -> None:
    """One change of any kind to a node picked at random."""
    name = rng.choice(sorted(fleet.nodes))
    node = fleet.nodes[name]
    kind = rng.randrange(12)
    if kind == 0:
        device = f"mlx5_{rng.randrange(RAILS)}"
        node.ports[device] = port(device, state=rng.choice([1, 4, 4]),
                                  rate=rng.choice([RATE, RATE / 2, 2 * RATE, None]),
                                  errors=rng.choice([0.0, 0.0, 1.0, None]))
        node.remake()
    elif kind == 1:
        index = rng.randrange(GPUS)
        node.gpus[index] = gpu(index, lost=rng.random() < 0.3,
                               reasons=rng.choice([(), ("hw_slowdown",), ("gpu_idle",)]))
        node.remake()
    elif kind == 2:
        node.state = rng.choice(["healthy", "degraded", "lost", "cordoned", "evicted"])
    elif kind == 3:
        fleet.open_incident(name, rng.choice(["critical", "warning"]),
                            rng.choice([None, 0, 1]))
    elif kind == 4 and fleet.incidents:
        fleet.close_incident(rng.choice(fleet.incidents)["id"])
    elif kind == 5:
        job = rng.choice(["llm", "aaa", "zzz"])
        members = fleet.jobs.setdefault(job, [])
        if name in members:
            members.remove(name)
        else:
            members.append(name)
    elif kind == 6:
        mark = {"node": name, "link": rng.choice(["gpu0", "gpu1/nvlink", "mlx5_1"])}
        if mark in fleet.fail_slow:
            fleet.fail_slow.remove(mark)
        else:
            fleet.fail_slow.append(mark)
    elif kind == 7:
        del fleet.nodes[name]
        fleet.add(f"new-{rng.randrange(1000):03d}", rack=rng.choice(["r0", "r9"]))
    elif kind == 8:
        node.view.report = None if node.view.report is not None else node.view.report
        if rng.random() < 0.5:
            node.report()
    elif kind == 9:
        fleet.book.put(name, topology(rng.choice([1, RAILS])))
    elif kind == 10:
        node.view.labels = {"supernode": "sn1", "rack": rng.choice(["r0", "r5"])}
    else:
        node.remake()  # new readings, the same values
        node.report()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_random_walk_of_changes_keeps_both_builds_the_same(seed: int) -> None:
    rng = random.Random(seed)
    fleet = Fleet(12)
    rows = OverviewRows()
    for _ in range(150):
        for _ in range(rng.randrange(1, 4)):  # a few changes between two builds
            change(fleet, rng)
        same(rows, fleet, (None, "llm", "aaa"))


def test_the_meter_keeps_its_frozen_values_while_no_port_state_changes() -> None:
    meter = FabricMeter(every_seconds=100.0)

    def observe(state: int, rate: float, at: float) -> None:
        meter.observe(Report(node="n", instance="i", sequence=int(at), sample_time_seconds=at,
                             infiniband=[IbPortReport(device="mlx5_0", port=1, state=state,
                                                      rate_bytes_per_second=rate)]), at)

    observe(4, RATE, 0.0)
    first = meter.values("n")
    observe(4, RATE, 1.0)  # every report carries the states: the same ones
    assert meter.values("n") is first
    observe(1, RATE, 2.0)
    down = meter.values("n")
    assert down is not first
    assert down is not None
    assert down.ports[("mlx5_0", 1)].state == 1
    observe(1, RATE / 2, 3.0)
    slower = meter.values("n")
    assert slower is not down
    assert slower is not None
    assert slower.ports[("mlx5_0", 1)].rate_bytes_per_second == RATE / 2


# ---------------------------------------------------------------- the health readings


@pytest.fixture
def api(tmp_path: Path) -> Any:
    made, h = make_api(tmp_path)
    yield made
    h.controller.close()
    h.store.close()


def report(api: Api, node: str, seq: int, *, down: bool = False, errors: int = 0,
           lost: bool = False, slowed: bool = False) -> None:
    """A report of ``node``: its rail 1 ``down``, ``errors`` on rail 0, GPU 1 ``lost``."""
    wiring = topology()
    ports = [IbPortReport(device=f"mlx5_{r}", port=1, state=1 if down and r == 1 else 4,
                          rate_bytes_per_second=RATE,
                          counters={"transmitted_bytes": 1000 * seq,
                                    "symbol_error": errors if r == 0 else 0})
             for r in range(RAILS)]
    gpus = [GpuReport(index=i, uuid=f"u{i}", lost=lost and i == 1, sm_clock_hertz=1.5e9,
                      throttle_reasons=["hw_slowdown"] if slowed and i == 0 else [])
            for i in range(GPUS)]
    body = Report(node=node, instance="i", sequence=seq,
                  sample_time_seconds=api.h.clock.time(), labels={"rack": "r1"},
                  topology_digest=topology_digest(wiring), topology=wiring, gpus=gpus,
                  infiniband=ports)
    answer = api.client.post("/api/v1/reports", content=msgspec.json.encode(body),
                             headers=bearer(AGENT))
    assert answer.status_code == 200, answer.text


def test_what_the_health_rules_read_gives_the_overview_the_whole_readings_give(
        api: Api) -> None:
    watch = api.h.controller.job_health
    rows = OverviewRows()
    rounds: list[dict[str, dict[str, Any]]] = [
        {}, {"gpu-2": {"down": True}}, {"gpu-3": {"errors": 5}, "gpu-2": {"down": True}},
        {"gpu-3": {"errors": 5}, "gpu-4": {"lost": True}}, {"gpu-1": {"slowed": True}},
        {"gpu-3": {"errors": 9}}, {}]
    seen: set[tuple[str, str, str]] = set()
    for seq, changes in enumerate(rounds, start=1):
        api.h.clock.advance(5.0)  # the meter takes a snapshot every 4.5 s
        for i in range(1, 6):
            report(api, f"gpu-{i}", seq, **changes.get(f"gpu-{i}", {}))
        if seq % 2:  # the health readings first, then the whole (which works in the rest)
            health, whole = watch.fabric(health=True), watch.fabric()
        else:  # or the whole readings first: the health ones then have nothing new
            whole, health = watch.fabric(), watch.fabric(health=True)
        kept = rows.overview(health)
        assert kept == fleet_overview(whole)
        assert kept == fleet_overview(health)
        seen.update(tuple(msgspec.json.decode(row)[i] for i in (0, 5, 6))
                    for row in kept.rows.values())
    assert {("gpu-2", "oo", "of"), ("gpu-3", "oo", "do"), ("gpu-4", "of", "oo"),
            ("gpu-1", "do", "oo")} <= seen  # a rail down, errors, a GPU lost, one slowed


def meter_report(seq: int, errors: int, lost: bool, state: int) -> Report:
    return Report(node="n", instance="i", sequence=seq, sample_time_seconds=float(seq),
                  infiniband=[IbPortReport(device="mlx5_0", port=1, state=state,
                                           rate_bytes_per_second=RATE,
                                           counters={"transmitted_bytes": 100 * seq,
                                                     "symbol_error": errors})],
                  gpus=[GpuReport(index=0, uuid="u0", lost=lost, sm_clock_hertz=1e9,
                                  nvlink_transmitted_bytes_total=10 * seq)])


def test_the_health_read_first_changes_no_value_the_whole_read_gives() -> None:
    alone, first = FabricMeter(every_seconds=1.0), FabricMeter(every_seconds=1.0)
    steps = [(0, False, 4), (0, False, 4), (3, False, 4), (3, True, 4), (7, True, 1),
             (7, False, 4), (7, False, 4)]
    for seq, (errors, lost, state) in enumerate(steps, start=1):
        for meter in (alone, first):
            meter.observe(meter_report(seq, errors, lost, state), float(seq))
        health = first.health("n")
        whole = alone.values("n")
        assert first.values("n") == whole  # errors went in once, not twice
        assert health is not None
        assert whole is not None
        port, gpu = whole.ports[("mlx5_0", 1)], whole.gpus[0]
        assert health.ports[("mlx5_0", 1)] == PortValues(
            "mlx5_0", 1, port.state, port.rate_bytes_per_second, None, None, None, None, None,
            None, port.errors_per_second)
        assert (health.gpus[0].lost, health.gpus[0].throttle_reasons) == (
            gpu.lost, gpu.throttle_reasons)
        assert health.gpus[0].nvlink_transmit_bytes_per_second is None  # no rate


def test_the_health_values_are_kept_while_what_they_show_is_the_same() -> None:
    meter = FabricMeter(every_seconds=1.0)
    meter.observe(meter_report(1, 0, False, 4), 1.0)
    meter.observe(meter_report(2, 0, False, 4), 2.0)
    held = meter.health("n")
    for seq in (3, 4):  # new counters, no new errors: the same health values
        meter.observe(meter_report(seq, 0, False, 4), float(seq))
        assert meter.health("n") is held
    meter.observe(meter_report(5, 2, False, 4), 5.0)
    errors = meter.health("n")
    assert errors is not held
    assert errors is not None
    assert (errors.ports[("mlx5_0", 1)].errors_per_second or 0) > 0
    meter.observe(meter_report(6, 2, True, 4), 6.0)
    lost = meter.health("n")
    assert lost is not None
    assert lost.gpus[0].lost


def test_the_desk_builds_the_overview_from_the_health_source() -> None:
    fleet = Fleet(4)
    whole_reads: list[FleetFabric] = []

    def whole() -> FleetFabric:
        whole_reads.append(fleet.fabric())
        return whole_reads[-1]

    clock = ManualClock()
    desk = TopologyDesk(whole, clock, health=fleet.fabric, cpu_clock=clock.monotonic)
    body = msgspec.json.decode(desk.overview().body)
    assert [row[0] for row in body["nodes"]] == sorted(fleet.nodes)
    assert whole_reads == []  # the overview read the health source alone
    desk.document()
    assert len(whole_reads) == 1
    assert desk.rows.judged == 4


def test_a_report_naming_the_same_parts_is_not_read_and_one_naming_others_is() -> None:
    """The registry keeps one ``named`` tuple while a node's reports name the same parts."""
    registry = NodeRegistry(ManualClock(1000.0))

    def accept(sequence: int, gpus: range) -> NodeView:
        registry.accept(Report(
            node="gpu-00", instance="i", sequence=sequence, sample_time_seconds=1000.0,
            labels={"supernode": "sn0", "rack": "r0"},
            gpus=[GpuReport(index=i, uuid=f"u{i}") for i in gpus],
            infiniband=[IbPortReport(device="mlx5_0", port=1, state=4)]))
        view = registry.get("gpu-00")
        assert view is not None
        return view

    def fabric(view: NodeView) -> FleetFabric:
        return FleetFabric(now=0.0, views={"gpu-00": view}, states={}, incidents=[],
                           wirings={}, readings={}, jobs=[], fail_slow=[])

    rows = OverviewRows()
    view = accept(1, range(2))
    named = view.named
    assert named == ((0, 1), ("mlx5_0",))
    assert rows.overview(fabric(view)) == fleet_overview(fabric(view))
    looked = rows.looked_at
    view = accept(2, range(2))
    assert view.named is named  # the same parts: the same tuple
    assert rows.overview(fabric(view)) == fleet_overview(fabric(view))
    assert rows.looked_at == looked  # and the node is not looked at
    view = accept(3, range(3))  # a GPU more
    assert view.named == ((0, 1, 2), ("mlx5_0",))
    shown = rows.overview(fabric(view))
    assert shown == fleet_overview(fabric(view))
    assert msgspec.json.decode(shown.rows["gpu-00"])[5] == "uuu"
