"""``sn-monitor demo`` refuses a scenario it cannot play before anything starts.

(The demo's runs themselves take minutes: ``make e2e``, tests/e2e/test_demo_*.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.demo_run import demo

pytestmark = pytest.mark.integration


def test_a_bad_scenario_file_is_refused_with_its_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Scenario\nfaults:\n  - {at: 10s, node: 1, fault: overheat}\n")
    done = demo("--headless", "--scenario", str(bad), timeout=30)
    assert done.returncode == 2
    assert f"{bad}:3: faults[0]: overheat needs a gpu from 0 to 7" in done.stderr
    assert done.stdout == ""


def test_a_scenario_that_does_not_fit_the_fleet_is_refused(tmp_path: Path):
    bad = tmp_path / "big.yaml"
    bad.write_text("kind: Scenario\nfaults:\n  - {at: 10s, node: 12, fault: node-lost}\n")
    done = demo("--headless", "--nodes", "8", "--scenario", str(bad), timeout=30)
    assert done.returncode == 2
    assert "node 12 is not in a fleet of 8 nodes" in done.stderr
