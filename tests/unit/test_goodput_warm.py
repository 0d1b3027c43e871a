"""Warm restarts in the goodput replay: sn-monitor's restores that keep the running ranks
and take pre-warmed spares relaunch in ``warm_relaunch``, every other start in
``relaunch``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sn_monitor.config import Duration
from sn_monitor.goodput.replay import ReplayOptions, replay
from sn_monitor.goodput.results import table
from sn_monitor.goodput.trace import Fault, Trace
from sn_monitor.goodput.world import (
    TORCHRUN_RELAUNCH,
    WARM_RELAUNCH_AT_SCALE,
    WorldSettings,
    warm_start,
)

#: 20 nodes, two spares, 10 s steps, a 2 s pause per checkpoint complete 8 s later; a
#: cold relaunch of 20 s, a warm one of 5 s, load 10 s.
SETTINGS = WorldSettings(nodes=20, spares=2, step_seconds=Duration(10),
                         save_blocking=Duration(2), save_persist=Duration(8),
                         relaunch=Duration(20), warm_relaunch=Duration(5),
                         load=Duration(10), operator_response=Duration(900),
                         replacement=Duration(30))
TWO_HOURS = 7200.0
#: A fatal XID kills the node's rank on a live host: the peers' collectives fail at once
#: and they can join the next generation (a lost host leaves them waiting: cold).
XID = Trace((Fault(time=3000.0, node="node-0001", kind="xid", code=79, category="gpu",
                   repair=86400.0),), TWO_HOURS, "one fatal XID")
#: 0.02 points of ETTR.
POINTS_002 = 0.0002


@pytest.mark.parametrize(("members", "ranks", "standby", "warm"), [
    (["a", "b", "s"], {"a", "b"}, {"s"}, True),       # a spare for a lost node
    (["a", "b", "c"], {"a", "b", "c"}, set(), True),  # the same nodes, every rank kept
    (["a", "b", "r"], {"a", "b"}, {"s"}, False),      # a node from elsewhere
    (["a", "b", "c"], {"a", "b"}, set(), False),      # c's rank died: started cold
    (["s", "t"], set(), {"s", "t"}, False),           # the whole job crashed
])
def test_a_start_is_warm_when_no_rank_starts_cold(members: list[str], ranks: set[str],
                                                   standby: set[str], warm: bool) -> None:
    assert warm_start(members, ranks, standby) is warm


def test_sn_monitor_s_restore_onto_a_spare_is_warm_on_a_hand_computed_trace() -> None:
    """sn-monitor checkpoints at 900, 1800, 2700 (every 900 s from its last request). The
    XID at 3000 fires on the node's report, the eviction settles 3 s: restored at 3003
    onto a spare, every other rank kept: warm, running at 3003 + 5 + 10 = 3018 (down 18,
    lost 3000 - 2702 = 298). Checkpoints at 3600, 4500, 5400, 6300:
    7200 - 18 - 298 - 7 x 2 = 6870 (cold, 15 s later: 6855)."""
    [sn] = replay(XID, SETTINGS, ReplayOptions(policies=("sn-monitor",)))
    assert sn.ettr == pytest.approx(6870 / TWO_HOURS, abs=POINTS_002)
    assert sn.downtime_seconds["relaunch"] == pytest.approx(5)
    assert sn.lost_work_seconds == pytest.approx(298, abs=0.1)


def test_a_baseline_s_restart_stays_cold() -> None:
    """Kubernetes and torchrun restart every rank, whatever the fault."""
    results = replay(XID, SETTINGS, ReplayOptions(policies=("kubernetes", "torchrun")))
    for result in results:
        assert result.interruptions == 1
        assert result.downtime_seconds["relaunch"] == pytest.approx(20), result.name


def test_a_restore_onto_a_node_given_back_is_cold() -> None:
    """One spare. node-0001's XID at 1000: replaced by the spare (warm: 5 s), repaired
    10 minutes later and given back to the pool, after the restore that could have
    pre-warmed it; node-0002's XID at 3000: replaced by it, which ran no rank and is no
    pre-warmed spare, so that restore is cold (20 s)."""
    one_spare = dataclasses.replace(SETTINGS, spares=1)
    trace = Trace((
        Fault(time=1000.0, node="node-0001", kind="xid", code=79, category="gpu",
              repair=600.0),
        Fault(time=3000.0, node="node-0002", kind="xid", code=79, category="gpu",
              repair=86400.0)), TWO_HOURS, "two XIDs, the first node repaired")
    [sn] = replay(trace, one_spare, ReplayOptions(policies=("sn-monitor",)))
    assert sn.interruptions == 2
    assert sn.downtime_seconds["relaunch"] == pytest.approx(5 + 20)


def test_a_node_given_back_before_a_restore_is_pre_warmed_for_the_next() -> None:
    """Two spares. node-0001 (an XID at 1000) is replaced by spare-000 (warm), repaired
    and given back 10 minutes later; node-0002 (3000) by spare-001 (warm): that restore
    leaves node-0001 in the pool, and the launcher starts its standby. node-0003 (5000)
    is replaced by node-0001: warm too (5 + 5 + 5)."""
    trace = Trace(tuple(
        Fault(time=at, node=f"node-{i:04d}", kind="xid", code=79, category="gpu",
              repair=600.0 if i == 1 else 86400.0)
        for i, at in ((1, 1000.0), (2, 3000.0), (3, 5000.0))), TWO_HOURS, "three XIDs")
    [sn] = replay(trace, SETTINGS, ReplayOptions(policies=("sn-monitor",)))
    assert sn.interruptions == 3
    assert sn.downtime_seconds["relaunch"] == pytest.approx(5 + 5 + 5)


@pytest.mark.parametrize(("kind", "category"), [
    ("hang", "software"), ("node-lost", "host"), ("ib-link", "network")])
def test_a_fault_that_leaves_every_rank_waiting_restarts_cold(kind: str,
                                                              category: str) -> None:
    """A hang, a lost host (its connections never close), a link down: every rank waits
    in its collective and none can leave it, so every one starts again."""
    trace = Trace((Fault(time=3000.0, node="node-0001", kind=kind, category=category,
                         repair=86400.0 if kind != "hang" else 0.0),), TWO_HOURS, kind)
    [sn] = replay(trace, SETTINGS, ReplayOptions(policies=("sn-monitor",)))
    assert sn.interruptions == 1
    assert sn.downtime_seconds["relaunch"] == pytest.approx(20)


def test_the_warm_relaunch_and_its_source_are_printed() -> None:
    [k8s] = replay(XID, SETTINGS, ReplayOptions(policies=("kubernetes",)))
    assert "warm relaunch: 5 s, a restore that keeps the running ranks" in \
        table([k8s], XID, SETTINGS, None)
    default = WorldSettings(relaunch=Duration(60))
    assert default.relaunch_seconds(warm=True) == WARM_RELAUNCH_AT_SCALE
    assert WorldSettings(relaunch=Duration(10)).relaunch_seconds(warm=True) == 10
    printed = table([k8s], XID, default, None)
    assert TORCHRUN_RELAUNCH.source in printed
    assert f"{TORCHRUN_RELAUNCH.warm_seconds:g} s warm" in printed


def test_warm_relaunch_is_an_option_and_in_the_json(
        capsys: pytest.CaptureFixture[str]) -> None:
    from sn_monitor.cli import build_parser  # not main(): it sets the process's logging
    from sn_monitor.goodput.command import run_goodput

    args = build_parser().parse_args([
        "goodput", "--nodes", "4", "--spares", "1", "--days", "0.1", "--json",
        "--warm-relaunch", "7s", "--policies", "torchrun"])
    assert run_goodput(args) == 0
    job = json.loads(capsys.readouterr().out)["job"]
    assert (job["relaunch"], job["warm_relaunch"]) == (60, 7)
    assert job["warm_relaunch_source"].endswith("(--warm-relaunch)")
