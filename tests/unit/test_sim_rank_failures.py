"""The demo rank's failures: what a rank told to fail raises, and the peers' coupling.

A rank signalled (the demo's ``rank-error``) raises at its next step what a real job
raises (an ``IndexError`` out of its batch lookup, PyTorch's uncorrectable ECC error);
the real traceback Python prints is recognised as the failure it is. With ``--peers``, a
rank whose peer ended by itself fails as gloo does, unless the launcher is stopping the
generation on purpose.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from sn_monitor.joblog.recognition import Recognizer, recognise_lines
from sn_monitor.sim.launcher import STOPPING, signal_rank
from sn_monitor.sim.train import Peers, fail_as_told

RECOGNIZER = Recognizer()


def printed(kind: str) -> list[str]:
    """The lines Python prints for the uncaught failure of ``kind``."""
    with pytest.raises((IndexError, RuntimeError)) as caught:
        fail_as_told(kind, step=7)
    return "".join(traceback.format_exception(caught.value)).splitlines()


@pytest.mark.parametrize(("kind", "category", "line"), [
    ("app-bug", "app-bug", "IndexError: list index out of range"),
    ("ecc-error", "ecc-error", "RuntimeError: CUDA error: uncorrectable ECC error encountered"),
])
def test_a_told_failure_prints_what_its_category_is_recognised_from(
        kind: str, category: str, line: str) -> None:
    lines = printed(kind)
    assert line in lines
    found = recognise_lines(RECOGNIZER, "gen0-rank3-sim-0003.log", lines, year=2026)
    first = found[0]
    assert (first.category, first.root_candidate, first.text) == (category, True, line)


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_peer_that_ended_by_itself_fails_the_rank_as_gloo_does(tmp_path: Path) -> None:
    now = [0.0]
    peers = Peers(tmp_path, rank=0, clock=lambda: now[0])
    (tmp_path / "rank1.pid").write_text(str(dead_pid()))
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        peers.check()
    assert (tmp_path / "rank0.pid").read_text().strip().isdigit()


def test_a_generation_being_stopped_fails_nobody(tmp_path: Path) -> None:
    peers = Peers(tmp_path, rank=0, clock=lambda: 0.0)
    (tmp_path / "rank1.pid").write_text(str(dead_pid()))
    (tmp_path / STOPPING).touch()
    peers.check()


def test_without_a_peer_folder_nothing_is_checked() -> None:
    Peers(None, rank=0).check()


def test_a_rank_error_on_a_node_without_a_running_rank_signals_nothing(tmp_path: Path) -> None:
    """The demo's fault then says "not delivered": no pid is signalled, dead or recycled."""
    state = tmp_path / "launcher.json"
    state.write_text(json.dumps({"ranks": [
        {"rank": 0, "node": "sim-0000", "pid": dead_pid()},
        {"rank": 1, "node": "sim-0001", "pid": dead_pid()}]}))
    assert signal_rank(state, "sim-0001", signal.SIGUSR1) is None
    assert signal_rank(state, "sim-0009", signal.SIGUSR1) is None
