"""A recovery as the store keeps it: typed both ways, and rows from before the typed model."""

from __future__ import annotations

import msgspec
import pytest

from sn_monitor.controller.jobs.recovery_record import (
    CheckpointRef,
    FailedNode,
    Recovery,
    from_row,
    to_row,
)
from sn_monitor.controller.storage.store import RecoveryRow, Store


def _recovery() -> Recovery:
    rec = Recovery(id="r1", job="train", state="restoring", kind="fatal", strategy="restart",
                   generation=3, fault_seen=10.0, detected=11.0, created_at=11.0,
                   updated_at=12.0, failed=(FailedNode("n2", "fatal", (7, 9), "done"),
                                            FailedNode("n5", "lost", (8,), "healed")),
                   order=("n1", "n2", "n5"), target=3, planned=True, nodes=("n1", "s1", "n5"),
                   replacements=("s1",), checkpoint=CheckpointRef(200, "/c/200"),
                   restore_attempt=2, steps={"evict:n2": "a1", "restore:2": "a2"})
    return rec.noted(12.0, "planned", "restart: 3 nodes, spares s1")


def test_a_recovery_round_trips_through_the_store(tmp_path) -> None:
    store = Store(tmp_path / "db")
    rec = _recovery()
    store.save_recovery(to_row(rec))
    again = from_row(store.get_recovery("r1"))
    assert again == rec
    assert again.out_nodes == ("n2",)
    assert again.incident_ids == (7, 9, 8)
    assert again.restore_step == "restore:2"
    row = store.get_recovery("r1")
    assert (row.failed_nodes, row.checkpoint_step, row.actions["restore:2"]) == (
        ("n2", "n5"), 200, "a2")
    store.close()


def test_a_row_from_before_the_typed_model_is_read() -> None:
    row = RecoveryRow(id="old", job="train", generation=2, state="restoring", kind="lost",
                      strategy="restart", fault_seen=1.0, created_at=1.0, updated_at=2.0,
                      failed_nodes=("n3",), incident_ids=(4,), nodes=("n1", "s1"),
                      actions={"evict:n3": "x", "restore:2": "y"},
                      data={"planned": True, "ckpt_before": 100, "restore_seq": 2,
                            "evict_tries": {}, "handled": [[4, "n3"]], "target": 2},
                      history=({"at": 1.0, "state": "detected", "event": "detected",
                                "message": "lost fault on n3"},))
    rec = from_row(row)
    assert rec.failed == (FailedNode("n3", "lost", (4,), "done"),)
    assert (rec.checkpoint_before, rec.restore_attempt, rec.restore_step) == (100, 2,
                                                                             "restore:2")
    assert rec.history[0].event == "detected"


def test_a_row_that_is_not_a_recovery_is_refused() -> None:
    row = RecoveryRow(id="bad", job="train", generation=1, state="exploded", kind="fatal",
                      strategy="restart", fault_seen=1.0, created_at=1.0, updated_at=1.0)
    with pytest.raises(msgspec.ValidationError):
        from_row(row)
