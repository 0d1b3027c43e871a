"""The real torchrun job failing five ways, and ``sn-monitor logs analyze`` naming why.

For each mode of ``examples/pytorch/failures.py`` (a rank SIGKILLed, an out-of-memory
allocation, a NaN loss, a rank that hangs past the collective timeout, an application
exception), ``examples/pytorch/capture_failures.py`` runs the job under torchrun with 4
ranks on gloo and keeps every rank's logs and torchrun's console. The logs must show
the failure (``tests.support.torchrun_failures``), and the offline analysis
(``sn-monitor logs analyze --json``) must name the rank that failed first and the
failure's category, as the mode's ``expected.yaml`` says: never a rank that merely lost
its peer or timed out waiting for it.

``make e2e`` runs it (torch: ``pip install -e '.[examples]'``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.torch_env import torch_available
from tests.support.torchrun_failures import (
    CAPTURE,
    MODES,
    assert_evidence,
    expected,
    log_paths,
)

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not torch_available(), reason="torch is not installed")]

#: One run: 4 ranks importing torch on a loaded two-core machine, the hang's 10 s timeout.
RUN_TIMEOUT = 240
ANALYZE_TIMEOUT = 60


@pytest.mark.parametrize("mode", MODES)
def test_a_real_torchrun_failure_is_analysed_to_its_first_rank_and_category(
        mode: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(CAPTURE), "--out", str(tmp_path), "--timeout",
         str(RUN_TIMEOUT), mode],
        capture_output=True, text=True, timeout=RUN_TIMEOUT + 30, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    run = tmp_path / mode
    assert_evidence(mode, run)

    analysis = subprocess.run(
        [sys.executable, "-m", "sn_monitor.cli", "logs", "analyze", "--json",
         *map(str, log_paths(run))],
        capture_output=True, text=True, timeout=ANALYZE_TIMEOUT, check=False)
    assert analysis.returncode == 0, analysis.stderr
    report = json.loads(analysis.stdout)
    want = expected(run)
    cause = report["root_cause"]
    assert cause is not None, report["findings"]
    assert (cause["rank"], cause["category"]) == (want.root_rank, want.category), (
        cause, want.note)
