"""A store that takes no writes (full disk, read-only state directory): the controller
refuses to act rather than act without a record, says so on /healthz and in
``sn_controller_store_up``, and acts again by itself once the store takes writes.

Tests run as root, where ``chmod 0555`` does not stop a write. So :class:`FullDisk` makes
every write transaction of a real store fail as SQLite fails on a full disk
(``sqlite3.OperationalError: database or disk is full``, which the store turns into
StoreUnavailable), whatever the permissions; reads go on. (SQLite's own SQLITE_FULL from
``max_page_count``: test_store; a read-only open:
test_controller_service.test_store_unavailable_refuses_to_act. A real size cap is no
good here: a small write can still fit a page's free space, so which write fails first
is not deterministic.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from sn_monitor.controller.actions.policy import PolicySettings
from sn_monitor.controller.api.app import build_app
from sn_monitor.controller.incidents.node_states import NODE_REFRESH_SECONDS
from tests.support.disk import FullDisk
from tests.support.harness import Harness, make_harness, rules_from, xid

XID_CORDON = """
- name: fatal-xid
  event: xid
  codes: [79]
  clear_after: 10m
  severity: critical
  actions: [alert, cordon]
"""


def _sweep_past_refresh(h: Harness) -> None:
    """Long enough for the sweep's store probe (every NODE_REFRESH_SECONDS)."""
    h.clock.advance(NODE_REFRESH_SECONDS + 0.1)
    h.controller.sweep()
    h.settle()


@pytest.fixture
def h(tmp_path: Path) -> Any:
    # room for two cordons out of three nodes: this is about the store, not the budget
    harness = make_harness(tmp_path, rules_from(XID_CORDON),
                           policy=PolicySettings(max_unavailable="100%"))
    yield harness
    harness.controller.close()
    harness.store.close()


def _store_up(h: Harness) -> str:
    line = next(x for x in h.controller.metrics().decode().splitlines()
                if x.startswith("sn_controller_store_up "))
    return line.split()[1]


def test_a_full_disk_refuses_to_act_and_acts_again_once_writable(h: Harness) -> None:
    for node in ("n1", "n2", "n3"):
        h.report(node)
    assert h.controller.health()[0]
    event = xid(0, 79, h.clock.time())

    with FullDisk(h.store):
        reply = h.report("n1", events=[event])
        assert reply.events_stored_through == -1  # not stored: the agent keeps it spooled
        h.controller.sweep()
        h.settle()
        ok, body = h.controller.health()
        assert not ok
        assert body["status"] == "refusing to act"
        assert "database or disk is full" in body["store"]
        assert _store_up(h) == "0.0"
        for fake in h.fakes.values():
            assert fake.calls == [], f"{fake.name} acted without a record"
        with pytest.raises(Exception, match="refusing to act"):  # by hand neither
            h.controller.manual_action("cordon", "n3", "alice", "fan")
        h.clock.advance(2)
        h.report("n1", events=[event])  # the agent retries; still not taken
        _sweep_past_refresh(h)
        assert not h.controller.health()[0], "a probe while full must not clear the error"
        assert h.fakes["cordon"].calls == []
        assert h.controller.list_actions(None, None, 100) == []

    # Space again: the next probe notices, without a restart ...
    _sweep_past_refresh(h)
    ok, body = h.controller.health()
    assert ok, body
    assert (body["status"], body["store"]) == ("ok", "ok")
    assert _store_up(h) == "1.0"
    # ... the agent's kept event is stored at last ...
    assert h.report("n1", events=[event]).events_stored_through == 0
    # ... the fault seen while full, still firing, is acted on now (once) ...
    h.settle()
    assert [c.node for c in h.fakes["cordon"].calls] == ["n1"]
    # ... and the next fault is recorded and acted on.
    h.report("n2", events=[xid(0, 79, h.clock.time())])
    h.settle()
    assert [c.node for c in h.fakes["cordon"].calls] == ["n1", "n2"]
    (incident,) = h.controller.list_incidents("open", "n2", 10)
    assert incident["id"] in [a["incident_id"] for a in h.actions("cordon")]


def test_a_fault_seen_while_the_store_was_full_is_acted_on_once_writable(h: Harness) -> None:
    h.report("n1")
    event = xid(0, 79, h.clock.time())
    with FullDisk(h.store):
        h.report("n1", events=[event])
        h.controller.sweep()
    _sweep_past_refresh(h)
    assert h.controller.health()[0]
    h.report("n1", events=[event])  # the agent resends what was never acknowledged
    h.controller.sweep()
    h.settle()
    assert [c.node for c in h.fakes["cordon"].calls] == ["n1"]
    assert [i["rule"] for i in h.controller.list_incidents("open", "n1", 10)] == ["fatal-xid"]


def test_healthz_and_metrics_over_http(h: Harness) -> None:
    client = TestClient(build_app(h.controller, None, 1 << 20))
    with client:
        assert client.get("/healthz").status_code == 200
        with FullDisk(h.store):
            h.report("n1", events=[xid(0, 79, h.clock.time())])
            response = client.get("/healthz")
            assert response.status_code == 503
            assert response.json()["status"] == "refusing to act"
            assert "database or disk is full" in response.json()["store"]
            assert "sn_controller_store_up 0.0" in client.get("/metrics").text
        _sweep_past_refresh(h)
        assert client.get("/healthz").status_code == 200
        assert "sn_controller_store_up 1.0" in client.get("/metrics").text
