"""The store's schema and its migrations: a database written by any earlier version opens,
keeps its rows and ends up with exactly the tables, columns and indexes of a new one, in
SQLite and PostgreSQL; and the schema itself is pinned by a golden file.

A deliberate schema change is a new step at the end of ``schema.MIGRATIONS``: regenerate
the golden file with ``UPDATE_GOLDEN=1 pytest tests/unit/test_store_schema.py`` and read
the diff (only additions belong in it).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from sn_monitor.controller.audit import ActionRequest
from sn_monitor.controller.storage.database.postgres import PostgresDatabase
from sn_monitor.controller.storage.database.sqlite import SQLiteDatabase
from sn_monitor.controller.storage.schema import MIGRATIONS, SCHEMA_VERSION
from sn_monitor.controller.storage.store import Store
from tests.conftest import FIXTURES, PgDatabase

GOLDEN = FIXTURES / "golden" / "store-schema.sql"


def sqlite_schema(path: Path) -> list[tuple[str, str, str, str | None]]:
    """Every table and index of a SQLite file with the SQL that made it."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")
        return [tuple(row) for row in rows]


def sqlite_at(path: Path, version: int) -> Path:
    """A SQLite file that an sn-monitor of schema ``version`` left behind."""
    db = SQLiteDatabase(path)
    db.migrate(MIGRATIONS[:version], version)
    db.close()
    return path


def test_one_migration_step_per_version() -> None:
    assert len(MIGRATIONS) == SCHEMA_VERSION == 5


def test_the_schema_matches_its_golden_file(tmp_path: Path) -> None:
    Store(tmp_path / "fresh.db").close()
    text = "".join(f"-- {kind} {name} on {table}\n{sql};\n\n"
                   for kind, name, table, sql in sqlite_schema(tmp_path / "fresh.db")
                   if sql is not None)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_a_sqlite_file_of_every_version_migrates_to_the_new_schema(
        tmp_path: Path, version: int) -> None:
    Store(tmp_path / "fresh.db").close()
    old = sqlite_at(tmp_path / "old.db", version)
    assert SQLiteDatabase(old).schema_version() == version
    store = Store(old)
    assert store.schema_version() == SCHEMA_VERSION
    store.close()
    assert sqlite_schema(old) == sqlite_schema(tmp_path / "fresh.db")


def test_a_version_1_file_keeps_its_rows(tmp_path: Path) -> None:
    old = sqlite_at(tmp_path / "old.db", 1)
    with sqlite3.connect(old) as conn:
        conn.execute("INSERT INTO nodes (name, first_seen, last_seen) VALUES ('n1', 1, 2)")
        conn.execute(
            "INSERT INTO actions (id, key, action, node, incident_id, severity, reason,"
            " requested_by, state, created_at, updated_at) VALUES ('a1', 'k1', 'cordon',"
            " 'n1', 7, 'critical', 'fatal xid 79', 'rules', 'succeeded', 10, 11)")
    conn.close()
    store = Store(old)
    node = store.get_node("n1")
    assert node is not None
    assert node.state == "healthy"
    action = store.get_action("a1")
    assert action is not None
    assert (action.state, action.refusal, action.owner) == ("succeeded", None, None)
    assert [a.id for a in store.list_actions(incident_id=7)] == ["a1"]
    assert store.list_jobs() == []
    assert store.lease() is None
    store.close()


def pg_schema(dsn: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """Every column (with its type, default, nullability) and index of a database."""
    db = PostgresDatabase(dsn)
    try:
        columns = db.query(
            "SELECT table_name, column_name, data_type, is_nullable, column_default,"
            " is_identity, identity_generation FROM information_schema.columns"
            " WHERE table_schema = 'public' ORDER BY table_name, ordinal_position")
        indexes = db.query("SELECT tablename, indexname, indexdef FROM pg_indexes"
                           " WHERE schemaname = 'public' ORDER BY indexname")
    finally:
        db.close()
    return [tuple(r.values()) for r in columns], [tuple(r.values()) for r in indexes]


@pytest.mark.parametrize("version", [1, SCHEMA_VERSION - 1])
def test_a_postgresql_database_of_an_older_version_migrates_to_the_new_schema(
        pg_database: PgDatabase, version: int) -> None:
    old = PostgresDatabase(pg_database.dsn)
    old.migrate(MIGRATIONS[:version], version)
    old.close()
    store = Store(PostgresDatabase(pg_database.dsn))
    assert store.schema_version() == SCHEMA_VERSION
    record, new = store.record_action(ActionRequest(
        id="a1", key="k1", action="cordon", node="n1", reason="fatal xid 79",
        created_seconds=100.0, owner="recovery-1"))
    assert new
    assert store.list_actions(owner="recovery-1") == [record]
    store.close()
    fresh = f"{pg_database.name}_fresh"
    Store(PostgresDatabase(pg_database.server.create_database(fresh))).close()
    try:
        assert pg_schema(pg_database.dsn) == pg_schema(pg_database.server.dsn(fresh))
    finally:
        pg_database.server.drop_database(fresh)
