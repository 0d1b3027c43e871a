"""The store's jobs and recoveries tables (schema 2)."""

from __future__ import annotations

import sqlite3

from sn_monitor.controller.storage.schema import SCHEMA_VERSION
from sn_monitor.controller.storage.store import JobRow, RecoveryRow, Store


def test_a_version_1_database_is_migrated(tmp_path):
    path = tmp_path / "old.db"
    Store(path).close()
    db = sqlite3.connect(path)
    db.executescript("DROP TABLE jobs; DROP TABLE recoveries; DROP TABLE controller_lease;"
                     " DROP INDEX actions_owner; DROP INDEX actions_incident;"
                     " ALTER TABLE actions DROP COLUMN refusal;"
                     " ALTER TABLE actions DROP COLUMN owner; PRAGMA user_version=1;")
    db.close()
    store = Store(path)
    assert store.schema_version() == SCHEMA_VERSION == 5
    assert store.list_jobs() == []
    assert store.list_recoveries() == []
    store.close()
    indexes = {row[0] for row in sqlite3.connect(path).execute(
        "SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"actions_owner", "actions_incident"} <= indexes


def test_jobs_round_trip(open_store):
    store = open_store()
    row = JobRow(name="train", spec={"spec": {"replicas": 2}}, source="api", state="running",
                 created_at=1.0, updated_at=2.0, generation=3, failures=1,
                 nodes=("a", "b"), added=("b",), excluded=("c",), pool=("d",),
                 data={"request": None, "productive": 5.5})
    store.save_job(row)
    assert store.get_job("train") == row
    store.save_job(JobRow(name="other", spec={}, source="f.yaml", state="failed",
                          created_at=1.0, updated_at=1.0))
    assert [j.name for j in store.list_jobs()] == ["other", "train"]
    assert store.delete_job("train")
    assert not store.delete_job("train")
    assert store.get_job("train") is None
    store.close()


def test_recoveries_round_trip_and_filters(open_store):
    store = open_store()
    first = RecoveryRow(id="r1", job="train", generation=1, state="done", kind="fatal",
                        strategy="restart", fault_seen=10.0, created_at=10.0, updated_at=20.0,
                        failed_nodes=("a",), replacement_nodes=("s",), nodes=("s", "b"),
                        incident_ids=(7,), checkpoint_step=200, checkpoint_path="/c/200",
                        detected=11.0, evicted=12.0, restore_sent=13.0, resumed=20.0,
                        finished_at=20.0, actions={"evict:a": "x1", "restore": "x2"},
                        data={"planned": True}, history=({"event": "detected"},))
    second = RecoveryRow(id="r2", job="train", generation=2, state="restoring",
                         kind="lost", strategy="restart", fault_seen=30.0, created_at=30.0,
                         updated_at=30.0)
    other = RecoveryRow(id="r3", job="other", generation=1, state="evicting", kind="hang",
                        strategy="elastic", fault_seen=40.0, created_at=40.0, updated_at=40.0)
    for row in (first, second, other):
        store.save_recovery(row)
    assert store.get_recovery("r1") == first
    assert [r.id for r in store.list_recoveries()] == ["r1", "r2", "r3"]
    assert [r.id for r in store.list_recoveries(job="train")] == ["r1", "r2"]
    assert [r.id for r in store.list_recoveries(states=["restoring", "evicting"])] == [
        "r2", "r3"]
    assert store.list_recoveries(states=[]) == []
    assert [r.id for r in store.list_recoveries(limit=2)] == ["r2", "r3"]
    store.save_recovery(RecoveryRow(**{**first.__dict__, "state": "failed"}))
    assert store.get_recovery("r1").state == "failed"
    store.close()
