"""The PostgreSQL test server (tests/postgres.py) and its fixtures do what the store's
tests rely on: fresh isolated databases, password auth over TCP, lost connections."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.conftest import ROOT, PgDatabase
from tests.postgres import USER, PostgresServer, reap_orphans


def test_a_fresh_database_takes_writes_and_reads(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE t (id integer PRIMARY KEY, name text NOT NULL)")
        conn.execute("INSERT INTO t VALUES (%s, %s), (%s, %s)", (1, "a", 2, "b"))
        conn.commit()
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT id, name FROM t ORDER BY id").fetchall() == [
            (1, "a"), (2, "b")]
        assert conn.execute("SELECT current_user").fetchone() == (USER,)


def test_the_server_keeps_its_durability_defaults(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            assert conn.execute(f"SHOW {setting}").fetchone() == ("on",)


def test_databases_are_isolated(postgres_server: PostgresServer, pg_database: PgDatabase) -> None:
    other = "t_isolation_other"
    other_dsn = postgres_server.create_database(other)
    try:
        with psycopg.connect(pg_database.dsn) as conn:
            conn.execute("CREATE TABLE only_here (x integer)")
            conn.commit()
        with psycopg.connect(other_dsn) as conn:
            row = conn.execute("SELECT to_regclass('only_here')").fetchone()
            assert row == (None,)
            assert conn.execute(
                "SELECT count(*) FROM information_schema.tables "
                "WHERE table_schema = 'public'").fetchone() == (0,)
    finally:
        postgres_server.drop_database(other)


def test_kill_connections_breaks_an_open_connection(pg_database: PgDatabase) -> None:
    conn = psycopg.connect(pg_database.dsn, autocommit=True)
    try:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert pg_database.server.kill_connections(pg_database.name) == 1
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        assert conn.closed
    finally:
        conn.close()
    with psycopg.connect(pg_database.dsn) as again:  # a new connection works
        assert again.execute("SELECT 1").fetchone() == (1,)


def test_tcp_needs_the_password(pg_database: PgDatabase) -> None:
    params = conninfo_to_dict(pg_database.dsn)
    assert params["host"] == "127.0.0.1"
    assert params["password"] == pg_database.server.password
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(make_conninfo(pg_database.dsn, password="wrong"), connect_timeout=10)
    without = {k: v for k, v in params.items() if k != "password"}
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(make_conninfo("", **without), connect_timeout=10,
                        passfile="/nonexistent")


def test_an_outage_and_a_crash_keep_committed_data(pg_database: PgDatabase) -> None:
    server = pg_database.server
    with psycopg.connect(pg_database.dsn) as conn:
        conn.execute("CREATE TABLE t (x integer)")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.commit()
    server.stop_server()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pg_database.dsn, connect_timeout=5)
    server.start_server()
    with psycopg.connect(pg_database.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (2)")
    server.restart(mode="immediate")  # a crash: the start replays the WAL
    with psycopg.connect(pg_database.dsn) as conn:
        assert conn.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]
    assert server.password not in server.log_text()


def test_a_server_left_by_a_killed_run_is_reaped(postgres_server: PostgresServer) -> None:
    script = ("import sys, time; from tests.postgres import PostgresServer; "
              "s = PostgresServer(); s.start(); print(s.tmpdir, flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        left = Path(child.stdout.readline().strip())
        assert (left / "data" / "postmaster.pid").exists()
    finally:
        child.kill()
        child.wait(timeout=10)
    assert left in reap_orphans()
    assert not left.exists()
    assert postgres_server.tmpdir is not None
    assert postgres_server.tmpdir.exists()  # this run's own server is left alone
