"""The ingest fast paths find what the straightforward paths find.

- The threshold screen (:class:`~sn_monitor.rules.threshold.ThresholdScreen`)
  passes over plain threshold rules that a report leaves untouched: an engine with it and
  one without (``screen=False``, every rule reads every report) give the same findings,
  in the same order, on any sequence of reports, sweeps and reloads.
- Counter names: ``Report`` leaves their bound out of its type (msgspec shares dict keys
  only for plain ``str`` keys) and ``decode_report`` checks it after decoding; whatever
  the body, it answers as one decode of the whole contract (the strict twin) does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sn_monitor.clock import ManualClock
from sn_monitor.config import parse_yaml
from sn_monitor.controller.api.statuses import status_of
from sn_monitor.controller.errors import ControllerError
from sn_monitor.controller.ingest import decode as ingest
from sn_monitor.controller.ingest.decode import decode_report
from sn_monitor.model import MAX_COUNTER_NAME, GpuReport, IbPortReport, NetReport, Report
from sn_monitor.rules.engine import RuleEngine
from sn_monitor.rules.spec import load_rules, parse_rules
from sn_monitor.rules.view import NodeView
from tests.fuzzing import examples

ROOT = Path(__file__).resolve().parents[2]

#: Beside the default rules: labels, scope, a bound too big for the screen, every
#: derived metric, both directions, other families, holds.
EXTRA = """
- name: hot-gpu0
  metric: gpu_temperature_celsius
  labels: {gpu: "0|1"}
  above: 60
  clear_below: 55
- name: hot-in-rack-a
  metric: gpu_temperature_celsius
  scope: {rack: a}
  above: 70
  for: 3s
- name: huge-bound
  metric: gpu_memory_used_bytes
  above: 10000000000000000
- name: memory-full
  metric: gpu_memory_used_ratio
  above: 0.9
  clear_below: 0.8
- name: power-near-limit
  metric: gpu_power_limit_ratio
  above: 0.95
  for: 2s
- name: slowdown-near
  metric: gpu_slowdown_margin_celsius
  below: 3
  clear_above: 6
- name: cold
  metric: gpu_temperature_celsius
  below: 10
- name: carrier-down
  metric: network_carrier_up
  below: 0
- name: link-downed
  metric: infiniband_port_link_downed
  above: 2
- name: ib-state-high
  metric: infiniband_port_state
  above: 5
"""

temperature = st.sampled_from([None, 5.0, 9.0, 10.0, 40.0, 59.0, 60.0, 70.0, 84.0, 85.0,
                               86.0, 88.0, 90.0, 95.0, 1e18, -1e18])
limit = st.sampled_from([None, 0.0, 89.0, 92.0, 95.0, 100.0])
small = st.sampled_from([None, 0, 1, 2, 3, 16])
gpus = st.builds(
    GpuReport,
    index=st.integers(min_value=0, max_value=3),
    lost=st.sampled_from([False, False, False, True]),
    temperature_celsius=temperature,
    memory_temperature_celsius=temperature,
    memory_max_temperature_celsius=limit,
    shutdown_temperature_celsius=limit,
    slowdown_temperature_celsius=limit,
    memory_used_bytes=st.sampled_from([None, 0, 70, 95, 2**60]),
    memory_total_bytes=st.sampled_from([None, 0, 100]),
    power_watts=st.sampled_from([None, 0.0, 500.0, 690.0, 700.0]),
    power_limit_watts=st.sampled_from([None, 0.0, 700.0]),
    row_remap_pending=st.sampled_from([None, False, True]),
    row_remap_failed=st.sampled_from([None, False, True]),
    nvlinks_down=small,
    pcie_link_width=small,
    pcie_link_width_max=st.sampled_from([None, 0, 16]),
    pcie_link_generation=small,
    pcie_link_generation_max=st.sampled_from([None, 0, 5]),
    ecc_uncorrected_errors_total=st.sampled_from([None, 0, 1, 3]),
)
ports = st.builds(
    IbPortReport,
    device=st.sampled_from(["mlx5_0", "mlx5_1"]),
    port=st.just(1),
    state=st.sampled_from([None, 1, 3, 4, 6]),
    counters=st.dictionaries(st.sampled_from(["symbol_errors", "link_downed"]),
                             st.integers(min_value=0, max_value=5), max_size=2),
)
nets = st.builds(NetReport, device=st.sampled_from(["eth0", "ib0"]),
                 carrier_up=st.none() | st.booleans())
step = st.tuples(
    st.sampled_from(["n1", "n2"]),
    st.sampled_from(["a", "b"]),  # the rack
    st.lists(gpus, max_size=4, unique_by=lambda g: g.index),
    st.lists(ports, max_size=2, unique_by=lambda p: p.device),
    st.lists(nets, max_size=2, unique_by=lambda n: n.device),
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 5.0, 20.0]),
    st.sampled_from(["report", "report", "report", "sweep", "reload"]),
)


def _rules(extra: bool = True) -> list[Any]:
    rules = load_rules([ROOT / "sn_monitor" / "rules"])
    return rules + parse_rules(parse_yaml(EXTRA, "extra.yaml")) if extra else rules


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=30))
def test_the_screen_changes_nothing(sequence: list[Any]) -> None:
    clock = ManualClock()
    fast, plain = (RuleEngine(_rules(), clock), RuleEngine(_rules(), clock, screen=False))
    views: dict[str, dict[str, NodeView]] = {"fast": {}, "plain": {}}
    for number, (node, rack, g, ib, net, wait, what) in enumerate(sequence):
        if what == "reload":  # the screen is rebuilt over the rules kept
            rules = _rules(extra=number % 2 == 0)
            assert fast.reload(rules) == plain.reload(rules)
            continue
        if what == "sweep":
            assert fast.sweep(views["fast"]) == plain.sweep(views["plain"])
            clock.advance(wait)
            continue
        labels = {"rack": rack}
        report = Report(node=node, instance="i", sequence=number,
                        sample_time_seconds=clock.time(), labels=labels,
                        gpus=g, infiniband=ib, network=net)
        report = msgspec.json.decode(msgspec.json.encode(report), type=Report)
        found = []
        for engine, name in ((fast, "fast"), (plain, "plain")):
            view = views[name].setdefault(node, NodeView(name=node))
            view.labels = labels
            view.report = report
            view.received_monotonic, view.received_wall = clock.monotonic(), clock.time()
            found.append(engine.observe(view))
        assert found[0] == found[1]
        clock.advance(wait)
    assert fast.firing() == plain.firing()


def test_the_screen_takes_the_plain_thresholds_only() -> None:
    engine = RuleEngine(_rules(), ManualClock())
    screen = engine._screen
    assert screen is not None
    names = {m.rule.name for m in screen.members}
    assert {"gpu-overheat", "gpu-near-shutdown", "pcie-width-degraded", "ib-port-down",
            "hot-gpu0", "carrier-down"} <= names
    # rates, increases, a bound beyond the exact floats, other kinds: judged on their own
    assert not names & {"ecc-uncorrectable", "nvlink-crc-rate", "huge-bound",
                        "gpu-temperature-anomaly", "fatal-xid"}
    assert RuleEngine(_rules(), ManualClock(), screen=False)._screen is None


def test_a_screened_rule_fires_holds_and_resolves() -> None:
    clock = ManualClock()
    engine = RuleEngine(_rules(extra=False), clock)
    view = NodeView(name="n1")

    def report(temperature: float) -> list[str]:
        view.report = Report(node="n1", instance="i", sequence=1,
                             sample_time_seconds=clock.time(),
                             gpus=[GpuReport(index=0, temperature_celsius=temperature,
                                             shutdown_temperature_celsius=92.0)])
        return [f"{f.rule} {f.status}" for f in engine.observe(view)]

    assert report(70.0) == []
    assert report(86.0) == []  # gpu-overheat pending (for: 5s)
    clock.advance(5.0)
    assert report(86.0) == ["gpu-overheat firing"]
    assert report(82.0) == []  # still above clear_below: the rule looks itself
    assert report(89.0) == ["gpu-near-shutdown firing"]
    assert report(79.0) == ["gpu-overheat resolved", "gpu-near-shutdown resolved"]


# --------------------------------------------------------------------------- counter names


def _strip(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip(v) for k, v in schema.items() if k not in ("description", "title")}
    if isinstance(schema, list):
        return [_strip(v) for v in schema]
    return schema


def test_the_schema_still_bounds_counter_names() -> None:
    """The OpenAPI schema (from Report) is the strict twin's: the bound is in both."""
    strict = msgspec.json.schema(ingest._strict_twin())
    assert _strip(msgspec.json.schema(Report)) == _strip(strict)
    counters = msgspec.json.schema(Report)["$defs"]["IbPortReport"]["properties"]["counters"]
    assert counters["propertyNames"] == {"maxLength": MAX_COUNTER_NAME}


def _body(counters: dict[str, Any], after: Any = None, truncate: int = 0) -> bytes:
    doc: dict[str, Any] = {"node": "n1", "instance": "i", "sequence": 1,
                           "sample_time_seconds": 1.0,
                           "infiniband": [{"device": "mlx5_0", "port": 1, "counters": counters}]}
    if after is not None:
        doc["network"] = [{"device": after}]
    body = json.dumps(doc).encode()
    return body[:len(body) - truncate] if truncate else body


LONG = "x" * (MAX_COUNTER_NAME + 1)
EXACT = "y" * MAX_COUNTER_NAME


@pytest.mark.parametrize(("body", "status", "message"), [
    (_body({LONG: 1}), 422,
     "Expected `str` of length <= 64 - at `key` in `$.infiniband[0].counters`"),
    (_body({"a": 1, LONG: 1}, after=7), 422, "at `key` in `$.infiniband[0].counters`"),
    (_body({LONG: -1}), 422, "at `key` in `$.infiniband[0].counters`"),
    (_body({"a": -1, LONG: 1}), 422, "Expected `int` >= 0"),
    (_body({LONG: 1}, truncate=3), 422, "at `key` in `$.infiniband[0].counters`"),
    (_body({EXACT: 1}, after=7), 422, "at `$.network[0].device`"),
])
def test_a_counter_name_too_long_is_refused_where_it_stands(body: bytes, status: int,
                                                            message: str) -> None:
    with pytest.raises(ControllerError) as err:
        decode_report(body)
    assert (status_of(err.value), message in err.value.message) == (status, True), err.value.message


def test_a_counter_name_at_the_bound_is_taken() -> None:
    report = decode_report(_body({EXACT: 1, "symbol_errors": 0}))
    assert report.infiniband[0].counters == {EXACT: 1, "symbol_errors": 0}


def _strict_answer(body: bytes) -> tuple[int, str] | Report:
    """What a decode of the whole contract in one go answers (the previous decoder)."""
    try:
        strict = ingest._strict_decoder.decode(body)
    except msgspec.ValidationError as err:
        return 422, f"invalid report: {err}"
    except msgspec.DecodeError as err:
        return 400, f"malformed JSON: {err}"
    return msgspec.convert(msgspec.to_builtins(strict), Report)


names = st.sampled_from(["symbol_errors", "link_downed", EXACT, LONG, "z" * 200, ""])
values = st.sampled_from([0, 1, -1, 2**63, "x", None])


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.dictionaries(names, values, max_size=4), max_size=3),
       st.sampled_from([None, "eth0", 7, LONG * 2]), st.integers(min_value=0, max_value=40))
def test_decode_answers_as_the_strict_decoder(ports_: list[dict[str, Any]], net: Any,
                                              truncate: int) -> None:
    doc: dict[str, Any] = {"node": "n1", "instance": "i", "sequence": 1,
                           "sample_time_seconds": 1.0,
                           "infiniband": [{"device": f"mlx5_{i}", "port": 1, "counters": c}
                                          for i, c in enumerate(ports_)]}
    if net is not None:
        doc["network"] = [{"device": net}]
    body = json.dumps(doc).encode()
    body = body[:len(body) - truncate] if truncate else body
    expected = _strict_answer(body)
    try:
        got: tuple[int, str] | Report = decode_report(body)
    except ControllerError as err:
        got = (status_of(err), err.message)
    if isinstance(expected, tuple) and expected[0] == 400 and not body.strip():
        pytest.skip("empty body: its own message")
    assert got == expected
