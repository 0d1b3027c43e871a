"""KubernetesLease: two candidates with the real client against one stub API server.

The election library measures expiry with ``time.time()`` inside its own module (no
clock to inject): the one test of expiry asks again until the standby takes the Lease,
one lease duration (1 s) after it first saw it.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Iterator

import pytest
import requests

from sn_monitor.config import Duration
from sn_monitor.controller.ha.k8s_lease import KubernetesLease, lease_namespace, micro_time
from sn_monitor.controller.ha.lease import HaSettings, KubernetesLeaseSettings, LeaseError
from tests.drivers.servers import RecordingHTTPServer, Reply, StubKubernetesAPI, wait_until

NS = "sn-monitor"
NAME = "sn-monitor-controller"
PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{NAME}"
RFC3339_MICRO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
LEASE_SECONDS = 1.0


def settings(url: str, identity: str, timeout: float = 2.0) -> HaSettings:
    return HaSettings(lease="kubernetes", identity=identity,
                      lease_duration=Duration(LEASE_SECONDS), renew_deadline=Duration(0.8),
                      retry_period=Duration(0.2),
                      kubernetes=KubernetesLeaseSettings(host=url, timeout=Duration(timeout)))


@pytest.fixture
def api() -> Iterator[StubKubernetesAPI]:
    stub = StubKubernetesAPI()
    stub.start()
    yield stub
    stub.stop()


@pytest.fixture
def candidates(api: StubKubernetesAPI) -> Iterator[tuple[KubernetesLease, KubernetesLease]]:
    a = KubernetesLease(settings(api.url, "ctl-a"), environ={"POD_NAMESPACE": NS})
    b = KubernetesLease(settings(api.url, "ctl-b"), environ={"POD_NAMESPACE": NS})
    yield a, b
    a.close()
    b.close()


def test_first_candidate_creates_and_holds_the_lease(
        api: StubKubernetesAPI, candidates: tuple[KubernetesLease, KubernetesLease]) -> None:
    a, b = candidates
    assert a.try_acquire_or_renew() is True
    assert api.lease(NS, NAME)["spec"]["holderIdentity"] == "ctl-a"
    (create,) = api.calls("POST")
    assert create.path == f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
    assert b.try_acquire_or_renew() is False  # fresh: held by a
    assert b.holder() == "ctl-a"
    assert a.try_acquire_or_renew() is True   # a renews
    assert b.try_acquire_or_renew() is False
    assert api.lease(NS, NAME)["spec"]["holderIdentity"] == "ctl-a"


def test_the_wire_carries_a_complete_lease_record(
        api: StubKubernetesAPI, candidates: tuple[KubernetesLease, KubernetesLease]) -> None:
    a, _ = candidates
    assert a.try_acquire_or_renew() is True
    spec = api.calls("POST")[0].json()["spec"]
    assert spec["holderIdentity"] == "ctl-a"
    assert spec["leaseDurationSeconds"] == 1
    for key in ("acquireTime", "renewTime"):
        assert RFC3339_MICRO.fullmatch(spec[key]), spec[key]
    acquired, renewed = spec["acquireTime"], spec["renewTime"]
    assert a.try_acquire_or_renew() is True
    (renewal,) = api.calls("PUT")
    body = renewal.json()
    assert body["metadata"]["resourceVersion"]  # optimistic concurrency
    assert body["spec"]["holderIdentity"] == "ctl-a"
    assert body["spec"]["acquireTime"] == acquired  # a renewal keeps the acquire time
    assert body["spec"]["renewTime"] > renewed      # and moves the renew time
    assert RFC3339_MICRO.fullmatch(body["spec"]["renewTime"])
    assert api.lease(NS, NAME)["spec"]["renewTime"] == body["spec"]["renewTime"]


def test_a_standby_takes_a_lease_left_unrenewed_for_lease_duration(
        api: StubKubernetesAPI, candidates: tuple[KubernetesLease, KubernetesLease]) -> None:
    a, b = candidates
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False  # b sees a's record: its clock starts
    # a stops renewing (paused, partitioned): b takes it once it has seen no change
    assert wait_until(b.try_acquire_or_renew, timeout=LEASE_SECONDS + 30, step=0.05)
    lease = api.lease(NS, NAME)["spec"]
    assert lease["holderIdentity"] == "ctl-b"
    assert lease["acquireTime"] == lease["renewTime"]  # a new term
    assert a.try_acquire_or_renew() is False  # the old holder learns it lost
    assert a.holder() == "ctl-b"


def test_release_lets_the_standby_take_over_at_once(
        api: StubKubernetesAPI, candidates: tuple[KubernetesLease, KubernetesLease]) -> None:
    a, b = candidates
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    a.release()
    spec = api.lease(NS, NAME)["spec"]
    assert "holderIdentity" not in spec  # cleared, as client-go's ReleaseOnCancel does
    assert spec["leaseDurationSeconds"] == 1
    assert RFC3339_MICRO.fullmatch(spec["renewTime"])
    assert b.try_acquire_or_renew() is True  # no wait for expiry
    assert api.lease(NS, NAME)["spec"]["holderIdentity"] == "ctl-b"


def test_release_leaves_someone_elses_lease_alone(
        api: StubKubernetesAPI, candidates: tuple[KubernetesLease, KubernetesLease]) -> None:
    a, b = candidates
    b.release()  # no Lease at all: nothing to do
    assert a.try_acquire_or_renew() is True
    b.release()
    assert api.lease(NS, NAME)["spec"]["holderIdentity"] == "ctl-a"
    assert api.calls("PUT") == []


def test_a_lost_write_race_is_false_not_an_error(
        api: StubKubernetesAPI, candidates: tuple[KubernetesLease, KubernetesLease]) -> None:
    a, _ = candidates
    assert a.try_acquire_or_renew() is True
    api.fail_method["PUT"] = [409]  # another candidate wrote between our read and write
    assert a.try_acquire_or_renew() is False


@pytest.mark.parametrize(("method", "status"), [("GET", 500), ("PUT", 500), ("PUT", 422),
                                                 ("GET", 429)])
def test_server_errors_are_lease_errors(
        api: StubKubernetesAPI, candidates: tuple[KubernetesLease, KubernetesLease],
        method: str, status: int) -> None:
    # LeaseError, not False: False means "another candidate holds it"; a standby that
    # cannot ask must say so (the elector logs it), and an active one counts it against
    # renew_deadline exactly as it would count False.
    a, _ = candidates
    assert a.try_acquire_or_renew() is True
    api.fail_method[method] = [status]
    with pytest.raises(LeaseError, match=str(status)):
        a.try_acquire_or_renew()
    assert a.holder() is None  # unknown after a failed step
    assert a.try_acquire_or_renew() is True  # the next step is a renewal as usual


def test_forbidden_names_the_missing_rbac(
        api: StubKubernetesAPI, candidates: tuple[KubernetesLease, KubernetesLease]) -> None:
    a, _ = candidates
    api.fail_next = [403]
    with pytest.raises(LeaseError, match=r"403.*coordination\.k8s\.io leases"):
        a.try_acquire_or_renew()


def test_an_unreachable_api_server_is_a_lease_error(api: StubKubernetesAPI) -> None:
    lease = KubernetesLease(settings(api.url, "ctl-a", timeout=1.0), environ={})
    try:
        assert lease.try_acquire_or_renew() is True
        api.stop()
        # refused at once, not waited out until the timeout
        with pytest.raises(LeaseError, match=r"unreachable: .*Connection refused"):
            lease.try_acquire_or_renew()
        with pytest.raises(LeaseError, match=r"unreachable: .*Connection refused"):
            lease.release()
    finally:
        lease.close()


def test_a_closed_port_is_a_lease_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    lease = KubernetesLease(settings(f"http://127.0.0.1:{port}", "ctl-a"), environ={})
    try:
        with pytest.raises(LeaseError, match="unreachable"):
            lease.try_acquire_or_renew()
    finally:
        lease.close()


def test_a_hanging_api_server_is_a_lease_error_within_the_timeout() -> None:
    server = RecordingHTTPServer(default=Reply(delay=10.0))
    server.start()
    lease = KubernetesLease(settings(server.url, "ctl-a", timeout=0.3), environ={})
    try:  # the configured 0.3 s timeout ended it, not the 10 s reply
        with pytest.raises(LeaseError, match=r"unreachable: .*\(read timeout=0\.[0-3]\d*\)"):
            lease.try_acquire_or_renew()
    finally:
        lease.close()
        server.stop()


def test_an_unreadable_answer_is_a_lease_error() -> None:
    server = RecordingHTTPServer(default=Reply(
        body=b'{"kind": "Lease", "spec": {"leaseDurationSeconds": "fifteen"}}',
        headers={"Content-Type": "application/json"}))
    server.start()
    lease = KubernetesLease(settings(server.url, "ctl-a"), environ={})
    try:
        with pytest.raises(LeaseError, match="unreadable answer"):
            lease.try_acquire_or_renew()
    finally:
        lease.close()
        server.stop()


def test_the_namespace_is_the_pods_own_unless_set(api: StubKubernetesAPI) -> None:
    ours = KubernetesLeaseSettings()
    assert lease_namespace(ours, {"POD_NAMESPACE": "ops"}) == "ops"
    assert lease_namespace(ours, {}) == "sn-monitor"
    assert lease_namespace(KubernetesLeaseSettings(namespace="ha"), {"POD_NAMESPACE": "x"}) == "ha"
    lease = KubernetesLease(settings(api.url, "ctl-a"), environ={"POD_NAMESPACE": "ops"})
    try:
        assert lease.try_acquire_or_renew() is True
    finally:
        lease.close()
    assert api.lease("ops", NAME)["spec"]["holderIdentity"] == "ctl-a"


def test_a_standby_does_not_log_every_retry(
        api: StubKubernetesAPI, candidates: tuple[KubernetesLease, KubernetesLease],
        caplog: pytest.LogCaptureFixture) -> None:
    a, b = candidates
    caplog.set_level(logging.INFO)
    assert a.try_acquire_or_renew() is True
    for _ in range(5):
        assert b.try_acquire_or_renew() is False
    assert [r for r in caplog.records if r.name == "leaderelection"] == []


def test_micro_time_has_six_digits_even_on_a_whole_second() -> None:
    import datetime as dt

    whole = dt.datetime(2024, 5, 1, 10, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert micro_time(whole) == "2024-05-01T08:00:00.000000Z"


def test_the_stub_refuses_a_stale_resource_version(
        api: StubKubernetesAPI, candidates: tuple[KubernetesLease, KubernetesLease]) -> None:
    a, _ = candidates
    assert a.try_acquire_or_renew() is True
    stale = api.lease(NS, NAME)
    assert a.try_acquire_or_renew() is True  # bumps the version
    reply = requests.put(api.url + PATH, json=stale, timeout=5)
    assert reply.status_code == 409
    assert reply.json()["reason"] == "Conflict"
    again = requests.post(api.url + PATH.rpartition("/")[0], json=stale, timeout=5)
    assert again.status_code == 409
    assert again.json()["reason"] == "AlreadyExists"


def test_the_elector_drives_it(api: StubKubernetesAPI,
                               candidates: tuple[KubernetesLease, KubernetesLease]) -> None:
    from sn_monitor.clock import ManualClock
    from sn_monitor.controller.ha.elector import Elector

    a, b = candidates
    first = Elector(a, settings(api.url, "ctl-a"), ManualClock())
    second = Elector(b, settings(api.url, "ctl-b"), ManualClock())
    assert first.try_to_lead() is True
    assert second.try_to_lead() is False
    assert b.holder() == "ctl-a"  # what the elector tells its observer
    first.check()  # renewed
    first.release()
    assert second.try_to_lead() is True
