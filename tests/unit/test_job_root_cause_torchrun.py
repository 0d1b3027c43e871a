"""The real torchrun failures (tests/fixtures/joblogs/torchrun) replayed to the live
controller: each rank's findings sent by the agent of its node as log events, the
job's ranks known from its progress reports; the controller names the first rank and
the category each failure's expected.yaml names (not the ranks that timed out).

The logs are read with the same recognition as ``sn-monitor logs analyze``; what an agent
would send is the finding as the wire carries it. The manual clock moves past the
triage's settle time; nothing sleeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sn_monitor.controller.jobs.spec import job_from_json
from sn_monitor.joblog.analysis import analyze
from sn_monitor.joblog.model import Finding
from tests.support.harness import XID_RULE, Harness, make_harness, rules_from
from tests.support.jobs import train

TORCHRUN = Path(__file__).parents[1] / "fixtures" / "joblogs" / "torchrun"
MODES = sorted(p.name for p in TORCHRUN.iterdir() if p.is_dir()) if TORCHRUN.is_dir() else []
#: One rank a node, as the fixtures' four ranks are numbered.
NODES = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Harness]:
    h = make_harness(tmp_path, rules_from(XID_RULE.format(clear_after="10m")))
    doc = {"apiVersion": "training.ai/v1", "kind": "DistributedJob",
           "metadata": {"name": "llm"}, "spec": {"replicas": len(NODES), "nodes": NODES}}
    h.controller.jobs.add_job(job_from_json(json.dumps(doc).encode()), "test")
    yield h
    h.controller.close()
    h.store.close()


def _event(event_id: int, f: Finding, at: float) -> dict[str, Any]:
    """A finding as an agent sends it (the wire's bounds: 8 parameters, 128 characters)."""
    event: dict[str, Any] = {
        "id": event_id, "kind": "log", "source": "joblog", "time_seconds": at,
        "message": f.text, "category": f.category, "severity": f.severity,
        "root_candidate": f.root_candidate, "file": str(Path(f.file).relative_to(TORCHRUN)),
        "line": f.line, "params": {k[:32]: v[:128] for k, v in list(f.params.items())[:8]}}
    if f.rank is not None:
        event["rank"] = f.rank
    if f.signature:
        event["signature"] = f.signature[:128]
    if f.timestamp is not None:
        event["line_time_seconds"] = f.timestamp
    return event


@pytest.mark.skipif(not MODES, reason="the torchrun failure logs are not in this checkout")
@pytest.mark.parametrize("mode", MODES)
def test_the_live_controller_names_the_first_rank_of_a_real_torchrun_failure(
        controller: Harness, mode: str) -> None:
    h = controller
    expected = yaml.safe_load((TORCHRUN / mode / "expected.yaml").read_text())
    train(h.controller.jobs, h.clock, "llm", NODES, 1, 3)  # the ranks are known
    findings = analyze([TORCHRUN / mode]).findings
    by_node: dict[str, list[dict[str, Any]]] = {}
    for f in findings:  # a rank's lines on its node; the launcher's (no rank) on gpu-0
        events = by_node.setdefault(NODES[f.rank if f.rank is not None else 0], [])
        events.append(_event(len(events) + 1, f, h.clock.time()))
    for node in reversed(NODES):  # the agents' reports in no particular order
        if node in by_node:
            reply = h.report(node, temps=[50.0], events=by_node[node])
            assert reply.events_stored_through == len(by_node[node])
    h.settle()
    h.clock.advance(31)
    h.controller.sweep()
    h.settle()
    cause = h.controller.get_job("llm")["root_cause"]  # type: ignore[index]
    assert (cause["rank"], cause["category"]) == (expected["root_rank"], expected["category"])
    assert cause["node"] == NODES[expected["root_rank"]]
    [incident] = [i for i in h.controller.list_incidents(None, None, 100)
                  if i["rule"] == "job-failure"]
    assert f"rank {expected['root_rank']} on " in incident["message"]
