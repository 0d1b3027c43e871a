"""The torchrun MTTR benchmark's smoke run (``bench/torch_recovery_bench.py --quick``).

Here rather than in ``tests/integration/test_bench_smoke.py``: it needs torch, which
``make test`` does not install (``make e2e`` does).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import stop_session
from tests.support.torch_env import torch_available

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not torch_available(), reason="torch is not installed")]

ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 480


def test_the_quick_run_measures_a_cold_and_a_warm_recovery_and_their_split(tmp_path: Path) -> None:
    out, log = tmp_path / "torch_recovery.json", tmp_path / "bench.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.torch_recovery_bench", "--quick", "--out", str(out)],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_session(proc, 30)
    output = log.read_text(errors="replace")
    assert code == 0, output[-4000:]
    results = json.loads(out.read_text())
    phases = ("detection", "eviction", "restart", "relaunch", "load", "first_step",
              "reported")
    for mode in ("cold", "warm"):
        (rec,) = results["passes"][mode]["recoveries"]
        assert all(rec[key] >= 0 for key in phases), (mode, rec)
        assert rec["mttr"] > 0
        # the split covers the controller's MTTR (fault seen -> the new generation's progress)
        assert sum(rec[key] for key in phases) == pytest.approx(rec["mttr"], abs=0.01)
    # cold: every rank started again; warm: rank 0 kept, the spare's standby joined
    cold, warm = (results["passes"][m]["recoveries"][0]["launcher"] for m in ("cold", "warm"))
    assert cold == {"kept": [], "standbys_used": [], "cold": ["sim-0", "sim-2"]}, cold
    assert warm == {"kept": ["sim-0"], "standbys_used": ["sim-2"], "cold": []}, warm
    assert set(results["warm_over_cold"]) == {"relaunch", "mttr"}
    assert results["meta"]["torch"]
    assert "| MTTR, fatal XID + dead node" in output
    assert "| warm / cold, medians: relaunch" in output
