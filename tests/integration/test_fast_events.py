"""The fast event path through real processes: an XID's incident before the next sample.

A simulated agent sampling every 5 s reports to a real controller. Right after one of
its samples, an XID is injected on the agent (``POST /sim/fault``): the agent's NVML
waiter and kernel-log follower take it between two samples and send it at once in an
event-only report, so the controller opens the incident while the agent's latest sample
is still the one from before the injection. Without the fast path the XID would wait
for the next sample, which the test would see as a newer sample time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.cluster import Cluster, metric_value

pytestmark = pytest.mark.integration

WAIT = 60.0
INTERVAL_SECONDS = 5


@pytest.fixture
def cluster(tmp_path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, nodes=1, sim_speed=1.0,
                agent_config={"interval": f"{INTERVAL_SECONDS}s",
                              "remediation": {"mode": "dry-run"}})
    try:
        c.start(timeout=WAIT)
        yield c
    finally:
        c.close()


def _sample_time(c: Cluster, node: str) -> float | None:
    return metric_value(c.agents[node].metrics(), "sn_agent_last_sample_timestamp_seconds")


def _fatal_xid(c: Cluster, node: str, gpu: int) -> dict[str, Any] | None:
    """The XID 79's open incident: ``fatal-xid``, from NVML's event or the kernel log's
    line, whichever of the two the agent read first (it counts one fault seen by both
    once)."""
    found = [i for i in c.incidents(status="open", node=node)
             if i["rule"] == "fatal-xid" and i["gpu"] == gpu]
    return found[0] if found else None


def test_an_xid_opens_its_incident_before_the_next_sample(cluster: Cluster) -> None:
    c, node, gpu = cluster, "sim-0", 3
    before = _sample_time(c, node)
    assert before is not None
    # Just after a sample: the next one is a whole interval away.
    after = c.wait_for(lambda: (t := _sample_time(c, node)) is not None and t > before and t,
                       WAIT, f"a new sample of {node}", interval=0.05)
    assert _fatal_xid(c, node, gpu) is None

    c.agents[node].fault("xid", gpu, code=79)
    incident = c.wait_for(lambda: _fatal_xid(c, node, gpu), WAIT,
                          f"a fatal-xid incident for GPU {gpu} of {node}", interval=0.05)
    latest = _sample_time(c, node)

    assert incident["value"] == 79
    assert latest == after, (
        f"the incident was seen only after another sample ({latest} > {after}): "
        "the XID waited for the sampling cycle")
    assert incident["detected_at"] >= after
    # The agent still counts it once, in the next sample's counters.
    c.wait_for(lambda: metric_value(c.agents[node].metrics(), "sn_gpu_xid_errors_total",
                                    gpu=str(gpu), xid="79") == 1.0,
               WAIT, f"XID 79 counted once on GPU {gpu} of {node}")
