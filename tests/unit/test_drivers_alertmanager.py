"""The Alertmanager driver: alert bodies, firing/resend/resolved, several cluster members."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from sn_monitor.clock import ManualClock
from sn_monitor.controller.actions.base import PermanentError, TemporaryError
from sn_monitor.controller.actions.drivers.alertmanager import (
    AlertmanagerDriver,
    AlertmanagerSettings,
    label_name,
    rfc3339,
)
from sn_monitor.controller.audit import ActionRequest
from sn_monitor.transport import check_http_url
from tests.drivers.servers import RecordingHTTPServer, Reply

T0 = 1_700_000_000.0
ALERTS = "/api/v2/alerts"


@pytest.fixture
def servers() -> Iterator[list[RecordingHTTPServer]]:
    started = [RecordingHTTPServer(), RecordingHTTPServer()]
    for server in started:
        server.start()
    yield started
    for server in started:
        server.stop()


def alert(status: str = "firing", **overrides: object) -> ActionRequest:
    fields: dict[str, object] = dict(
        id="a-1", key="k", action="alert", node="gpu-node-017", reason="GPU 3 at 91 C",
        rule="gpu-overheat", gpu=3, severity="critical", labels={"supernode": "sn0",
                                                                  "team.io/owner": "ml"},
        params={"status": status}, incident_id=7)
    fields.update(overrides)
    return ActionRequest(**fields)  # type: ignore[arg-type]


def driver(urls: list[str], clock: ManualClock, **settings: object) -> AlertmanagerDriver:
    return AlertmanagerDriver(AlertmanagerSettings(urls=urls, **settings),  # type: ignore[arg-type]
                              clock=clock)


def test_firing_alert_body(servers: list[RecordingHTTPServer]) -> None:
    clock = ManualClock(T0)
    am = driver([servers[0].url], clock, resend_interval=60.0,
                generator_url="http://sn-controller:9848/incidents")
    am.run(alert())
    (call,) = servers[0].calls("POST", ALERTS)
    (body,) = call.json()
    assert body["labels"] == {
        "alertname": "gpu-overheat", "node": "gpu-node-017", "gpu": "3",
        "severity": "critical", "source": "sn-monitor", "supernode": "sn0",
        "team_io_owner": "ml",
    }
    assert body["annotations"]["summary"] == "gpu-overheat on gpu-node-017 GPU 3"
    assert body["annotations"]["description"] == "GPU 3 at 91 C"
    assert body["startsAt"] == "2023-11-14T22:13:20.000Z"
    assert body["endsAt"] == rfc3339(T0 + 240)  # 4 x resend_interval
    assert body["generatorURL"] == "http://sn-controller:9848/incidents"


def test_resend_keeps_starts_at_and_moves_ends_at(servers: list[RecordingHTTPServer]) -> None:
    clock = ManualClock(T0)
    am = driver([servers[0].url], clock, resend_interval=60.0)
    am.run(alert())
    am.run(alert(node="gpu-node-018", gpu=None))
    clock.advance(60)
    assert am.resend_firing() == 2
    resent = servers[0].calls("POST", ALERTS)[-1].json()
    assert {a["labels"]["node"] for a in resent} == {"gpu-node-017", "gpu-node-018"}
    for body in resent:
        assert body["startsAt"] == rfc3339(T0)
        assert body["endsAt"] == rfc3339(T0 + 60 + 240)


def test_resolved_ends_now_and_stops_resending(servers: list[RecordingHTTPServer]) -> None:
    clock = ManualClock(T0)
    am = driver([servers[0].url], clock)
    am.run(alert())
    clock.advance(30)
    am.run(alert("resolved", id="a-2"))
    (body,) = servers[0].calls("POST", ALERTS)[-1].json()
    assert body["startsAt"] == rfc3339(T0)
    assert body["endsAt"] == rfc3339(T0 + 30)
    assert am.firing() == []
    before = len(servers[0].calls())
    assert am.resend_firing() == 0
    assert len(servers[0].calls()) == before


def test_firing_twice_is_one_alert(servers: list[RecordingHTTPServer]) -> None:
    clock = ManualClock(T0)
    am = driver([servers[0].url], clock)
    am.run(alert())
    clock.advance(5)
    am.run(alert(id="a-again"))
    assert len(am.firing()) == 1
    (body,) = servers[0].calls()[-1].json()
    assert body["startsAt"] == rfc3339(T0)


def test_two_ports_of_one_node_are_two_alerts(servers: list[RecordingHTTPServer]) -> None:
    # one rule, one node, two subjects (InfiniBand ports): two incidents, two alerts
    clock = ManualClock(T0)
    am = driver([servers[0].url], clock)
    for port in ("device=mlx5_0,port=1", "device=mlx5_1,port=1"):
        am.run(alert(rule="ib-port-down", gpu=None, params={"status": "firing",
                                                             "subject": port}))
    assert sorted(a["subject"] for a in am.firing()) == ["device=mlx5_0,port=1",
                                                         "device=mlx5_1,port=1"]
    am.run(alert("resolved", rule="ib-port-down", gpu=None,
                 params={"status": "resolved", "subject": "device=mlx5_0,port=1"}))
    assert [a["subject"] for a in am.firing()] == ["device=mlx5_1,port=1"]
    # a GPU's subject adds nothing to its gpu label
    am.run(alert(params={"status": "firing", "subject": "gpu=3"}))
    assert "subject" not in servers[0].calls()[-1].json()[0]["labels"]


def test_posts_to_every_member_and_succeeds_if_any_accepts(
        servers: list[RecordingHTTPServer]) -> None:
    servers[0].script(ALERTS, Reply(503))
    am = driver([servers[0].url, servers[1].url + "/"], ManualClock(T0))
    outcome = am.run(alert())
    assert len(servers[0].calls()) == 1
    assert len(servers[1].calls()) == 1
    assert outcome.details["accepted"] == [servers[1].url + ALERTS]


def test_all_members_failing_is_temporary(servers: list[RecordingHTTPServer]) -> None:
    servers[0].script(ALERTS, Reply(503, headers={"Retry-After": "3"}))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    am = driver([servers[0].url, dead], ManualClock(T0))
    with pytest.raises(TemporaryError) as caught:
        am.run(alert())
    assert caught.value.retry_after == 3.0
    # Not lost: it stays firing, and the next resend delivers it once a member is back.
    servers[0].script(ALERTS, Reply(200))
    assert am.resend_firing() == 1


def test_all_members_refusing_is_permanent_and_forgotten(
        servers: list[RecordingHTTPServer]) -> None:
    for server in servers:
        server.script(ALERTS, Reply(400, b'{"message":"bad label"}'))
    am = driver([s.url for s in servers], ManualClock(T0))
    with pytest.raises(PermanentError, match="bad label"):
        am.run(alert())
    assert am.firing() == []


def test_timeout(servers: list[RecordingHTTPServer]) -> None:
    servers[0].script(ALERTS, Reply(200, delay=2.0))
    with pytest.raises(TemporaryError, match="timed out"):
        driver([servers[0].url], ManualClock(T0), timeout=0.2).run(alert())


def test_settings_checks() -> None:
    with pytest.raises(ValueError, match="http"):
        check_http_url("alertmanager:9093")
    assert label_name("a.b/c") == "a_b_c"
    assert label_name("9x") == "_9x"
