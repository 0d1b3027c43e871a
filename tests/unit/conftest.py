"""Fixtures several unit test modules share."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sn_monitor.controller.api.app import ControllerApp, build_app
from sn_monitor.controller.security.auth import TokenBook
from sn_monitor.controller.storage.store import Store, StoreError
from tests.support.api import Api, make_api, write_tokens
from tests.support.harness import HOT_RULE, Harness, make_harness, rules_from
from tests.support.report_lane import MAX_BODY
from tests.support.tls import Server


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    """The controller's app around a real controller, with tokens of every role.

    A module that means another API (a stub Kubernetes one) defines its own ``api``.
    """
    client, h = make_api(tmp_path)
    with client.client:
        yield client
    h.controller.close()
    h.store.close()


@pytest.fixture
def app(harness: Harness, tmp_path: Path) -> ControllerApp:
    """The controller's app around ``harness``, tokens of every role, a MAX_BODY limit.

    A module that means another app defines its own ``app``.
    """
    return build_app(harness.controller, TokenBook.load(write_tokens(tmp_path)), MAX_BODY)


@pytest.fixture
def lane_server(app: ControllerApp) -> Iterator[Server]:
    """``app`` served by uvicorn with the reports' lane, in a thread, on 127.0.0.1."""
    s = Server(app)
    yield s
    s.stop()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    """A controller with the gpu-hot rule (HOT_RULE), its store and fake drivers.

    A module that means other rules defines its own ``harness``.
    """
    h = make_harness(tmp_path, rules_from(HOT_RULE))
    yield h
    h.controller.close()
    h.store.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path
               ) -> Iterator[Callable[[], Store]]:
    """Opens stores on one database: a SQLite file, or a fresh real PostgreSQL database.

    Every call opens another connection to the same database (two controllers, or one
    restarted); all are closed at the end. Tests of behaviour both backends must share
    take this fixture, so the same schema and queries run on both.
    """
    opened: list[Store] = []
    if request.param == "sqlite":
        def where() -> Path:
            return tmp_path / "state" / "controller.db"
        opener: Callable[[], Store] = lambda: Store(where())  # noqa: E731
    else:
        from sn_monitor.controller.storage.database.postgres import PostgresDatabase

        dsn: str = request.getfixturevalue("pg_dsn")
        opener = lambda: Store(PostgresDatabase(dsn))  # noqa: E731

    def open_one() -> Store:
        store = opener()
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        with contextlib.suppress(StoreError):
            store.close()
