"""Whatever a valid report holds, the rules never raise and never repeat a transition.

Then each kind of rule on its own (threshold, rate, increase, baseline, peers, event,
heartbeat, alert), over arbitrary sequences of values with extremes (within what the wire
accepts), counter resets and gaps in time: it never raises, its findings alternate
firing / resolved per subject and agree with what it says is firing, and a series that
stays within the rule's bounds never fires. Budgets: tests/fuzzing.py.
"""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sn_monitor.clock import ManualClock
from sn_monitor.config import parse_yaml
from sn_monitor.model import (
    INT64_MAX,
    MEASURE_MAX,
    EventRecord,
    GpuReport,
    IbPortReport,
    NetReport,
    Report,
)
from sn_monitor.rules.alerts import WebhookAlert
from sn_monitor.rules.engine import RuleEngine
from sn_monitor.rules.spec import load_rules, parse_rules
from sn_monitor.rules.view import NodeView
from tests.fuzzing import examples

ROOT = Path(__file__).resolve().parents[2]

EXTRA = """
- name: any-rate
  metric: infiniband_port_symbol_errors
  rate: {window: 10s}
  above: 0.5
- name: power-baseline
  metric: gpu_power_watts
  baseline: {window: 1m, sigmas: 2, warmup: 5s, min_samples: 3}
- name: power-peers
  metric: gpu_power_watts
  peers: {group: job, above_median_by: 0.2, min_group: 2}
- name: carrier
  metric: network_carrier_changes_total
  increase: {window: 5s}
  above: 1
- name: any-xid
  event: xid
  count: 2
  window: 5s
  clear_after: 3s
"""

temperature = st.floats(min_value=-50, max_value=200, allow_nan=False)
counter = st.integers(min_value=0, max_value=2**63 - 1)
ratio = st.floats(min_value=0, max_value=1)

gpus = st.builds(
    GpuReport,
    index=st.integers(min_value=0, max_value=7),
    lost=st.booleans(),
    utilization_ratio=st.none() | ratio,
    temperature_celsius=st.none() | temperature,
    memory_temperature_celsius=st.none() | temperature,
    memory_max_temperature_celsius=st.none() | temperature,
    shutdown_temperature_celsius=st.none() | temperature,
    power_watts=st.none() | st.floats(min_value=0, max_value=2000),
    ecc_uncorrected_errors_total=st.none() | counter,
    row_remap_pending=st.none() | st.booleans(),
    row_remap_failed=st.none() | st.booleans(),
    pcie_link_width=st.none() | st.integers(min_value=0, max_value=32),
    pcie_link_width_max=st.none() | st.integers(min_value=0, max_value=32),
    pcie_link_generation=st.none() | st.integers(min_value=0, max_value=6),
    pcie_link_generation_max=st.none() | st.integers(min_value=0, max_value=6),
    nvlink_crc_errors_total=st.none() | counter,
    nvlinks_down=st.none() | st.integers(min_value=0, max_value=18),
)
ports = st.builds(
    IbPortReport,
    device=st.sampled_from(["mlx5_0", "mlx5_1"]),
    port=st.integers(min_value=0, max_value=2),
    state=st.none() | st.integers(min_value=0, max_value=5),
    counters=st.dictionaries(st.sampled_from(["symbol_errors", "link_downed"]), counter),
)
nets = st.builds(NetReport, device=st.sampled_from(["eth0", "ib0"]),
                 carrier_changes_total=st.none() | counter)
events = st.builds(
    EventRecord,
    id=st.integers(min_value=0, max_value=50),
    kind=st.sampled_from(["xid", "sxid", "gpu_lost", "gpu_fallen_off_bus", "link_down",
                          "guard", "collector_stuck"]),
    source=st.sampled_from(["nvml", "kmsg", "agent"]),
    time_seconds=st.floats(min_value=0, max_value=2e9),
    gpu=st.none() | st.integers(min_value=0, max_value=63),
    code=st.none() | st.integers(min_value=-5, max_value=200),
    device=st.none() | st.sampled_from(["mlx5_0", "eth0"]),
)
steps = st.tuples(
    st.sampled_from(["n1", "n2", "n3"]),
    st.sampled_from(["a", "b"]),
    st.lists(gpus, max_size=8),
    st.lists(ports, max_size=3),
    st.lists(nets, max_size=2),
    st.lists(events, max_size=4),
    st.floats(min_value=0, max_value=20),
)


def _engine(clock: ManualClock) -> RuleEngine:
    rules = (load_rules([ROOT / "sn_monitor" / "rules"])
             + parse_rules(parse_yaml(EXTRA, "extra.yaml")))
    return RuleEngine(rules, clock)


@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps, min_size=1, max_size=25))
def test_observe_and_sweep_never_raise_and_only_transition(sequence):
    clock = ManualClock()
    engine = _engine(clock)
    views: dict[str, NodeView] = {}
    state: dict[tuple[str, str, str], str] = {}
    for number, (node, instance, g, ib, net, ev, wait) in enumerate(sequence):
        report = Report(node=node, instance=instance, sequence=number,
                        sample_time_seconds=clock.time(), labels={"job": "j"},
                        gpus=g, infiniband=ib, network=net, events=ev)
        # Only what the wire accepts: the controller decodes before the rules see it.
        report = msgspec.json.decode(msgspec.json.encode(report), type=Report)
        view = views.setdefault(node, NodeView(name=node, labels={"job": "j"}))
        view.report = report
        view.received_monotonic, view.received_wall = clock.monotonic(), clock.time()
        found = engine.observe(view)
        clock.advance(wait)
        found += engine.sweep(views)
        for f in found:
            key = (f.rule, f.node, f.subject)
            assert state.get(key, "resolved") != f.status, f
            state[key] = f.status
    firing = {(f.rule, f.node, f.subject) for f in engine.firing()}
    assert firing == {k for k, v in state.items() if v == "firing"}


# --------------------------------------------------------------------------- each kind alone

measure = st.floats(min_value=-MEASURE_MAX, max_value=MEASURE_MAX, allow_nan=False)
any_counter = st.integers(min_value=0, max_value=INT64_MAX)
#: Seconds between two reports: often none, sometimes a long silence.
gap = st.one_of(st.just(0.0), st.floats(min_value=0.001, max_value=30),
                st.floats(min_value=30, max_value=1e6))
PROPERTY = settings(max_examples=examples(60), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class Watch:
    """One rule in an engine on a manual clock, and every transition it made.

    :meth:`check` holds the invariants: transitions alternate per (node, subject) starting
    with ``firing``, and what the engine says is firing is what the transitions say.
    """

    def __init__(self, rule_yaml: str) -> None:
        self.clock = ManualClock()
        self.engine = RuleEngine(parse_rules(parse_yaml(rule_yaml, "rule.yaml")), self.clock)
        self.views: dict[str, NodeView] = {}
        self.state: dict[tuple[str, str], str] = {}
        self.fired = 0
        self.sequence = 0

    def report(self, node: str, labels: dict[str, str] | None = None, **fields) -> None:
        self.sequence += 1
        report = Report(node=node, instance="i", sequence=self.sequence,
                        sample_time_seconds=self.clock.time(), labels=labels or {}, **fields)
        report = msgspec.json.decode(msgspec.json.encode(report), type=Report)
        view = self.views.setdefault(node, NodeView(name=node, labels=dict(labels or {})))
        view.report = report
        view.received_monotonic, view.received_wall = self.clock.monotonic(), self.clock.time()
        self.note(self.engine.observe(view))

    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.note(self.engine.sweep(self.views))

    def note(self, findings) -> None:
        for f in findings:
            key = (f.node, f.subject)
            assert self.state.get(key, "resolved") != f.status, f
            assert f.observed_wall <= f.detected_wall + 1e-6 or f.kind == "heartbeat", f
            self.state[key] = f.status
            self.fired += f.status == "firing"

    def check(self) -> None:
        firing = {(f.node, f.subject) for f in self.engine.firing()}
        assert firing == {k for k, v in self.state.items() if v == "firing"}


def test_the_watch_sees_each_kind_fire():
    """The properties below are not vacuous: out of bounds, each rule fires in a Watch."""
    hot = Watch("- {name: t, metric: gpu_temperature_celsius, above: 85}")
    hot.report("n1", gpus=_gpus([90.0]))
    rate = Watch("- {name: r, metric: infiniband_port_symbol_errors, rate: {window: 5s}, "
                 "above: 10}")
    for second in range(3):
        rate.wait(1)
        rate.report("n1", infiniband=[IbPortReport(device="mlx5_0", port=1,
                                                   counters={"symbol_errors": 100 * second})])
    base = Watch(BASELINE)
    for _ in range(10):
        base.wait(1)
        base.report("n1", gpus=[GpuReport(index=0, power_watts=100.0)])
    base.report("n1", gpus=[GpuReport(index=0, power_watts=500.0)])
    peers = Watch(PEERS)
    for node, value in enumerate([0.9, 0.9, 0.9, 0.1]):
        peers.report(f"n{node}", labels={"job": "j"},
                     gpus=[GpuReport(index=0, utilization_ratio=value)])
    peers.wait(1)
    event = Watch(EVENT)
    at = event.clock.time()
    event.report("n1", events=[EventRecord(id=i, kind="xid", source="kmsg", time_seconds=at,
                                           code=79) for i in range(2)])
    beat = Watch("- {name: h, heartbeat_timeout: 10s}")
    beat.report("n1")
    beat.wait(11)
    for watch in (hot, rate, base, peers, event, beat):
        assert watch.fired == 1
        watch.check()


def _gpus(values) -> list[GpuReport]:
    return [GpuReport(index=i, temperature_celsius=v) for i, v in enumerate(values)]


@PROPERTY
@given(st.lists(st.tuples(gap, st.lists(st.none() | measure, max_size=4)), max_size=30),
       st.integers(min_value=-10**6, max_value=10**6))
def test_threshold_on_any_values_only_alternates(steps_, bound):
    watch = Watch(f"- {{name: t, metric: gpu_temperature_celsius, above: {bound}, "
                  f"clear_below: {bound - 5}, for: 3s}}")
    for wait, values in steps_:
        watch.wait(wait)
        watch.report("n1", gpus=[GpuReport(index=i, temperature_celsius=v)
                                 for i, v in enumerate(values)])
    watch.wait(10)
    watch.check()


@PROPERTY
@given(st.lists(st.tuples(gap, st.lists(st.floats(min_value=-MEASURE_MAX, max_value=84.999),
                                        max_size=4)), max_size=30),
       st.sampled_from(["0s", "3s"]))
def test_threshold_never_fires_below_its_bound(steps_, hold):
    watch = Watch(f"- {{name: t, metric: gpu_temperature_celsius, above: 85, for: {hold}}}")
    for wait, values in steps_:
        watch.wait(wait)
        watch.report("n1", gpus=_gpus(values))
    watch.wait(10)
    assert watch.fired == 0


@PROPERTY
@given(st.lists(st.tuples(gap, st.lists(st.floats(min_value=10.001, max_value=MEASURE_MAX),
                                        max_size=4)), max_size=30))
def test_a_below_threshold_never_fires_above_its_bound(steps_):
    watch = Watch("- {name: t, metric: gpu_power_watts, below: 10, clear_above: 20}")
    for wait, values in steps_:
        watch.wait(wait)
        watch.report("n1", gpus=[GpuReport(index=i, power_watts=v) for i, v in enumerate(values)])
    assert watch.fired == 0


def _counter_steps(rate_bound: float):
    """(seconds, counter) steps whose rate never exceeds ``rate_bound``; drops are resets."""
    step = st.tuples(st.floats(min_value=0.001, max_value=1e5), st.floats(min_value=0, max_value=1),
                     st.booleans(), st.integers(min_value=0, max_value=10**6))
    return st.lists(step, max_size=40).map(lambda raw: _counters(raw, rate_bound))


def _counters(raw, rate_bound: float) -> list[tuple[float, int]]:
    out: list[tuple[float, int]] = []
    value = 0
    for wait, share, reset, restart in raw:
        if reset:
            value = min(value, restart) // 2  # a driver reload: back to (near) zero
        else:
            value = min(INT64_MAX, value + int(share * rate_bound * wait))
        out.append((wait, value))
    return out


@PROPERTY
@given(_counter_steps(rate_bound=5.0), st.sampled_from(["5s", "1m", "1h"]))
def test_rate_never_fires_on_a_counter_within_its_rate(series, window):
    # above: 10 per second; the counter never climbs faster than 5 (resets in between)
    watch = Watch("- {name: r, metric: infiniband_port_symbol_errors, "
                  f"rate: {{window: {window}}}, above: 10}}")
    for wait, value in series:
        watch.wait(wait)
        watch.report("n1", infiniband=[IbPortReport(device="mlx5_0", port=1,
                                                    counters={"symbol_errors": value})])
    assert watch.fired == 0


@PROPERTY
@given(st.lists(st.tuples(gap, st.integers(min_value=0, max_value=INT64_MAX)), max_size=40),
       st.sampled_from(["rate", "increase"]))
def test_rate_and_increase_on_any_counter_only_alternate(series, mode):
    watch = Watch(f"- {{name: r, metric: network_carrier_changes_total, {mode}: {{window: 10s}}, "
                  "above: 1}")
    for wait, value in series:
        watch.wait(wait)
        watch.report("n1", network=[NetReport(device="eth0", carrier_changes_total=value)])
    watch.wait(60)
    watch.check()


@PROPERTY
@given(st.lists(st.tuples(gap, st.integers(min_value=0, max_value=2)), max_size=40),
       st.integers(min_value=0, max_value=2**53 - 2))
def test_increase_never_fires_on_a_counter_that_moves_less(series, base):
    # above: 3 over the window; values stay within base .. base + 2 (down is a reset).
    # Beyond 2**53 a counter's double loses units: see the xfail test below.
    watch = Watch("- {name: i, metric: network_carrier_changes_total, increase: {window: 1m}, "
                  "above: 3}")
    for wait, offset in series:
        watch.wait(wait)
        watch.report("n1", network=[NetReport(device="eth0",
                                              carrier_changes_total=base + offset)])
    assert watch.fired == 0


@pytest.mark.xfail(strict=True, reason="known bug: rate/increase keep samples as doubles "
                   "(rules/threshold.py), so a counter beyond 2**53 moving by 2 can look like 4")
def test_increase_is_exact_on_counters_beyond_2_53():
    watch = Watch("- {name: i, metric: network_carrier_changes_total, increase: {window: 1m}, "
                  "above: 3}")
    base = 14_417_064_385_340_489  # found by `make fuzz`
    for offset in (0, 2):
        watch.report("n1", network=[NetReport(device="eth0", carrier_changes_total=base + offset)])
    assert watch.fired == 0


BASELINE = ("- {name: b, metric: gpu_power_watts, baseline: {window: 1m, sigmas: 3, "
            "min_delta: 5, warmup: 5s, min_samples: 3}}")


@PROPERTY
@given(st.lists(st.tuples(gap, st.lists(st.none() | measure, max_size=3)), max_size=40))
def test_baseline_on_any_values_only_alternates(steps_):
    watch = Watch(BASELINE)
    for wait, values in steps_:
        watch.wait(wait)
        watch.report("n1", gpus=[GpuReport(index=i, power_watts=v) for i, v in enumerate(values)])
    watch.check()


@PROPERTY
@given(st.floats(min_value=-1e9, max_value=1e9),
       st.lists(st.tuples(gap, st.floats(min_value=-2.25, max_value=2.25)), max_size=60))
def test_baseline_never_fires_on_a_series_within_min_delta(centre, steps_):
    # min_delta 5: values within centre +- 2.25 are never more than 5 from their mean
    watch = Watch(BASELINE)
    for wait, noise in steps_:
        watch.wait(wait)
        watch.report("n1", gpus=[GpuReport(index=0, power_watts=centre + noise)])
    assert watch.fired == 0


PEERS = ("- {name: p, metric: gpu_utilization_ratio, "
         "peers: {group: job, below_median_by: 0.3, min_group: 3}}")


@PROPERTY
@given(st.lists(st.tuples(gap, st.integers(min_value=0, max_value=5),
                          st.none() | st.floats(min_value=0, max_value=1)), max_size=40))
def test_peers_on_any_values_only_alternate(steps_):
    watch = Watch(PEERS)
    for wait, node, value in steps_:
        watch.wait(wait)
        gpus = [] if value is None else [GpuReport(index=0, utilization_ratio=value)]
        watch.report(f"n{node}", labels={"job": "j"}, gpus=gpus)
    watch.wait(10)
    watch.check()


@PROPERTY
@given(st.floats(min_value=0.01, max_value=1),
       st.lists(st.tuples(gap, st.integers(min_value=0, max_value=5),
                          st.floats(min_value=0.9, max_value=1.0)), max_size=40))
def test_peers_never_fire_when_every_node_is_near_the_median(level, steps_):
    # every node within 10 % of one level: none is 30 % below the median
    watch = Watch(PEERS)
    for wait, node, share in steps_:
        watch.wait(wait)
        watch.report(f"n{node}", labels={"job": "j"},
                     gpus=[GpuReport(index=0, utilization_ratio=level * share)])
    watch.wait(10)
    assert watch.fired == 0


def test_peers_never_fire_when_every_node_is_idle():
    watch = Watch(PEERS)
    for node in range(4):
        watch.report(f"n{node}", labels={"job": "j"},
                     gpus=[GpuReport(index=0, utilization_ratio=0.0)])
    watch.wait(10)
    assert watch.fired == 0


events_any = st.builds(
    EventRecord, id=st.integers(min_value=0, max_value=INT64_MAX),
    kind=st.sampled_from(["xid", "sxid", "gpu_lost", "gpu_fallen_off_bus", "link_down",
                          "guard", "collector_stuck"]),
    source=st.sampled_from(["nvml", "kmsg", "agent"]),
    time_seconds=st.floats(min_value=-1e18, max_value=1e18),
    gpu=st.none() | st.integers(min_value=0, max_value=63),
    code=st.none() | st.integers(min_value=-(2**63), max_value=INT64_MAX),
    device=st.none() | st.sampled_from(["mlx5_0", "eth0"]))
EVENT = "- {name: e, event: xid, codes: [79], count: 2, window: 5s, clear_after: 30s}"


@PROPERTY
@given(st.lists(st.tuples(gap, st.sampled_from(["a", "b"]), st.lists(events_any, max_size=5)),
                max_size=30))
def test_events_on_any_reports_only_alternate(steps_):
    watch = Watch(EVENT)
    for wait, instance, events in steps_:
        watch.wait(wait)
        watch.sequence += 1
        report = Report(node="n1", instance=instance, sequence=watch.sequence,
                        sample_time_seconds=watch.clock.time(), events=events)
        view = watch.views.setdefault("n1", NodeView(name="n1"))
        view.report = report
        view.received_monotonic = watch.clock.monotonic()
        watch.note(watch.engine.observe(view))
    watch.wait(60)
    watch.check()
    assert not list(watch.engine.firing())  # 60 s quiet clears every event incident


@PROPERTY
@given(st.lists(st.tuples(gap, st.lists(events_any.filter(
    lambda e: e.kind != "xid" or e.code != 79), max_size=5)), max_size=30))
def test_events_that_do_not_match_never_fire(steps_):
    watch = Watch(EVENT.replace("count: 2, window: 5s, ", ""))
    for wait, events in steps_:
        watch.wait(wait)
        watch.report("n1", events=[msgspec.structs.replace(e, id=i + 1000 * watch.sequence)
                                   for i, e in enumerate(events)])
    assert watch.fired == 0


@PROPERTY
@given(st.lists(st.floats(min_value=5.001, max_value=1e6), max_size=20))
def test_counted_events_further_apart_than_the_window_never_fire(spacing):
    watch = Watch(EVENT)
    at = watch.clock.time()
    for number, apart in enumerate(spacing):
        at += apart
        watch.wait(apart)
        watch.report("n1", events=[EventRecord(id=number, kind="xid", source="kmsg",
                                               time_seconds=at, code=79)])
    assert watch.fired == 0


@PROPERTY
@given(st.lists(st.tuples(st.floats(min_value=0, max_value=9.99), st.integers(0, 3)),
                max_size=60))
def test_heartbeat_never_fires_while_nodes_report_in_time(steps_):
    watch = Watch("- {name: h, heartbeat_timeout: 10s}")
    for node in range(4):
        watch.report(f"n{node}")
    for wait, _ in steps_:
        watch.wait(wait)  # less than the timeout since everyone's last report
        for node in range(4):
            watch.report(f"n{node}")
    assert watch.fired == 0


@PROPERTY
@given(st.lists(st.tuples(gap, st.sets(st.integers(0, 3))), max_size=40))
def test_heartbeat_with_any_silences_only_alternates(steps_):
    watch = Watch("- {name: h, heartbeat_timeout: 10s}")
    for wait, reporting in steps_:
        watch.wait(wait)
        for node in sorted(reporting):
            watch.report(f"n{node}")
    watch.wait(20)
    watch.check()


label_value = st.text(max_size=12)
alerts = st.builds(
    WebhookAlert, status=st.sampled_from(["firing", "resolved"]),
    labels=st.dictionaries(st.sampled_from(["alertname", "node", "instance", "gpu",
                                            "severity", "source", "x"]),
                           st.one_of(label_value, st.sampled_from(
                               ["SnBad", "gpu-1", "gpu-2", "3", "sn-monitor", ""])),
                           max_size=6),
    starts_at=st.datetimes(timezones=st.just(UTC)),
    ends_at=st.none() | st.datetimes(timezones=st.just(UTC)),
    fingerprint=st.sampled_from(["", "f1", "f2"]))


@PROPERTY
@given(st.lists(st.tuples(gap, st.lists(alerts, max_size=5)), max_size=30))
def test_alert_rules_on_any_alerts_only_alternate(steps_):
    watch = Watch("- {name: a, alert: {alertname: SnBad}, actions: [alert]}")
    for wait, batch in steps_:
        watch.wait(wait)
        intake = watch.engine.receive_alerts(batch, lambda node: {}, "alertmanager:test")
        watch.note(intake.findings)
        assert intake.accepted + intake.skipped + intake.unmatched == len(batch)
    watch.check()


@PROPERTY
@given(st.lists(alerts.filter(lambda a: a.labels.get("alertname") != "SnBad"), max_size=20))
def test_alert_rules_never_fire_on_alerts_they_do_not_match(batch):
    watch = Watch("- {name: a, alert: {alertname: SnBad}, actions: [alert]}")
    intake = watch.engine.receive_alerts(batch, lambda node: {}, "alertmanager:test")
    assert intake.findings == []
