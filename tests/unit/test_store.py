"""The controller's store on SQLite and PostgreSQL: dedup, idempotency, reopen, failures."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from sn_monitor.controller.audit import ActionRecord, ActionRequest
from sn_monitor.controller.storage.schema import SCHEMA_VERSION
from sn_monitor.controller.storage.store import Store, StoreError, StoreUnavailable


@pytest.fixture
def store(open_store):
    """A store on SQLite, then on PostgreSQL (the same tests on both backends)."""
    return open_store()


def request(n: int = 1, key: str | None = None, **kw) -> ActionRequest:
    fields = {"action": "cordon", "node": "node-1", "reason": "fatal xid 79"} | kw
    return ActionRequest(id=f"a{n}", key=key or f"k{n}", **fields)


def test_wal_mode_and_schema_version(tmp_path: Path) -> None:
    store = Store(tmp_path / "state" / "controller.db")
    assert store.db.journal_mode == "wal"  # type: ignore[attr-defined]
    assert store.schema_version() == SCHEMA_VERSION
    with sqlite3.connect(store.path) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer"):
        Store(path)


def test_node_upsert_and_transitions(store: Store) -> None:
    store.upsert_node("node-1", {"rack": "r1"}, 100.0)
    store.upsert_node("node-1", {"rack": "r2"}, 110.0)
    node = store.get_node("node-1")
    assert node is not None
    assert (node.labels, node.first_seen, node.last_seen, node.state) == (
        {"rack": "r2"}, 100.0, 110.0, "healthy")
    assert store.set_node_state("node-1", "lost", "no heartbeat for 10s", 120.0)
    assert not store.set_node_state("node-1", "lost", "still none", 121.0)
    assert store.set_node_state("node-1", "healthy", "reporting again", 130.0)
    moves = [(t.from_state, t.to_state, t.at) for t in store.transitions("node-1")]
    assert moves == [("healthy", "lost", 120.0), ("lost", "healthy", 130.0)]
    assert store.get_node("nope") is None
    store.set_cordoned_by_us("node-2", True, 140.0)
    assert [n.name for n in store.list_nodes()] == ["node-1", "node-2"]
    node2 = store.get_node("node-2")
    assert node2 is not None
    assert node2.cordoned_by_us


def test_incidents_dedupe_while_open(store: Store) -> None:
    args = {"severity": "critical", "message": "87 C", "observed_at": 9.0, "detected_at": 10.0}
    first = store.open_incident("gpu-overheat", "node-1", "gpu3", gpu=3, value=87.0, **args)
    again = store.open_incident("gpu-overheat", "node-1", "gpu3", **args)
    other = store.open_incident("gpu-overheat", "node-1", "gpu4", **args)
    assert first == again != other
    assert store.open_incident_count() == 2
    assert store.close_incident("gpu-overheat", "node-1", "gpu3", 20.0) == first
    assert store.close_incident("gpu-overheat", "node-1", "gpu3", 21.0) is None
    incident = store.get_incident(first)
    assert incident is not None
    assert (incident.status, incident.closed_at, incident.value) == ("closed", 20.0, 87.0)
    # the fault comes back: a new incident, not the closed one reopened
    assert store.open_incident("gpu-overheat", "node-1", "gpu3", **args) not in (first, other)
    assert len(store.list_incidents(status="open")) == 2
    assert len(store.list_incidents(node="node-1")) == 3
    assert store.list_incidents(node="node-9") == []


def test_action_idempotency_key(store: Store) -> None:
    record, created = store.record_action(request(1), "pending", "", at=50.0)
    assert created
    assert record.state == "pending"
    assert record.created_at == 50.0
    again, created = store.record_action(request(2, key="k1"), "pending", "")
    assert not created
    assert again == record  # the first one, untouched
    assert store.get_action("a2") is None


def test_action_id_reused_with_another_key_is_an_error(store: Store) -> None:
    store.record_action(request(1))
    with pytest.raises(StoreError, match="already used"):
        store.record_action(request(1, key="other"))


def test_record_round_trips_the_request(store: Store) -> None:
    req = request(1, action="throttle", gpu=2, rule="gpu-overheat", incident_id=7,
                  severity="critical", labels={"rack": "r1"}, params={"power_fraction": 0.7},
                  requested_by="rules", created_seconds=5.0)
    record, _ = store.record_action(req)
    assert record.to_request() == req
    assert ActionRecord.from_request(req, "pending", "", 5.0) == record


def test_update_action_and_queries(store: Store) -> None:
    store.record_action(request(1), at=1.0)
    store.record_action(request(2, node="node-2"), at=2.0)
    updated = store.update_action("a1", at=3.0, state="running", attempts=1,
                                  next_attempt_at=None)
    assert (updated.state, updated.attempts, updated.updated_at) == ("running", 1, 3.0)
    done = store.update_action("a1", at=4.0, state="succeeded", outcome_message="cordoned",
                               outcome={"api": "ok"})
    assert done.final
    assert done.outcome == {"api": "ok"}
    assert done.attempts == 1
    with pytest.raises(StoreError):
        store.update_action("a1", at=5.0, state="running", expect_state="pending")
    with pytest.raises(ValueError, match="unknown action state"):
        store.update_action("a1", at=5.0, state="bogus")  # type: ignore[arg-type]
    assert [r.id for r in store.list_actions()] == ["a2", "a1"]
    assert [r.id for r in store.list_actions(node="node-2")] == ["a2"]
    assert [r.id for r in store.list_actions(state="succeeded")] == ["a1"]
    assert [r.id for r in store.actions_in_states(["pending", "running"])] == ["a2"]


def test_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    first = Store(path)
    first.record_action(request(1), at=1.0)
    first.update_action("a1", at=2.0, state="running", attempts=1)
    first.open_incident("node-lost", "node-1", severity="critical", message="gone",
                        observed_at=1.0, detected_at=1.5)
    first.set_meta("breaker", '{"open": true}')
    first.close()
    second = Store(path)
    try:
        record = second.get_action("a1")
        assert record is not None
        assert (record.state, record.attempts) == ("running", 1)
        assert second.open_incident_count() == 1
        assert second.get_meta("breaker") == '{"open": true}'
        second.delete_meta("breaker")
        assert second.get_meta("breaker") is None
    finally:
        second.close()


def test_read_only_database_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    Store(path).close()
    # chmod does not stop root; a read-only open does, for every user
    ro = Store(f"file:{path}?mode=ro")
    try:
        assert ro.get_action("a1") is None  # reading still works
        with pytest.raises(StoreUnavailable, match="readonly"):
            ro.record_action(request(1))
    finally:
        ro.close()


def test_path_that_cannot_exist_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailable):
        Store(blocker / "controller.db")


def test_full_disk_is_unavailable(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db", max_bytes=128 * 1024)
    try:
        with pytest.raises(StoreUnavailable, match="full"):  # noqa: PT012
            for n in range(10_000):
                store.record_action(request(n, reason="x" * 2000))
        # a failed write leaves the store usable for reads and the data consistent
        assert store.get_action("a0") is not None
    finally:
        store.close()


def test_shared_between_threads(store: Store) -> None:
    def worker(base: int) -> None:
        for n in range(base, base + 25):
            store.record_action(request(n))
            store.update_action(f"a{n}", at=1.0, state="running")

    threads = [threading.Thread(target=worker, args=(i * 100,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store.actions_in_states(["running"])) == 100
