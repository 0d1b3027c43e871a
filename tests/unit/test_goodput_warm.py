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
LOST = Trace((Fault(time=3000.0, node="node-0001", kind="node-lost", category="host",
                    repair=86400.0),), TWO_HOURS, "one lost node")
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
    node lost at 3000 is silent 10 s (its heartbeat) at 3010, the eviction settles 3 s:
    restored at 3013 onto a spare, every other rank kept: warm, running at 3013 + 5 + 10
    = 3028 (down 28, lost 3000 - 2702 = 298). Checkpoints at 3600, 4500, 5400, 6300:
    7200 - 28 - 298 - 7 x 2 = 6860 (cold, 15 s later: 6845)."""
    [sn] = replay(LOST, SETTINGS, ReplayOptions(policies=("sn-monitor",)))
    assert sn.ettr == pytest.approx(6860 / TWO_HOURS, abs=POINTS_002)
    assert sn.downtime_seconds["relaunch"] == pytest.approx(5)
    assert sn.lost_work_seconds == pytest.approx(298, abs=0.1)


def test_a_baseline_s_restart_stays_cold() -> None:
    """torchrun: the node found at 3015, a replacement at 3045, running at 3075."""
    results = replay(LOST, SETTINGS, ReplayOptions(policies=("kubernetes", "torchrun")))
    for result in results:
        assert result.interruptions == 1
        assert result.downtime_seconds["relaunch"] == pytest.approx(20), result.name


def test_a_restore_onto_a_node_given_back_is_cold() -> None:
    """One spare. The node lost at 1000 is replaced by the spare (warm: 5 s), repaired
    10 minutes later and given back to the pool; the node lost at 3000 is replaced by it:
    it ran no rank and is no pre-warmed spare, so that restore is cold (20 s)."""
    one_spare = dataclasses.replace(SETTINGS, spares=1)
    trace = Trace((
        Fault(time=1000.0, node="node-0001", kind="node-lost", category="host", repair=600.0),
        Fault(time=3000.0, node="node-0002", kind="node-lost", category="host",
              repair=86400.0)), TWO_HOURS, "two lost nodes, the first repaired")
    [sn] = replay(trace, one_spare, ReplayOptions(policies=("sn-monitor",)))
    assert sn.interruptions == 2
    assert sn.downtime_seconds["relaunch"] == pytest.approx(5 + 20)


def test_a_node_given_back_before_a_restore_is_pre_warmed_for_the_next() -> None:
    """Two spares. node-0001, lost at 1000, is replaced by spare-000 (warm), repaired and
    given back 10 minutes later; node-0002, lost at 3000, by spare-001 (warm): that
    restore leaves node-0001 in the pool, and the launcher starts its standby. node-0003,
    lost at 5000, is replaced by node-0001: warm too (5 + 5 + 5)."""
    trace = Trace(tuple(
        Fault(time=at, node=f"node-{i:04d}", kind="node-lost", category="host",
              repair=600.0 if i == 1 else 86400.0)
        for i, at in ((1, 1000.0), (2, 3000.0), (3, 5000.0))), TWO_HOURS, "three lost")
    [sn] = replay(trace, SETTINGS, ReplayOptions(policies=("sn-monitor",)))
    assert sn.interruptions == 3
    assert sn.downtime_seconds["relaunch"] == pytest.approx(5 + 5 + 5)


def test_a_hang_restarts_cold() -> None:
    """Every rank waits in the collective: none can leave it, every one starts again."""
    trace = Trace((Fault(time=3000.0, node="node-0001", kind="hang", category="software",
                         repair=0.0),), TWO_HOURS, "one hang")
    [sn] = replay(trace, SETTINGS, ReplayOptions(policies=("sn-monitor",)))
    assert sn.interruptions == 1
    assert sn.downtime_seconds["relaunch"] == pytest.approx(20)


def test_the_warm_relaunch_and_its_source_are_printed() -> None:
    [k8s] = replay(LOST, SETTINGS, ReplayOptions(policies=("kubernetes",)))
    assert "warm relaunch: 5 s, a restore that keeps the running ranks" in \
        table([k8s], LOST, SETTINGS, None)
    default = WorldSettings(relaunch=Duration(60))
    assert default.relaunch_seconds(warm=True) == WARM_RELAUNCH_AT_SCALE
    assert WorldSettings(relaunch=Duration(10)).relaunch_seconds(warm=True) == 10
    printed = table([k8s], LOST, default, None)
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
