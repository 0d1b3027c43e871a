"""Events-only reports: a fault's events sent at once, between two samples (issue 34).

The controller takes their events through the event rules at once (the incident and its
first actions, with no sweep in between), keeps the node's last sample as it was, and
does not count them as samples: the threshold holds, the heartbeat and the values wait
for the next sampled report. The decoder refuses one that carries values.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sn_monitor.controller.errors import Invalid
from sn_monitor.controller.ingest.decode import decode_report
from tests.support.harness import (
    HEARTBEAT_RULE,
    HOT_RULE,
    XID_RULE,
    Harness,
    make_harness,
    report_body,
    rules_from,
    xid,
)

NODE = "gpu-node-017"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    rules = rules_from(XID_RULE.format(clear_after="10m") + HOT_RULE + HEARTBEAT_RULE)
    h = make_harness(tmp_path, rules, settle=3.0)
    yield h
    h.controller.close()
    h.store.close()


def events_only(h: Harness, *events: dict[str, Any], sequence: int | None = None) -> Any:
    """An events-only report from ``NODE``'s agent now: events and no values."""
    return h.report(NODE, sequence=sequence, events_only=True, events=list(events))


def test_an_xid_opens_its_incident_and_alerts_on_its_own_report(harness: Harness) -> None:
    h = harness
    h.report(NODE, temps=[50])
    h.clock.advance(0.4)  # between two samples
    injected = h.clock.time()
    events_only(h, xid(0, 79, injected))
    h.settle()  # the writer records; nothing sweeps
    (incident,) = h.controller.list_incidents("open", NODE, 10)
    assert incident["rule"] == "fatal-xid"
    assert incident["detected_at"] == injected
    assert h.fakes["alert"].actions() == ["alert"]  # the first action, no sweep
    assert h.fakes["failover"].calls == []  # node-taking actions still settle

    h.clock.advance(3)
    h.controller.sweep()
    h.settle()
    assert h.fakes["failover"].actions() == ["failover"]


def test_a_node_whose_first_report_is_events_only_gets_its_incident(harness: Harness) -> None:
    h = harness
    events_only(h, xid(0, 79, h.clock.time()))
    h.settle()
    assert [i["rule"] for i in h.controller.list_incidents("open", NODE, 10)] == ["fatal-xid"]


def test_the_last_sample_stays_the_nodes_values(harness: Harness) -> None:
    h = harness
    h.report(NODE, temps=[61, 62])
    sampled_at = h.controller.registry.get(NODE).received_wall  # type: ignore[union-attr]
    h.clock.advance(0.5)
    events_only(h, xid(0, 79, h.clock.time()))
    view = h.controller.registry.get(NODE)
    assert view is not None
    assert view.report is not None
    assert [g.temperature_celsius for g in view.report.gpus] == [61, 62]
    assert view.received_wall == sampled_at  # no sample came
    assert [e.code for e in view.report.events] == [79]


def test_a_threshold_hold_does_not_complete_on_an_events_only_report(harness: Harness) -> None:
    h = harness
    h.report(NODE, temps=[90])  # hot from now: gpu-hot holds 5 s
    h.clock.advance(6)
    events_only(h, xid(0, 31, h.clock.time()))  # an XID no rule here takes
    h.settle()
    assert h.controller.list_incidents(None, NODE, 10) == []  # no new sample said 90
    h.report(NODE, temps=[90])
    h.settle()
    assert [i["rule"] for i in h.controller.list_incidents("open", NODE, 10)] == ["gpu-hot"]


def test_an_events_only_report_is_no_heartbeat(harness: Harness) -> None:
    h = harness
    h.report(NODE, temps=[50])
    h.clock.advance(9)
    events_only(h, xid(0, 31, h.clock.time()))
    h.clock.advance(2)  # 11 s since the last sample, 2 since the events
    h.controller.sweep()
    h.settle()
    assert "node-lost" in [i["rule"] for i in h.controller.list_incidents("open", NODE, 10)]


def test_events_only_reports_share_the_agents_sequence(harness: Harness) -> None:
    h = harness
    h.report(NODE, temps=[50], sequence=1)
    events_only(h, xid(0, 79, h.clock.time()), sequence=2)
    h.report(NODE, temps=[88], sequence=2)  # a replay of 2: not applied
    view = h.controller.registry.get(NODE)
    assert view is not None
    assert view.report is not None
    assert [g.temperature_celsius for g in view.report.gpus] == [50]
    h.report(NODE, temps=[88], sequence=3)
    assert [g.temperature_celsius for g in view.report.gpus] == [88]


@pytest.mark.parametrize(("extra", "names"), [
    ({"gpus": [{"index": 0, "temperature_celsius": 50}]}, "`$.gpus`"),
    ({"host": {"processes_stuck": 0}}, "`$.host`"),
    ({"events": []}, "`$.events`"),
])
def test_an_events_only_report_with_values_or_without_events_is_refused(
        extra: dict[str, Any], names: str) -> None:
    body = report_body(NODE, events_only=True, **{"events": [xid(0, 79, 1.0)], **extra})
    with pytest.raises(Invalid, match="events_only") as refused:
        decode_report(body)
    assert names in str(refused.value)
