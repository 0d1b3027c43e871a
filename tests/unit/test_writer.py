"""The controller's one writer: in order, batched, acknowledged only once durable."""

from __future__ import annotations

import threading
from pathlib import Path

from sn_monitor.controller.storage.health import StoreHealth
from sn_monitor.controller.storage.store import Store
from sn_monitor.controller.storage.writer import StoreWriter
from sn_monitor.model import EventRecord
from tests.support.disk import FullDisk

WAIT = 30.0


def _event(i: int) -> EventRecord:
    return EventRecord(id=i, kind="xid", source="nvml", time_seconds=1000.0 + i, gpu=0,
                       code=79, message=f"xid {i}")


def test_inline_each_write_runs_at_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    writer = StoreWriter(store, StoreHealth())
    writer.events("n1", "i1", [_event(0), _event(1)], 2000.0)
    assert writer.stored_through("n1", "i1") == 1
    assert writer.stored_through("n1", "another instance") == -1
    assert store.count_events("n1") == 2


def test_threaded_writes_run_in_order_and_events_count_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    stored: list[int] = []
    writer = StoreWriter(store, StoreHealth(), on_stored=lambda e: stored.extend(x.id for x in e))
    stop = threading.Event()
    thread = threading.Thread(target=writer.run, args=(stop,), name="test-writer")
    thread.start()
    order: list[str] = []
    try:
        writer.call(lambda: order.append("first"))
        for i in range(5):  # a resent event is stored, and counted, once
            writer.events("n1", "i1", [_event(i), _event(i + 1)], 2000.0)
        writer.call(lambda: order.append("last"))
        assert writer.flush(WAIT)
    finally:
        stop.set()
        thread.join(WAIT)
    assert not thread.is_alive()
    assert order == ["first", "last"]
    assert writer.stored_through("n1", "i1") == 5
    assert sorted(stored) == [0, 1, 2, 3, 4, 5]
    assert store.count_events("n1") == 6
    assert writer.depth == 0


def test_a_store_that_takes_no_writes_acknowledges_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    health = StoreHealth()
    writer = StoreWriter(store, health)
    with FullDisk(store):
        writer.events("n1", "i1", [_event(7)], 2000.0)
    assert writer.stored_through("n1", "i1") == -1  # the agent keeps it spooled
    assert "full" in (health.error or "")
    writer.events("n1", "i1", [_event(7)], 2001.0)  # sent again, once the disk has room
    assert writer.stored_through("n1", "i1") == 7
