"""The controller and four simulated agents as real processes: faults in, actions out.

Each agent is ``sn-monitor agent --simulate 8`` (physics 10x), reporting once a second
with a bearer token; the controller runs the repository's ``rules/`` with short timings
(sweep 0.5 s, settle 1 s) and routes evict/cordon to a command script and failover to
a job-control script, both of which append their SN_ environment to a log (see
``cluster.py``). The thermal, XID and node-lost tests share one cluster (each on its
own node); the breaker and the restart tests get fresh ones.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster import Cluster, metric_value

pytestmark = pytest.mark.integration

#: Generous, bounded waits: these tests must pass on a loaded two-core machine.
WAIT = 45.0
#: The node-lost rule's heartbeat timeout (sn_monitor/rules/default.yaml) plus settle and slack.
LOST_WAIT = 10.0 + 45.0


#: These tests follow an eviction: the agents' remediation (the ladder's reset and
#: reboot, which would repair and return the node) is a dry run, as on real hardware.
DRY_REMEDIES = {"remediation": {"mode": "dry-run"}}

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the tests that each break a different node.

    Its breaker window (5 s) is shorter than the gaps between those tests' faults, so
    sim-0's cordon, sim-1's eviction and sim-2's loss never count as one burst.
    """
    c = Cluster(tmp_path_factory.mktemp("shared"),
                config={"policy": {"breaker": {"window": "5s"}}}, agent_config=DRY_REMEDIES)
    try:
        c.start()
        yield c
    finally:
        c.close()


def _find(items: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [i for i in items if all(i.get(k) == v for k, v in match.items())]


def _one_open(c: Cluster, rule: str, node: str) -> dict[str, Any] | None:
    found = _find(c.incidents(status="open", node=node), rule=rule)
    return found[0] if found else None


def _xid79_open(c: Cluster, node: str) -> dict[str, Any] | None:
    """The incident of a GPU that fell off the bus (XID 79).

    The driver reports it twice, as NVML's XID 79 event and as the kernel log's Xid
    line; the agent counts one fault seen by two sources once, as one XID: ``fatal-xid``
    whichever source it read first.
    """
    return _one_open(c, "fatal-xid", node)


def _temperature(c: Cluster, node: str, gpu: int) -> float | None:
    return metric_value(c.agents[node].metrics(), "sn_gpu_temperature_celsius", gpu=str(gpu))


# ---------------------------------------------------------------------- 1. thermal


def test_an_overheating_gpu_is_throttled_and_released(cluster: Cluster) -> None:
    c, node, gpu = cluster, "sim-0", 3
    agent = c.agents[node]
    start = _temperature(c, node, gpu)
    assert start is not None
    assert start < 80
    agent.fault("overheat", gpu, factor=1.8)

    incident = c.wait_for(lambda: _one_open(c, "gpu-overheat", node), WAIT,
                          f"a gpu-overheat incident for {node}")
    assert incident["gpu"] == gpu
    assert incident["severity"] == "critical"

    def throttle_done() -> dict[str, Any] | None:
        found = _find(c.incident_actions(incident["id"]), action="throttle")
        return found[0] if found and found[0]["state"] == "succeeded" \
            and (found[0]["outcome"] or "").startswith("agent done") else None

    throttle = c.wait_for(throttle_done, WAIT, "the throttle action reported done by the agent")
    assert (throttle["node"], throttle["gpu"]) == (node, gpu)
    assert "capped GPU 3" in throttle["outcome"]

    def capped() -> bool:
        text = agent.metrics()
        limit = metric_value(text, "sn_gpu_power_limit_watts", gpu=str(gpu))
        return metric_value(text, "sn_guard_throttled", gpu=str(gpu)) == 1.0 or (
            limit is not None and limit < 700)
    c.wait_for(capped, WAIT, f"GPU {gpu}'s power capped on the agent")
    peak = max(filter(None, [incident["value"], _temperature(c, node, gpu)]))
    c.wait_for(lambda: (_temperature(c, node, gpu) or 999) <= peak - 3, WAIT,
               f"GPU {gpu} cooling below {peak - 3} °C under the cap")

    agent.fault("cooling-repaired", gpu)
    closed = c.wait_for(
        lambda: _find(c.incidents(status="closed", node=node), id=incident["id"]), WAIT,
        "the gpu-overheat incident closing after the cooling repair")[0]
    assert closed["closed_at"] >= closed["detected_at"]

    def released() -> dict[str, Any] | None:
        found = _find(c.incident_actions(incident["id"]), action="release")
        return found[0] if found and found[0]["state"] == "succeeded" \
            and (found[0]["outcome"] or "").startswith("agent done") else None
    release = c.wait_for(released, WAIT, "the release action reported done by the agent")
    assert (release["node"], release["gpu"]) == (node, gpu)
    c.wait_for(lambda: metric_value(agent.metrics(), "sn_gpu_power_limit_watts",
                                    gpu=str(gpu)) == 700.0, WAIT,
               f"GPU {gpu}'s power limit back at 700 W")
    # one throttle ran for this GPU: the other thermal rules' throttles hit the cooldown
    ran = [a for a in c.actions(node=node) if a["action"] == "throttle"
           and a["state"] == "succeeded"]
    assert len(ran) == 1, ran


# ---------------------------------------------------------------------- 2. XID 79


def _two_more_reports(c: Cluster, node: str) -> None:
    """Wait until the controller took two more reports from ``node``'s agent: one sent
    entirely after this call, with every event and reading the agent had by then."""
    def taken() -> float:
        return metric_value(c.agents[node].metrics(), "sn_agent_reports_total") or 0.0
    target = taken() + 2
    c.wait_for(lambda: taken() >= target, WAIT, f"two more reports of {node} taken")


def test_xid_79_evicts_the_node_once_through_the_command_driver(cluster: Cluster) -> None:
    c, node, gpu = cluster, "sim-1", 2
    c.agents[node].fault("fall-off-bus", gpu)

    fatal = c.wait_for(lambda: _xid79_open(c, node), WAIT,
                       f"an XID 79 incident for {node}")
    assert fatal["gpu"] == gpu
    assert fatal["value"] == 79

    def evicted() -> list[dict[str, str]]:
        return [call for call in c.script_calls(c.evict_log)
                if call["SN_ACTION"] == "evict" and call["SN_NODE"] == node]
    c.wait_for(evicted, WAIT, f"the evict script to run for {node}")
    c.wait_for(lambda: [x for x in c.script_calls(c.job_log) if x["SN_NODE"] == node],
               WAIT, f"the failover script to run for {node}")
    # every rule that fired (fatal-xid, gpu-lost) has had its settle
    # time and its evict/failover decided: nothing is left pending. Once the node is
    # evicted, later findings plan no more evictions (it is out of service already);
    # ones decided before that were refused by the cooldown.
    def all_decided() -> list[dict[str, Any]] | None:
        acts = [a for a in c.actions(node=node) if a["action"] in ("evict", "failover")]
        done = [a for a in acts if a["state"] in ("succeeded", "refused", "failed")]
        return acts if acts and len(done) == len(acts) else None
    _two_more_reports(c, node)  # what the fault makes the agent say is said
    c.wait_settled(WAIT, "late findings get their actions too")
    acts = c.wait_for(all_decided, WAIT, f"every evict/failover for {node} decided")

    for action in ("evict", "failover"):
        mine = [a for a in acts if a["action"] == action]
        succeeded = [a for a in mine if a["state"] == "succeeded"]
        assert len(succeeded) == 1, mine
        for other in mine:
            if other is not succeeded[0]:
                assert other["state"] == "refused", other
                assert other["verdict"].startswith(f"cooldown: {action} ran on {node}"), other
    calls = evicted()
    assert len(calls) == 1, calls
    assert calls[0]["SN_RULE"] in ("fatal-xid", "gpu-lost")
    jobs = [x for x in c.script_calls(c.job_log) if x["SN_NODE"] == node]
    assert [x["SN_ACTION"] for x in jobs] == ["failover"], jobs

    # a second GPU of the same node failing is a new incident, not a second eviction
    c.agents[node].fault("xid", 5, code=79)
    second = c.wait_for(lambda: [i for i in c.incidents(status="open", node=node)
                                 if i["rule"] == "fatal-xid" and i["gpu"] == 5], WAIT,
                        f"a fatal-xid incident for {node} GPU 5")[0]

    # the node is out of service already: the new fault alerts, and evicts nothing more
    c.wait_for(lambda: [a for a in c.incident_actions(second["id"]) if a["action"] == "alert"
                        and a["state"] == "succeeded"], WAIT, "the alert for GPU 5")
    c.wait_settled(WAIT, "past its settle time")
    assert [a for a in c.incident_actions(second["id"])
            if a["action"] in ("evict", "failover")] == []
    assert len(evicted()) == 1, c.script_calls()
    assert len([x for x in c.script_calls(c.job_log) if x["SN_NODE"] == node]) == 1

    # the node list learns who is cordoned from the store every few seconds, and counts
    # the lost GPU from the node's latest sample (one whose NVML read ran past its
    # deadline on a loaded machine has no GPU in it: the next one has)
    node_doc = c.wait_for(
        lambda: (d := c.get(f"/api/v1/nodes/{node}"))["cordoned_by_us"] and d["gpus"] == 8
        and d, WAIT, f"{node} shown as cordoned by sn-monitor, with its 8 GPUs")
    assert node_doc["gpus_lost"] == 1, node_doc
    assert node_doc["state"] == "evicted", node_doc


# ---------------------------------------------------------------------- 3. node lost


def test_a_killed_agent_is_failed_over_after_the_heartbeat_timeout(cluster: Cluster) -> None:
    c, node = cluster, "sim-2"
    c.agents[node].kill(signal.SIGKILL)
    killed = time.time()

    lost = c.wait_for(lambda: _one_open(c, "node-lost", node), LOST_WAIT,
                      f"a node-lost incident for {node}")
    # No earlier than the 10 s timeout, timed from the last report the controller got
    # (on a loaded machine that one may have left the agent a while before the kill).
    assert lost["value"] >= 10.0, lost
    assert lost["detected_at"] >= killed, lost

    def ran() -> list[dict[str, str]] | None:
        calls = [x for x in c.script_calls() if x["SN_NODE"] == node]
        return calls if len(calls) >= 2 else None
    calls = c.wait_for(ran, WAIT, f"evict and failover scripts for {node}")
    assert sorted(x["SN_ACTION"] for x in calls) == ["evict", "failover"]
    assert {x["SN_RULE"] for x in calls} == {"node-lost"}
    assert {x["SN_INCIDENT_ID"] for x in calls} == {str(lost["id"])}

    def succeeded() -> list[str] | None:
        # the script logs its call before it exits; the runner records the outcome after
        acts = _find(c.incident_actions(lost["id"]), state="succeeded")
        done = sorted(a["action"] for a in acts)
        return done if len(done) >= 3 else None
    done = c.wait_for(succeeded, WAIT, f"the actions on {node} recorded as succeeded")
    assert done == ["alert", "evict", "failover"]
    assert c.get(f"/api/v1/nodes/{node}")["state"] == "lost"
    assert c.get("/healthz")["breaker"]["open"] is False


# ---------------------------------------------------------------------- 4. breaker


def test_half_the_nodes_lost_at_once_trips_the_breaker_and_evicts_nobody(
        tmp_path: Path) -> None:
    # 2 of 4 faulted is over 40% and at least 2: a partition, not two broken servers.
    # A 3 s settle leaves room for the two heartbeats to expire up to a report apart.
    with Cluster(tmp_path, config={"settle": "3s"}) as c:
        c.start()
        victims = ["sim-1", "sim-3"]
        for name in victims:
            c.agents[name].kill(signal.SIGKILL)

        def both_lost() -> bool:
            return all(_one_open(c, "node-lost", n) for n in victims)
        c.wait_for(both_lost, LOST_WAIT, "node-lost incidents for both killed agents")
        health = c.wait_for(lambda: (h := c.get("/healthz"))["breaker"]["open"] and h,
                            WAIT, "the circuit breaker open on /healthz")
        assert "2 of 4 nodes faulted" in health["breaker"]["reason"]
        assert metric_value(c.controller_metrics(), "sn_breaker_open") == 1.0

        def page() -> list[dict[str, Any]]:
            return [a for a in c.actions() if a["rule"] == "circuit-breaker"
                    and a["action"] == "alert" and a["severity"] == "critical"
                    and a["state"] == "succeeded"]
        c.wait_for(page, WAIT, "a critical circuit-breaker alert")

        def decided() -> list[dict[str, Any]] | None:
            acts = [a for a in c.actions() if a["action"] in ("evict", "failover")]
            return acts if len(acts) == 2 * len(victims) and all(
                a["state"] not in ("pending", "running") for a in acts) else None
        acts = c.wait_for(decided, WAIT, "evict and failover for both nodes decided")
        c.wait_settled(WAIT, "nothing else turns up later")
        acts = [a for a in c.actions() if a["action"] in ("evict", "failover")]
        assert len(acts) == 4, acts
        for a in acts:
            assert a["node"] in victims
            assert a["state"] == "refused", a
            assert a["verdict"].startswith("circuit breaker open"), a
        assert c.script_calls() == []
        survivors = {n["name"]: n["state"] for n in c.get("/api/v1/nodes")["nodes"]}
        assert survivors == {"sim-0": "healthy", "sim-1": "lost", "sim-2": "healthy",
                             "sim-3": "lost"}


# ---------------------------------------------------------------------- 5. restart


@pytest.fixture(scope="module")
def restart_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster whose controller the tests kill and restart.

    A 5 s settle, so that a test can kill the controller while an eviction is settling;
    a 5 s breaker window, so that the tests' faults on different nodes are no burst.
    """
    c = Cluster(tmp_path_factory.mktemp("restart"),
                config={"settle": "5s", "policy": {"breaker": {"window": "5s"}}},
                agent_config=DRY_REMEDIES)
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_a_controller_killed_mid_incident_resumes_without_repeating(
        restart_cluster: Cluster) -> None:
    c, node, gpu = restart_cluster, "sim-1", 5
    c.agents[node].fault("fall-off-bus", gpu)
    incident = c.wait_for(lambda: _xid79_open(c, node), WAIT,
                          f"an XID 79 incident for {node}")

    def both_ran() -> list[dict[str, str]] | None:
        calls = [x for x in c.script_calls() if x["SN_NODE"] == node]
        return calls if len(calls) >= 2 else None
    c.wait_for(both_ran, WAIT, f"evict and failover for {node}")
    c.wait_settled(WAIT, "every rule's settled actions decided")
    before = {a["id"]: (a["key"], a["state"]) for a in c.actions()}
    open_before = {i["id"] for i in c.incidents(status="open")}
    assert incident["id"] in open_before

    assert c.controller.kill(signal.SIGKILL) == -signal.SIGKILL
    c.start_controller()
    c.wait_reporting(list(c.agents))
    # a restart settles again what it cannot find decided: once nothing is settling,
    # anything it would repeat has happened
    c.wait_settled(WAIT, "the restarted controller's settled actions decided")

    after = {a["id"]: (a["key"], a["state"]) for a in c.actions()}
    assert after == before
    assert {i["id"] for i in c.incidents(status="open")} == open_before
    again = c.get(f"/api/v1/incidents/{incident['id']}")
    assert again["status"] == "open"
    calls = [x for x in c.script_calls() if x["SN_NODE"] == node]
    assert sorted(x["SN_ACTION"] for x in calls) == ["evict", "failover"], calls
    ids = [x["SN_ACTION_ID"] for x in c.script_calls()]
    assert len(ids) == len(set(ids)), "an action ran twice"


def test_a_controller_killed_while_an_eviction_settles_runs_it_after_restart(
        restart_cluster: Cluster) -> None:
    c, node = restart_cluster, "sim-3"
    c.agents[node].fault("xid", 1, code=48)
    incident = c.wait_for(lambda: _one_open(c, "fatal-xid", node), WAIT,
                          f"a fatal-xid incident for {node}")
    c.controller.kill(signal.SIGKILL)  # well within the 5 s settle
    assert [x for x in c.script_calls() if x["SN_NODE"] == node] == []

    c.start_controller()

    def both_ran() -> list[dict[str, str]] | None:
        calls = [x for x in c.script_calls() if x["SN_NODE"] == node]
        return calls if len(calls) >= 2 else None
    calls = c.wait_for(both_ran, WAIT, f"evict and failover for {node} after the restart")
    c.wait_settled(WAIT, "nothing more after the restart")
    calls = [x for x in c.script_calls() if x["SN_NODE"] == node]
    assert sorted(x["SN_ACTION"] for x in calls) == ["evict", "failover"], calls
    assert {x["SN_INCIDENT_ID"] for x in calls} == {str(incident["id"])}
    acts = [a for a in c.incident_actions(incident["id"])
            if a["action"] in ("evict", "failover")]  # the ladder's rungs are its own
    assert sorted((a["action"], a["state"]) for a in acts) == [
        ("evict", "succeeded"), ("failover", "succeeded")]


# ---------------------------------------------------------------------- 6. spool


def test_the_agent_spool_delivers_every_event_after_a_controller_outage(
        restart_cluster: Cluster) -> None:
    c, node = restart_cluster, "sim-2"
    agent = c.agents[node]
    assert c.get("/api/v1/events", node=node, kind="xid")["events"] == []

    c.controller.kill(signal.SIGKILL)

    def seen() -> float:
        return metric_value(agent.metrics(), "sn_agent_events_total", kind="xid") or 0.0
    for _ in range(5):  # one at a time: each an event of its own
        before = seen()
        agent.fault("xid", 0, code=13)
        c.wait_for(lambda before=before: seen() > before, WAIT, f"{node} seeing the XID")

    def failing() -> float | None:
        value = metric_value(agent.metrics(), "sn_agent_report_failures_total")
        return value if value else None
    c.wait_for(failing, WAIT, f"{node} counting failed reports during the outage")

    c.start_controller()

    def all_five() -> list[dict[str, Any]] | None:
        events = c.get("/api/v1/events", node=node, kind="xid")["events"]
        return events if len(events) >= 5 else None
    events = c.wait_for(all_five, WAIT + 30, f"the 5 spooled XIDs of {node}")
    # and no duplicates arrive later: the spool is empty, a report after that was taken
    # (any report in flight with those events is in), and the writer stored what it had
    c.wait_for(lambda: metric_value(agent.metrics(), "sn_agent_spool_events") == 0, WAIT,
               f"{node}'s spool emptied")
    _two_more_reports(c, node)
    c.wait_settled(WAIT, "the events stored")
    events = c.get("/api/v1/events", node=node, kind="xid")["events"]
    assert len(events) == 5, events
    assert {(e["code"], e["gpu"]) for e in events} == {(13, 0)}
    app = c.wait_for(lambda: _find(c.incidents(node=node), rule="app-xid"), WAIT,
                     "an app-xid incident from the delivered events")
    assert len(app) == 1
