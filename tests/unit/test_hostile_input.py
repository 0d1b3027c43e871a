"""Hostile and broken input: reports, agent clocks, agent identities, request bodies.

Each case gets a clear 4xx naming what is wrong, or a documented accept (see
sn_monitor/controller/ingest/decode.py and docs/controller/hostile-input.md); never a 5xx,
never a crash, never an action. The decoder is also driven by Hypothesis: arbitrary
bytes, arbitrary JSON values and mutations of a valid report never raise anything but
ControllerError, and what it accepts is within the wire's bounds. Budgets: tests/fuzzing.py.
"""

from __future__ import annotations

import copy
import faulthandler
import json
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.body_shape_bench import SHAPES
from sn_monitor.controller.api.bodies import MAX_DEPTH, BodyRefused, check_shape
from sn_monitor.controller.api.statuses import status_of
from sn_monitor.controller.errors import ControllerError
from sn_monitor.controller.ingest.decode import (
    MAX_EVENT_AGE_SECONDS,
    controller_times,
    decode_report,
)
from sn_monitor.controller.security.auth import OPEN_ACCESS, Identity
from sn_monitor.model import (
    INT64_MAX,
    MAX_EVENTS,
    MAX_GPUS,
    MAX_LABELS,
    MAX_PORTS,
    MAX_WORKLOADS,
    MEASURE_MAX,
    CommandResult,
    EventRecord,
    GpuReport,
    GpuWorkloadReport,
    IbPortReport,
    NetReport,
    Report,
)
from tests.conftest import ROOT
from tests.fuzzing import examples
from tests.support.api import AGENT, OPERATE, READ, Api, bearer
from tests.support.harness import T0, Harness, make_harness, rules_from

# --------------------------------------------------------------------------- a valid report


def valid_doc(node: str = "gpu-1", sequence: int = 1, sample_time: float = T0) -> dict[str, Any]:
    """A report with every kind of field filled in."""
    return {
        "node": node, "instance": "i-1", "sequence": sequence,
        "sample_time_seconds": sample_time, "agent_version": "0.1.0",
        "interval_seconds": 1.0, "metrics_port": 9847,
        "labels": {"supernode": "sn0", "rack": "r1"},
        "gpus": [{"index": 0, "uuid": "GPU-0", "temperature_celsius": 50.0,
                  "power_watts": 300.0, "utilization_ratio": 0.5,
                  "ecc_uncorrected_errors_total": 0, "pcie_link_width": 16,
                  "pcie_link_width_max": 16, "throttle_reasons": ["sw_power_cap"],
                  "row_remap_pending": False, "energy_joules_total": 1.5e6,
                  "workloads": [{"pod": "train-0", "namespace": "ml", "container": "main"}]}],
        "infiniband": [{"device": "mlx5_0", "port": 1, "state": 4,
                        "counters": {"symbol_errors": 0}}],
        "network": [{"device": "eth0", "carrier_up": True, "carrier_changes_total": 1}],
        "events": [{"id": 1, "kind": "xid", "source": "kmsg", "time_seconds": sample_time,
                    "message": "Xid 13", "gpu": 0, "code": 13}],
        "command_results": [{"id": "c1", "ok": True, "time_seconds": sample_time}],
    }


def encode(doc: Any) -> bytes:
    return json.dumps(doc).encode()  # Python's encoder: ints of any size, as a peer may send


# --------------------------------------------------------------------------- decoder properties

json_scalars = (st.none() | st.booleans()
                | st.integers(min_value=-(2**80), max_value=2**80)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20)
EXTREMES: list[Any] = [0, -1, INT64_MAX, INT64_MAX + 1, 2**64, -(2**63) - 1, 10**400,
                       1e308, -1e308, MEASURE_MAX, 1e19, 5e-324, "", "x" * 5000, [], {},
                       None, True, [[[[[[]]]]]], {"a": {"b": {"c": {}}}}]
PROPERTY = settings(max_examples=examples(150), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _places(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) in ``doc``: where a mutation can go."""
    out: list[tuple[Any, Any]] = []
    stack = [doc]
    while stack:
        node = stack.pop()
        keys = list(node) if isinstance(node, dict) else (
            range(len(node)) if isinstance(node, list) else [])
        for key in keys:
            out.append((node, key))
            stack.append(node[key])
    return out


@st.composite
def mutated_reports(draw: st.DrawFn) -> bytes:
    """A valid report with one to three values replaced, removed, or added."""
    doc = valid_doc()
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        places = _places(doc)
        container, key = draw(st.sampled_from(places))
        how = draw(st.sampled_from(["value", "extreme", "remove", "add"]))
        # Copies: a later step may mutate what an earlier one put in, and a drawn value
        # (EXTREMES' lists, a value hypothesis replays) must stay as drawn, or data
        # generation depends on the previous example (hypothesis's FlakyStrategyDefinition).
        if how == "value":
            container[key] = copy.deepcopy(draw(json_values))
        elif how == "extreme":
            container[key] = copy.deepcopy(draw(st.sampled_from(EXTREMES)))
        elif how == "remove":
            del container[key]
        elif isinstance(container, dict):
            container[draw(st.text(max_size=8))] = copy.deepcopy(draw(json_values))
        else:
            container.append(copy.deepcopy(draw(json_values)))
    body = encode(doc)
    # and, sometimes, what only a non-Python encoder writes
    literal = draw(st.sampled_from([None, b"NaN", b"Infinity", b"-Infinity", b"1e999"]))
    if literal is not None:
        body = body.replace(b"50.0", literal, 1)
    return body


def assert_within_the_wire(report: Report) -> None:
    """What the decoder lets through: bounded numbers, bounded lists, a round trip."""
    for value in _numbers(msgspec.to_builtins(report)):
        if isinstance(value, int) and not isinstance(value, bool):
            assert -(2**63) <= value <= INT64_MAX, value
        elif isinstance(value, float):
            assert math.isfinite(value), value
    for gpu in report.gpus:
        for name in ("temperature_celsius", "power_watts", "sm_clock_hertz"):
            value = getattr(gpu, name)
            assert value is None or abs(value) <= MEASURE_MAX
    assert len(report.gpus) <= MAX_GPUS
    assert len(report.events) <= MAX_EVENTS
    assert len(report.labels) <= MAX_LABELS
    assert len(report.infiniband) <= MAX_PORTS
    assert len({g.index for g in report.gpus}) == len(report.gpus)
    assert decode_report(msgspec.json.encode(report)) == report


def _numbers(doc: Any) -> Iterator[Any]:
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, int | float):
            yield node


def decodes_or_refuses(body: bytes) -> Report | None:
    """The report ``body`` holds, within the wire's bounds; None if refused (400 or 422)."""
    refused: ControllerError | None = None
    try:
        report = decode_report(body)
    except ControllerError as err:
        refused = err
    if refused is not None:
        assert status_of(refused) in (400, 422)
        assert refused.message.startswith(("invalid report: ", "malformed JSON: "))
        return None
    assert_within_the_wire(report)
    return report


@PROPERTY
@given(st.binary(max_size=300))
def test_decoding_any_bytes_raises_only_report_rejected(body: bytes) -> None:
    decodes_or_refuses(body)


@PROPERTY
@given(json_values)
def test_decoding_any_json_value_raises_only_report_rejected(value: Any) -> None:
    assert decodes_or_refuses(encode(value)) is None  # never a report: node etc. missing


@PROPERTY
@given(mutated_reports())
def test_decoding_a_mutated_report_raises_only_report_rejected(body: bytes) -> None:
    decodes_or_refuses(body)


@PROPERTY
@given(st.data())
def test_decoding_a_damaged_report_raises_only_report_rejected(data: st.DataObject) -> None:
    body = bytearray(encode(valid_doc()))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        at = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
        how = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        if how == "flip":
            body[at] = data.draw(st.integers(min_value=0, max_value=255))
        elif how == "cut":
            del body[at:]
            if not body:
                break
        elif how == "insert":
            body[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del body[at]
            if not body:
                break
    decodes_or_refuses(bytes(body))


def test_the_valid_report_is_valid() -> None:
    report = decode_report(encode(valid_doc()))
    assert_within_the_wire(report)
    assert report.gpus[0].temperature_celsius == 50.0


# --------------------------------------------------------------------------- through the controller

ACTING = """
- name: hot
  metric: gpu_temperature_celsius
  above: 85
  severity: critical
  actions: [throttle, alert]
- name: any-xid
  event: xid
  severity: critical
  actions: [alert, evict]
"""


def _quiet(tmp: Path) -> Harness:
    return make_harness(tmp, rules_from(ACTING), fake=("alert", "evict", "failover"))


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(mutated_reports(), st.just(encode(valid_doc()))), max_size=6))
def test_a_refused_report_changes_nothing_and_nothing_else_escapes(bodies: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        h = _quiet(Path(tmp))
        try:
            for body in bodies:
                before = (h.controller.list_nodes(), h.controller.list_incidents(None, None, 100),
                          h.store.count_events())
                refused: ControllerError | None = None
                try:
                    h.controller.ingest(body, OPEN_ACCESS, None)
                except ControllerError as err:
                    refused = err
                if refused is not None:
                    assert 400 <= status_of(refused) < 500
                    after = (h.controller.list_nodes(),
                             h.controller.list_incidents(None, None, 100),
                             h.store.count_events())
                    assert after == before
            h.settle()
        finally:
            h.controller.close()
            h.store.close()


# --------------------------------------------------------------------------- refused, by table


def _nothing_happened(api: Api) -> None:
    h = api.h
    assert h.controller.get_node("gpu-1") is None
    assert h.controller.list_incidents(None, None, 10) == []
    assert h.controller.list_actions(None, None, 10) == []
    assert h.store.count_events() == 0


def _with(path: list[Any], value: Any) -> bytes:
    doc = valid_doc()
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return encode(doc)


DEEP = b"[" * 100_000 + b"]" * 100_000
REFUSED = [
    ("empty", b"", 400, "the body is empty"),
    ("blank", b" \r\n\t", 400, "the body is empty"),
    ("top-level array", b"[]", 422, "Expected `object`, got `array`"),
    ("array of reports", b"[" + encode(valid_doc()) + b"]", 422, "got `array`"),
    ("null", b"null", 422, "Expected `object`, got `null`"),
    ("string", b'"gpu-1"', 422, "got `str`"),
    ("number", b"42", 422, "got `int`"),
    ("not UTF-8", encode(valid_doc()).replace(b"gpu-1", b"gpu-\xff"), 400,
     "Invalid UTF-8"),
    ("deeply nested", DEEP, 422, "Expected `object`, got `array`"),
    ("deeply nested label", encode(valid_doc()).replace(b'"sn0"', DEEP[:2000] + DEEP[-2000:]),
     422, "$.labels[...]"),
    ("deeply nested unknown field", encode(valid_doc())[:-1] + b',"junk":' + DEEP[:4000]
     + DEEP[-4000:] + b"}", 422, "unknown field `junk`"),
    ("NaN", encode(valid_doc()).replace(b"50.0", b"NaN"), 400, "malformed JSON"),
    ("Infinity", encode(valid_doc()).replace(b"50.0", b"Infinity"), 400, "malformed JSON"),
    ("1e999", encode(valid_doc()).replace(b"50.0", b"1e999"), 422,
     "Number out of range - at `$.gpus[0].temperature_celsius`"),
    ("sample time 1e999", _with(["sample_time_seconds"], 0).replace(
        b'"sample_time_seconds": 0', b'"sample_time_seconds": 1e999'), 422,
     "$.sample_time_seconds"),
    ("negative counter", _with(["gpus", 0, "ecc_uncorrected_errors_total"], -1), 422,
     "Expected `int` >= 0 - at `$.gpus[0].ecc_uncorrected_errors_total`"),
    ("counter over 64 bits", _with(["network", 0, "carrier_changes_total"], 2**64), 422,
     "<= 9223372036854775807 - at `$.network[0].carrier_changes_total`"),
    ("IB counter of 400 digits", _with(["infiniband", 0, "counters", "symbol_errors"],
                                       10**400), 422, "$.infiniband[0].counters[...]"),
    ("sequence over 64 bits", _with(["sequence"], 2**70), 422, "$.sequence"),
    ("event id over 63 bits", _with(["events", 0, "id"], 2**63), 422, "$.events[0].id"),
    ("XID code over 63 bits", _with(["events", 0, "code"], -(2**63) - 1), 422,
     "$.events[0].code"),
    ("port state over 64 bits", _with(["infiniband", 0, "state"], 2**64), 422,
     "$.infiniband[0].state"),
    ("measure over 1e18", _with(["gpus", 0, "power_watts"], 1e19), 422,
     "Expected `float` <= 1e+18 - at `$.gpus[0].power_watts`"),
    ("ratio over 1", _with(["gpus", 0, "utilization_ratio"], 1.5), 422,
     "$.gpus[0].utilization_ratio"),
    ("GPU listed twice", _with(["gpus"], [{"index": 3}, {"index": 3}]), 422,
     "GPU index 3 is listed twice - at `$.gpus[1].index`"),
    ("port listed twice", _with(["infiniband"], [{"device": "mlx5_0", "port": 1}] * 2), 422,
     "InfiniBand port ('mlx5_0', 1) is listed twice - at `$.infiniband[1]`"),
    ("interface listed twice", _with(["network"], [{"device": "eth0"}, {"device": "eth0"}]),
     422, "network device 'eth0' is listed twice - at `$.network[1].device`"),
    ("GPU index out of range", _with(["gpus", 0, "index"], MAX_GPUS), 422, "$.gpus[0].index"),
    ("too many GPUs", _with(["gpus"], [{"index": i % MAX_GPUS} for i in range(MAX_GPUS + 1)]),
     422, "Expected `array` of length <= 64 - at `$.gpus`"),
    ("too many ports", _with(["infiniband"], [{"device": f"d{i}", "port": 1}
                                              for i in range(MAX_PORTS + 1)]), 422,
     "$.infiniband"),
    ("too many interfaces", _with(["network"], [{"device": f"e{i}"}
                                                for i in range(MAX_PORTS + 1)]), 422,
     "$.network"),
    ("too many events", _with(["events"], [{"id": i, "kind": "xid", "source": "kmsg",
                                            "time_seconds": T0} for i in range(MAX_EVENTS + 1)]),
     422, "$.events"),
    ("too many labels", _with(["labels"], {f"k{i}": "v" for i in range(MAX_LABELS + 1)}),
     422, "$.labels"),
    ("label key of 65", _with(["labels"], {"k" * 65: "v"}), 422, "`key` in `$.labels`"),
    ("label value of 129", _with(["labels"], {"rack": "v" * 129}), 422, "$.labels[...]"),
    ("label value not a string", _with(["labels"], {"rack": 12}), 422, "$.labels[...]"),
    ("node name with a slash", _with(["node"], "gpu/1"), 422, "$.node"),
    ("node name too long", _with(["node"], "g" * 254), 422, "$.node"),
    ("empty instance", _with(["instance"], ""), 422, "$.instance"),
    ("unknown field", _with(["gpus", 0, "fan_rpm"], 1), 422, "unknown field `fan_rpm`"),
    ("wrong type", _with(["gpus", 0, "lost"], "yes"), 422, "$.gpus[0].lost"),
    ("workload name not a string", _with(["gpus", 0, "workloads", 0, "pod"], 7), 422,
     "Expected `str | null`, got `int` - at `$.gpus[0].workloads[0].pod`"),
    ("workload name of 129", _with(["gpus", 0, "workloads", 0, "slurm_job"], "1" * 129), 422,
     "$.gpus[0].workloads[0].slurm_job"),
    ("unknown workload field", _with(["gpus", 0, "workloads", 0, "job"], "x"), 422,
     "unknown field `job` - at `$.gpus[0].workloads[0]`"),
    ("too many workloads", _with(["gpus", 0, "workloads"], [{"user": "u"}] * (MAX_WORKLOADS + 1)),
     422, f"length <= {MAX_WORKLOADS} - at `$.gpus[0].workloads`"),
    ("negative energy", _with(["gpus", 0, "energy_joules_total"], -1.0), 422,
     "$.gpus[0].energy_joules_total"),
]


@pytest.mark.parametrize(("body", "status", "fragment"),
                         [pytest.param(b, s, f, id=i) for i, b, s, f in REFUSED])
def test_a_broken_report_is_refused_naming_what_is_wrong(api: Api, body: bytes, status: int,
                                                        fragment: str) -> None:
    response = api.client.post("/api/v1/reports", content=body, headers=bearer(AGENT))
    assert response.status_code == status, response.text
    assert list(response.json()) == ["error"]
    assert fragment in response.json()["error"]
    _nothing_happened(api)


ACCEPTED_AT_THE_LIMITS = [
    ("16 labels of 64 and 128", _with(["labels"], {f"{i:02d}" + "k" * 62: "v" * 128
                                                   for i in range(MAX_LABELS)})),
    ("64 GPUs", _with(["gpus"], [{"index": i, "temperature_celsius": -MEASURE_MAX}
                                 for i in range(MAX_GPUS)])),
    ("64 ports and interfaces", _with(["infiniband"], [{"device": "mlx5_0", "port": i}
                                                       for i in range(MAX_PORTS)])),
    ("1000 events", _with(["events"], [{"id": i, "kind": "guard", "source": "agent",
                                        "time_seconds": T0} for i in range(MAX_EVENTS)])),
    ("largest counter", _with(["gpus", 0, "ecc_uncorrected_errors_total"], INT64_MAX)),
    ("16 workloads", _with(["gpus", 0, "workloads"], [{"user": f"u{i}", "pod": "p" * 128}
                                                      for i in range(MAX_WORKLOADS)])),
    ("label with control characters", _with(["labels"], {"rack": "r\u0000\u202e1"})),
    ("empty label key", _with(["labels"], {"": "x"})),
]


@pytest.mark.parametrize("body", [pytest.param(b, id=i) for i, b in ACCEPTED_AT_THE_LIMITS])
def test_a_report_at_the_limits_is_accepted(api: Api, body: bytes) -> None:
    response = api.client.post("/api/v1/reports", content=body, headers=bearer(AGENT))
    assert response.status_code == 200, response.text
    assert api.get("/api/v1/nodes/gpu-1").status_code == 200


def test_every_number_on_the_wire_is_bounded() -> None:
    """Integers fit SQLite and float(); measured values cannot overflow arithmetic."""
    timestamps = {"sample_time_seconds", "time_seconds"}
    for struct in (Report, GpuReport, GpuWorkloadReport, IbPortReport, NetReport, EventRecord,
                   CommandResult):
        for field in msgspec.inspect.type_info(struct).fields:
            for kind in _kinds(field.type):
                where = (struct.__name__, field.name)
                if isinstance(kind, msgspec.inspect.IntType):
                    top = kind.le if kind.le is not None else kind.lt
                    assert top is not None, where
                    assert top <= INT64_MAX, where
                    assert kind.ge is not None, where
                    assert kind.ge >= -(2**63), where
                elif isinstance(kind, msgspec.inspect.FloatType) and field.name not in timestamps:
                    top = kind.le if kind.le is not None else kind.lt
                    assert top is not None, where
                    assert top <= MEASURE_MAX, where
                    assert kind.ge is not None or kind.gt is not None, where


def _kinds(kind: Any) -> Iterator[Any]:
    if isinstance(kind, msgspec.inspect.UnionType):
        yield from kind.types
    elif isinstance(kind, msgspec.inspect.DictType):
        yield kind.value_type
    elif isinstance(kind, msgspec.inspect.ListType):
        yield kind.item_type
    else:
        yield kind


# --------------------------------------------------------------------------- agent clocks


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = make_harness(tmp_path, rules_from("""
- name: hot
  metric: gpu_temperature_celsius
  above: 85
  for: 5s
  severity: critical
  actions: [alert]
- name: xid-79
  event: xid
  codes: [79]
  severity: critical
  actions: [alert]
- name: xid-pair
  event: xid
  codes: [31]
  count: 2
  window: 5s
  actions: [alert]
- name: node-lost
  heartbeat_timeout: 10s
  actions: [alert]
"""), fake=("alert",))
    yield h
    h.controller.close()
    h.store.close()


def _send(h: Harness, node: str = "n1", *, instance: str = "i1", skew: float = 0.0,
          temps: tuple[float, ...] = (50.0,), events: list[dict[str, Any]] | None = None,
          sequence: int | None = None) -> Any:
    key = f"{node}/{instance}"
    seq = sequence if sequence is not None else h.sequences.get(key, 0) + 1
    h.sequences[key] = seq
    doc = {"node": node, "instance": instance, "sequence": seq,
           "sample_time_seconds": h.clock.time() + skew,
           "gpus": [{"index": i, "temperature_celsius": t} for i, t in enumerate(temps)],
           "events": events or []}
    return h.controller.ingest(encode(doc), OPEN_ACCESS, None)


def _xid(h: Harness, event_id: int, code: int, at: float) -> dict[str, Any]:
    return {"id": event_id, "kind": "xid", "source": "kmsg", "time_seconds": at, "code": code}


def _incident(h: Harness, rule: str) -> dict[str, Any]:
    (found,) = [i for i in h.controller.list_incidents(None, None, 100) if i["rule"] == rule]
    return found


@pytest.mark.parametrize("skew", [3600.0, 86_400.0 * 365, 1e300])
def test_an_agent_clock_ahead_never_makes_detection_latency_negative(harness: Harness,
                                                                     skew: float) -> None:
    h = harness
    hot_since = h.clock.time()
    for second in range(6):
        if second:
            h.clock.advance(1)
        _send(h, skew=skew, temps=(95.0,))
        h.controller.sweep()
    hot = _incident(h, "hot")
    assert hot["observed_at"] == pytest.approx(hot_since)  # the controller's time, not +skew
    assert hot["detection_latency_seconds"] == pytest.approx(5.0)
    # an event the agent saw 2 s before its report, on its own (fast) clock
    _send(h, skew=skew, temps=(95.0,),
          events=[_xid(h, 1, 79, h.clock.time() + skew - 2)])
    xid = _incident(h, "xid-79")
    if skew < 1e15:
        assert xid["observed_at"] == pytest.approx(h.clock.time() - 2)
    else:  # at 1e300 a double has no room for the 2 s: seen when received
        assert xid["observed_at"] == h.clock.time()
    assert 0 <= xid["detection_latency_seconds"] <= 2


@pytest.mark.parametrize("sample_time", [0.0, -1e300, T0 - 86_400.0 * 365])
def test_an_agent_clock_far_behind_does_not_date_faults_years_back(harness: Harness,
                                                                   sample_time: float) -> None:
    h = harness
    skew = sample_time - h.clock.time()
    _send(h, skew=skew, events=[_xid(h, 1, 79, sample_time - 3)])
    xid = _incident(h, "xid-79")
    expected = 0.0 if abs(sample_time) > 1e15 else 3.0  # no room for 3 s next to 1e300
    assert xid["observed_at"] == pytest.approx(h.clock.time() - expected)
    assert xid["detection_latency_seconds"] == pytest.approx(expected)


def test_a_late_report_keeps_its_times(harness: Harness) -> None:
    # a report 60 s late (a slow network, a busy agent) is dated when it was sampled
    h = harness
    _send(h, skew=-60.0, events=[_xid(h, 1, 79, h.clock.time() - 61)])
    assert _incident(h, "xid-79")["detection_latency_seconds"] == pytest.approx(61.0)


def test_events_are_dated_within_a_day_and_never_in_the_future(harness: Harness) -> None:
    h = harness
    now = h.clock.time()
    _send(h, events=[_xid(h, 1, 79, 0.0)])
    assert _incident(h, "xid-79")["observed_at"] == pytest.approx(now - MAX_EVENT_AGE_SECONDS)
    h.clock.advance(1)
    _send(h, "n2", events=[_xid(h, 1, 79, now + 1e9)])
    (later,) = h.controller.list_incidents(None, "n2", 10)
    assert later["observed_at"] == pytest.approx(h.clock.time())
    assert later["detection_latency_seconds"] == 0


def test_counted_events_keep_their_spacing_on_a_skewed_clock(harness: Harness) -> None:
    h = harness
    skew = 3600.0
    # two XID 31 one second apart on the agent's clock: within the 5 s window
    _send(h, skew=skew, events=[_xid(h, 1, 31, h.clock.time() + skew)])
    h.clock.advance(1)
    _send(h, skew=skew, events=[_xid(h, 2, 31, h.clock.time() + skew)])
    assert _incident(h, "xid-pair")["observed_at"] == pytest.approx(h.clock.time() - 1)
    # on another node, whose clock is behind, six seconds apart: never two within 5 s
    for n in range(3):
        _send(h, "n2", skew=-skew, events=[_xid(h, n + 1, 31, h.clock.time() - skew)])
        h.clock.advance(6)
    assert [i for i in h.controller.list_incidents(None, "n2", 10)
            if i["rule"] == "xid-pair"] == []


def test_controller_times_leaves_a_good_report_alone() -> None:
    report = decode_report(encode(valid_doc(sample_time=T0 - 0.5)))
    assert controller_times(report, T0) is report
    ahead = controller_times(report, T0 - 10)
    assert ahead.sample_time_seconds == T0 - 10
    assert ahead.events[0].time_seconds == T0 - 10  # moved with its report
    twice = decode_report(encode({**valid_doc(), "events": valid_doc()["events"] * 2}))
    assert len(controller_times(twice, T0).events) == 1


def test_an_event_listed_twice_counts_once(harness: Harness) -> None:
    h = harness
    event = _xid(h, 7, 31, h.clock.time())
    _send(h, events=[event, event])  # count: 2 would fire on two distinct events
    assert h.controller.list_incidents(None, None, 10) == []
    assert h.store.count_events("n1") == 1


# --------------------------------------------------------------------------- agent instances


def test_an_agent_restarted_after_a_clock_far_ahead_is_applied_at_once(
        harness: Harness) -> None:
    h = harness
    _send(h, instance="before", skew=1e9)
    h.clock.advance(1)
    _send(h, instance="after", temps=(99.0,))  # a fixed clock: earlier than the old one
    node = h.controller.get_node("n1")
    assert node is not None
    assert node["hottest_gpu_celsius"] == 99.0


def test_a_replaced_instance_is_not_applied_again_whatever_its_clock(harness: Harness) -> None:
    h = harness
    _send(h, instance="before", sequence=10)
    h.clock.advance(1)
    _send(h, instance="after", sequence=1)
    # a report of the old instance, sent before the restart, arrives late with a later time
    _send(h, instance="before", sequence=11, skew=+30, temps=(99.0,))
    node = h.controller.get_node("n1")
    assert node is not None
    assert node["hottest_gpu_celsius"] == 50.0
    metrics = h.controller.metrics().decode()
    assert 'sn_controller_reports_total{outcome="stale"} 1.0' in metrics


def test_no_report_can_lock_a_live_agent_out(harness: Harness) -> None:
    h = harness
    _send(h, instance="live")
    # an unknown instance with a later clock takes over (a newer agent, as far as the
    # controller can tell) and then says nothing more
    _send(h, instance="intruder", skew=+5)
    for _ in range(15):
        h.clock.advance(1)
        _send(h, instance="live", temps=(70.0,))
        h.controller.sweep()
    node = h.controller.get_node("n1")
    assert node is not None
    assert node["hottest_gpu_celsius"] == 70.0  # the live agent is the node again
    assert node["state"] == "healthy"
    assert h.controller.list_incidents(None, None, 10) == []  # never lost


def test_duplicate_and_older_sequences_are_answered_but_not_applied(harness: Harness) -> None:
    h = harness
    _send(h, sequence=5, temps=(50.0,))
    for sequence in (5, 4, 0):
        reply = _send(h, sequence=sequence, temps=(99.0,),
                      events=[_xid(h, sequence + 100, 13, h.clock.time())])
        assert reply.sequence == sequence
        assert reply.events_stored_through == sequence + 100  # events still stored
    node = h.controller.get_node("n1")
    assert node is not None
    assert node["hottest_gpu_celsius"] == 50.0


# --------------------------------------------------------------------------- renaming


def test_an_agent_renaming_itself_is_another_node(harness: Harness) -> None:
    h = harness
    _send(h, "n1", instance="same")
    h.clock.advance(1)
    _send(h, "n2", instance="same", sequence=2)  # the same agent instance, a new name
    names = [n["name"] for n in h.controller.list_nodes()]
    assert names == ["n1", "n2"]
    for _ in range(8):  # within the heartbeat timeout: nothing happens to n1
        h.clock.advance(1)
        _send(h, "n2", instance="same")
        h.controller.sweep()
    assert h.controller.list_incidents(None, None, 10) == []
    for _ in range(3):  # then n1 is a node that stopped reporting, like any other
        h.clock.advance(1)
        _send(h, "n2", instance="same")
        h.controller.sweep()
    assert [i["node"] for i in h.controller.list_incidents("open", None, 10)] == ["n1"]


def test_a_token_bound_to_its_node_refuses_a_rename(harness: Harness) -> None:
    h = harness
    agent = Identity("gpu-17", "agent", ("gpu-17",))
    doc = {"node": "gpu-17", "instance": "i", "sequence": 1,
           "sample_time_seconds": h.clock.time()}
    h.controller.ingest(encode(doc), agent, None)
    with pytest.raises(ControllerError) as refused:
        h.controller.ingest(encode({**doc, "node": "gpu-18", "sequence": 2}), agent, None)
    assert status_of(refused.value) == 403
    assert "gpu-17 may not report for node gpu-18" in refused.value.message


# --------------------------------------------------------------------------- request bodies


def test_body_shape_limits() -> None:
    check_shape(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH)
    with pytest.raises(BodyRefused, match="nested deeper than 32 levels"):
        check_shape(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    check_shape(b'{"a": "' + b"[" * 1000 + b'"}')  # inside a string: text, not nesting
    check_shape(b'{"a": "\\"[[[[' + b"[" * 100 + b'"}')
    with pytest.raises(BodyRefused, match="more than 64 digits"):
        check_shape(b'{"a": ' + b"9" * 65 + b"}")
    check_shape(b'{"a": "' + b"9" * 5000 + b'"}')
    with pytest.raises(BodyRefused, match="anchors and aliases"):
        check_shape(b"a: &x [1]\nb: *x\n", yaml_allowed=True)
    check_shape(b"a: &x [1]\nb: *x\n")  # a JSON-only route leaves YAML to its parser
    with pytest.raises(BodyRefused, match="indented deeper"):
        check_shape(b"a:\n" + b"- " * 200 + b"x\n", yaml_allowed=True)
    check_shape((ROOT / "tests/fixtures/jobs/trillion.yaml").read_bytes(), yaml_allowed=True)
    check_shape(b"a: '*not an alias*'\nb: \"[[[\"\n", yaml_allowed=True)


#: Not a time limit (a check takes milliseconds): what ends a check that would never end.
HANG_GUARD_SECONDS = 120

#: The verdict on a megabyte of each of the bench's hostile shapes (None: accepted).
MEGABYTE_VERDICTS: dict[str, str | None] = {
    "brackets": "nested deeper", "braces": "nested deeper", "dashes": "indented deeper",
    "digits": "more than 64 digits", "backslashes": None, "single quotes": None,
    "double quotes": None, "blanks": "indented deeper", "newlines": None,
    "objects": "nested deeper",
}


@pytest.mark.parametrize(("name", "prefix", "unit", "suffix"), SHAPES)
def test_a_megabyte_of_each_hostile_shape_is_checked_to_its_verdict(
        name: str, prefix: bytes, unit: bytes, suffix: bytes) -> None:
    """A megabyte (the default body limit) of each shape gets its verdict, here without a
    clock: linear time is milliseconds, quadratic about 10^12 steps (hours). The ratio of
    1 MiB to 128 KiB (linear: near 8) is measured by ``python -m bench.body_shape_bench``.

    A quadratic regular expression never lets go of the GIL, so neither of
    pytest-timeout's methods can stop it: faulthandler's watchdog (a C thread) ends the
    process with the stack of the check instead of leaving the suite hanging.
    """
    body = prefix + unit * ((1 << 20) // len(unit)) + suffix
    verdict = MEGABYTE_VERDICTS[name]
    faulthandler.dump_traceback_later(HANG_GUARD_SECONDS, exit=True)
    try:
        if verdict is None:
            check_shape(body, yaml_allowed=True)
        else:
            with pytest.raises(BodyRefused, match=verdict):
                check_shape(body, yaml_allowed=True)
    finally:
        faulthandler.cancel_dump_traceback_later()


LOL = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 10)}]\n"
    for i in range(8))
BODIES = [
    ("/api/v1/jobs", LOL.encode(), "anchors and aliases"),
    ("/api/v1/jobs", b"a: &x [*x]\n", "anchors and aliases"),
    ("/api/v1/jobs", b"spec:\n" + b"- " * 5000 + b"x\n", "indented deeper"),
    ("/api/v1/jobs", b"[" * 5000 + b"]" * 5000, "nested deeper"),
    ("/api/v1/jobs", b'{"apiVersion": ' + b"9" * 5000 + b"}", "more than 64 digits"),
    ("/api/v1/alertmanager", b'{"version": "4", "status": "firing", "alerts": [], "x": '
     + b"[" * 5000 + b"]" * 5000 + b"}", "nested deeper"),
    ("/api/v1/nodes/gpu-1/cordon", b'{"reason": ' + b"[" * 5000 + b"]" * 5000 + b"}",
     "nested deeper"),
    ("/api/v1/jobs/x/progress", b"[" * 5000 + b"]" * 5000, "nested deeper"),
    ("/api/v1/jobs/x/checkpoints", b'{"step": ' + b"1" * 5000 + b"}", "more than 64 digits"),
]


@pytest.mark.parametrize(("path", "body", "fragment"), BODIES)
def test_a_body_of_a_hostile_shape_is_refused_at_once(api: Api, path: str, body: bytes,
                                                     fragment: str) -> None:
    api.report("gpu-1")
    media = "application/yaml" if path == "/api/v1/jobs" else "application/json"
    response = api.client.post(path, content=body, headers={
        **bearer(OPERATE), "content-type": media})
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]
    assert api.h.controller.list_actions(None, None, 10) == []


def test_unknown_routes_and_methods_answer_json(api: Api) -> None:
    missing = api.get("/api/v1/nothing-here")
    assert missing.status_code == 404
    assert missing.json() == {"error": "Not Found"}
    wrong = api.client.get("/api/v1/reports", headers=bearer(READ))
    assert wrong.status_code == 405
    assert wrong.json() == {"error": "Method Not Allowed"}
    assert wrong.headers["allow"] == "POST"


@pytest.mark.parametrize("path", ["/api/v1/incidents?stat=open", "/api/v1/actions?nod=x",
                                  "/api/v1/events?kind=xid&limt=5", "/api/v1/recoveries?x=1"])
def test_an_unknown_query_parameter_is_refused_naming_it(api: Api, path: str) -> None:
    response = api.get(path)
    assert response.status_code == 422
    assert "unknown query parameter" in response.json()["error"]
    assert repr(path.rsplit("&", 1)[-1].split("?")[-1].split("=")[0]) in response.json()["error"]
