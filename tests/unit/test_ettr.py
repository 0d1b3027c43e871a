"""ETTR (sn_monitor.ettr): a known history of steps, saves, a stall and a restart, by hand."""

from __future__ import annotations

import pytest

from sn_monitor.controller.jobs.progress import JobProgress
from sn_monitor.ettr import TrainingLedger, effective_training_ratio
from tests.support.ettr_history import END, KEPT, STEP, history

T0 = 1000.0


@pytest.mark.parametrize("restore", ["in-place", "generation"])
def test_ettr_of_a_known_history_equals_the_hand_computation(restore: str) -> None:
    """``in-place``: the rank's step goes back (its launcher restarted it); ``generation``:
    the controller restored the job (a new generation of ranks)."""
    p = JobProgress(max_ranks=8)
    for kind, step, value in history():
        if kind == "step":
            p.update(0, "n0", 1, [(step, T0 + value)], STEP, T0 + value)
        elif kind == "save":
            p.saved(step, value)
        elif restore == "generation":
            p.reset_ranks()
    assert p.ledger.started == T0
    assert p.frontier == 60
    assert KEPT == 590.0
    assert p.ledger.productive == pytest.approx(KEPT, abs=1e-6)
    assert effective_training_ratio(p.ledger.productive, END) == pytest.approx(
        590.0 / 1155.0, abs=1e-6)


def test_a_restore_older_than_the_advances_kept_goes_back_by_the_redone_steps() -> None:
    ledger = TrainingLedger(kept=4)
    for s in range(1, 11):
        ledger.reached(s, T0 + STEP * s, STEP)
    ledger.resumed(3, T0 + 500.0, STEP)  # steps 4..10 redone: 7 steps of 10 s
    assert ledger.productive == pytest.approx(90.0 - 70.0)
    assert ledger.frontier == 3


def test_a_save_in_a_stalled_gap_is_not_taken_off_twice() -> None:
    ledger = TrainingLedger()
    ledger.reached(1, T0, STEP)
    ledger.reached(2, T0 + 60.0, STEP)  # 60 s for a step: only its 10 s count
    ledger.saved(1, 45.0)               # a 45 s synchronous save was most of that stall
    assert ledger.productive == pytest.approx(STEP)


def test_the_ratio_is_bounded_and_undefined_without_wall_time() -> None:
    assert effective_training_ratio(10.0, 0.0) is None
    assert effective_training_ratio(12.0, 10.0) == 1.0
    assert effective_training_ratio(-1.0, 10.0) == 0.0
    assert effective_training_ratio(5.0, 10.0) == pytest.approx(0.5)
