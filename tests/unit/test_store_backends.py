"""What both store backends must do alike beyond test_store: events, meta, the lease and
its fence; and what only PostgreSQL can do wrong: a lost connection, a stopped server,
two controllers migrating at once, a password that must not leak."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.storage.schema import SCHEMA_VERSION
from sn_monitor.controller.storage.store import (
    Fenced,
    JobRow,
    Store,
    StoreUnavailable,
)
from sn_monitor.model import EventRecord

Opener = Callable[[], Store]


def request(n: int) -> ActionRequest:
    return ActionRequest(id=f"a{n}", key=f"k{n}", action="cordon", node="n1",
                         reason="fatal xid 79", created_seconds=100.0)


def xid(event_id: int, at: float = 50.0) -> EventRecord:
    return EventRecord(id=event_id, kind="xid", source="nvml", time_seconds=at, gpu=0,
                       code=79, message="GPU has fallen off the bus")


def test_events_are_stored_once_and_read_back(open_store: Opener) -> None:
    store = open_store()
    assert store.record_events("n1", [xid(1), xid(2)], at=60.0) == 2
    assert store.record_events("n1", [xid(2), xid(3)], at=61.0) == 1  # a retry of 2
    assert store.record_events("n1", [xid(2**63 - 1)], at=62.0) == 1  # 64-bit ids
    assert store.count_events() == 4
    assert store.count_events("n2") == 0
    newest = store.list_events(node="n1", limit=2)
    assert [e["event_id"] for e in newest] == [2**63 - 1, 3]
    assert set(newest[0]) == {"id", "node", "event_id", "kind", "source", "time",
                              "received_at", "gpu", "code", "pci_bus_id", "device",
                              "message"}
    assert newest[0]["code"] == 79
    assert newest[0]["received_at"] == 62.0


def test_meta_round_trip(open_store: Opener) -> None:
    store = open_store()
    assert store.get_meta("breaker") is None
    store.set_meta("breaker", "{}")
    store.set_meta("breaker", '{"open": true}')
    assert store.get_meta("breaker") == '{"open": true}'
    store.delete_meta("breaker")
    assert store.get_meta("breaker") is None


def test_actions_with_one_creation_time_keep_insertion_order(open_store: Opener) -> None:
    store = open_store()
    for n in (3, 1, 2):  # ids out of order, one creation time: only insertion orders them
        store.record_action(request(n))
    assert [a.id for a in store.list_actions()] == ["a2", "a1", "a3"]
    assert [a.id for a in store.actions_in_states(["pending"])] == ["a3", "a1", "a2"]


def test_a_second_connection_sees_the_same_decisions(open_store: Opener) -> None:
    first, second = open_store(), open_store()
    assert second.schema_version() == SCHEMA_VERSION
    first.record_action(request(1))
    first.save_job(JobRow(name="train", spec={}, source="api", state="running",
                          created_at=1.0, updated_at=1.0))
    assert second.get_action("a1") is not None
    assert second.get_job("train") is not None
    record, new = second.record_action(request(1))
    assert not new
    assert record.id == "a1"


# ------------------------------------------------------------------ the lease


def test_the_lease_is_taken_renewed_and_expires(open_store: Opener) -> None:
    a, b = open_store(), open_store()
    assert a.lease() is None
    got = a.acquire_lease("ctl-a", now=100.0, duration=15.0)
    assert got is not None
    assert (got.holder, got.epoch, got.expires_at) == ("ctl-a", 1, 115.0)
    assert b.acquire_lease("ctl-b", now=101.0, duration=15.0) is None  # fresh: refused
    renewed = a.acquire_lease("ctl-a", now=110.0, duration=15.0)
    assert renewed is not None
    assert renewed.epoch == 1
    assert renewed.acquired_at == 100.0
    assert b.acquire_lease("ctl-b", now=124.9, duration=15.0) is None  # 125 is the end
    taken = b.acquire_lease("ctl-b", now=125.0, duration=15.0)
    assert taken is not None
    assert (taken.holder, taken.epoch) == ("ctl-b", 2)
    assert a.acquire_lease("ctl-a", now=126.0, duration=15.0) is None  # lost for good
    lease = a.lease()
    assert lease is not None
    assert (lease.holder, lease.epoch) == ("ctl-b", 2)


def test_release_hands_over_at_once_and_force_takes_a_fresh_lease(open_store: Opener
                                                                   ) -> None:
    a, b = open_store(), open_store()
    assert a.acquire_lease("ctl-a", now=100.0, duration=15.0) is not None
    assert not b.release_lease("ctl-b", now=101.0)  # not b's to release
    assert a.release_lease("ctl-a", now=101.0)
    taken = b.acquire_lease("ctl-b", now=101.0, duration=15.0)
    assert taken is not None
    assert taken.epoch == 2
    # Kubernetes decided (its own Lease): the store's row follows, with a new epoch
    forced = a.acquire_lease("ctl-a2", now=102.0, duration=15.0, force=True)
    assert forced is not None
    assert (forced.holder, forced.epoch) == ("ctl-a2", 3)


def test_candidates_racing_for_a_free_lease_get_one_winner(open_store: Opener) -> None:
    stores = [open_store() for _ in range(4)]
    winners: list[str] = []
    barrier = threading.Barrier(len(stores))

    def candidate(i: int) -> None:
        barrier.wait(timeout=10)
        if stores[i].acquire_lease(f"ctl-{i}", now=100.0, duration=15.0) is not None:
            winners.append(f"ctl-{i}")

    threads = [threading.Thread(target=candidate, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(winners) == 1, winners
    lease = stores[0].lease()
    assert lease is not None
    assert lease.holder == winners[0]
    assert lease.epoch == 1


def test_a_fenced_store_refuses_every_write_once_another_took_over(open_store: Opener
                                                                     ) -> None:
    old, new = open_store(), open_store()
    granted = old.acquire_lease("ctl-a", now=100.0, duration=15.0)
    assert granted is not None
    old.fence("ctl-a", granted.epoch)
    old.record_action(request(1))  # while it holds the lease, it writes
    taken = new.acquire_lease("ctl-b", now=116.0, duration=15.0)
    assert taken is not None
    new.fence("ctl-b", taken.epoch)

    with pytest.raises(Fenced, match="held by ctl-b"):
        old.record_action(request(2))
    with pytest.raises(StoreUnavailable):  # Fenced is one: callers refuse to act
        old.update_action("a1", at=117.0, state="running")
    with pytest.raises(Fenced):
        old.open_incident("fatal-xid", "n1", severity="critical", message="xid 79",
                          observed_at=1.0, detected_at=2.0)
    with pytest.raises(Fenced):
        old.set_cordoned_by_us("n1", True, at=117.0)
    assert new.get_action("a2") is None
    assert new.get_action("a1").state == "pending"  # type: ignore[union-attr]
    assert new.list_incidents() == []
    new.record_action(request(3))  # the new active writes
    assert old.get_action("a3") is not None  # and the old one may still read


# ------------------------------------------------------------------ PostgreSQL only


@pytest.fixture
def pg(postgres_server, pg_database):
    from sn_monitor.controller.storage.database.postgres import PostgresDatabase

    stores: list[Store] = []

    def open_one() -> Store:
        stores.append(Store(PostgresDatabase(pg_database.dsn)))
        return stores[-1]

    yield postgres_server, pg_database, open_one
    for s in stores:
        s.close()


def test_a_lost_connection_is_unavailable_once_then_reconnects(pg) -> None:
    server, database, open_one = pg
    store = open_one()
    store.record_action(request(1))
    assert server.kill_connections(database.name) >= 1
    with pytest.raises(StoreUnavailable, match="store postgresql://"):
        store.record_action(request(2))
    _, new = store.record_action(request(2))  # connected again
    assert new
    assert store.get_action("a1") is not None


def test_a_stopped_server_is_unavailable_and_the_store_comes_back(pg) -> None:
    server, _database, open_one = pg
    store = open_one()
    server.stop_server()
    try:
        with pytest.raises(StoreUnavailable):
            store.record_action(request(1))
        with pytest.raises(StoreUnavailable):
            store.list_actions()
    finally:
        server.start_server()
    store.record_action(request(1))
    assert [a.id for a in store.list_actions()] == ["a1"]


def test_the_password_is_in_no_name_or_error(pg) -> None:
    from sn_monitor.controller.storage.database.postgres import PostgresDatabase

    _server, database, open_one = pg
    password = database.dsn.split("password=")[1].split()[0]
    store = open_one()
    assert password not in store.path
    assert store.path.startswith("postgresql://sn@")
    wrong = database.dsn.replace(password, password[::-1])
    with pytest.raises(StoreUnavailable) as err:
        PostgresDatabase(wrong)
    assert password not in str(err.value)
    assert password[::-1] not in str(err.value)
    with pytest.raises(Exception) as bad:  # noqa: PT011 (any error, but no secret in it)
        PostgresDatabase(f"host=127.0.0.1 password={password} port=")
    assert password not in str(bad.value)


def test_two_controllers_starting_together_migrate_once(pg) -> None:
    _, _, open_one = pg
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def start() -> None:
        barrier.wait(timeout=10)
        try:
            open_one()
        except BaseException as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert open_one().schema_version() == SCHEMA_VERSION
