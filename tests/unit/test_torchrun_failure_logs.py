"""The kept torchrun failure logs (tests/fixtures/joblogs/torchrun/) show their failures.

Each mode's logs are a real run of ``examples/pytorch/`` under torchrun
(``examples/pytorch/capture_failures.py``): the checks here are the evidence an analysis
has to work from (the root rank's own error, the others' gloo cascade, torchrun's exit
codes), so a recapture that lost it fails. ``tests/e2e/test_torchrun_failures.py`` runs
the same modes for real and asks ``sn-monitor logs analyze`` for the root cause.
"""

from __future__ import annotations

import pytest

from tests.support.torchrun_failures import (
    FIXTURES,
    MODES,
    ROOT,
    WORLD,
    assert_evidence,
    expected,
)


def test_every_failure_mode_has_its_logs_kept() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == sorted(MODES)


@pytest.mark.parametrize("mode", MODES)
def test_the_kept_logs_show_the_failing_rank_and_the_cascade(mode: str) -> None:
    assert_evidence(mode, FIXTURES / mode)


def test_each_mode_fails_a_rank_of_its_own_and_none_is_rank_0() -> None:
    # an analysis that names the first file, or always the same rank, cannot pass
    ranks = [expected(FIXTURES / mode).root_rank for mode in MODES]
    assert 0 not in ranks
    assert len(set(ranks)) > 1


def test_the_kept_logs_name_no_path_or_host_of_the_machine_that_ran_them() -> None:
    kept = [path for path in FIXTURES.rglob("*") if path.is_file()]
    assert len(kept) >= len(MODES) * (2 + 2 * WORLD)  # console, expected, each rank's 2 logs
    for path in kept:
        text = path.read_text()
        assert str(ROOT) not in text, path
        assert "/tmp/tmp" not in text, path
