"""Scenario files: the format, its errors, the packaged scenarios, and the fleet playing them."""

from __future__ import annotations

import re

import msgspec
import pytest

from sn_monitor.cli.check_config import check_file
from sn_monitor.config import ConfigError, parse_yaml
from sn_monitor.model import Command, CommandResult, HostReport, Report, topology_digest
from sn_monitor.sim.fleet import Fleet, FleetOptions, base_reports, node_name
from sn_monitor.sim.node import FAULTS
from sn_monitor.sim.scenario import (
    FAULT_SPECS,
    format_seconds,
    load_scenario,
    packaged_scenario,
    packaged_scenario_names,
    parse_scenario,
)
from tests.conftest import FIXTURES, expected_messages

BAD = FIXTURES / "scenarios" / "bad"

GOOD = """\
kind: Scenario
name: tour
description: one of each
duration: 10m
faults:
  - {at: 30s, node: 3, gpu: 5, fault: overheat, factor: 1.8}
  - {at: 2m, node: sim-0007, gpu: 2, fault: xid, code: 79}
  - {at: 3m, node: 11, fault: node-lost}
  - {at: 4m, node: "*", count: 6, fault: node-lost}
  - {at: 1m, node: "*", count: 25%, fault: ib-flap}
  - {at: 5m, node: 1, gpu: 0, fault: ecc-uncorrectable, count: 3}
  - {at: 6m, node: "*", count: 2, gpu: 0, fault: ecc-uncorrectable, params: {count: 4}}
  - {at: 7m, node: 2, fault: straggler}
"""


def _parse(text: str):
    return parse_scenario(parse_yaml(text, "s.yaml"))


def test_a_scenario_parses_sorted_with_defaults_filled_in():
    s = _parse(GOOD)
    assert (s.name, s.description, s.duration, s.gpus) == ("tour", "one of each", 600.0, 8)
    assert [f.at for f in s.faults] == sorted(f.at for f in s.faults)
    hot = s.faults[0]
    assert (hot.fault, hot.node, hot.gpu, hot.params, hot.line) == (
        "overheat", 3, 5, {"factor": 1.8}, 6)
    xid = next(f for f in s.faults if f.fault == "xid")
    assert xid.params == {"code": 79, "message": "Simulated fault"}
    assert xid.node == "sim-0007"
    flap = next(f for f in s.faults if f.fault == "ib-flap")
    assert (flap.node, flap.count, flap.share, flap.params) == ("*", None, 0.25,
                                                               {"device": "mlx5_0"})
    ecc = [f for f in s.faults if f.fault == "ecc-uncorrectable"]
    assert [(f.count, f.params) for f in ecc] == [(None, {"count": 3}), (2, {"count": 4})]
    assert next(f for f in s.faults if f.fault == "straggler").params == {"utilization": 0.3}


def test_resolve_binds_indices_names_and_seeded_picks():
    s = _parse(GOOD)
    names = [node_name(i, 64) for i in range(64)]
    plan = s.resolve(64, names)
    by_fault = {(p.fault, p.source.position): p.nodes for p in plan}
    assert by_fault[("xid", 1)] == (7,)
    assert len(by_fault[("node-lost", 3)]) == 6
    assert len(by_fault[("ib-flap", 4)]) == 16  # 25 % of 64
    assert s.resolve(64, names) == plan  # the same nodes every run


def test_resolve_names_the_fault_that_does_not_fit_the_fleet():
    s = _parse("kind: Scenario\nfaults:\n  - {at: 1s, node: 11, fault: node-lost}\n"
               "  - {at: 2s, node: '*', count: 6, fault: node-lost}\n")
    with pytest.raises(ConfigError) as err:
        s.resolve(10)
    assert str(err.value) == ("s.yaml:3: faults[0].node: node 11 is not in a fleet of 10 "
                              "nodes (0 to 9)")
    with pytest.raises(ConfigError) as err:
        _parse("kind: Scenario\nfaults:\n  - {at: 2s, node: '*', count: 6, "
               "fault: node-lost}\n").resolve(5)
    assert str(err.value) == "s.yaml:3: faults[0].count: 6 nodes asked for, the fleet has 5"


def test_an_unknown_node_name_and_a_gpu_beyond_the_fleet_are_errors():
    s = _parse("kind: Scenario\nfaults:\n  - {at: 1s, node: gpu-7, gpu: 7, fault: overheat}\n")
    with pytest.raises(ConfigError, match=r"s.yaml:3: faults\[0\].node: no node named 'gpu-7' "
                                          r"in the fleet \(sim-0000 to sim-0003\)"):
        s.resolve(4, [node_name(i, 4) for i in range(4)])
    with pytest.raises(ConfigError, match=r"faults\[0\].gpu: overheat needs a gpu from 0 to 3"):
        s.check_gpus(4)


def test_fault_specs_cover_every_node_fault():
    node_faults = {name for name, spec in FAULT_SPECS.items()
                   if not spec.fleet_only and not spec.job_only}
    assert node_faults == set(FAULTS)
    for name in node_faults:
        assert FAULT_SPECS[name].needs_gpu == FAULTS[name].needs_gpu, name


def _expected():
    return expected_messages(BAD)


def test_every_bad_scenario_has_an_expectation():
    assert {name for name, _ in _expected()} == {p.name for p in BAD.glob("*.yaml")}


@pytest.mark.parametrize(("name", "message"), _expected())
def test_bad_scenario_names_file_key_and_line(name, message):
    path = BAD / name
    with pytest.raises(ConfigError) as err:
        load_scenario(path)
    assert str(err.value) == f"{path}{message}"


def test_check_config_knows_scenario_files():
    path = BAD.parent.parent.parent.parent / "sn_monitor" / "sim" / "scenarios" / "default.yaml"
    assert check_file(path) == "scenario file"
    with pytest.raises(ConfigError):
        check_file(BAD / "gpu-out-of-range.yaml")


def test_packaged_scenarios_all_load_and_fit_a_small_fleet():
    names = packaged_scenario_names()
    assert {"default", "thermal", "network", "mass-failure"} <= set(names)
    for name in names:
        s = packaged_scenario(name)
        assert s.name == name
        assert s.faults
        assert s.description
        s.resolve(16, [node_name(i, 16) for i in range(16)])
    with pytest.raises(ConfigError, match="packaged: default"):
        packaged_scenario("nope")


def test_format_seconds():
    assert [format_seconds(x) for x in (0.5, 30, 90, 3600, 3725)] == [
        "500ms", "30s", "1m30s", "1h", "1h2m5s"]


# ---------------------------------------------------------------- the fleet, without a network


def _fleet(nodes=4, scenario=None, **kw):
    return Fleet(FleetOptions(controller="http://127.0.0.1:1", nodes=nodes, **kw), scenario)


def test_base_reports_are_valid_working_temperature_reports():
    reports = base_reports(8, variants=3)
    for r in reports:
        decoded = msgspec.json.decode(msgspec.json.encode(r), type=Report)
        assert len(decoded.gpus) == 8
        assert len(decoded.infiniband) == 8
        assert all(60 <= g.temperature_celsius <= 80 for g in decoded.gpus)
        assert "symbol_errors" in decoded.infiniband[0].counters


def test_fast_and_slow_bodies_are_reports_of_the_right_node():
    fleet = _fleet()
    node = fleet.nodes[2]
    fast = msgspec.json.decode(fleet.fast_body(node, 3, 100.0), type=Report)
    assert (fast.node, fast.sequence, fast.labels["rack"]) == ("sim-0002", 3, "r000")
    assert fast.interval_seconds == 1.0
    assert fast.events == []
    body, events, results = fleet.slow_body(node, 4, 101.0, 0.0)
    slow = msgspec.json.decode(body, type=Report)
    assert (slow.node, slow.sequence, events, results) == ("sim-0002", 4, 0, 0)


def test_the_topology_goes_with_a_nodes_first_report_and_when_the_controller_wants_it():
    fleet = _fleet()
    node = fleet.nodes[1]
    digest = topology_digest(fleet.topology)
    assert node.slow  # its first report carries the topology: encoded from structs
    body, _, _ = fleet.slow_body(node, 1, 100.0, 0.0)
    first = msgspec.json.decode(body, type=Report)
    assert (first.topology, first.topology_digest) == (fleet.topology, digest)
    node.topology_due = False  # as sending it does
    assert not node.slow
    fast = msgspec.json.decode(fleet.fast_body(node, 2, 101.0), type=Report)
    assert (fast.topology, fast.topology_digest) == (None, digest)
    fleet._reply(node, msgspec.json.encode({"sequence": 2, "topology_wanted": True}), 0.0)
    assert node.topology_due
    assert node.slow
    assert fleet.topology.nvswitches == 4
    assert [(n.device, n.role, n.rail) for n in fleet.topology.nics] == [
        *((f"mlx5_{i}", "rail", i) for i in range(8)),
        ("mlx5_8", "storage", None), ("mlx5_9", "storage", None)]
    assert [g.uuid for g in fleet.topology.gpus] == [g.uuid for g in first.gpus]


def test_an_overheat_heats_its_gpu_and_a_throttle_cools_it():
    s = _parse("kind: Scenario\nfaults:\n  - {at: 0s, node: 1, gpu: 3, fault: overheat, "
               "factor: 1.8}\n")
    fleet = _fleet(scenario=s)
    fleet.apply(fleet.plan[0], 0.0)
    node = fleet.nodes[1]
    assert node.slow

    def gpu3(sim_now):
        body, _, _ = fleet.slow_body(node, 1, 0.0, sim_now)
        return msgspec.json.decode(body, type=Report).gpus[3]

    hot = gpu3(60.0)
    assert hot.temperature_celsius >= 85
    assert fleet.stats.faults_played == ["t=0s: overheat factor=1.8 on sim-0001 GPU 3"]
    command = msgspec.json.encode(Command(id="a1", kind="throttle", gpu=3, power_fraction=0.6))
    fleet._commands(node, [msgspec.Raw(command)], 60.0)
    assert node.results[0].ok
    assert fleet.stats.commands["throttle"] == 1
    cooled = gpu3(300.0)
    assert cooled.power_limit_watts == pytest.approx(420.0)
    assert cooled.temperature_celsius < hot.temperature_celsius - 5


def test_xid_events_wait_for_the_acknowledgement():
    s = _parse("kind: Scenario\nfaults:\n  - {at: 0s, node: 0, gpu: 2, fault: fall-off-bus}\n"
               "  - {at: 0s, node: 0, gpu: 1, fault: xid, code: 13}\n")
    fleet = _fleet(scenario=s)
    for planned in fleet.plan:
        fleet.apply(planned, 0.0)
    node = fleet.nodes[0]
    body, sent, _ = fleet.slow_body(node, 1, 0.0, 1.0)
    report = msgspec.json.decode(body, type=Report)
    kinds = sorted((e.kind, e.code) for e in report.events)
    assert kinds == [("gpu_fallen_off_bus", None), ("xid", 13), ("xid", 79)]
    ids = [e.id for e in report.events]
    assert ids == sorted(ids)
    assert len(set(ids)) == 3
    assert sent == 3
    assert report.gpus[2].lost
    fleet._reply(node, msgspec.json.encode({"sequence": 1, "events_stored_through": ids[1]}),
                 1.0)
    assert [e.id for e in node.events] == [ids[2]]
    assert fleet.stats.events_acknowledged == 2


def test_node_lost_and_back_and_network_faults():
    s = _parse("kind: Scenario\nfaults:\n"
               "  - {at: 0s, node: 0, fault: node-lost}\n"
               "  - {at: 0s, node: 1, fault: ib-port-down, device: mlx5_2}\n"
               "  - {at: 0s, node: 1, fault: carrier-flap}\n"
               "  - {at: 0s, node: 2, fault: straggler, utilization: 0.2}\n"
               "  - {at: 1s, node: 0, fault: node-back}\n")
    fleet = _fleet(scenario=s)
    for planned in fleet.plan[:4]:
        fleet.apply(planned, 0.0)
    assert fleet.nodes[0].lost
    body, _, _ = fleet.slow_body(fleet.nodes[1], 1, 0.0, 1.0)
    report = msgspec.json.decode(body, type=Report)
    port = next(p for p in report.infiniband if p.device == "mlx5_2")
    assert port.state == 1
    assert port.counters["link_downed"] == 1
    assert report.network[0].carrier_changes_total == 4
    body, _, _ = fleet.slow_body(fleet.nodes[2], 1, 0.0, 5.0)
    assert all(g.utilization_ratio == 0.2 for g in msgspec.json.decode(body, type=Report).gpus)
    fleet.apply(fleet.plan[4], 1.0)
    assert not fleet.nodes[0].lost


def test_fabric_and_stuck_process_faults_on_the_fleet():
    s = _parse("kind: Scenario\nfaults:\n"
               "  - {at: 0s, node: 1, gpu: 3, fault: fabric-not-ready}\n"
               "  - {at: 0s, node: 1, fault: stuck-process, count: 3}\n"
               "  - {at: 0s, node: 2, gpu: 0, fault: fabric-not-ready, state: 3, status: 999}\n")
    assert s.faults[1].params == {"name": "python", "count": 3}
    fleet = _fleet(scenario=s)
    healthy = msgspec.json.decode(fleet.slow_body(fleet.nodes[0], 1, 0.0, 0.0)[0], type=Report)
    assert {(g.fabric_state, g.fabric_status, g.processes) for g in healthy.gpus} == {(3, 0, 0)}
    assert healthy.host == HostReport(processes_stuck=0)
    for planned in fleet.plan:
        fleet.apply(planned, 0.0)
    report = msgspec.json.decode(fleet.slow_body(fleet.nodes[1], 1, 0.0, 1.0)[0], type=Report)
    assert [g.fabric_state for g in report.gpus][2:5] == [3, 1, 3]
    assert report.gpus[3].fabric_status is None  # no status before completion
    assert report.host == HostReport(processes_stuck=3)
    report = msgspec.json.decode(fleet.slow_body(fleet.nodes[2], 1, 0.0, 1.0)[0], type=Report)
    assert (report.gpus[0].fabric_state, report.gpus[0].fabric_status) == (3, 999)


def test_with_the_controller_s_node_local_rules_reports_are_trimmed_and_carry_values_at_times():
    from sn_monitor.model import EdgeRules
    from sn_monitor.rules.edge import EdgeCatalog
    from sn_monitor.rules.spec import load_rules, packaged_rules
    from sn_monitor.rules.view import NodeView

    fleet = _fleet(nodes=4, scenario=_parse(
        "kind: Scenario\nfaults:\n  - {at: 0s, node: 1, gpu: 2, fault: row-remap-failure}\n"))
    edge = EdgeCatalog(load_rules([packaged_rules()])).for_node(NodeView(name="x"))
    assert edge.keep_every == 5.0
    assert fleet._take_rules(msgspec.json.decode(msgspec.json.encode(edge), type=EdgeRules))
    node = fleet.nodes[1]
    node.rules_version = edge.version
    sent = [msgspec.json.decode(fleet.fast_body(node, s, 100.0 + s), type=Report)
            for s in range(1, 11)]
    assert all(r.rules_version == edge.version and r.takes_rules for r in sent)
    assert all(r.findings == [] and r.infiniband == [] and r.network == [] for r in sent)
    assert [s for s, r in zip(range(1, 11), sent, strict=True) if r.gpus] == [4, 9]
    assert {g.utilization_ratio is not None and g.temperature_celsius is None
            for g in sent[3].gpus} == {True}
    # a node with a fault evaluates the rules on its full values
    fleet.apply(fleet.plan[0], 0.0)
    body, _, _ = fleet.slow_body(node, 11, 111.0, 1.0)
    report = msgspec.json.decode(body, type=Report)
    assert report.rules_version == edge.version
    assert ("row-remap-failed", "gpu=2") in {(f.rule, f.subject) for f in report.findings}


def test_an_nvml_hang_blanks_the_gpus_with_one_stuck_event_until_released():
    s = _parse("kind: Scenario\nfaults:\n  - {at: 0s, node: 1, fault: nvml-hang}\n"
               "  - {at: 0s, node: 1, fault: nvml-hang}\n"
               "  - {at: 1m, node: 1, fault: nvml-release}\n")
    fleet = _fleet(scenario=s)
    fleet.apply(fleet.plan[0], 0.0)
    fleet.apply(fleet.plan[1], 0.0)  # already wedged: no second event
    node = fleet.nodes[1]
    body, sent, _ = fleet.slow_body(node, 1, 0.0, 1.0)
    report = msgspec.json.decode(body, type=Report)
    assert report.gpus == []
    assert [(e.kind, e.source) for e in report.events] == [("collector_stuck", "agent")]
    assert sent == 1
    fleet.apply(fleet.plan[2], 60.0)
    body, _, _ = fleet.slow_body(node, 2, 60.0, 60.0)
    assert len(msgspec.json.decode(body, type=Report).gpus) == 8


def test_a_simulated_node_resets_reboots_and_verifies_on_its_gpu_models():
    s = _parse("kind: Scenario\nfaults:\n"
               "  - {at: 0s, node: 1, gpu: 3, fault: row-remap-pending}\n"
               "  - {at: 0s, node: 1, gpu: 2, fault: pcie-downgrade, width: 8}\n")
    fleet = _fleet(scenario=s)
    for planned in fleet.plan:
        fleet.apply(planned, 0.0)
    node = fleet.nodes[1]

    def run(command: Command) -> CommandResult:
        fleet._commands(node, [msgspec.Raw(msgspec.json.encode(command))], 1.0)
        return node.results[-1]

    first = run(Command(id="v1", kind="verify"))
    assert not first.ok
    assert {c.name for c in first.checks if not c.ok} == {"row-remap", "pcie-links"}
    assert run(Command(id="r1", kind="reset_gpu", gpu=3)).ok
    after_reset = run(Command(id="v2", kind="verify"))
    assert [c.name for c in after_reset.checks if not c.ok] == ["pcie-links"]  # the slot
    assert run(Command(id="b1", kind="reboot")).ok
    assert run(Command(id="v3", kind="verify")).ok
    assert fleet.stats.commands["verify"] == 3


def test_a_range_of_nodes_and_a_repeated_fault_make_a_storm():
    s = _parse("kind: Scenario\nduration: 10m\nfaults:\n"
               "  - {at: 10s, node: 2-5, gpu: 1, fault: xid, code: 13}\n"
               "  - {at: 0s, node: 7, gpu: 0, fault: xid, code: 95,"
               " repeat: {count: 4, every: 5s}}\n")
    plan = s.resolve(8)
    assert [(p.at, p.nodes) for p in plan] == [
        (0.0, (7,)), (5.0, (7,)), (10.0, (2, 3, 4, 5)), (10.0, (7,)), (15.0, (7,))]
    with pytest.raises(ConfigError, match="nodes 2-5 are not all in a fleet of 5 nodes"):
        _parse("kind: Scenario\nfaults:\n  - {at: 0s, node: 2-5, fault: node-lost}\n"
               ).resolve(5)


@pytest.mark.parametrize(("fault", "message"), [
    ("node: 5-2, gpu: 0, fault: xid, code: 13", "a range runs from low to high"),
    ("node: 0, gpu: 0, fault: xid, code: 13, repeat: {count: 1, every: 1s}",
     "expected a count from 2 to 100000"),
    ("node: 0, gpu: 0, fault: xid, code: 13, repeat: {count: 3}",
     "expected {count: N, every: DURATION}"),
    ("node: 0, gpu: 0, fault: xid, code: 13, repeat: {count: 700, every: 1s}",
     "the last repeat (11m39s) is after the scenario's duration (10m)"),
])
def test_a_bad_range_or_repeat_names_the_key(fault, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _parse(f"kind: Scenario\nduration: 10m\nfaults:\n  - {{at: 0s, {fault}}}\n")
