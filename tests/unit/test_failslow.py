"""The bottleneck finder on hand-made reports: a slow job, and which node and link."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sn_monitor.controller.fabric.meter import FabricMeter, PortReading, Rate
from sn_monitor.controller.failslow.finder import BottleneckFinder, FailSlowSettings
from sn_monitor.controller.failslow.steps import StepTrend, TrendSettings
from sn_monitor.model import (
    IbPortReport,
    Report,
)
from tests.support.failslow import GB, NODES, Fleet


def run(fleet: Fleet, finder: BottleneckFinder, start: float, seconds: float,
        step_time: float, dt: float = 5.0) -> list:
    found: list = []
    t = start
    while t < start + seconds:
        t += dt
        for node in NODES:
            finder.observe(fleet.report(node, dt), t)
        finder.observe_step_time("llm", step_time * fleet.rng.uniform(0.98, 1.02), t)
        found = finder.find({"llm": NODES}, t)
    return found


@pytest.fixture
def warm() -> tuple[Fleet, BottleneckFinder, float]:
    fleet, finder = Fleet(), BottleneckFinder(FailSlowSettings())
    assert run(fleet, finder, 0.0, 600.0, 2.0) == []
    return fleet, finder, 600.0


def test_a_healthy_job_names_nobody(warm):
    fleet, finder, t = warm
    assert run(fleet, finder, t, 300.0, 2.0) == []
    assert finder.slowdown("llm", t + 300) is None


def test_a_congested_port_is_named_with_its_rail(warm):
    fleet, finder, t = warm
    fleet.wait[("n3", "mlx5_3")] = 4e6
    found = run(fleet, finder, t, 60.0, 2.4)
    assert [(b.node, b.link, b.kind, b.rail) for b in found] == [
        ("n3", "mlx5_3", "congested-link", 3)]
    assert "rail 3 on n3 (mlx5_3): xmit_wait" in found[0].message
    assert found[0].message.startswith("job llm: step time +")
    assert 0.1 < found[0].slowdown_ratio < 0.3


def test_congestion_while_the_job_keeps_its_pace_names_nobody(warm):
    fleet, finder, t = warm
    fleet.wait[("n3", "mlx5_3")] = 4e6
    assert run(fleet, finder, t, 120.0, 2.0) == []


def test_a_storage_nic_is_never_named(warm):
    fleet, finder, t = warm
    fleet.wait[("n3", "mlx5_8")] = 4e7
    assert run(fleet, finder, t, 120.0, 2.4) == []


def test_a_trained_down_nic_outranks_its_own_waiting(warm):
    fleet, finder, t = warm
    fleet.rate[("n5", "mlx5_2")] = 200 * GB
    fleet.wait[("n5", "mlx5_2")] = 1e6
    found = run(fleet, finder, t, 60.0, 2.6)
    assert [(b.node, b.link, b.kind) for b in found] == [("n5", "mlx5_2", "nic-degraded")]
    assert "rate 200 Gb/s of 400" in found[0].evidence


def test_a_throttled_gpu_needs_a_reason(warm):
    fleet, finder, t = warm
    fleet.clock[("n1", 6)] = 1.3e9
    assert run(fleet, finder, t, 60.0, 2.5) == []  # a low clock alone: a sensor's word
    fleet.reasons[("n1", 6)] = ["hw_slowdown"]
    found = run(fleet, finder, t + 60, 60.0, 2.5)
    assert [(b.node, b.link, b.kind, b.gpu) for b in found] == [
        ("n1", "gpu6", "gpu-throttled", 6)]
    assert "hw_slowdown" in found[0].evidence


def test_a_noisy_neighbour_and_a_slow_nvlink(warm):
    fleet, finder, t = warm
    fleet.processes[("n7", 0)] = 2
    found = run(fleet, finder, t, 60.0, 2.5)
    assert [(b.node, b.link, b.kind) for b in found] == [("n7", "gpu0", "noisy-neighbour")]
    fleet.processes[("n7", 0)] = 1
    fleet.nvlink_errors[("n2", 4)] = 500.0
    found = run(fleet, finder, t + 60, 90.0, 2.5)
    assert [(b.node, b.link, b.kind) for b in found] == [("n2", "gpu4/nvlink", "nvlink-slow")]


def test_a_bottleneck_keeps_its_first_detection_time_and_goes_when_the_job_recovers(warm):
    fleet, finder, t = warm
    fleet.wait[("n3", "mlx5_3")] = 4e6
    first = run(fleet, finder, t, 60.0, 2.4)
    later = run(fleet, finder, t + 60, 30.0, 2.4)
    assert first[0].detected == later[0].detected
    fleet.wait[("n3", "mlx5_3")] = 2e4
    assert run(fleet, finder, t + 90, 120.0, 2.0) == []


def test_step_trend_baseline_since_and_bounds():
    trend = StepTrend(TrendSettings(min_samples=4, recent_seconds=10, baseline_seconds=100,
                                    max_samples=50))
    for i in range(20):
        trend.add(1.0, float(i))
    assert trend.slowdown(19.0) is None
    for i in range(20, 31):
        trend.add(1.3, float(i))
    slow = trend.slowdown(30.0)
    # the recent window's median turned at 25 s: six slow samples of eleven
    assert slow is not None
    assert slow.since == 25.0
    assert slow.ratio == pytest.approx(0.3)
    trend.add(-1.0, 22.0)  # nonsense is ignored
    trend.add(1.3, 5.0)  # and so is the past
    assert trend.latest() == 1.3
    for i in range(200):
        trend.add(1.0, 31.0 + i)
    assert trend.slowdown(230.0) is None
    assert len(trend._samples) <= 50


def test_meter_rates_survive_trimmed_reports_and_counter_resets():
    meter = FabricMeter(tau_seconds=1e-9, every_seconds=0)  # the last interval's rate
    def report(tx: int, with_ports: bool = True) -> Report:
        ports = [IbPortReport(device="mlx5_0", port=1, counters={"transmitted_bytes": tx})]
        return Report(node="n", instance="i", sequence=1, sample_time_seconds=0,
                      infiniband=ports if with_ports else [])
    def rate() -> float | None:
        return meter.node("n").ports[("mlx5_0", 1)].transmit.value

    meter.observe(report(1000), 0.0)
    meter.observe(report(3000), 2.0)
    assert rate() == pytest.approx(1000.0)  # a node read for the first time: a rate at once
    meter.observe(report(0, with_ports=False), 3.0)
    assert rate() == pytest.approx(1000.0)
    meter.observe(report(10), 4.0)  # the counter started again
    assert rate() == pytest.approx(1000.0)
    meter.observe(report(410), 5.0)
    assert rate() == pytest.approx(400.0)


def test_a_burst_that_is_over_is_not_named_even_while_the_job_is_slow(warm):
    fleet, finder, t = warm
    run(fleet, finder, t, 30.0, 2.5)  # slow for a reason no counter shows
    fleet.wait[("n4", "mlx5_1")] = 2e7  # one report's worth of waiting ...
    run(fleet, finder, t + 30, 5.0, 2.5)
    fleet.wait[("n4", "mlx5_1")] = 2e4  # ... then none: its smoothed rate still decays
    assert run(fleet, finder, t + 35, 30.0, 2.5) == []


def test_a_job_back_at_its_pace_is_not_slow_on_its_next_two_samples():
    trend = StepTrend(TrendSettings(min_samples=4, recent_seconds=20))
    for i in range(40):
        trend.add(1.0, float(i))
    for i in range(40, 60):
        trend.add(1.3, float(i))
    assert trend.slowdown(59.0) is not None
    trend.add(1.0, 60.0)
    assert trend.slowdown(60.0) is not None  # one sample back: a pause in a slow stretch
    trend.add(1.0, 61.0)
    assert trend.slowdown(61.0) is None  # the recent median still says 1.3


def test_congestion_on_roce_rails_is_read_from_ecn_marks():
    fleet, finder = Fleet(roce=True), BottleneckFinder(FailSlowSettings())
    assert run(fleet, finder, 0.0, 600.0, 2.0) == []
    fleet.ecn[("n6", "mlx5_5")] = 5e4
    found = run(fleet, finder, 600.0, 60.0, 2.4)
    assert [(b.node, b.link, b.kind) for b in found] == [("n6", "mlx5_5", "congested-link")]
    assert "ECN marks" in found[0].evidence
    assert "x the rail median" in found[0].evidence


def test_meter_takes_rates_every_few_seconds_and_states_from_every_report():
    meter = FabricMeter(tau_seconds=1e-9, every_seconds=4.5)

    def report(tx: int, state: int = 4) -> Report:
        return Report(node="n", instance="i", sequence=1, sample_time_seconds=0,
                      infiniband=[IbPortReport(device="mlx5_0", port=1, state=state,
                                               counters={"transmitted_bytes": tx})])
    def port() -> Any:
        return meter.node("n").ports[("mlx5_0", 1)]

    meter.observe(report(0), 0.0)
    meter.observe(report(1000), 1.0)  # too soon for a rate
    assert port().transmit.value is None
    meter.observe(report(5000, state=1), 5.0)
    assert port().transmit.value == pytest.approx(1000.0)
    meter.observe(report(5000, state=4), 6.0)  # a port's state shows at once
    assert port().state == 4


def test_a_bad_fail_slow_setting_names_the_file_key_and_line(tmp_path):
    from sn_monitor.config import ConfigError
    from sn_monitor.controller.settings import load_controller_settings

    path = tmp_path / "controller.yaml"
    path.write_text("fail_slow:\n  trend: {min_slowdown: 0.1}\n  suspects: {wait_ratio: -1}\n")
    with pytest.raises(ConfigError, match=r"controller.yaml:3: fail_slow.suspects.wait_ratio: "
                                          r"must be greater than 0"):
        load_controller_settings(path)
    path.write_text("fail_slow: {trend: {min_slowdown: 0.1}, confirm: 3}\n")
    settings = load_controller_settings(path).fail_slow
    assert (settings.trend.min_slowdown, settings.confirm) == (0.1, 3)


def test_a_rate_at_rest_moves_only_its_time_and_reads_as_the_whole_computation() -> None:
    """A counter that stops after moving, and moves again: every reading is the smoothed
    rate computed in full (the short way for a counter at rest changes nothing), and one
    at rest long enough reads 0."""
    rate, tau = Rate(), 15.0
    totals = [0, 100, 100, 100, 100, 250, 250, 250, 250, 250, 250, 400]
    value: float | None = None
    for i, total in enumerate(totals):
        rate.feed(total, 2.0 * i, tau)
        if i:
            step = (total - totals[i - 1]) / 2.0
            value = step if value is None else value + (1 - math.exp(-2.0 / tau)) * (step - value)
            assert rate.latest == step
        assert rate.value == value
    at = 2.0 * len(totals)
    while rate.value:  # at rest: decays to 0.0 (not to the smallest float) in minutes
        rate.feed(400, at, tau)
        at += 2.0
        assert rate.latest == 0.0
        assert at < 2.0 * len(totals) + 30 * tau
    assert rate.value == 0.0
    rate.feed(400, 1e6, tau)  # at rest: only the time moves
    rate.feed(430, 1e6 + 3.0, tau)
    assert rate.latest == 10.0
    assert rate.value == pytest.approx(10.0 * (1 - math.exp(-0.2)))


def test_a_port_that_counted_errors_once_is_healthy_again_minutes_later() -> None:
    meter = FabricMeter(every_seconds=0)

    def report(errors: int, at: float) -> Report:
        port = IbPortReport(device="mlx5_0", port=1, state=4, rate_bytes_per_second=5e10,
                            counters={"symbol_error": errors, "port_xmit_data": 0})
        return Report(node="n", instance="i", sequence=1, sample_time_seconds=at,
                      infiniband=[port])

    meter.observe(report(0, 0.0), 0.0)
    meter.observe(report(3, 2.0), 2.0)  # a burst of errors
    health = meter.health("n")
    assert health is not None
    assert (health.ports[("mlx5_0", 1)].errors_per_second or 0) > 0
    at = 2.0
    while at < 20 * 60:  # twenty minutes at rest, a report every two seconds
        at += 2.0
        meter.observe(report(3, at), at)
        meter.health("n")
    health = meter.health("n")
    assert health is not None
    assert health.ports[("mlx5_0", 1)].errors_per_second == 0.0


def test_a_port_sums_its_error_counters_and_counts_one_missing_as_zero() -> None:
    reading = PortReading("mlx5_0", 1)
    counters = {"symbol_error": 2, "link_downed": 1, "port_xmit_data": 900}
    reading.name_errors(counters)
    assert reading.error_names == ("symbol_error", "link_downed")
    assert reading.error_total(counters) == 3
    # as many counters, one of them another: its names stay, the missing one counts 0
    assert reading.error_total({"symbol_error": 5, "port_rcv_errors": 7,
                                "port_xmit_data": 950}) == 5
    alone = PortReading("mlx5_1", 1)
    alone.name_errors({"symbol_error": 4, "port_xmit_data": 1})
    assert alone.error_total({"symbol_error": 4, "port_xmit_data": 2}) == 4
