"""The demo's live view and summary at a fixed width: the columns people need stay on
screen, the breaker's close is shown, and the verdict is counted from the run's state."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from sn_monitor.sim.demo import (
    actions_table,
    bottleneck_lines,
    breaker_banner,
    breaker_line,
    false_evictions,
    incidents_table,
    out_of_service,
    render_summary,
    verdict,
)

LONG = ("XID 79 on GPU 7: xid 79. XID 79 (GPU has fallen off the bus): NVIDIA's resolution "
        "RESTART_BM - The GPU fell off the PCIe bus: it answers nothing until the node is "
        "rebooted; drain the node and reboot it")


def _incident(id_: int, node: str, rule: str, severity: str, message: str = LONG,
              **extra: Any) -> dict[str, Any]:
    return {"id": id_, "node": node, "rule": rule, "severity": severity, "message": message,
            "status": "open", "subject": None, "detected_at": 100.0 + id_, **extra}


def _action(action: str, node: str, state: str, created_at: float, *, rule: str = "fatal-xid",
            incident_id: int | None = 7, verdict_: str | None = None) -> dict[str, Any]:
    return {"action": action, "node": node, "rule": rule, "state": state,
            "created_at": created_at, "incident_id": incident_id, "verdict": verdict_,
            "outcome": None, "reason": "XID 79", "requested_by": "controller"}


def _text(renderable: Any, width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("width", [100, 120, 140])
def test_the_incidents_table_keeps_id_node_and_severity_and_cuts_the_message(width: int):
    incidents = [_incident(12, "sim-0004", "gpu-fallen-off-bus", "critical"),
                 _incident(113, "sim-0013", "node-lost", "warning", "no report for 10s")]
    text = _text(incidents_table(incidents), width)
    header = next(line for line in text.splitlines() if "message" in line)
    for column in ("id", "node", "rule", "severity", "message"):
        assert column in header, (column, text)
    for value in ("12", "sim-0004", "gpu-fallen-off-bus", "critical", "113", "sim-0013",
                  "node-lost", "warning", "no report for 10s", "XID 79 on GPU 7"):
        assert value in text, (value, text)
    assert "…" in text  # the long message is cut, not the other columns
    assert all(len(line) <= width for line in text.splitlines())


def test_the_actions_table_keeps_node_and_state_and_cuts_the_reason():
    actions = [_action("evict", "sim-0013", "refused", 50.0,
                       verdict_="circuit breaker open: " + LONG),
               _action("throttle", "sim-0001", "succeeded", 40.0, rule="gpu-overheat")]
    text = _text(actions_table(actions), 120)
    for value in ("action", "node", "state", "outcome", "evict", "sim-0013", "refused",
                  "throttle", "sim-0001", "succeeded", "circuit breaker open"):
        assert value in text, (value, text)
    assert text.index("evict") < text.index("throttle")  # newest first


def test_the_banner_turns_from_open_to_closed_at_when_the_breaker_closes():
    assert breaker_banner(None, None, None) is None
    opened = _text(breaker_banner("4 nodes faulted within 12s", 390.0, None), 120)
    assert "CIRCUIT BREAKER OPEN since t=6m30s" in opened
    assert "FROZEN" in opened
    closed = _text(breaker_banner("4 nodes faulted within 12s", 390.0, 442.0), 120)
    assert "circuit breaker closed at t=7m22s" in closed
    assert "FROZEN" not in closed
    assert "OPEN" not in closed


def test_a_fail_slow_incident_is_a_bottleneck_line():
    incident = _incident(
        31, "sim-0002", "fail-slow", "warning",
        "job demo: step time +28 % since 18:06:22 UTC; rail 3 on sim-0002 (mlx5_3): "
        "rate 200 Gb/s of 400", subject="job:demo/mlx5_3")
    other = _incident(32, "sim-0001", "gpu-overheat", "critical", "GPU 5 at 91 °C")
    assert bottleneck_lines([incident, other]) == [
        "bottleneck: node sim-0002 link mlx5_3 (rail 3 on sim-0002 (mlx5_3): rate 200 Gb/s "
        "of 400)"]


def _summary(**changes: Any) -> dict[str, Any]:
    """A run's summary as Demo.summary builds it (the parts the verdict reads)."""
    actions = [_action("evict", "sim-0004", "succeeded", 130.0),
               _action("failover", "sim-0003", "succeeded", 250.0, rule="node-lost",
                       incident_id=9),
               _action("evict", "sim-0009", "refused", 400.0, rule="node-lost")]
    summary: dict[str, Any] = {
        "scenario": "default", "faults": [], "undetected": [],
        "recoveries": [
            {"id": "a1b2c3d4e5", "state": "done", "kind": "restart",
             "failed_nodes": ["sim-0004"], "replacement_nodes": ["sim-0014"],
             "generation": 1, "mttr_seconds": 21.37},
            {"id": "f6e5d4c3b2", "state": "done", "kind": "restart",
             "failed_nodes": ["sim-0003"], "replacement_nodes": ["sim-0015"],
             "generation": 2, "mttr_seconds": 18.9},
            {"id": "0a0b0c0d0e", "state": "cancelled", "kind": "restart",
             "failed_nodes": ["sim-0009"], "replacement_nodes": [],
             "generation": 2, "mttr_seconds": None}],
        "job": {"state": "running", "state_reason": None, "generation": 2,
                "last_step": 4210, "nodes": [], "spares": [],
                "effective_training_ratio": 0.96812, "training": True},
        "false_node_lost": [],
        # the nodes faults were played on: sim-0004 (t=120) and sim-0003 (t=240)
        "false_evictions": false_evictions(actions, {"sim-0004": 120.0, "sim-0003": 240.0}),
        "detection_latency_seconds": {"mean": 3.214, "max": 9.87},
        "breaker": {"tripped": True, "open": False, "reason": "4 nodes faulted within 12s",
                    "opened_at_seconds": 392.0, "closed_at_seconds": 441.5},
        "out_of_service": [], "bottlenecks": [], "page": "http://127.0.0.1:9848/ui/topology",
        "ok": True,
    }
    summary.update(changes)
    return summary


def test_the_verdict_is_counted_from_the_run():
    assert verdict(_summary()) == "job recovered 2 times, ETTR 0.97, 0 false evictions"
    one = _summary()
    one["recoveries"] = one["recoveries"][:1]
    one["job"] = {**one["job"], "effective_training_ratio": 0.5}
    assert verdict(one) == "job recovered 1 time, ETTR 0.50, 0 false evictions"


def test_an_eviction_of_a_node_no_fault_was_played_on_is_a_false_one():
    actions = [_action("evict", "sim-0004", "succeeded", 130.0),
               _action("evict", "sim-0006", "succeeded", 140.0),  # nothing played on it
               _action("evict", "sim-0005", "succeeded", 100.0)]  # before its fault
    evicted = false_evictions(actions, {"sim-0004": 120.0, "sim-0005": 300.0})
    assert evicted == ["sim-0006 (succeeded)", "sim-0005 (succeeded)"]
    line = verdict(_summary(false_evictions=evicted, undetected=["4m overheat on sim-0001"]))
    assert line == ("job recovered 2 times, ETTR 0.97, 2 false evictions, "
                    "1 fault(s) NOT DETECTED")


def test_the_breaker_line_says_it_closed_or_is_still_open():
    breaker = {**_summary()["breaker"],
               "reason": "circuit breaker open: 4 nodes faulted within 12s"}
    assert breaker_line(breaker) == ("circuit breaker: tripped at t=6m32s (4 nodes faulted "
                                     "within 12s), closed at t=7m22s")
    still = {**breaker, "open": True, "closed_at_seconds": None}
    assert "still OPEN" in breaker_line(still)
    assert breaker_line({"tripped": False, "open": False}) == "circuit breaker: never tripped"


def test_a_node_still_out_says_what_took_it_out_and_what_it_waits_for():
    nodes = [{"name": "sim-0003", "state": "cordoned", "cordoned_by_us": True},
             {"name": "sim-0004", "state": "evicted", "cordoned_by_us": True},
             {"name": "sim-0001", "state": "healthy", "cordoned_by_us": False}]
    actions = [_action("evict", "sim-0003", "succeeded", 250.0, rule="job-recovery",
                       incident_id=9),
               _action("cordon", "sim-0004", "succeeded", 130.0, incident_id=7),
               _action("cordon", "sim-0001", "succeeded", 100.0, incident_id=2),
               _action("uncordon", "sim-0001", "succeeded", 200.0, incident_id=None)]
    repairs = [{"node": "sim-0004", "step": "replace", "rung": "replace"},
               {"node": "sim-0003", "step": "verifying", "rung": "check"}]
    incidents = [_incident(9, "sim-0003", "node-lost", "critical"),
                 _incident(7, "sim-0004", "fatal-xid", "critical")]
    out = {o["node"]: o for o in out_of_service(nodes, actions, repairs, incidents)}
    assert set(out) == {"sim-0003", "sim-0004"}
    # the recovery's eviction is shown by the incident that started the recovery
    assert out["sim-0003"]["by"] == "node-lost#9"
    assert out["sim-0003"]["action"] == "evict"
    assert out["sim-0003"]["awaits"] == ("the repair ladder (check verifying), then the "
                                         "return-to-service check")
    assert out["sim-0004"]["by"] == "fatal-xid#7"
    assert out["sim-0004"]["awaits"].startswith("a person: uncordon it once repaired")
    assert out["sim-0004"]["awaits"].endswith("no rung of the repair ladder cleared its fault")


def test_the_summary_at_120_columns_ends_with_the_breaker_and_the_verdict():
    summary = _summary(out_of_service=[{
        "node": "sim-0003", "state": "cordoned", "by": "node-lost#9", "action": "failover",
        "reason": "no report for 10s", "awaits": "a person, then the return-to-service "
                                                 "check (POST /api/v1/jobs/demo/spares/sim-0003)"}])
    summary["faults"] = [{
        "at": "2m10s", "node": "sim-0004", "fault": "fall-off-bus", "gpu": 7,
        "expects_detection": True, "detection_latency_seconds": 1.234,
        "incidents": ["fatal-xid#7", "gpu-fallen-off-bus#8"],
        "actions": ["alert succeeded", "evict succeeded", "restore succeeded"],
        "refused": [], "recoveries": [{"state": "done", "mttr_seconds": 21.37}]}]
    summary["bottlenecks"] = [{
        "line": "bottleneck: node sim-0002 link mlx5_3 (rail 3 on sim-0002 (mlx5_3): rate "
                "200 Gb/s of 400)", "status": "closed",
        "message": "job demo: step time +24 % since 18:06:22 UTC; rail 3 on sim-0002 "
                   "(mlx5_3): rate 200 Gb/s of 400"}]
    summary["verdict"] = verdict(summary)  # as Demo.summary leaves it
    console = Console(width=120, record=True, color_system=None)
    render_summary(summary, console)
    text = console.export_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[-2] == ("circuit breaker: tripped at t=6m32s (4 nodes faulted within 12s), "
                         "closed at t=7m22s")
    assert lines[-1] == "verdict: job recovered 2 times, ETTR 0.97, 0 false evictions"
    for value in ("sim-0004", "fall-off-bus GPU 7", "1.2s", "done in 21.4s",
                  "sim-0003 is cordoned: failover by node-lost#9",
                  "topology page: http://127.0.0.1:9848/ui/topology",
                  "effective training ratio 0.97", "mean 3.2s, max 9.9s",
                  "bottleneck: node sim-0002 link mlx5_3",
                  "job demo: step time +24 % since 18:06:22 UTC (closed)"):
        assert value in " ".join(text.split()), (value, text)  # a long line may wrap
    assert all(len(line) <= 120 for line in text.splitlines())
