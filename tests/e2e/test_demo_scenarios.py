"""The packaged demo scenarios that take minutes each, played by ``sn-monitor demo --headless``
on 8 nodes at x10 (``make e2e``: each run is one to three minutes on two cores).

* ``fail-slow``: a rail NIC at half rate; the job's step time follows it, and the
  bottleneck finder names the node and port.
* ``remediation``: a reset that repairs a node (back in the spare pool, no person), one
  that does not (reset, reboot, then out and a page), and a driver that hangs.
* ``job-failure``: a bug in one rank (its traceback in its log, read by its node's
  agent) restarts the job in place, evicts nobody and pages the job's owner with the
  rank and category; an ECC error in another rank takes its node out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.demo_run import faults, headless_on_eight_nodes

pytestmark = pytest.mark.integration


@pytest.mark.timeout(420)
def test_the_fail_slow_scenario_slows_the_job_and_the_finder_names_the_link(tmp_path: Path) -> None:
    """A rail NIC at half rate: the job's step time follows it, and the bottleneck finder
    names the node and port."""
    doc = headless_on_eight_nodes(tmp_path, "fail-slow", timeout=400)
    (slow,) = faults(doc, "nic-degraded")
    assert slow["incidents"][0].startswith("fail-slow#")
    (named,) = doc["bottlenecks"]
    assert (named["node"], named["link"]) == ("sim-0002", "mlx5_3")
    assert named["line"].startswith("bottleneck: node sim-0002 link mlx5_3 (")
    assert "step time +" in named["message"]
    assert doc["false_evictions"] == []
    assert doc["verdict"].startswith("job recovered 0 times, ETTR ")


def test_the_remediation_scenario_repairs_one_node_and_keeps_the_other_out(tmp_path: Path) -> None:
    """A reset that repairs a node (back in the spare pool, no person), one that does not
    (reset, reboot, then out and a page), and a driver that hangs: from the CLI."""
    doc = headless_on_eight_nodes(tmp_path, "remediation", timeout=240)
    repaired, broken = faults(doc, "xid")
    assert (repaired["node"], broken["node"]) == ("sim-0002", "sim-0004")
    assert "return-to-service succeeded" in repaired["actions"]
    assert "reset_gpu succeeded" in repaired["actions"]
    assert "reboot succeeded" in broken["actions"]  # the reset did not clear it
    assert "verify succeeded x2" in broken["actions"]  # after the reset, after the reboot
    assert "return-to-service succeeded" not in broken["actions"]
    job = doc["job"]
    assert "sim-0002" in job["spares"]  # back, after its check
    assert "sim-0004" not in job["spares"] + job["nodes"]  # out: a person's
    (hang,) = faults(doc, "nvml-hang")
    assert [i.split("#")[0] for i in hang["incidents"]] == ["collector-stuck"]


def test_the_job_failure_scenario_names_each_ranks_failure_from_its_log(tmp_path: Path) -> None:
    doc = headless_on_eight_nodes(tmp_path, "job-failure", timeout=300)
    bug, ecc = faults(doc, "rank-error")
    assert (bug["node"], bug["params"]["error"]) == ("sim-0002", "app-bug")
    assert (ecc["node"], ecc["params"]["error"]) == ("sim-0004", "ecc-error")
    assert bug["result"].endswith("fails at its next step (app-bug)"), bug
    # the controller named each failure from the rank's own log
    named = [f["message"] for f in doc["job_failures"]]
    assert len(named) == 2, named
    assert "on sim-0002 (app-bug): IndexError: list index out of range" in named[0]
    assert "no node is taken" in named[0]
    assert "on sim-0004 (ecc-error)" in named[1]
    assert "uncorrectable ECC error" in named[1]
    # the bug evicted nobody and restarted in place; the ECC error took its node out
    assert not any(a.startswith("evict") for a in bug["actions"]), bug
    assert doc["false_evictions"] == []
    job = doc["job"]
    assert "sim-0002" in job["nodes"]
    assert "sim-0004" not in job["nodes"]
    assert job["training"] is True
    assert job["root_cause"]["category"] == "ecc-error"
