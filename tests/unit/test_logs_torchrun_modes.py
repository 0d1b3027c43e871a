"""``sn-monitor logs analyze`` on the real torchrun job made to fail five ways.

``tests/fixtures/joblogs/torchrun/<mode>/`` holds the logs of ``examples/pytorch/`` run
under torchrun and made to fail for real (a rank SIGKILLed, a huge allocation, a NaN
loss, a rank that hangs past the collective timeout, an exception on one rank), with
``expected.yaml`` naming the first failing rank and its category. The command, through
the installed entry point, must name both: the hang and the kill not blamed on the ranks
that merely timed out or lost their peer.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import ROOT
from tests.support.entry_point import sn_monitor

MODES = ROOT / "tests" / "fixtures" / "joblogs" / "torchrun"


@pytest.mark.parametrize("mode", ["kill", "oom", "nan", "hang", "exception"])
def test_logs_analyze_names_the_first_failing_rank_and_why(mode: str) -> None:
    expected = yaml.safe_load((MODES / mode / "expected.yaml").read_text(encoding="utf-8"))
    result = sn_monitor("logs", "analyze", "--json", str(MODES / mode / "torchrun.log"),
                        str(MODES / mode / "logs"))
    assert result.returncode == 0, result.stderr
    cause = json.loads(result.stdout)["root_cause"]
    assert (cause["rank"], cause["category"]) == (expected["root_rank"], expected["category"])
