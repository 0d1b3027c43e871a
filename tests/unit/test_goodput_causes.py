"""A replay that explains itself: interruptions and lost work by cause (the trace's
faults, the policy's own restarts, its restarts for a healthy node), and healthy nodes'
noise that an over-eager rule set mistakes for faults while the shipped rules do not."""

from __future__ import annotations

from pathlib import Path

import pytest

from sn_monitor.config import Duration
from sn_monitor.goodput.noise import NOISE, NOISE_BUDGET, Noise, NoiseKind, draw_noise
from sn_monitor.goodput.replay import ReplayOptions, job_nodes, replay
from sn_monitor.goodput.results import PolicyResult, table, to_json
from sn_monitor.goodput.trace import Fault, Trace, Warning
from sn_monitor.goodput.world import CAUSES, WorldSettings
from sn_monitor.rules.spec import packaged_rules

SETTINGS = WorldSettings(nodes=20, spares=2, step_seconds=Duration(10),
                         save_blocking=Duration(2), save_persist=Duration(8),
                         relaunch=Duration(20), load=Duration(10),
                         operator_response=Duration(900), replacement=Duration(30))
TWO_HOURS = 7200.0
#: One process exit: the trace's only fault.
TRACE = Trace((Fault(time=1000.0, node="node-0000", kind="software", category="software",
                     repair=0.0),), TWO_HOURS, "hand")
#: One of each kind of noise, on healthy nodes, after the exit.
NOISE_EVENTS = (
    Noise(time=2000.0, slot="node-0005", signal="temperature", lasts=60.0),
    Noise(time=3000.0, slot="node-0006", signal="ecc-corrected"),
    Noise(time=3500.0, slot="node-0007", signal="link-flap", lasts=3.0),
    Noise(time=4000.0, slot="node-0008", signal="ib-symbols"),
    Noise(time=5000.0, slot="node-0009", signal="app-xid"),
)
#: Over-eager: a temperature threshold below the noise's 80 °C excursions and every
#: application XID taken for a broken GPU (each takes the node out of the job), and any
#: symbol error for a failing link (a checkpoint).
EAGER_RULES = """
- name: eager-temperature
  description: A GPU above 75 °C is broken (it is not).
  metric: gpu_temperature_celsius
  above: 75
  severity: critical
  actions: [alert, failover]
- name: eager-xid
  description: Any XID 13 is a broken GPU (it is the application's).
  event: xid
  codes: [13]
  severity: critical
  actions: [alert, failover]
- name: eager-symbols
  description: Any symbol error is a failing link (a burst is not).
  metric: infiniband_port_symbol_errors
  increase: {window: 5m}
  above: 2
  severity: warning
  actions: [alert, checkpoint]
"""


def _sn_monitor(rules: tuple[Path, ...], noise: tuple[Noise, ...]) -> PolicyResult:
    [result] = replay(TRACE, SETTINGS, ReplayOptions(policies=("sn-monitor",), rules=rules,
                                                      noise=noise))
    return result


def _adds_up(result: PolicyResult) -> None:
    assert sum(result.interruptions_by_cause.values()) == result.interruptions
    assert sum(result.lost_work_by_cause_seconds.values()) == pytest.approx(
        result.lost_work_seconds, abs=0.01)


def test_over_eager_rules_evict_healthy_nodes_for_noise(tmp_path: Path) -> None:
    """The columns can fail: the excursion and the application XID each take a healthy
    node out, and each stop of the job, and the work it lost, is counted as false; the
    checkpoint asked for on the symbol burst, and the one the recovery takes before it
    moves the job off the hot GPU, are false checkpoints."""
    (tmp_path / "eager.yaml").write_text(EAGER_RULES)
    result = _sn_monitor((packaged_rules(), tmp_path / "eager.yaml"), NOISE_EVENTS)
    assert result.false_evictions == 2
    assert result.false_checkpoints == 2
    assert result.interruptions_by_cause == {"fault": 1, "own": 0, "false": 2}
    assert result.lost_work_by_cause_seconds["false"] > 0
    _adds_up(result)


def test_the_shipped_rules_take_no_healthy_node_out_for_noise() -> None:
    """The same noise under the packaged rules: no false eviction, no false checkpoint,
    and the job keeps what it keeps with no noise at all."""
    noisy = _sn_monitor((), NOISE_EVENTS)
    quiet = _sn_monitor((), ())
    assert noisy.false_evictions == 0
    assert noisy.false_checkpoints == 0
    assert noisy.interruptions_by_cause == {"fault": 1, "own": 0, "false": 0}
    assert noisy.ettr == pytest.approx(quiet.ettr, abs=1e-9)
    _adds_up(noisy)


def test_a_warning_s_checkpoint_is_not_false_and_the_baselines_count_faults() -> None:
    """A checkpoint on a warning of a fault to come is not a false one; a baseline's
    stops are all the trace's."""
    warned = Trace((Fault(time=1500.0, node="node-0002", kind="xid", category="gpu",
                          code=48, repair=86400.0,
                          warning=Warning(signal="row-remap-pending", lead=600.0)),),
                   3600.0, "warned")
    results = replay(warned, SETTINGS, ReplayOptions(policies=("kubernetes", "sn-monitor")))
    for result in results:
        assert result.false_checkpoints == 0, result.name
        assert result.interruptions_by_cause == {"fault": 1, "own": 0, "false": 0}
        _adds_up(result)


def test_noise_is_drawn_at_its_rates_on_the_job_s_slots_the_same_for_a_seed() -> None:
    slots = job_nodes(WorldSettings(nodes=100))
    days = 10.0
    drawn = draw_noise(NOISE, slots, days * 86400, seed=4)
    assert drawn == draw_noise(NOISE, slots, days * 86400, seed=4)
    assert list(drawn) == sorted(drawn, key=lambda n: (n.time, n.slot))
    assert {n.slot for n in drawn} <= set(slots)
    expected = sum(k.per_node_day for k in NOISE) * len(slots) * days
    assert expected / 2 < len(drawn) < expected * 2
    assert draw_noise((), slots, days * 86400, seed=4) == ()


def test_the_table_and_json_split_by_cause_and_print_each_noise_source() -> None:
    [result] = replay(TRACE, SETTINGS, ReplayOptions(policies=("kubernetes",)))
    text = table([result], TRACE, SETTINGS, None, NOISE)
    assert "fault / own / false" in text
    assert "1 / 0 / 0" in text
    for kind in NOISE:
        assert kind.line() in text
        assert kind.source
    assert "noise on healthy nodes: off" in table([result], TRACE, SETTINGS, None)
    doc = to_json([result], TRACE, SETTINGS, None, 0.0, NOISE)
    assert [k["signal"] for k in doc["noise"]] == [k.signal for k in NOISE]
    [policy] = doc["policies"]
    assert set(policy["interruptions_by_cause"]) == set(CAUSES)
    assert set(policy["lost_work_by_cause_seconds"]) == set(CAUSES)


def test_a_noise_line_says_the_published_rate_next_to_the_replayed_one() -> None:
    def kind(replayed: float, published: float | None) -> NoiseKind:
        return NoiseKind("ecc-corrected", replayed, published, 0.0, "an error", "a paper")

    assert kind(0.5, 0.5).line() == (
        "ecc-corrected: 0.5 per node and day, as published, an error (a paper)")
    assert kind(0.5, 40.0).line() == ("ecc-corrected: published 40 per node and day, "
                                      "replayed 0.5, an error (a paper)")
    assert kind(0.5, None).line() == ("ecc-corrected: 0.5 per node and day, assumed (no "
                                      "published rate), an error (a paper)")


def test_the_default_noise_stays_within_its_budget_and_never_above_its_source() -> None:
    assert sum(k.per_node_day for k in NOISE) <= NOISE_BUDGET
    for kind in NOISE:
        published = kind.published_per_node_day
        assert published is None or kind.per_node_day <= published, kind.signal
        assert ("no published rate" in kind.source) == (published is None), kind.signal
