"""Rule files: the shipped defaults load, and every bad file names file, key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sn_monitor.config import ConfigError, parse_yaml
from sn_monitor.model import GpuReport, IbPortReport, NetReport, Report
from sn_monitor.rules.series import compile_accessor, series_of
from sn_monitor.rules.spec import (
    BaselineRule,
    EventRule,
    HeartbeatRule,
    PeersRule,
    ThresholdRule,
    load_rule_set,
    load_rules,
    packaged_rules,
    parse_rules,
)
from sn_monitor.rules.xid_catalog import load_catalog
from tests.conftest import expected_messages

ROOT = Path(__file__).resolve().parents[2]
BAD = ROOT / "tests" / "fixtures" / "rules" / "bad"
DEFAULT = ROOT / "sn_monitor" / "rules" / "default.yaml"


def _expected() -> list[tuple[str, str]]:
    return expected_messages(BAD)


def test_every_bad_rule_file_has_an_expectation():
    listed = {name for name, _ in _expected()}
    assert listed == {p.name for p in BAD.glob("*.yaml")}


@pytest.mark.parametrize(("name", "message"), _expected())
def test_bad_rule_file_names_file_key_and_line(name, message):
    path = BAD / name
    with pytest.raises(ConfigError) as caught:
        load_rules([path])
    assert str(caught.value) == f"{path}{message}"


def test_default_rules_load_and_cover_every_kind():
    rules = load_rules([DEFAULT])
    names = {r.name for r in rules}
    assert {"gpu-overheat", "fatal-xid", "node-lost", "straggler", "gpu-temperature-anomaly",
            "ecc-uncorrectable", "ib-port-down", "pending-row-remap"} <= names
    kinds = {type(r) for r in rules}
    assert kinds == {ThresholdRule, BaselineRule, PeersRule, EventRule, HeartbeatRule}
    overheat = next(r for r in rules if r.name == "gpu-overheat")
    assert isinstance(overheat, ThresholdRule)
    assert (overheat.above, overheat.hold, overheat.clear_below) == (85.0, 5.0, 80.0)
    assert overheat.actions == ["throttle", "alert"]
    assert overheat.severity == "critical"
    fatal = next(r for r in rules if r.name == "fatal-xid")
    assert isinstance(fatal, EventRule)
    fatal_codes = load_catalog().codes(fatal.resolutions)
    assert {48, 64, 74, 79, 95, 119, 120, 140} <= fatal_codes  # NVIDIA: reset or reboot
    assert not {13, 31, 43, 45, 94} & fatal_codes  # the application's, or nothing
    assert all(r.description for r in rules)


def test_default_rules_end_with_the_collector_stuck_alert():
    rules = load_rules([DEFAULT])
    stuck = rules[-1]
    assert isinstance(stuck, EventRule)
    assert (stuck.name, stuck.event, stuck.severity, stuck.actions) == (
        "collector-stuck", "collector_stuck", "critical", ["alert"])


def test_an_unknown_event_kind_lists_collector_stuck(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("- name: x\n  event: collector_hung\n")
    with pytest.raises(ConfigError, match="collector_stuck"):
        load_rules([path])


def test_a_directory_loads_every_yaml_sorted(tmp_path):
    (tmp_path / "b.yaml").write_text("- name: b\n  heartbeat_timeout: 10s\n")
    (tmp_path / "a.yaml").write_text("- name: a\n  event: xid\n")
    (tmp_path / "notes.txt").write_text("not rules")
    assert [r.name for r in load_rules([tmp_path])] == ["a", "b"]


def test_duplicate_across_files_names_the_first_file(tmp_path):
    first = tmp_path / "a.yaml"
    first.write_text("- name: x\n  event: xid\n")
    second = tmp_path / "b.yaml"
    second.write_text("- name: y\n  event: sxid\n- name: x\n  heartbeat_timeout: 5s\n")
    with pytest.raises(ConfigError) as caught:
        load_rules([tmp_path])
    assert str(caught.value) == (
        f"{second}:3: rules[1].name: duplicate rule name 'x' (first defined at {first}:1)"
    )


def test_empty_file_has_no_rules():
    assert parse_rules(parse_yaml("# nothing yet\n", "r.yaml")) == []


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: rules path does not exist"):
        load_rules([tmp_path / "nope.yaml"])


def test_a_directory_without_rule_files_says_what_it_holds(tmp_path):
    # a typo, an emptied directory or the old rules/ path must not load as "no rules"
    with pytest.raises(ConfigError) as caught:
        load_rules([tmp_path])
    assert str(caught.value) == f"{tmp_path}: no rule files (*.yaml) in this directory: it is empty"
    for name in ("notes.txt", "gpu.yml", "old.json"):
        (tmp_path / name).write_text("- name: x\n  event: xid\n")
    with pytest.raises(ConfigError) as caught:
        load_rules([tmp_path])
    assert str(caught.value) == (
        f"{tmp_path}: no rule files (*.yaml) in this directory: found 3 other files "
        "(gpu.yml, notes.txt, old.json); rule files must end in .yaml")


def test_a_directory_holding_only_an_xid_catalogue_has_no_rule_files(tmp_path):
    (tmp_path / "xid_catalog.yaml").write_text(
        (packaged_rules() / "xid_catalog.yaml").read_text())
    with pytest.raises(ConfigError, match="no rule files .* found 1 other file "
                                          r"\(xid_catalog.yaml\)$"):
        load_rules([tmp_path])


def test_a_rule_set_counts_the_rules_of_each_source(tmp_path):
    (tmp_path / "a.yaml").write_text("- name: a\n  event: xid\n- name: b\n  event: sxid\n")
    (tmp_path / "none.yaml").write_text("[]\n")
    loaded = load_rule_set([tmp_path, packaged_rules()])
    packaged = len(load_rules([packaged_rules()]))
    assert packaged > 0
    assert loaded.sources == {str(tmp_path): 2, "packaged": packaged}
    assert len(loaded.rules) == 2 + packaged


def test_kinds_parse_their_keys():
    doc = parse_yaml(
        """
- name: crc
  metric: gpu_nvlink_crc_errors_total
  rate: {window: 1m}
  above: 10
  labels: {gpu: "[0-3]"}
- name: anomaly
  metric: gpu_power_watts
  baseline: {window: 30m, sigmas: 4, min_delta: 5, warmup: 10m, direction: both}
- name: slow
  metric: gpu_utilization_ratio
  peers: {group: job, below_median_by: 0.3}
  for: 2m
  dry_run: true
  scope: {supernode: "sn[0-9]+"}
- name: flapping
  event: link_down
  count: 3
  window: 10m
  clear_after: 1h
""",
        "r.yaml",
    )
    crc, anomaly, slow, flapping = parse_rules(doc)
    assert isinstance(crc, ThresholdRule)
    assert crc.rate is not None
    assert crc.rate.window == 60
    assert isinstance(anomaly, BaselineRule)
    assert anomaly.warmup == 600
    assert anomaly.direction == "both"
    assert isinstance(slow, PeersRule)
    assert slow.dry_run
    assert slow.hold == 120
    assert slow.peers.min_group == 4
    assert isinstance(flapping, EventRule)
    assert flapping.clear_after == 3600


def test_temperature_baselines_default_to_upwards():
    (rule,) = parse_rules(parse_yaml(
        "- name: t\n  metric: gpu_temperature_celsius\n  baseline: {window: 30m}\n", "r.yaml"))
    assert isinstance(rule, BaselineRule)
    assert rule.direction == "above"
    assert rule.warmup == 600  # a third of the window


def _report() -> Report:
    return Report(
        node="n1", instance="i", sequence=1, sample_time_seconds=100.0,
        gpus=[
            GpuReport(index=0, temperature_celsius=60.0, row_remap_pending=True,
                      pcie_link_width=8, pcie_link_width_max=16,
                      shutdown_temperature_celsius=92.0),
            GpuReport(index=1, lost=True, temperature_celsius=99.0),
            GpuReport(index=2, temperature_celsius=None),
        ],
        infiniband=[
            IbPortReport(device="mlx5_0", port=1, state=4, counters={"symbol_errors": 3}),
            IbPortReport(device="eth_roce", port=1, state=1),
        ],
        network=[NetReport(device="eth0", carrier_changes_total=2)],
    )


def test_series_skip_lost_gpus_and_missing_values():
    values = [(s.text, v) for s, v in series_of(_report(), "gpu_temperature_celsius")]
    assert values == [("gpu=0", 60.0)]


def test_series_of_each_family():
    report = _report()
    assert [(s.text, v) for s, v in series_of(report, "gpu_row_remap_pending")] == [
        ("gpu=0", 1.0)]
    assert [(s.text, v) for s, v in series_of(report, "gpu_pcie_link_width_ratio")] == [
        ("gpu=0", 0.5)]
    assert [(s.text, v) for s, v in series_of(report, "gpu_shutdown_margin_celsius")] == [
        ("gpu=0", 32.0)]
    assert [(s.text, v) for s, v in series_of(report, "infiniband_port_state")] == [
        ("device=mlx5_0,port=1", 4.0), ("device=eth_roce,port=1", 1.0)]
    assert [(s.text, v) for s, v in series_of(report, "infiniband_port_symbol_errors")] == [
        ("device=mlx5_0,port=1", 3.0)]
    assert series_of(report, "infiniband_port_symbol_errors_total") == series_of(
        report, "infiniband_port_symbol_errors")
    assert [(s.text, v) for s, v in series_of(report, "network_carrier_changes_total")] == [
        ("device=eth0", 2.0)]
    (gpu0, _), = series_of(report, "gpu_temperature_celsius")
    assert (gpu0.gpu, gpu0.human) == (0, "GPU 0")


def test_label_matches_are_full_regex_matches():
    read = compile_accessor("infiniband_port_state", {"device": "mlx5_.*"})
    assert [s.text for s, _ in read(_report())] == ["device=mlx5_0,port=1"]
    read = compile_accessor("infiniband_port_state", {"device": "mlx5"})
    assert read(_report()) == []


def test_unknown_metrics_are_refused():
    for metric in ("gpu_index", "gpu_uuid", "gpu_throttle_reasons", "cpu_load", "network_device"):
        with pytest.raises(ValueError, match="unknown metric"):
            compile_accessor(metric)
