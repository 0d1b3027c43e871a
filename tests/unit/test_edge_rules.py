"""Node-local rules evaluated by the agent: the same findings as on the controller.

The agent side (:class:`NodeRules`) runs the rules the controller's reply names on full
reports and sends trimmed ones with its firing set; the controller's engine turns that set
into transitions. Fed the same samples, the two ways find the same faults at the same
times, with the controller's severity and actions, and the hand-over between them (an
agent that starts or stops evaluating) neither opens a fault twice nor loses one.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import msgspec
import pytest

from sn_monitor.agent.rules import NodeRules
from sn_monitor.clock import ManualClock
from sn_monitor.config import ConfigError, parse_yaml
from sn_monitor.model import (
    EdgeFinding,
    EdgeRules,
    GpuReport,
    GpuWorkloadReport,
    HostReport,
    IbPortReport,
    Report,
)
from sn_monitor.rules.edge import EdgeCatalog, is_node_local, parse_edge_rules
from sn_monitor.rules.engine import Finding, RuleEngine
from sn_monitor.rules.series import Trim
from sn_monitor.rules.spec import Rule, load_rules, parse_rules
from sn_monitor.rules.view import NodeView

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = load_rules([ROOT / "sn_monitor" / "rules" / "default.yaml"])

RULES = """
- name: gpu-overheat
  metric: gpu_temperature_celsius
  above: 85
  for: 5s
  clear_below: 80
  severity: critical
  actions: [throttle, alert]
- name: ecc
  metric: gpu_ecc_uncorrected_errors_total
  increase: {window: 1m}
  above: 1
  actions: [alert, evict]
- name: hot-anomaly
  metric: gpu_temperature_celsius
  baseline: {window: 2m, sigmas: 4, min_delta: 5, warmup: 30s}
- name: ib-errors
  metric: infiniband_port_symbol_errors_total
  rate: {window: 30s}
  above: 0.5
- name: straggler
  metric: gpu_utilization_ratio
  peers: {group: job, below_median_by: 0.3, min_group: 2}
- name: only-rack-b
  metric: gpu_power_watts
  above: 600
  scope: {rack: b}
- name: xid
  event: xid
  codes: [79]
  severity: critical
  actions: [alert, failover]
"""


def rules(text: str = RULES) -> list[Rule]:
    return parse_rules(parse_yaml(text, "test.yaml"))


def gpu(i: int, temp: float, ecc: int = 0, util: float = 0.9, power: float = 400) -> GpuReport:
    return GpuReport(index=i, temperature_celsius=temp, ecc_uncorrected_errors_total=ecc,
                     utilization_ratio=util, power_watts=power, uuid=f"GPU-{i}")


class Pair:
    """One node's samples, judged by the controller alone and by agent + controller."""

    def __init__(self, text: str = RULES, labels: dict[str, str] | None = None) -> None:
        self.clock = ManualClock()
        self.labels = labels or {"rack": "a"}
        self.full = RuleEngine(rules(text), self.clock)
        self.split = RuleEngine(rules(text), self.clock)
        self.full_view = NodeView(name="n1", labels=self.labels)
        self.split_view = NodeView(name="n1", labels=self.labels)
        self.agent: NodeRules | None = None
        self.sequence = 0

    def sample(self, gpus: list[GpuReport], ib: list[IbPortReport] | None = None
               ) -> tuple[list[Finding], list[Finding]]:
        self.sequence += 1
        report = Report(node="n1", instance="a", sequence=self.sequence,
                        sample_time_seconds=self.clock.time(), gpus=gpus,
                        infiniband=ib or [], labels={"rack": self.labels["rack"]})
        self.full_view.report = report
        full = self.full.observe(self.full_view)
        sent = self.agent.evaluate(report) if self.agent is not None else report
        self.split_view.report = sent
        split = self.split.observe(self.split_view)
        offered = self.split.edge_rules(self.split_view, sent.rules_version)
        if offered is not None:
            self.agent = NodeRules(msgspec.json.decode(msgspec.json.encode(offered),
                                                       type=EdgeRules),
                                   "n1", self.labels, self.clock)
        return full, split

    def tick(self, seconds: float = 1.0) -> tuple[list[Finding], list[Finding]]:
        self.clock.advance(seconds)
        return (self.full.sweep({"n1": self.full_view}),
                self.split.sweep({"n1": self.split_view}))


def found(clock: ManualClock, rule: str, subject: str = "", gpu: int | None = None
          ) -> EdgeFinding:
    """A finding an agent reports firing, first seen now."""
    return EdgeFinding(rule=rule, subject=subject, gpu=gpu, observed_seconds=clock.time())


def sent(clock: ManualClock, sequence: int, version: str, *findings: EdgeFinding,
         instance: str = "b") -> Report:
    """A trimmed report of node n1 whose agent judged by ``version`` and finds ``findings``."""
    return Report(node="n1", instance=instance, sequence=sequence,
                  sample_time_seconds=clock.time(), rules_version=version,
                  findings=list(findings))


def keys(findings: list[Finding]) -> list[tuple[str, str, str]]:
    return sorted((f.rule, f.subject, f.status) for f in findings)


def test_every_node_local_default_rule_travels_to_the_agent_and_back_unchanged():
    local = [r for r in DEFAULT if is_node_local(r)]
    assert len(local) >= 10
    view = NodeView(name="n1", labels={})
    edge = EdgeCatalog(DEFAULT).for_node(view)
    wire = msgspec.json.decode(msgspec.json.encode(edge), type=EdgeRules)
    back = {r.name: r for r in parse_edge_rules(wire)}
    for rule in local:
        if rule.scope:
            continue
        assert back[rule.name] == dataclasses.replace(rule.detection(), scope={}), rule.name
    assert sorted(wire.keep) == sorted({r.metric for r in DEFAULT if r.kind == "peers"})


def test_the_version_changes_with_what_rules_detect_not_with_what_they_do():
    view = NodeView(name="n1", labels={})
    before = EdgeCatalog(rules()).for_node(view).version
    louder = RULES.replace("severity: critical\n  actions: [throttle, alert]",
                           "severity: warning\n  actions: [alert]")
    assert EdgeCatalog(rules(louder)).for_node(view).version == before
    hotter = RULES.replace("above: 85", "above: 87")
    assert EdgeCatalog(rules(hotter)).for_node(view).version != before


def test_a_scoped_rule_goes_only_to_the_nodes_it_applies_to():
    catalog = EdgeCatalog(rules())
    a = catalog.for_node(NodeView(name="n1", labels={"rack": "a"}))
    b = catalog.for_node(NodeView(name="n2", labels={"rack": "b"}))
    assert "only-rack-b" not in [r["name"] for r in a.rules]
    assert "only-rack-b" in [r["name"] for r in b.rules]
    assert a.version != b.version
    assert all("scope" not in r for r in b.rules)
    assert catalog.offer(NodeView(name="n3", labels={"rack": "b"}), b.version) is None


def test_the_agent_and_the_controller_find_the_same_faults_at_the_same_times():
    pair = Pair()
    rng = random.Random(7)
    temps = [60.0] * 8
    ecc = 0
    symbol = 0
    seen: list[Finding] = []
    for second in range(400):
        for i in range(8):
            temps[i] = max(40.0, min(99.0, temps[i] + rng.uniform(-0.6, 0.6)))
        if 100 <= second < 160:
            temps[3] = 92.0  # overheats, then cools
        elif second == 160:
            temps[3] = 60.0
        if second == 200:
            ecc += 3
        if 250 <= second < 300:
            symbol += 5
        gpus = [gpu(i, temps[i], ecc if i == 5 else 0) for i in range(8)]
        ib = [IbPortReport(device="mlx5_0", port=1, counters={"symbol_errors": symbol})]
        # a cycle: time passes (the controller sweeps), then the next sample; the agent
        # completes a ``for`` timer at its next sample, the controller at its sweep
        full_tick, split_tick = pair.tick()
        full, split = pair.sample(gpus, ib)
        if second == 0:
            assert pair.agent is not None  # the reply to the first report carried the rules
        else:
            assert keys(full_tick + full) == keys(split_tick + split), second
            seen.extend(full_tick + full)
    assert {(f.rule, f.status) for f in seen} >= {
        ("gpu-overheat", "firing"), ("gpu-overheat", "resolved"), ("ecc", "firing"),
        ("ecc", "resolved"), ("ib-errors", "firing"), ("ib-errors", "resolved")}


def test_findings_of_the_agent_take_the_controller_s_severity_actions_and_times():
    pair = Pair()
    pair.sample([gpu(0, 60)])
    pair.sample([gpu(0, 90)])
    fired: list[Finding] = []
    for _ in range(6):
        pair.tick()
        fired += pair.sample([gpu(0, 90)])[1]
    (f,) = [f for f in fired if f.status == "firing"]
    assert (f.rule, f.subject, f.gpu, f.severity, f.actions) == (
        "gpu-overheat", "gpu=0", 0, "critical", ("throttle", "alert"))
    assert f.detected_wall - f.observed_wall == 5.0  # the rule's for
    assert "85" in f.message


def test_a_trimmed_report_carries_only_what_the_controller_s_rules_read():
    pair = Pair()
    pair.sample([gpu(0, 60)])
    assert pair.agent is not None
    sent = pair.agent.evaluate(Report(node="n1", instance="a", sequence=9,
                                      sample_time_seconds=pair.clock.time(),
                                      gpus=[gpu(0, 60), gpu(1, 61)],
                                      infiniband=[IbPortReport(device="mlx5_0", port=1,
                                                               counters={"symbol_errors": 1})]))
    assert sent.gpus == [GpuReport(index=0, utilization_ratio=0.9),
                         GpuReport(index=1, utilization_ratio=0.9)]
    assert sent.infiniband == []
    assert sent.rules_version == pair.agent.version
    assert len(msgspec.json.encode(sent)) < 300


def test_trim_keeps_both_parts_of_a_derived_metric_and_the_named_counters():
    trim = Trim(["gpu_shutdown_margin_celsius", "infiniband_port_link_downed_total",
                 "network_carrier_up"])
    report = Report(node="n", instance="i", sequence=1, sample_time_seconds=1.0,
                    gpus=[GpuReport(index=0, temperature_celsius=80,
                                    shutdown_temperature_celsius=92, power_watts=300)],
                    infiniband=[IbPortReport(device="m", port=1, state=4,
                                             counters={"link_downed": 2, "symbol_errors": 1}),
                                IbPortReport(device="m", port=2, counters={"x": 1})])
    out = trim(report)
    assert out.gpus == [GpuReport(index=0, temperature_celsius=80,
                                  shutdown_temperature_celsius=92)]
    assert out.infiniband == [IbPortReport(device="m", port=1, counters={"link_downed": 2})]


def test_trim_keeps_the_host_part_only_when_a_host_metric_is_read():
    report = Report(node="n", instance="i", sequence=1, sample_time_seconds=1.0,
                    host=HostReport(processes_stuck=2))
    assert Trim(["host_processes_stuck"])(report).host == HostReport(processes_stuck=2)
    assert Trim(["gpu_utilization_ratio"])(report).host is None
    assert Trim(["host_processes_stuck"])(
        msgspec.structs.replace(report, host=HostReport())).host is None


def test_the_default_host_and_fabric_rules_run_on_the_node():
    by_name = {rule.name: rule for rule in DEFAULT}
    for name in ("processes-stuck", "fabric-not-ready", "fabric-registration-failed"):
        assert is_node_local(by_name[name]), name


def test_a_node_that_turns_to_evaluating_itself_keeps_its_open_fault_open_once():
    pair = Pair()
    engine, view, clock = pair.split, pair.split_view, pair.clock
    # an old agent: full reports, the controller fires
    fired: list[Finding] = []
    for _ in range(7):
        view.report = Report(node="n1", instance="a", sequence=len(fired) + clock.monotonic(),
                             sample_time_seconds=clock.time(), gpus=[gpu(0, 90)])
        fired += engine.observe(view)
        clock.advance(1)
        fired += engine.sweep({"n1": view})
    assert keys(fired) == [("gpu-overheat", "gpu=0", "firing")]
    version = engine.edge_rules(view, "").version  # type: ignore[union-attr]
    finding = EdgeFinding(rule="gpu-overheat", subject="gpu=0", gpu=0,
                          observed_seconds=clock.time() - 6)
    # upgraded: it reports the same fault firing: nothing new
    view.report = sent(clock, 1, version, finding)
    assert engine.observe(view) == []
    assert keys(engine.firing()) == [("gpu-overheat", "gpu=0", "firing")]
    # and when it no longer does, the controller resolves it
    view.report = sent(clock, 2, version)
    assert keys(engine.observe(view)) == [("gpu-overheat", "gpu=0", "resolved")]
    assert engine.firing() == []


def test_a_node_that_turns_back_to_full_reports_is_not_opened_twice():
    pair = Pair()
    engine, view, clock = pair.split, pair.split_view, pair.clock
    version = engine.edge_rules(view, "").version  # type: ignore[union-attr]
    finding = EdgeFinding(rule="gpu-overheat", subject="gpu=0", gpu=0,
                          observed_seconds=clock.time())
    view.report = sent(clock, 1, version, finding)
    assert keys(engine.observe(view)) == [("gpu-overheat", "gpu=0", "firing")]
    # the agent restarts (its first report is full): the fault is still there
    out: list[Finding] = []
    for s in range(8):
        clock.advance(1)
        view.report = Report(node="n1", instance="c", sequence=s + 1,
                             sample_time_seconds=clock.time(), gpus=[gpu(0, 90)])
        out += engine.observe(view) + engine.sweep({"n1": view})
    assert out == []  # the controller's evaluator took it over, without a second firing
    assert keys(engine.firing()) == [("gpu-overheat", "gpu=0", "firing")]
    view.report = Report(node="n1", instance="c", sequence=99,
                         sample_time_seconds=clock.time(), gpus=[gpu(0, 70)])
    assert keys(engine.observe(view)) == [("gpu-overheat", "gpu=0", "resolved")]


def test_what_an_older_agent_never_finds_again_resolves_after_a_while():
    pair = Pair()
    engine, view, clock = pair.split, pair.split_view, pair.clock
    version = engine.edge_rules(view, "").version  # type: ignore[union-attr]
    view.report = sent(clock, 1, version, found(clock, "ecc", "gpu=2", gpu=2))
    assert keys(engine.observe(view)) == [("ecc", "gpu=2", "firing")]
    out: list[Finding] = []
    for s in range(400):
        clock.advance(1)
        view.report = Report(node="n1", instance="old", sequence=s + 1,
                             sample_time_seconds=clock.time(), gpus=[gpu(2, 60)])
        out += engine.observe(view)
    assert keys(out) == [("ecc", "gpu=2", "resolved")]
    assert engine.firing() == []


def test_a_finding_for_a_rule_the_controller_does_not_have_is_not_taken():
    pair = Pair()
    engine, view, clock = pair.split, pair.split_view, pair.clock
    version = engine.edge_rules(view, "").version  # type: ignore[union-attr]
    view.report = sent(clock, 1, version, found(clock, "gone"), found(clock, "xid"))
    assert engine.observe(view) == []  # neither unknown nor a kind the controller evaluates


def test_findings_by_rules_since_changed_wait_for_the_agent_s_next_report():
    pair = Pair()
    engine, view, clock = pair.split, pair.split_view, pair.clock
    old = engine.edge_rules(view, "").version  # type: ignore[union-attr]
    hot = found(clock, "gpu-overheat", "gpu=0")
    view.report = sent(clock, 1, old, hot)
    assert keys(engine.observe(view)) == [("gpu-overheat", "gpu=0", "firing")]
    engine.reload(rules(RULES.replace("min_delta: 5", "min_delta: 6")))  # another rule
    new = engine.edge_rules(view, old).version  # type: ignore[union-attr]
    assert new != old
    # a report judged by the old rules: neither what it found nor what it no longer finds
    view.report = sent(clock, 2, old, found(clock, "ecc", "gpu=1"))
    assert engine.observe(view) == []
    view.report = sent(clock, 3, new, hot)
    assert engine.observe(view) == []  # still the same fault, still open once


def test_reloading_a_changed_rule_resolves_what_the_agents_had_firing_for_it():
    pair = Pair()
    engine, view, clock = pair.split, pair.split_view, pair.clock
    version = engine.edge_rules(view, "").version  # type: ignore[union-attr]
    view.report = sent(clock, 1, version, found(clock, "gpu-overheat", "gpu=0"),
                       found(clock, "ecc", "gpu=1"))
    assert len(engine.observe(view)) == 2
    changed = RULES.replace("above: 85", "above: 87").replace(
        "actions: [alert, evict]", "actions: [alert]")
    out = engine.reload(rules(changed))
    assert keys(out) == [("gpu-overheat", "gpu=0", "resolved")]
    (kept,) = [f for f in engine.firing()]
    assert (kept.rule, kept.actions) == ("ecc", ("alert",))
    assert engine.edge_rules(view, version) is not None  # the agent gets the new rules


def test_rules_an_agent_cannot_parse_are_refused_with_the_rule_named():
    bad = EdgeRules(version="v", rules=[{"name": "x", "metric": "gpu_nope", "above": 1}])
    with pytest.raises(ConfigError, match="gpu_nope"):
        NodeRules(bad, "n1", {}, ManualClock())


def test_values_the_controller_reads_travel_every_few_seconds_and_are_kept_between():
    from sn_monitor.controller.ingest.decode import NodeRegistry

    clock = ManualClock()
    catalog = EdgeCatalog(rules())
    edge = catalog.for_node(NodeView(name="n1", labels={}))
    assert edge.keep == ["gpu_utilization_ratio"]
    assert edge.keep_every == 5.0
    agent = NodeRules(edge, "n1", {}, clock)
    registry = NodeRegistry(clock)
    sent = []
    for s in range(12):
        report = Report(node="n1", instance="a", sequence=s + 1,
                        sample_time_seconds=clock.time(),
                        gpus=[gpu(0, 60, util=0.5 + s / 100)])
        sent.append(agent.evaluate(report))
        view = registry.accept(sent[-1]).view
        assert view.report is not None
        assert view.report.gpus  # the controller always has the latest values sent
        clock.advance(1)
    with_values = [i for i, r in enumerate(sent) if r.gpus]
    assert with_values == [0, 5, 10]
    assert view.report.gpus[0].utilization_ratio == 0.6  # sent at second 10


def test_a_first_report_of_an_agent_that_takes_rules_is_judged_on_the_others_only():
    pair = Pair()
    engine, view, clock = pair.split, pair.split_view, pair.clock
    version = engine.edge_rules(view, "").version  # type: ignore[union-attr]
    view.report = sent(clock, 1, version, found(clock, "gpu-overheat", "gpu=0", gpu=0),
                       instance="a")
    assert keys(engine.observe(view)) == [("gpu-overheat", "gpu=0", "firing")]
    # the agent restarts: its first report is full, hot, with an XID; it takes rules
    from sn_monitor.model import EventRecord
    xid = EventRecord(id=1, kind="xid", source="kmsg", time_seconds=clock.time(),
                      message="Xid 79", gpu=0, code=79)
    view.report = Report(node="n1", instance="b", sequence=1, sample_time_seconds=clock.time(),
                         gpus=[gpu(0, 99, ecc=50)], events=[xid], takes_rules=True)
    assert keys(engine.observe(view)) == [("xid", "gpu=0", "firing")]  # events still judged
    # the agent's open finding stays open, and its next report (with rules) keeps it
    view.report = sent(clock, 2, version, found(clock, "gpu-overheat", "gpu=0", gpu=0))
    assert engine.observe(view) == []


def test_a_later_report_without_rules_is_judged_on_all_of_them():
    pair = Pair(labels={"rack": "b"})
    engine, view, clock = pair.split, pair.split_view, pair.clock
    view.report = Report(node="n1", instance="a", sequence=1, sample_time_seconds=clock.time(),
                         gpus=[gpu(0, 60, power=650)], takes_rules=True)
    assert engine.observe(view) == []  # the first: the agent judges from its next sample
    # the reply with the rules was lost: the next report is judged here, all of it
    view.report = Report(node="n1", instance="a", sequence=2, sample_time_seconds=clock.time(),
                         gpus=[gpu(0, 60, power=650)], takes_rules=True)
    assert keys(engine.observe(view)) == [("only-rack-b", "gpu=0", "firing")]


def test_a_trimmed_gpu_carries_its_workloads_and_energy_for_the_controllers_accounting():
    held = [GpuWorkloadReport(slurm_job="4242", user="ada")]
    full = Report(node="n1", instance="a", sequence=1, sample_time_seconds=1.0, gpus=[
        GpuReport(index=0, utilization_ratio=0.5, temperature_celsius=60.0,
                  energy_joules_total=1e6, workloads=held)])
    (kept,) = Trim(["gpu_utilization_ratio"])(full).gpus
    assert kept == GpuReport(index=0, utilization_ratio=0.5, energy_joules_total=1e6,
                             workloads=held)
    assert Trim(["gpu_energy_joules_total"])(full).gpus[0].energy_joules_total == 1e6
    assert Trim(())(full).gpus == []  # a bare report: the controller keeps the last ones
