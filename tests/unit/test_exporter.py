"""Exposition: snapshots in, metric families out; promtool's lint over the result."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sn_monitor.agent.exporter import AgentStatus, SnapshotCollector
from sn_monitor.agent.snapshot import (
    XidCount,
)
from tests.conftest import assert_promtool_clean
from tests.support.exporter import BARE_GPU, FULL_GPU, _snapshot


def _scrape(snapshot):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot))
    return generate_latest(registry).decode()


def _samples(text):
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _k(name, **labels):
    return (name, tuple(sorted(labels.items())))


def test_values_and_units():
    samples = _samples(_scrape(_snapshot()))
    g0 = {"gpu": "0", "uuid": "GPU-0"}
    assert samples[_k("sn_gpu_power_watts", **g0)] == 650.5
    assert samples[_k("sn_gpu_energy_joules_total", **g0)] == 12345.6
    assert samples[_k("sn_gpu_throttle_active", **g0, reason="sw_power_cap")] == 1.0
    assert samples[_k("sn_gpu_clock_hertz", **g0, clock="sm")] == 1.98e9
    assert samples[_k("sn_gpu_nvlink_up", **g0, link="1")] == 0.0
    assert samples[_k("sn_gpu_xid_errors_total", **g0, xid="79")] == 2.0
    assert samples[_k("sn_gpu_xid_errors_total", gpu="", uuid="", xid="13")] == 1
    assert samples[_k("sn_gpu_xid_errors_total", gpu="1", uuid="GPU-1", xid="79")] == 0
    # every code of a GPU in one counter, there at 0 before its first error
    assert samples[_k("sn_gpu_xid_errors_all_codes_total", **g0)] == 3
    assert samples[_k("sn_gpu_xid_errors_all_codes_total", gpu="1", uuid="GPU-1")] == 0
    assert samples[_k("sn_gpu_xid_errors_all_codes_total", gpu="", uuid="")] == 1
    assert samples[_k("sn_infiniband_port_received_bytes_total", device="mlx5_0", port="1")] == 400
    assert samples[_k("sn_agent_collector_success", collector="kmsg")] == 0.0
    assert samples[_k("sn_agent_collector_stuck", collector="kmsg")] == 0.0
    assert samples[_k("sn_agent_collector_stuck", collector="host")] == 1.0
    assert samples[_k("sn_agent_collector_success", collector="host")] == 0.0
    assert samples[_k("sn_agent_collector_duration_seconds", collector="host")] == 12.5
    assert samples[_k("sn_agent_last_sample_timestamp_seconds")] == 1_700_000_000.0
    assert samples[_k("sn_gpu_row_remap_pending", **g0)] == 0.0
    assert samples[_k("sn_agent_events_total", kind="xid")] == 3


def test_missing_values_are_left_out_not_nan():
    text = _scrape(_snapshot())
    g1 = (("gpu", "1"), ("uuid", "GPU-1"))
    samples = _samples(text)
    assert samples[("sn_gpu_temperature_celsius", g1)] == 40.0
    assert ("sn_gpu_power_watts", g1) not in samples
    assert not any(k[0] == "sn_gpu_nvlink_crc_errors_total" and ("link", "1") in k[1]
                   for k in samples)
    assert "NaN" not in text


def test_xid_counters_of_a_node_without_errors_are_there_at_zero():
    """Prometheus' increase() sees a counter's first error only if the counter was there
    before it: a node that never had an XID serves the totals (and the watched codes the
    sampler hands over) at 0."""
    quiet = tuple(XidCount(gpu=g.index, xid=79, count=0, uuid=g.uuid)
                  for g in (FULL_GPU, BARE_GPU))
    samples = _samples(_scrape(_snapshot(xid_counts=quiet)))
    xids = {k: v for k, v in samples.items() if k[0].startswith("sn_gpu_xid_errors")}
    assert xids == {
        _k("sn_gpu_xid_errors_total", gpu="0", uuid="GPU-0", xid="79"): 0,
        _k("sn_gpu_xid_errors_total", gpu="1", uuid="GPU-1", xid="79"): 0,
        _k("sn_gpu_xid_errors_all_codes_total", gpu="0", uuid="GPU-0"): 0,
        _k("sn_gpu_xid_errors_all_codes_total", gpu="1", uuid="GPU-1"): 0,
        _k("sn_gpu_xid_errors_all_codes_total", gpu="", uuid=""): 0,
    }


def test_no_hostname_label_anywhere():
    samples = _samples(_scrape(_snapshot()))
    assert not any(name in ("node", "hostname", "instance") for _, labels in samples
                   for name, _ in labels)


def test_before_the_first_sample_only_the_info_is_served():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: None))
    text = generate_latest(registry).decode()
    assert "sn_agent_info" in text
    assert "sn_gpu" not in text


def test_promtool_lint_has_no_warnings():
    assert_promtool_clean(_scrape(_snapshot()))


def test_which_controller_is_in_use():
    status = AgentStatus(controller_configured=True, reports_total=9,
                         controllers=("https://ctl-a:9848", "https://ctl-b:9848"),
                         controller_in_use="https://ctl-b:9848", controller_switches_total=1,
                         report_stream=True)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(_snapshot, lambda: status))
    text = generate_latest(registry).decode()
    samples = _samples(text)
    assert samples[_k("sn_agent_controller_in_use", url="https://ctl-a:9848")] == 0.0
    assert samples[_k("sn_agent_controller_in_use", url="https://ctl-b:9848")] == 1.0
    assert samples[_k("sn_agent_controller_switches_total")] == 1.0
    assert samples[_k("sn_agent_report_stream")] == 1.0
    assert_promtool_clean(text)
    without = CollectorRegistry(auto_describe=False)
    without.register(SnapshotCollector(_snapshot, AgentStatus))
    assert "sn_agent_controller" not in generate_latest(without).decode()
