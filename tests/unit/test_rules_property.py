"""Whatever a valid report holds, the rules never raise and never repeat a transition."""

from __future__ import annotations

from pathlib import Path

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sn_monitor.clock import ManualClock
from sn_monitor.config import parse_yaml
from sn_monitor.controller.rules.engine import RuleEngine
from sn_monitor.controller.rules.spec import load_rules, parse_rules
from sn_monitor.controller.state import NodeView
from sn_monitor.model import EventRecord, GpuReport, IbPortReport, NetReport, Report

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
                          "guard"]),
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
    rules = load_rules([ROOT / "rules"]) + parse_rules(parse_yaml(EXTRA, "extra.yaml"))
    return RuleEngine(rules, clock)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
