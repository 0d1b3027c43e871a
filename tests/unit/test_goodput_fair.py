"""A fair replay: every policy on a hand-computed trace, a dead node found no sooner than
its heartbeat allows, each policy at a fixed, Daly's or its best interval, the shared
human and scheduler timings as options."""

from __future__ import annotations

import json

import pytest

from sn_monitor.config import Duration
from sn_monitor.controller.jobs.advisor import daly
from sn_monitor.goodput.intervals import SEARCH_FACTORS, parse_policy
from sn_monitor.goodput.replay import ReplayOptions, replay
from sn_monitor.goodput.results import PolicyResult, table
from sn_monitor.goodput.trace import Fault, Trace
from sn_monitor.goodput.world import WorldSettings
from sn_monitor.rules.spec import HeartbeatRule, load_rules, packaged_rules

#: 20 nodes (the safety policy lets two be out at once), two spares, 10 s steps, a 2 s
#: pause per checkpoint complete 8 s later, relaunch 20 s + load 10 s, a replacement
#: node from the cluster in 30 s, a person acting after 15 minutes.
SETTINGS = WorldSettings(nodes=20, spares=2, step_seconds=Duration(10),
                         save_blocking=Duration(2), save_persist=Duration(8),
                         relaunch=Duration(20), load=Duration(10),
                         operator_response=Duration(900), replacement=Duration(30))
TWO_HOURS = 7200.0
#: A process exit, a lost server, a link down (repaired a day later).
TRACE = Trace((
    Fault(time=1000.0, node="node-0000", kind="software", category="software", repair=0.0),
    Fault(time=3000.0, node="node-0001", kind="node-lost", category="host", repair=86400.0),
    Fault(time=5000.0, node="node-0002", kind="ib-link", category="network",
          repair=86400.0)), TWO_HOURS, "hand")
#: 0.02 points of ETTR.
POINTS_002 = 0.0002


def _by_name(results: list[PolicyResult]) -> dict[str, PolicyResult]:
    return {r.name: r for r in results}


def test_every_policy_s_ettr_on_a_hand_computed_trace() -> None:
    """ETTR = (wall time - downtime - lost work - 2 s per checkpoint) / wall time.

    Kubernetes (checkpoints every 900 s from each start): a checkpoint at 900. The exit
    at 1000 is seen at 1010, running at 1040 from 900: down 40, lost 98. Checkpoints at
    1940 (work 1800) and 2840 (2698). The lost node at 3000 is evicted at 3340 (40 +
    300), a node comes at 3370, running at 3400: down 400, lost 3000 - 2842 = 158. A
    checkpoint at 4300 (3598). The link at 5000: the watchdog restarts onto the same
    node at 5600, the start fails at 5630, the person takes the node out at 5900, a node
    comes at 5930, running at 5960: down 960, lost 5000 - 4302 = 698. A checkpoint at
    6860: 7200 - 1400 - 954 - 5 x 2 = 4836.
    torchrun: the exit seen at 1005 (running 1035: down 35, lost 98); checkpoints at
    1935, 2835; the node at 3015, a node at 3045, running at 3075 (down 75, lost 3000 -
    2837 = 163); checkpoints at 3975, 4875; the link as Kubernetes' (down 960, lost
    5000 - 4877 = 123); a checkpoint at 6860: 7200 - 1070 - 384 - 6 x 2 = 5734.
    sn-monitor (its schedule asks every 900 s from the last request, whatever the
    restores): checkpoints at 900, 1800, 2700. The exit: the launcher restarts in place
    at 1005, running at 1035 (down 35, lost 98). The lost node: silent 10 s (its
    heartbeat) at 3010, the eviction settles 3 s, a spare at 3013, running at 3043
    (down 43, lost 3000 - 2702 = 298). Checkpoints at 3600, 4500. The link: the port
    down only alerts; the job hangs, its progress stops at 5000 and the hang rule (no
    progress for 120 s) sees it at the first sweep past 5120 (every 10 s while the job
    is down, from 5015): 5125, restored onto the other spare, running at 5155 (down
    155, lost 5000 - 4502 = 498). Checkpoints at 5400, 6300:
    7200 - 233 - 894 - 7 x 2 = 6059. The advisor's configuration at 900 s is the same
    (no warning in this trace to checkpoint on).
    """
    results = _by_name(replay(TRACE, SETTINGS, ReplayOptions(policies=(
        "kubernetes", "torchrun", "sn-monitor", "sn-monitor-advisor@900"))))
    hand = {"kubernetes": 4836, "torchrun": 5734, "sn-monitor": 6059,
            "sn-monitor-advisor@900": 6059}
    for name, kept in hand.items():
        assert results[name].ettr == pytest.approx(kept / TWO_HOURS, abs=POINTS_002), name
    assert results["kubernetes"].lost_work_seconds == pytest.approx(954)
    assert results["torchrun"].lost_work_seconds == pytest.approx(384)
    assert results["sn-monitor"].lost_work_seconds == pytest.approx(894, abs=0.1)
    assert {r.interruptions for r in results.values()} == {3}


def test_a_dead_node_is_found_no_sooner_than_its_heartbeat_allows() -> None:
    """The replay sweeps the controller up to 10 minutes apart between faults: the dead
    node's silence runs from its fault, not from the last sweep."""
    [rule] = [r for r in load_rules([packaged_rules()]) if r.name == "node-lost"]
    assert isinstance(rule, HeartbeatRule)
    heartbeat = float(rule.heartbeat_timeout)
    lost = Trace((Fault(time=1234.5, node="node-0003", kind="node-lost", category="host",
                        repair=86400.0),), 3600.0, "one lost node")
    [sn] = replay(lost, SETTINGS, ReplayOptions(policies=("sn-monitor",)))
    assert sn.interruptions == 1
    # found at the first sweep (every second after a fault) at or past the timeout; these
    # are seconds of the replay's virtual clock, not wall time: no machine load moves them
    assert heartbeat <= sn.downtime_seconds["detection"] <= heartbeat + 1.0


def test_a_baseline_at_daly_s_interval_and_at_its_best() -> None:
    results = _by_name(replay(TRACE, SETTINGS, ReplayOptions(policies=(
        "kubernetes", "kubernetes@daly", "kubernetes@auto", "torchrun@10m"))))
    # Daly's from the same 2 s save and its own MTBF: 3 interruptions in 2 hours
    tau = daly(2.0, TWO_HOURS / 3)
    assert results["kubernetes@daly"].checkpoint_interval_seconds == pytest.approx(tau)
    assert "Daly's" in results["kubernetes@daly"].notes[0]
    assert results["torchrun@10m"].checkpoint_interval_seconds == 600
    # its best: no worse than its default or Daly's, and at one of the intervals tried
    best = results["kubernetes@auto"]
    assert best.ettr >= max(results["kubernetes"].ettr, results["kubernetes@daly"].ettr)
    assert any(best.checkpoint_interval_seconds == pytest.approx(seconds)
               for seconds in [900.0, *(tau * f for f in SEARCH_FACTORS)])
    assert (best.title, results["kubernetes"].title) == (
        "Kubernetes, best interval", "Kubernetes default")


def test_the_headline_is_against_the_best_baseline() -> None:
    results = replay(TRACE, SETTINGS, ReplayOptions(policies=(
        "kubernetes", "kubernetes@auto", "torchrun@auto", "sn-monitor")))
    best = max(results[:3], key=lambda r: r.ettr)
    gap = (results[3].ettr - best.ettr) * 100
    text = table(results, TRACE, SETTINGS, None)
    assert f"sn-monitor: {gap:+.2f} points of ETTR over the best baseline ({best.title}:" \
        in text
    assert "Daly 2006: J. T. Daly" in text
    assert "a person acts on what no tool does after 900 s" in text


@pytest.mark.parametrize(("text", "parsed"), [
    ("kubernetes", ("kubernetes", None)), ("torchrun@daly", ("torchrun", "daly")),
    ("sn-monitor@auto", ("sn-monitor", "auto")), ("kubernetes@4m", ("kubernetes", 240.0)),
])
def test_a_policy_is_named_with_its_interval(text: str, parsed: tuple[str, object]) -> None:
    assert parse_policy(text) == parsed


@pytest.mark.parametrize(("args", "says"), [
    (["--policies", "kubernetes@soon"], "--policies: expected a duration"),
    (["--operator-response", "later"], "--operator-response: expected a duration"),
])
def test_a_bad_interval_or_response_exits_2(args: list[str], says: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from sn_monitor.cli import build_parser  # not main(): it sets the process's logging
    from sn_monitor.goodput.command import run_goodput

    assert run_goodput(build_parser().parse_args(["goodput", *args])) == 2
    assert says in capsys.readouterr().err


def test_the_json_has_each_baseline_at_its_best_and_the_shared_timings(
        capsys: pytest.CaptureFixture[str]) -> None:
    from sn_monitor.cli import build_parser
    from sn_monitor.goodput.command import run_goodput

    args = build_parser().parse_args([
        "goodput", "--nodes", "16", "--spares", "1", "--days", "2", "--json",
        "--operator-response", "10m", "--replacement", "1m",
        "--policies", "kubernetes,kubernetes@auto,torchrun,torchrun@auto"])
    assert run_goodput(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in doc["policies"]] == [
        "kubernetes", "kubernetes@auto", "torchrun", "torchrun@auto"]
    assert (doc["job"]["operator_response"], doc["job"]["replacement"]) == (600, 60)
    for policy in doc["policies"]:
        assert any("(assumed)" in line for line in policy["assumes"])


def test_a_replacement_node_comes_no_sooner_than_the_cluster_gives_it() -> None:
    """A person takes the node out while the watchdog's restart onto it is starting: that
    start dies, and the job runs again on the new node ``replacement`` later."""
    slow = WorldSettings(nodes=20, spares=0, step_seconds=Duration(10),
                         save_blocking=Duration(2), save_persist=Duration(8),
                         relaunch=Duration(20), load=Duration(10),
                         operator_response=Duration(610), replacement=Duration(300))
    link = Trace((Fault(time=1000.0, node="node-0002", kind="ib-link", category="network",
                        repair=86400.0),), TWO_HOURS, "a link down")
    [k8s] = replay(link, slow, ReplayOptions(policies=("kubernetes",)))
    # watchdog at 1600 (starting until 1630), the person at 1610, a node at 1910,
    # running at 1940: down 940
    assert sum(k8s.downtime_seconds.values()) == pytest.approx(940)
