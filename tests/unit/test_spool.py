from __future__ import annotations

import json
import logging

import pytest

from sn_monitor.agent.spool import ACK_FILE, EventSpool
from sn_monitor.clock import ManualClock
from sn_monitor.model import Event


def event(n: int, message: str = "") -> Event:
    return Event("xid", "nvml", 1_700_000_000.0 + n, message or f"Xid 13 #{n}", gpu=n % 8,
                 code=13)


def segments(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("events-"))


def test_append_pending_acknowledge(tmp_path):
    spool = EventSpool(tmp_path, clock=ManualClock())
    records = [spool.append(event(i)) for i in range(5)]
    assert [r.id for r in records] == [0, 1, 2, 3, 4]
    assert spool.pending_count == 5
    assert [r.id for r in spool.pending()] == [0, 1, 2, 3, 4]
    assert [r.id for r in spool.pending(limit=2)] == [0, 1]
    assert spool.pending()[0].message == "Xid 13 #0"
    spool.acknowledge(2)
    assert [r.id for r in spool.pending()] == [3, 4]
    assert spool.pending_count == 2
    assert json.loads((tmp_path / ACK_FILE).read_text()) == {"acknowledged_through": 2}
    spool.acknowledge(4)
    assert spool.pending() == []
    assert spool.pending_count == 0
    assert segments(tmp_path) == []  # fully acknowledged segments are deleted


def test_acknowledge_is_monotonic_and_clamped_to_what_exists(tmp_path):
    spool = EventSpool(tmp_path)
    spool.extend([event(i) for i in range(3)])
    spool.acknowledge(1)
    spool.acknowledge(0)  # an old reply: no effect
    assert [r.id for r in spool.pending()] == [2]
    spool.acknowledge(99)  # a confused controller cannot acknowledge the future
    assert spool.acknowledged_through == 2
    assert spool.append(event(3)).id == 3
    assert [r.id for r in spool.pending()] == [3]


def test_ids_and_pending_survive_a_restart(tmp_path):
    spool = EventSpool(tmp_path)
    spool.extend([event(i) for i in range(4)])
    spool.acknowledge(1)
    reopened = EventSpool(tmp_path)
    assert [r.id for r in reopened.pending()] == [2, 3]
    assert reopened.pending_count == 2
    assert reopened.append(event(9)).id == 4


def test_ids_continue_after_everything_was_acknowledged(tmp_path):
    spool = EventSpool(tmp_path)
    spool.extend([event(i) for i in range(3)])
    spool.acknowledge(2)
    assert segments(tmp_path) == []
    assert EventSpool(tmp_path).append(event(5)).id == 3


def test_torn_last_line_is_cut_and_appends_continue_cleanly(tmp_path, caplog):
    spool = EventSpool(tmp_path)
    spool.extend([event(i) for i in range(3)])
    [name] = segments(tmp_path)
    with open(tmp_path / name, "ab") as handle:
        handle.write(b'{"id":3,"kind":"xid","sou')  # the crash came mid-write
    with caplog.at_level(logging.WARNING):
        reopened = EventSpool(tmp_path)
    assert "torn last line" in caplog.text
    assert [r.id for r in reopened.pending()] == [0, 1, 2]
    assert reopened.append(event(3)).id == 3
    assert [r.id for r in EventSpool(tmp_path).pending()] == [0, 1, 2, 3]


def test_corrupt_ack_marker_resends_rather_than_loses(tmp_path):
    spool = EventSpool(tmp_path)
    spool.extend([event(i) for i in range(3)])
    spool.acknowledge(0)
    (tmp_path / ACK_FILE).write_text("{not json")
    assert [r.id for r in EventSpool(tmp_path).pending()] == [0, 1, 2]


def test_bound_drops_the_oldest_events_and_counts_them(tmp_path, caplog):
    clock = ManualClock()
    spool = EventSpool(tmp_path, max_bytes=4096, clock=clock, segment_bytes=1024)
    with caplog.at_level(logging.WARNING):
        for i in range(200):
            spool.append(event(i, message=f"event {i:03d} " + "x" * 60))
    assert spool.dropped_total > 0
    assert spool.size_bytes <= 4096
    pending = spool.pending()
    ids = [r.id for r in pending]
    assert ids == list(range(200 - len(ids), 200))  # the newest are kept, in order
    assert spool.pending_count == len(ids) == 200 - spool.dropped_total
    warnings = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(warnings) == 1  # rate-limited
    assert EventSpool(tmp_path, max_bytes=4096, segment_bytes=1024).next_id == 200


def test_acknowledged_records_are_not_counted_as_dropped(tmp_path):
    spool = EventSpool(tmp_path, max_bytes=4096, segment_bytes=1024)
    for i in range(20):
        spool.append(event(i, message="y" * 100))
    spool.acknowledge(spool.next_id - 1)
    for i in range(20):
        spool.append(event(i, message="y" * 100))
    assert spool.dropped_total == 0


def test_bad_sizes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="max_bytes"):
        EventSpool(tmp_path, max_bytes=10)
    with pytest.raises(ValueError, match="segment_bytes"):
        EventSpool(tmp_path, max_bytes=4096, segment_bytes=4096)
