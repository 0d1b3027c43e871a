"""The rule engine: every kind fires and resolves, once each, on the controller's clock."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.config import parse_yaml
from sn_monitor.model import EventRecord, GpuReport, HostReport, IbPortReport, NetReport, Report
from sn_monitor.rules.engine import Finding, RuleEngine
from sn_monitor.rules.peers import PASS_SLICE
from sn_monitor.rules.spec import Rule, load_rules, parse_rules
from sn_monitor.rules.view import NodeView

ROOT = Path(__file__).resolve().parents[2]


def rules(text: str) -> list[Rule]:
    return parse_rules(parse_yaml(text, "test.yaml"))


class Cluster:
    """Nodes reporting to an engine on a manual clock."""

    def __init__(self, text: str, labels: dict[str, dict[str, str]] | None = None) -> None:
        self.clock = ManualClock()
        self.engine = RuleEngine(rules(text), self.clock)
        self.views: dict[str, NodeView] = {}
        self.labels = labels or {}
        self.sequence = 0
        self.event_id = 0

    def send(self, node: str = "n1", *, gpus: list[GpuReport] | None = None,
             ib: list[IbPortReport] | None = None, net: list[NetReport] | None = None,
             events: list[EventRecord] | None = None, instance: str = "a") -> list[Finding]:
        self.sequence += 1
        report = Report(node=node, instance=instance, sequence=self.sequence,
                        sample_time_seconds=self.clock.time() - 0.25,
                        gpus=gpus or [], infiniband=ib or [], network=net or [],
                        events=events or [])
        view = self.views.get(node)
        if view is None:
            view = self.views[node] = NodeView(name=node, labels=self.labels.get(node, {}))
        view.report = report
        view.received_monotonic = self.clock.monotonic()
        view.received_wall = self.clock.time()
        return self.engine.observe(view)

    def tick(self, seconds: float = 1.0) -> list[Finding]:
        self.clock.advance(seconds)
        return self.engine.sweep(self.views)

    def event(self, kind: str = "xid", code: int | None = None, gpu: int | None = 0,
              at: float | None = None) -> EventRecord:
        self.event_id += 1
        return EventRecord(id=self.event_id, kind=kind, source="kmsg",  # type: ignore[arg-type] # str for Literal
                           time_seconds=self.clock.time() if at is None else at,
                           message=f"Xid {code}", gpu=gpu, code=code)


def temps(*values: float) -> list[GpuReport]:
    return [GpuReport(index=i, temperature_celsius=v) for i, v in enumerate(values)]


def statuses(findings: list[Finding]) -> list[tuple[str, str, str]]:
    return [(f.rule, f.subject, f.status) for f in findings]


OVERHEAT = """
- name: gpu-overheat
  metric: gpu_temperature_celsius
  above: 85
  for: 5s
  clear_below: 80
  severity: critical
  actions: [throttle, alert]
"""


# ------------------------------------------------------------------ threshold


def test_threshold_fires_after_for_and_clears_with_hysteresis():
    c = Cluster(OVERHEAT)
    start_wall = c.clock.time()
    assert c.send(gpus=temps(70, 70, 70, 91)) == []
    for _ in range(4):
        c.clock.advance(1)
        assert c.send(gpus=temps(70, 70, 70, 91)) == []
    c.clock.advance(1)
    (fired,) = c.send(gpus=temps(70, 70, 70, 91))
    assert fired.status == "firing"
    assert (fired.rule, fired.kind, fired.node, fired.subject, fired.gpu) == (
        "gpu-overheat", "threshold", "n1", "gpu=3", 3)
    assert fired.message == "GPU 3 temperature 91 °C >= 85 for 5s"
    assert fired.observed_wall == start_wall - 0.25  # the first report's sample time
    assert fired.detected_wall == c.clock.time()
    assert (fired.severity, fired.actions, fired.dry_run) == ("critical", ("throttle", "alert"),
                                                              False)
    assert fired.value == 91.0
    # Transitions only: still hot, or between the clear and fire bounds, says nothing.
    c.clock.advance(1)
    assert c.send(gpus=temps(70, 70, 70, 95)) == []
    assert c.send(gpus=temps(70, 70, 70, 82)) == []
    assert [f.subject for f in c.engine.firing()] == ["gpu=3"]
    (resolved,) = c.send(gpus=temps(70, 70, 70, 79.5))
    assert resolved.status == "resolved"
    assert resolved.message == "GPU 3 temperature 79.5 °C < 80"
    assert c.engine.firing() == []


def test_for_completes_on_a_sweep_without_a_new_report():
    c = Cluster(OVERHEAT)
    c.send(gpus=temps(90))
    assert c.tick(4.9) == []
    assert statuses(c.tick(0.1)) == [("gpu-overheat", "gpu=0", "firing")]
    assert c.tick(1) == []


def test_for_restarts_when_the_condition_breaks():
    c = Cluster(OVERHEAT)
    c.send(gpus=temps(90))
    c.clock.advance(3)
    c.send(gpus=temps(84))
    c.clock.advance(3)
    assert c.send(gpus=temps(90)) == []
    assert c.tick(4) == []
    assert statuses(c.tick(1)) == [("gpu-overheat", "gpu=0", "firing")]


def test_without_clear_bound_it_clears_when_the_condition_stops():
    c = Cluster("- name: hot\n  metric: gpu_temperature_celsius\n  above: 85\n")
    assert statuses(c.send(gpus=temps(85))) == [("hot", "gpu=0", "firing")]
    assert statuses(c.send(gpus=temps(84.9))) == [("hot", "gpu=0", "resolved")]


def test_lost_nodes_complete_no_timers():
    c = Cluster(OVERHEAT)
    c.send(gpus=temps(90))
    c.views["n1"].state = "lost"
    assert c.tick(10) == []
    c.views["n1"].state = "healthy"
    assert statuses(c.tick(0)) == [("gpu-overheat", "gpu=0", "firing")]


def test_below_threshold_with_labels_and_clear_above():
    c = Cluster("""
- name: ib-port-down
  metric: infiniband_port_state
  below: 3
  clear_above: 3.5
  for: 10s
  labels: {device: "mlx5_.*"}
""")
    ports = [IbPortReport(device="mlx5_0", port=1, state=1),
             IbPortReport(device="lo_roce", port=1, state=1)]
    c.send(ib=ports)
    (fired,) = c.tick(10)
    assert (fired.subject, fired.gpu) == ("device=mlx5_0,port=1", None)
    assert fired.message == "mlx5_0 port 1 state 1 <= 3 for 10s"
    assert c.send(ib=[IbPortReport(device="mlx5_0", port=1, state=3)]) == []
    (resolved,) = c.send(ib=[IbPortReport(device="mlx5_0", port=1, state=4)])
    assert resolved.status == "resolved"


def test_bools_count_as_one_and_derived_metrics_work():
    c = Cluster("""
- name: pending-row-remap
  metric: gpu_row_remap_pending
  above: 1
  actions: [alert, checkpoint]
- name: pcie-width-degraded
  metric: gpu_pcie_link_width_ratio
  below: 0.9
""")
    found = c.send(gpus=[GpuReport(index=0, row_remap_pending=False, pcie_link_width=16,
                                   pcie_link_width_max=16),
                         GpuReport(index=1, row_remap_pending=True, pcie_link_width=8,
                                   pcie_link_width_max=16)])
    assert statuses(found) == [("pending-row-remap", "gpu=1", "firing"),
                               ("pcie-width-degraded", "gpu=1", "firing")]


def test_lost_gpus_and_missing_values_keep_their_state():
    c = Cluster("- name: hot\n  metric: gpu_temperature_celsius\n  above: 85\n")
    c.send(gpus=temps(90))
    assert c.send(gpus=[GpuReport(index=0, lost=True, temperature_celsius=20)]) == []
    assert c.send(gpus=[GpuReport(index=0)]) == []
    assert len(c.engine.firing()) == 1


# ------------------------------------------------------------------ rate / increase


def crc(value: int) -> list[GpuReport]:
    return [GpuReport(index=0, nvlink_crc_errors_total=value)]


RATE = """
- name: nvlink-crc-rate
  metric: gpu_nvlink_crc_errors_total
  rate: {window: 1m}
  above: 10
"""


def test_rate_fires_on_a_rising_counter_and_clears_when_it_calms():
    c = Cluster(RATE)
    value = 1_000
    assert c.send(gpus=crc(value)) == []  # one sample: no rate yet
    found: list[Finding] = []
    for _ in range(5):
        c.clock.advance(1)
        value += 20
        found += c.send(gpus=crc(value))
    assert statuses(found) == [("nvlink-crc-rate", "gpu=0", "firing")]
    assert found[0].kind == "rate"
    assert found[0].message == "GPU 0 nvlink crc errors rate 20/s >= 10 over 1m"
    found = []
    for _ in range(120):
        c.clock.advance(1)
        found += c.send(gpus=crc(value))
    assert statuses(found) == [("nvlink-crc-rate", "gpu=0", "resolved")]


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_the_quiet_shortcut_changes_nothing(seed: int):
    """Flat counters skip the full pass; the same histories without the shortcut agree."""
    rng = random.Random(seed)
    for window, above in (("1m", 0.05), ("5m", 0.01)):
        text = RATE.replace("1m", window).replace("above: 10", f"above: {above}")
        fast, full = Cluster(text), Cluster(text)
        values = [1_000, 5, 0]
        fired = 0
        for _ in range(600):  # 2 s apart: quiet spells across buckets, steps, resets
            step = rng.random()
            for g in range(3):
                if step < 0.06:
                    values[g] += rng.randint(1, 40)
                elif step < 0.065:
                    values[g] = 0
            gpus = [GpuReport(index=g, nvlink_crc_errors_total=v) for g, v in enumerate(values)]
            for c in (fast, full):
                c.clock.advance(2)
            evaluator = full.engine._evaluators["nvlink-crc-rate"]
            evaluator._quiet.clear()  # type: ignore[union-attr]
            got, want = fast.send(gpus=gpus), full.send(gpus=gpus)
            assert [(f.subject, f.status, f.value) for f in got] == [
                (f.subject, f.status, f.value) for f in want]
            fired += len(got)
        assert fired >= 4  # the histories did exercise the rule


def test_a_counter_reset_is_not_a_burst():
    c = Cluster(RATE)
    c.send(gpus=crc(1_000_000))
    c.clock.advance(1)
    c.send(gpus=crc(1_000_001))
    found: list[Finding] = []
    for value in (0, 1, 2, 3):  # the agent restarted: the counter starts over
        c.clock.advance(1)
        found += c.send(gpus=crc(value))
    assert found == []


def test_increase_fires_on_any_new_error_and_clears_after_the_window():
    c = Cluster("""
- name: ecc-uncorrectable
  metric: gpu_ecc_uncorrected_errors_total
  increase: {window: 5m}
  above: 1
  actions: [alert, evict]
""")

    def ecc(n: int) -> list[GpuReport]:
        return [GpuReport(index=0, ecc_uncorrected_errors_total=n)]

    c.send(gpus=ecc(3))
    c.clock.advance(1)
    assert c.send(gpus=ecc(3)) == []
    c.clock.advance(1)
    (fired,) = c.send(gpus=ecc(4))
    assert fired.kind == "increase"
    assert fired.message == "GPU 0 ecc uncorrected errors increased by 1 >= 1 over 5m"
    found: list[Finding] = []
    for _ in range(299):
        c.clock.advance(1)
        found += c.send(gpus=ecc(4))
    assert found == []
    c.clock.advance(1)
    assert statuses(c.send(gpus=ecc(4))) == [("ecc-uncorrectable", "gpu=0", "resolved")]


# ------------------------------------------------------------------ baseline


BASELINE = """
- name: temperature-anomaly
  metric: gpu_temperature_celsius
  baseline: {window: 30m, sigmas: 4, min_delta: 5, warmup: 10m}
"""


def test_baseline_does_not_fire_during_warmup():
    c = Cluster(BASELINE)
    for i in range(599):
        c.clock.advance(1)
        assert c.send(gpus=temps(60.0 if i < 300 else 95.0)) == [], i


def test_baseline_ignores_noise_and_catches_a_real_spike():
    c = Cluster(BASELINE)
    rng = random.Random(7)
    found: list[Finding] = []
    for _ in range(3600):
        c.clock.advance(1)
        found += c.send(gpus=temps(65 + rng.gauss(0, 1.0), 70 + rng.gauss(0, 1.0)))
    assert found == []
    c.clock.advance(1)
    (fired,) = c.send(gpus=temps(65 + rng.gauss(0, 1.0), 80.0))
    assert (fired.rule, fired.kind, fired.subject) == ("temperature-anomaly", "baseline", "gpu=1")
    assert "above its baseline 70" in fired.message
    c.clock.advance(1)
    (resolved,) = c.send(gpus=temps(65.0, 70.5))
    assert resolved.status == "resolved"


def test_temperature_baselines_ignore_a_cooler_gpu():
    c = Cluster(BASELINE)
    for _ in range(700):
        c.clock.advance(1)
        c.send(gpus=temps(65.0))
    c.clock.advance(1)
    assert c.send(gpus=temps(40.0)) == []


# ------------------------------------------------------------------ peers


PEERS = """
- name: straggler
  metric: gpu_utilization_ratio
  peers: {group: job, below_median_by: 0.3, min_group: 4}
  for: 2m
"""


def util(*values: float) -> list[GpuReport]:
    return [GpuReport(index=i, utilization_ratio=v) for i, v in enumerate(values)]


def test_peers_need_min_group():
    labels = {f"n{i}": {"job": "j1"} for i in range(3)}
    c = Cluster(PEERS, labels)
    for i in range(3):
        c.send(f"n{i}", gpus=util(0.95, 0.95) if i else util(0.1, 0.1))
    assert c.tick(600) == []


def test_peers_find_the_straggler():
    labels = {f"n{i}": {"job": "j1"} for i in range(5)}
    labels["other"] = {"job": "j2"}
    c = Cluster(PEERS, labels)
    for i in range(5):
        c.send(f"n{i}", gpus=util(0.9, 0.96) if i else util(0.5, 0.6))
    c.send("other", gpus=util(0.1, 0.1))  # alone in its job: nothing to compare with
    assert c.tick(0) == []  # peers are compared on sweeps: the 2 minutes start here
    assert c.tick(119) == []
    (fired,) = c.tick(1)
    assert (fired.rule, fired.kind, fired.node, fired.subject, fired.gpu) == (
        "straggler", "peers", "n0", "", None)
    assert fired.message == ("node utilization 0.55 is 41% below the median 0.93 of 5 nodes "
                             "(job=j1) for 2m")
    c.send("n0", gpus=util(0.9, 0.9))
    assert c.tick(1) == []  # the fleet is compared every 5 s (a tenth of `for`, at most 5 s)
    (resolved,) = c.tick(4)
    assert (resolved.node, resolved.status) == ("n0", "resolved")


def test_a_straggler_whose_group_shrinks_resolves():
    labels = {f"n{i}": {"job": "j1"} for i in range(4)}
    c = Cluster(PEERS.replace("for: 2m", "for: 0s"), labels)
    for i in range(4):
        c.send(f"n{i}", gpus=util(0.9) if i else util(0.2))
    assert statuses(c.tick(1)) == [("straggler", "", "firing")]
    del c.views["n3"]
    assert statuses(c.tick(1)) == [("straggler", "", "resolved")]


def test_a_big_fleet_is_read_a_slice_a_sweep_then_judged():
    # 2,500 nodes, one straggler among them (the last one read): the comparison reads
    # PASS_SLICE nodes a sweep (the engine is held a few ms, not for the whole fleet),
    # judges once every node is read, then waits the rule's interval before the next pass
    nodes = 2 * PASS_SLICE + 452
    labels = {f"n{i}": {"job": "j1"} for i in range(nodes)}
    c = Cluster(PEERS.replace("for: 2m", "for: 0s"), labels)
    for i in range(nodes):
        c.send(f"n{i}", gpus=util(0.9, 0.9) if i else util(0.2, 0.2))
    assert c.tick(0.5) == []  # slice 1 (n2499 ... n1476)
    assert c.tick(0.5) == []  # slice 2
    (fired,) = c.tick(0.5)  # slice 3, with n0 in it: judged
    assert (fired.node, fired.status) == ("n0", "firing")
    assert f"of {nodes} nodes" in fired.message
    c.send("n0", gpus=util(0.9, 0.9))  # caught up; the next pass starts 0 s later (for/10)
    assert c.tick(0.5) == []
    assert c.tick(0.5) == []
    (resolved,) = c.tick(0.5)
    assert (resolved.node, resolved.status) == ("n0", "resolved")


def test_a_node_gone_during_a_pass_is_not_judged():
    nodes = PASS_SLICE + 10
    labels = {f"n{i}": {"job": "j1"} for i in range(nodes)}
    c = Cluster(PEERS.replace("for: 2m", "for: 0s"), labels)
    for i in range(nodes):
        c.send(f"n{i}", gpus=util(0.9) if i != nodes - 1 else util(0.1))
    assert c.tick(0.5) == []  # the slice with the straggler (read first) is in
    del c.views[f"n{nodes - 1}"]  # and then it is gone (forgotten by the registry)
    assert c.tick(0.5) == []  # judged without it


# ------------------------------------------------------------------ events


FATAL = """
- name: fatal-xid
  event: xid
  codes: [48, 79, 95]
  actions: [alert, failover]
"""


def test_event_codes_fire_and_clear_after_quiet():
    c = Cluster(FATAL)
    assert c.send(events=[c.event(code=13, gpu=2)]) == []
    c.clock.advance(0.5)
    (fired,) = c.send(events=[c.event(code=79, gpu=2, at=c.clock.time() - 0.4)])
    assert (fired.kind, fired.subject, fired.gpu, fired.value) == ("event", "gpu=2", 2, 79.0)
    assert fired.message.startswith("XID 79 on GPU 2: Xid 79. XID 79 (GPU has fallen off the "
                                    "bus): NVIDIA's resolution RESTART_BM")
    assert fired.observed_wall == c.clock.time() - 0.4
    # More of the same while firing: no new finding, counted, clear timer extended.
    c.clock.advance(300)
    assert c.send(events=[c.event(code=79, gpu=2), c.event(code=48, gpu=2)]) == []
    assert c.engine.firing()[0].count == 3
    assert c.tick(599) == []
    (resolved,) = c.tick(1)
    assert resolved.status == "resolved"
    assert resolved.message == "no XID event on GPU 2 for 10m (3 in this incident)"


def test_the_default_collector_stuck_rule_alerts_once_for_the_node():
    text = (ROOT / "sn_monitor" / "rules" / "default.yaml").read_text(encoding="utf-8")
    c = Cluster(text)
    stuck = EventRecord(id=1, kind="collector_stuck", source="agent",
                        time_seconds=c.clock.time(),
                        message="collector nvml has not returned for 5.0 s (deadline 5 s)")
    (fired,) = c.send(events=[stuck])
    assert (fired.rule, fired.subject, fired.status) == ("collector-stuck", "", "firing")
    assert fired.message == ("collector stuck: collector nvml has not returned for 5.0 s "
                             "(deadline 5 s)")
    assert fired.actions == ("alert",)
    assert fired.severity == "critical"


def test_events_on_other_gpus_are_other_incidents():
    c = Cluster(FATAL)
    found = c.send(events=[c.event(code=79, gpu=0), c.event(code=79, gpu=1),
                           c.event(code=95, gpu=None)])
    assert [f.subject for f in found] == ["gpu=0", "gpu=1", ""]


def test_retried_events_count_once():
    c = Cluster("- name: x\n  event: xid\n  count: 2\n  window: 1m\n")
    first = c.event(code=13)
    assert c.send(events=[first]) == []
    assert c.send(events=[first]) == []  # the ack was lost: the agent sent it again
    assert len(c.send(events=[first, c.event(code=13)])) == 1


def test_a_restarted_agent_numbers_events_afresh():
    c = Cluster("- name: x\n  event: xid\n  clear_after: 1s\n")
    c.send(events=[c.event(code=13)], instance="a")
    c.tick(1)
    c.event_id = 0
    assert len(c.send(events=[c.event(code=13)], instance="b")) == 1


def test_event_count_within_window():
    c = Cluster("""
- name: thermal-slowdown-repeated
  event: guard
  count: 3
  window: 10m
  actions: [alert, checkpoint]
""")
    t0 = c.clock.time()
    assert c.send(events=[c.event("guard", gpu=1, at=t0)]) == []
    assert c.send(events=[c.event("guard", gpu=1, at=t0 + 100)]) == []
    assert c.send(events=[c.event("guard", gpu=1, at=t0 + 650)]) == []  # first one expired
    (fired,) = c.send(events=[c.event("guard", gpu=1, at=t0 + 660)])
    assert fired.count == 3
    assert fired.observed_wall == t0 + 100
    assert fired.message.startswith("3 guard action events on GPU 1 within 10m")


# ------------------------------------------------------------------ heartbeat


def test_heartbeat_fires_after_timeout_and_clears_on_a_report():
    c = Cluster("- name: node-lost\n  heartbeat_timeout: 10s\n  actions: [alert, failover]\n")
    c.send("n1")
    last_wall = c.clock.time()
    assert c.tick(9.5) == []
    (fired,) = c.tick(0.5)
    assert (fired.rule, fired.kind, fired.node, fired.subject) == (
        "node-lost", "heartbeat", "n1", "")
    assert fired.observed_wall == last_wall + 10
    assert fired.message == "no report for 10s (timeout 10s)"
    assert c.tick(30) == []
    (resolved,) = c.send("n1")
    assert resolved.status == "resolved"
    assert c.tick(1) == []


def test_a_node_that_never_reported_is_timed_from_first_sight():
    c = Cluster("- name: node-lost\n  heartbeat_timeout: 10s\n")
    c.clock.advance(1_000)
    c.views["silent"] = NodeView(name="silent")
    assert c.tick(0) == []
    # its agent may still be backing off from the controller's absence: 12 s more
    assert c.tick(21.9) == []
    (lost,) = c.tick(0.1)
    assert (lost.rule, lost.status) == ("node-lost", "firing")
    assert lost.message == "no report since the controller started watching for 22s (timeout 10s)"


# ------------------------------------------------------------------ engine


def test_reload_keeps_unchanged_rules_and_resolves_removed_ones():
    c = Cluster(OVERHEAT + FATAL + "- name: hot2\n  metric: gpu_temperature_celsius\n"
                "  above: 90\n")
    c.send(gpus=temps(95), events=[c.event(code=79)])
    c.tick(5)
    before = {f.rule for f in c.engine.firing()}
    assert before == {"gpu-overheat", "fatal-xid", "hot2"}
    found = c.engine.reload(rules(OVERHEAT + FATAL.replace("[alert, failover]", "[alert]")))
    assert statuses(found) == [("hot2", "gpu=0", "resolved")]
    assert found[0].message == "rule removed on reload"
    firing = {f.rule: f for f in c.engine.firing()}
    assert set(firing) == {"gpu-overheat", "fatal-xid"}
    assert firing["fatal-xid"].actions == ("alert",)  # an action change keeps the incident
    assert c.send(gpus=temps(95)) == []  # still firing: no second transition


def test_reload_restarts_a_rule_whose_detection_changed():
    c = Cluster(OVERHEAT)
    c.send(gpus=temps(95))
    c.tick(5)
    found = c.engine.reload(rules(OVERHEAT.replace("above: 85", "above: 99")))
    assert [(f.status, f.message) for f in found] == [("resolved", "rule changed on reload")]
    assert c.send(gpus=temps(95)) == []


def test_reload_keeps_pending_timers():
    c = Cluster(OVERHEAT)
    c.send(gpus=temps(95))
    c.clock.advance(3)
    assert c.engine.reload(rules(OVERHEAT)) == []
    assert statuses(c.tick(2)) == [("gpu-overheat", "gpu=0", "firing")]


def test_scope_limits_rules_to_matching_nodes():
    c = Cluster("- name: hot\n  metric: gpu_temperature_celsius\n  above: 85\n"
                "  scope: {supernode: sn1}\n",
                {"a": {"supernode": "sn0"}, "b": {"supernode": "sn1"}})
    assert c.send("a", gpus=temps(95)) == []
    assert [f.node for f in c.send("b", gpus=temps(95))] == ["b"]


def test_forget_node_drops_state_silently():
    c = Cluster(OVERHEAT)
    c.send(gpus=temps(95))
    c.tick(5)
    c.engine.forget_node("n1")
    assert c.engine.firing() == []
    del c.views["n1"]
    assert c.tick(1) == []


def test_dry_run_is_carried_in_findings():
    c = Cluster("- name: hot\n  metric: gpu_temperature_celsius\n  above: 85\n  dry_run: true\n")
    (fired,) = c.send(gpus=temps(95))
    assert fired.dry_run


def test_rule_names_must_be_unique():
    with pytest.raises(ValueError, match="two rules are named 'x'"):
        RuleEngine(rules("- name: x\n  event: xid\n") * 2, ManualClock())


def test_default_rules_on_a_hot_node():
    clock = ManualClock()
    engine = RuleEngine(load_rules([ROOT / "sn_monitor" / "rules"]), clock)
    view = NodeView(name="n1", labels={"job": "j1"})
    gpus = [GpuReport(index=i, temperature_celsius=70.0, memory_temperature_celsius=60.0,
                      memory_max_temperature_celsius=95.0, shutdown_temperature_celsius=92.0,
                      utilization_ratio=0.9, pcie_link_width=16, pcie_link_width_max=16,
                      ecc_uncorrected_errors_total=0, row_remap_pending=False)
            for i in range(8)]
    found: list[Finding] = []
    for second in range(30):
        if second == 10:
            gpus[5] = GpuReport(index=5, temperature_celsius=89.0,
                                shutdown_temperature_celsius=92.0)
        view.report = Report(node="n1", instance="a", sequence=second,
                             sample_time_seconds=clock.time(), gpus=gpus)
        view.received_monotonic, view.received_wall = clock.monotonic(), clock.time()
        found += engine.observe(view)
        found += engine.sweep({"n1": view})
        clock.advance(1)
    assert statuses(found) == [("gpu-near-shutdown", "gpu=5", "firing"),
                               ("gpu-overheat", "gpu=5", "firing")]


def _default_rules_over(reports: list[tuple[float, Report]]) -> list[Finding]:
    """The packaged rules, fed ``(seconds since start, report)`` in order, one sweep each."""
    clock = ManualClock()
    engine = RuleEngine(load_rules([ROOT / "sn_monitor" / "rules"]), clock)
    view = NodeView(name="n1", labels={})
    found: list[Finding] = []
    start = clock.monotonic()
    for at, report in reports:
        clock.advance(start + at - clock.monotonic())
        view.report = msgspec.structs.replace(report, sample_time_seconds=clock.time())
        view.received_monotonic, view.received_wall = clock.monotonic(), clock.time()
        found += engine.observe(view)
        found += engine.sweep({"n1": view})
    return found


def _fabric(states: list[int | None], statuses: list[int | None] | None = None,
            sequence: int = 1) -> Report:
    statuses = statuses or [0 if s == 3 else None for s in states]
    return Report(node="n1", instance="a", sequence=sequence, sample_time_seconds=0.0,
                  gpus=[GpuReport(index=i, fabric_state=s, fabric_status=st)
                        for i, (s, st) in enumerate(zip(states, statuses, strict=True))])


def test_default_rules_a_fabric_that_never_completes_fires_after_two_minutes():
    # GPU 1: Fabric Manager not running (NOT_STARTED); GPU 2 without fabric support;
    # GPU 0 registered. 10 s between reports, for 3 minutes.
    reports = [(t, _fabric([3, 1, None], sequence=t + 1)) for t in range(0, 181, 10)]
    found = _default_rules_over(reports)
    assert statuses(found) == [("fabric-not-ready", "gpu=1", "firing")]
    assert found[0].detected_wall - found[0].observed_wall == pytest.approx(120.0)
    # IN_PROGRESS that completes within the hold is a normal start: nothing.
    starting = [(0, _fabric([2], sequence=1)), (60, _fabric([2], sequence=2)),
                (90, _fabric([3], sequence=3)), (300, _fabric([3], sequence=4))]
    assert _default_rules_over(starting) == []


def test_default_rules_a_fabric_completed_with_an_error_fires():
    reports = [(t, _fabric([3, 3], [0, 999], sequence=t + 1)) for t in range(0, 41, 10)]
    assert statuses(_default_rules_over(reports)) == [
        ("fabric-registration-failed", "gpu=1", "firing")]


def test_default_rules_stuck_processes_fire_for_the_node_and_resolve():
    def host(stuck: int | None, sequence: int) -> Report:
        return Report(node="n1", instance="a", sequence=sequence, sample_time_seconds=0.0,
                      host=None if stuck is None else HostReport(processes_stuck=stuck))
    reports = [(t, host(0 if t < 30 else 2, t + 1)) for t in range(0, 121, 10)]
    reports.append((130, host(0, 200)))
    found = _default_rules_over(reports)
    assert statuses(found) == [("processes-stuck", "", "firing"),
                               ("processes-stuck", "", "resolved")]
    assert found[0].detected_wall - found[0].observed_wall == pytest.approx(60.0)
    assert found[0].gpu is None
    # An agent without the processes collector sends no host part: nothing to judge.
    assert _default_rules_over([(t, host(None, t + 1)) for t in range(0, 121, 10)]) == []


def test_an_event_message_that_only_repeats_what_and_where_is_not_said_twice():
    c = Cluster("- name: x\n  event: xid\n")
    nvml = EventRecord(id=1, kind="xid", source="nvml", time_seconds=c.clock.time(),
                       message="XID 13 on GPU 1", gpu=1, code=13)
    kmsg = EventRecord(id=2, kind="xid", source="kmsg", time_seconds=c.clock.time(),
                       message="NVRM: Xid (PCI:0000:1b:00): 13, pid=7, Graphics Exception",
                       gpu=2, code=13)
    messages = [f.message for f in c.send(events=[nvml, kmsg])]
    assert messages[0].startswith("XID 13 on GPU 1. XID 13 (")
    assert messages[1].startswith("XID 13 on GPU 2: NVRM: Xid (PCI:0000:1b:00): 13, pid=7")
