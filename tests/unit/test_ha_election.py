"""The elector and the PostgreSQL-store lease, on a real store and a manual clock, and
what a standby serves."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from sn_monitor.clock import ManualClock
from sn_monitor.config import ConfigError, Duration
from sn_monitor.controller.ha.elector import Elector, LeadershipLost
from sn_monitor.controller.ha.lease import HaSettings, KubernetesLeaseSettings, LeaseError
from sn_monitor.controller.ha.standby import StandbyApp, StandbyStatus
from sn_monitor.controller.ha.store_lease import StoreLease
from sn_monitor.controller.process.leadership import build_lease
from sn_monitor.controller.storage.store import Store
from sn_monitor.transport import ROLE_HEADER
from tests.drivers.servers import wait_until
from tests.support.disk import FullDisk


def settings(identity: str) -> HaSettings:
    return HaSettings(lease="postgresql", identity=identity, lease_duration=Duration(15),
                      renew_deadline=Duration(10), retry_period=Duration(2))


@pytest.fixture
def pair(tmp_path: Path):
    """Two candidates, each with its own connection to one store, on one clock."""
    clock = ManualClock()
    stores = [Store(tmp_path / "c.db"), Store(tmp_path / "c.db")]
    a, b = (Elector(StoreLease(s, settings(name), clock), settings(name), clock)
            for s, name in zip(stores, ("ctl-a", "ctl-b"), strict=True))
    yield clock, a, b
    for s in stores:
        s.close()


def test_one_leads_the_other_waits_until_the_lease_expires(pair) -> None:
    clock, a, b = pair
    assert a.try_to_lead()
    assert not b.try_to_lead()
    assert b.lease.holder() == "ctl-a"
    for _ in range(20):  # the active renews every retry period: the standby never gets in
        clock.advance(2)
        a.check()
        assert not b.try_to_lead()
    clock.advance(14.9)  # the active is gone (no renewal): not yet expired
    assert not b.try_to_lead()
    clock.advance(0.1)
    assert b.try_to_lead()
    assert b.lease.granted.epoch == 2
    with pytest.raises(LeadershipLost, match="another controller"):
        a.check()  # the old active, back from a pause, finds the lease taken
    assert not a.leading


def test_an_unreachable_store_is_tolerated_until_the_renew_deadline(pair) -> None:
    clock, a, b = pair
    assert a.try_to_lead()
    with FullDisk(a.lease._store):
        clock.advance(2)
        a.check()  # not renewed, within the deadline: still leading
        clock.advance(7.9)
        a.check()
        clock.advance(0.1)
        with pytest.raises(LeadershipLost, match=r"not renewed for 10\.0s"):
            a.check()
    # it gave up 10 s after its last renewal, 5 s before the standby may take over
    assert not b.try_to_lead()
    clock.advance(5)
    assert b.try_to_lead()


def test_lease_errors_are_lease_errors(pair) -> None:
    _, a, _ = pair
    with FullDisk(a.lease._store), pytest.raises(LeaseError):
        a.lease.try_acquire_or_renew()
    with FullDisk(a.lease._store):
        assert not a.try_to_lead()  # a standby that cannot ask stays a standby


def test_release_hands_over_at_once(pair) -> None:
    _, a, b = pair
    assert a.try_to_lead()
    a.release()
    assert not a.leading
    assert b.try_to_lead()  # no wait for the expiry
    a.release()  # not leading: nothing to do


def test_a_release_the_store_refuses_is_logged_not_raised(pair, caplog) -> None:
    clock, a, b = pair
    assert a.try_to_lead()
    with FullDisk(a.lease._store), caplog.at_level(logging.WARNING):
        a.release()  # an orderly stop goes on: the standby waits for the expiry instead
    assert not a.leading
    assert "lease not released" in caplog.text
    assert not b.try_to_lead()
    clock.advance(15)
    assert b.try_to_lead()


def test_build_lease_picks_the_backend_and_names_a_bad_kubernetes_config(tmp_path) -> None:
    store = Store(tmp_path / "c.db")
    try:
        lease = build_lease(settings("ctl-a"), store, ManualClock())
        assert isinstance(lease, StoreLease)
        with pytest.raises(ConfigError, match=r"ha\.kubernetes"):
            build_lease(HaSettings(lease="kubernetes", kubernetes=KubernetesLeaseSettings(
                kubeconfig=str(tmp_path / "no-kubeconfig"))), store, ManualClock())
    finally:
        store.close()


def test_keep_leading_reports_a_loss_once_and_wait_to_lead_stops(pair) -> None:
    clock, a, b = pair
    assert a.try_to_lead()
    clock.advance(15)
    assert b.try_to_lead()  # a missed its renewals: b took over
    fast = HaSettings(lease="postgresql", identity="ctl-a", lease_duration=Duration(0.3),
                      renew_deadline=Duration(0.2), retry_period=Duration(0.01))
    a.settings = fast
    lost: list[str] = []
    stop = threading.Event()
    a.keep_leading(stop, lost.append)  # returns at the first renewal
    assert lost == ["another controller holds the lease"]

    stop.set()
    assert not a.wait_to_lead(stop)  # a stopped standby returns at once
    seen: list[str | None] = []
    stop = threading.Event()
    waiter = threading.Thread(target=lambda: a.wait_to_lead(stop, observe=seen.append))
    waiter.start()
    try:
        assert wait_until(lambda: seen)
    finally:
        stop.set()
        waiter.join(timeout=5)
    assert seen[0] == "ctl-b"


def test_a_standby_answers_503_with_its_role_and_is_alive() -> None:
    status = StandbyStatus("ctl-b")
    status.saw("ctl-a")
    client = TestClient(StandbyApp(status))
    report = client.post("/api/v1/reports", content=b'{"node": "n1"}',
                         headers={"Content-Type": "application/json"})
    assert report.status_code == 503
    assert report.headers[ROLE_HEADER] == "standby"
    assert report.headers["retry-after"] == "1"
    assert report.json()["active"] == "ctl-a"
    for path in ("/healthz", "/readyz"):
        answer = client.get(path)
        assert answer.status_code == 503
        assert answer.json() == {"status": "standby", "role": "standby", "identity": "ctl-b",
                                 "active": "ctl-a"}
    assert client.get("/livez").status_code == 200
    assert client.post("/api/v1/nodes/n1/cordon").status_code == 503  # nothing acts
    metrics = client.get("/metrics").text
    assert "sn_controller_leader 0.0" in metrics
    assert json.loads(client.get("/livez").text)["role"] == "standby"
