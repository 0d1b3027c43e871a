"""Goodput replays: hand-checked ETTR per policy, determinism, the advisor on a constant
rate, trace files and their errors, the subcommand."""

from __future__ import annotations

import json
import logging
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from sn_monitor.config import ConfigError, Duration
from sn_monitor.controller.jobs.advisor import young
from sn_monitor.goodput.controlled import ControlledReplay
from sn_monitor.goodput.replay import ReplayOptions, job_nodes, refine, replay
from sn_monitor.goodput.results import PolicyResult, to_json
from sn_monitor.goodput.trace import (
    Fault,
    Trace,
    draw,
    load_catalogue,
    load_trace,
    parse_trace_text,
)
from sn_monitor.goodput.world import WorldSettings
from sn_monitor.rules.spec import load_rules, packaged_rules

#: Small enough to compute by hand: 4 nodes, one spare, 10 s steps, a 2 s pause per
#: checkpoint that is complete 8 s later, relaunch 20 s, load 10 s, one hour.
TINY = WorldSettings(nodes=4, spares=1, step_seconds=Duration(10), save_blocking=Duration(2),
                     save_persist=Duration(8), relaunch=Duration(20), load=Duration(10))
HOUR = 3600.0


def _one_xid(at: float = 2000.0) -> Trace:
    return Trace((Fault(time=at, node="node-0001", kind="xid", code=79, category="gpu",
                        repair=86400.0),), HOUR, "hand")


def _by_name(results: list[PolicyResult]) -> dict[str, PolicyResult]:
    return {r.name: r for r in results}


def test_each_policy_s_ettr_is_the_hand_calculation() -> None:
    """One XID at t = 2000 s. Work is training time kept; a checkpoint pauses it 2 s.

    Kubernetes: checkpoints at 900 (work 900) and 1800 (work 1798); the fault at 2000
    (work 1996) is seen at 2010, the job rescheduled at 2040, running at 2070 from 1798
    (lost 198); a checkpoint at 2970; the end at 3600: 3600 - 70 - 198 - 3 x 2 = 3326.
    torchrun: seen at 2005, a replacement node from the cluster 30 s later (the same
    ``replacement`` as Kubernetes'), running at 2065: 3600 - 65 - 198 - 6 = 3331.
    sn-monitor: its schedule asks at 900 and 1800 (each period from the last request);
    the XID fires on the report, the recovery starts after the 3 s settle and restores
    at 2003 onto the spare, the other ranks kept (a warm restart: 15 s, the default
    warm relaunch, test_goodput_warm.py): running at 2028 from 1798 (lost 198); the next
    request at 2700: 3600 - 28 - 198 - 6 = 3368.
    """
    results = _by_name(replay(_one_xid(), TINY, ReplayOptions(
        policies=("kubernetes", "torchrun", "sn-monitor"))))
    k8s, torchrun, sn = results["kubernetes"], results["torchrun"], results["sn-monitor"]
    assert k8s.ettr == pytest.approx(3326 / HOUR, abs=1e-9)
    assert k8s.lost_work_seconds == pytest.approx(198)
    assert k8s.downtime_seconds == pytest.approx(
        {"detection": 10, "eviction": 30, "relaunch": 20, "load": 10})
    assert torchrun.ettr == pytest.approx(3331 / HOUR, abs=1e-9)
    assert torchrun.downtime_seconds == pytest.approx(
        {"detection": 5, "eviction": 30, "relaunch": 20, "load": 10})
    # (the replay wakes the controller a millisecond after each checkpoint is due)
    assert sn.ettr == pytest.approx(3368 / HOUR, abs=1e-5)
    assert sn.lost_work_seconds == pytest.approx(198, abs=0.01)
    assert sn.downtime_seconds == pytest.approx(
        {"detection": 0, "eviction": 3, "relaunch": 15, "load": 10}, abs=0.01)
    assert (k8s.interruptions, torchrun.interruptions, sn.interruptions) == (1, 1, 1)
    assert sn.false_evictions == 0
    # the controller's own gauge (from rank 0's steps and saves as the client reports
    # them, sn_monitor/ettr.py) is the same number: the restore's downtime and the work
    # redone after it are not productive, and neither are the saves' pauses
    assert sn.controller_ettr == pytest.approx(sn.ettr, abs=1e-5)


def test_the_advisor_policy_loses_the_same_and_checkpoints_on_its_own_interval() -> None:
    [advisor] = replay(_one_xid(), TINY, ReplayOptions(policies=("sn-monitor-advisor",)))
    assert advisor.lost_work_seconds == pytest.approx(198, abs=0.01)
    assert advisor.downtime_seconds == pytest.approx(
        {"detection": 0, "eviction": 3, "relaunch": 15, "load": 10}, abs=0.01)
    # after one failure it checkpoints far more often than every 15 minutes, and every
    # checkpoint cost its 2 s: ETTR is the hour less downtime, loss and those pauses
    assert advisor.checkpoint_interval_seconds is not None
    assert advisor.checkpoint_interval_seconds < 900
    started = advisor.checkpoints + (1 if advisor.checkpoints else 0)
    low = (HOUR - 28 - 198 - 2 * started) / HOUR
    high = (HOUR - 28 - 198 - 2 * advisor.checkpoints) / HOUR
    assert low - 1e-5 <= advisor.ettr <= high + 1e-5
    # the gauge misses only the pause of a save not complete (so not reported) at the end
    assert advisor.controller_ettr is not None
    assert advisor.ettr - 1e-5 <= advisor.controller_ettr <= advisor.ettr + 2 / HOUR + 1e-5


def test_a_warning_before_the_fault_saves_the_work_with_a_checkpoint() -> None:
    trace = parse_trace_text("""
duration: 1h
faults:
  - {time: 1500, node: node-0002, kind: xid, code: 48,
     warning: {signal: row-remap-pending, lead: 10m}}
""", "warned.yaml")
    results = _by_name(replay(trace, TINY, ReplayOptions(policies=("kubernetes",
                                                                   "sn-monitor"))))
    # the pending remap at 900 s asks for a checkpoint at once (pending-row-remap has
    # the checkpoint action): the work lost is what came after it, not the interval's
    assert results["sn-monitor"].lost_work_seconds < 700
    assert results["kubernetes"].lost_work_seconds == pytest.approx(1500 - 902)


def test_the_replay_is_deterministic_for_a_seed() -> None:
    # 64 nodes: the default policy lets 10 % of the fleet be out at once (repairs last)
    settings = WorldSettings(nodes=64, spares=4)
    trace = draw(load_catalogue(), job_nodes(settings), 2 * 86400.0, seed=7)
    assert trace == draw(load_catalogue(), job_nodes(settings), 2 * 86400.0, seed=7)
    assert trace != draw(load_catalogue(), job_nodes(settings), 2 * 86400.0, seed=8)
    heavy = Trace(trace.faults + tuple(
        Fault(time=t, node=f"node-{7 * i:04d}", kind=kind, code=79 if kind == "xid" else None,
              category=kind, repair=7200.0)
        for i, (t, kind) in enumerate([(20_000.0, "xid"), (50_000.0, "node-lost"),
                                       (90_000.0, "ib-link"), (120_000.0, "hang"),
                                       (150_000.0, "software")])), trace.duration, "test")
    heavy = Trace(tuple(sorted(heavy.faults, key=lambda f: f.time)), heavy.duration, "t")

    def run() -> dict[str, object]:
        doc = to_json(replay(heavy, settings), heavy, settings, 7, 0.0)
        for policy in doc["policies"]:  # type: ignore[union-attr]
            policy.pop("replay_seconds")
        return doc
    first = run()
    assert first == run()
    by_name = {p["name"]: p for p in first["policies"]}  # type: ignore[index,union-attr]
    for name, policy in by_name.items():
        assert policy["interruptions"] >= 5, (name, policy)
    # every kind was recovered from: the job ran again after each (ETTR well above 0)
    assert all(p["ettr"] > 0.8 for p in by_name.values()), by_name


def test_the_advisor_s_interval_is_young_daly_on_a_constant_rate() -> None:
    """A fault every 2 h: the controller's recommendation is sqrt(2 x 2 s x 2 h) +- 10 %."""
    settings = WorldSettings(nodes=16, spares=1, save_blocking=Duration(2.0))
    mtbf = 7200.0
    faults = tuple(Fault(time=mtbf * (i + 1), node=f"node-{(5 * i) % 16:04d}", kind="xid",
                         code=79, category="gpu", repair=3600.0) for i in range(35))
    trace = Trace(faults, mtbf * 36, "constant rate")
    run = ControlledReplay(trace, settings, job_nodes(settings),
                           load_rules([packaged_rules()]), state_dir=_tmp(),
                           interval="auto")
    try:
        run.run()
        status = run.controller.get_job("llm")
    finally:
        run.close()
    assert status is not None
    expected = young(2.0, mtbf)
    recommended = status["checkpoint_interval_recommended_seconds"]
    assert recommended == pytest.approx(expected, rel=0.10), (recommended, expected, status)
    assert status["checkpoint_interval_seconds"] == recommended  # auto: applied
    assert status["checkpoint_save_seconds"] == pytest.approx(2.0)


def test_refine_replays_intervals_around_the_advised_one() -> None:
    """Faults at random (Poisson, MTBF 1 h): the advised interval is near the replay's best.

    64 nodes: the default policy keeps at most 10 % of the fleet out at once.
    """
    settings = WorldSettings(nodes=64, spares=4, save_blocking=Duration(2.0))
    rng = random.Random(5)
    faults, t = [], rng.expovariate(1 / 3600.0)
    while t < 2 * 86400.0:
        faults.append(Fault(time=round(t, 3), node=f"node-{rng.randrange(64):04d}",
                            kind="xid", code=79, category="gpu", repair=1800.0))
        t += rng.expovariate(1 / 3600.0)
    advised = young(2.0, 3600.0)
    pairs = refine(Trace(tuple(faults), 2 * 86400.0, "poisson"), settings, advised)
    ettr = {round(i): e for i, e in pairs}
    assert sorted(ettr) == [round(advised * f) for f in (0.5, 0.75, 1.0, 1.5, 2.0)]
    assert pairs == sorted(pairs, key=lambda p: -p[1])
    assert max(ettr.values()) - ettr[round(advised)] < 0.005, pairs
    assert ettr[round(advised)] > ettr[round(advised * 0.5)], pairs


def _tmp() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="sn-goodput-test-"))


# ---------------------------------------------------------------------- trace files


def test_trace_files_yaml_csv_and_recorded_incidents(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(
        "# time, node, kind: one fault a line\n"
        "time,node,kind,code,warning,lead,repair\n"
        "1h,gpu-a,xid,79,thermal,10m,2d\n"
        "7200,gpu-b,node-lost,,,,4h\n")
    trace = load_trace(tmp_path / "t.csv")
    assert [(f.time, f.node, f.kind, f.code) for f in trace.faults] == [
        (3600.0, "gpu-a", "xid", 79), (7200.0, "gpu-b", "node-lost", None)]
    assert trace.faults[0].warning is not None
    assert trace.faults[0].warning.lead == 600.0
    assert trace.faults[1].repair == 4 * 3600.0
    incidents = [
        {"rule": "pending-row-remap", "node": "n7", "observed_at": 1000.0},
        {"rule": "fatal-xid", "node": "n7", "observed_at": 2800.0, "closed_at": 9000.0},
        {"rule": "node-lost", "node": "n2", "observed_at": 5000.0},
        {"rule": "gpu-overheat", "node": "n9", "observed_at": 100.0},
        {"rule": "job-hang", "node": "job:llm", "observed_at": 8000.0},
    ]
    (tmp_path / "incidents.json").write_text(json.dumps(incidents))
    recorded = load_trace(tmp_path / "incidents.json")
    assert [(f.node, f.kind, f.time) for f in recorded.faults] == [
        ("n7", "xid", 2700.0), ("n2", "node-lost", 4900.0), ("llm", "hang", 7900.0)]
    assert recorded.faults[0].warning is not None
    assert recorded.faults[0].warning.signal == "row-remap-pending"
    assert recorded.faults[0].warning.lead == pytest.approx(1800.0)
    assert recorded.faults[0].repair == pytest.approx(6200.0)


def test_a_recorded_run_replays_as_a_trace(tmp_path: Path) -> None:
    """The incidents a controller recorded (GET /api/v1/incidents) are a trace again."""
    settings = WorldSettings(nodes=16, spares=2)
    original = Trace((
        Fault(time=1000.0, node="node-0002", kind="xid", code=79, category="gpu",
              repair=7200.0),
        Fault(time=5000.0, node="node-0009", kind="node-lost", category="psu",
              repair=7200.0)), 4 * 3600.0, "two faults")
    run = ControlledReplay(original, settings, job_nodes(settings),
                           load_rules([packaged_rules()]), state_dir=tmp_path / "run",
                           interval=900.0)
    try:
        run.run()
        incidents = run.controller.list_incidents(None, None, 1000)
    finally:
        run.close()
    (tmp_path / "incidents.json").write_text(json.dumps(incidents))
    recorded = load_trace(tmp_path / "incidents.json")
    assert [(f.node, f.kind) for f in recorded.faults] == [("node-0002", "xid"),
                                                          ("node-0009", "node-lost")]
    # a lost node is dated from its last report before the silence (the replay's last
    # sweep before the fault, at most its quiet interval earlier)
    gap = recorded.faults[1].time - recorded.faults[0].time
    assert 4000.0 - 600.0 <= gap <= 4000.0 + 10.0, recorded.faults
    results = _by_name(replay(recorded, settings, ReplayOptions(policies=("sn-monitor",))))
    assert results["sn-monitor"].interruptions == 2


@pytest.mark.parametrize(("name", "text", "where"), [
    ("bad-kind.csv", "time,node,kind\n10,n1,hang\n20,n2,meltdown\n", "bad-kind.csv:3: kind:"),
    ("no-code.csv", "time,node,kind\n10,n1,xid\n", "no-code.csv:2:"),
    ("bad-time.csv", "time,node,kind\nsoon,n1,hang\n", "bad-time.csv:2: time:"),
    ("bad-column.csv", "time,node,kind,colour\n", "bad-column.csv:1: colour:"),
    ("bad-time.yaml", "faults:\n  - {time: 1h, node: n1, kind: hang}\n"
                      "  - {time: later, node: n1, kind: hang}\n", "bad-time.yaml:3:"),
    ("no-node.yaml", "faults:\n  - {time: 1h, kind: hang}\n", "no-node.yaml:2:"),
    ("outside.yaml", "duration: 1h\nfaults:\n  - {time: 2h, node: n1, kind: hang}\n",
     "outside.yaml: duration:"),
    ("broken.json", '[{"rule": "node-lost",\n "node": }]', "broken.json:2:"),
])
def test_a_bad_trace_file_names_the_file_and_line(tmp_path: Path, name: str, text: str,
                                                   where: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as err:
        load_trace(tmp_path / name)
    assert str(err.value).startswith(f"{tmp_path / name}".rsplit("/", 1)[0]), err.value
    assert where in str(err.value), err.value


def test_a_missing_or_unknown_trace_file_and_a_bad_catalogue_are_named(
        tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_trace(tmp_path / "gone.csv")
    (tmp_path / "trace.txt").write_text("time,node,kind\n")
    with pytest.raises(ConfigError, match=r"trace.txt: a trace is a \.yaml, \.csv or \.json"):
        load_trace(tmp_path / "trace.txt")
    (tmp_path / "cat.yaml").write_text(
        "source: mine\ndays: 10\nnodes: 8\ncategories:\n"
        "  - {name: gpu, count: 3, shows_as: xid}\n")
    with pytest.raises(ConfigError) as err:
        load_catalogue(tmp_path / "cat.yaml")
    assert "cat.yaml:5: categories[0].shows_as: an XID needs its code" in str(err.value)


@pytest.mark.parametrize(("args", "says"), [
    (["--policies", "kubernetes,slurm"], "--policies: unknown slurm"),
    (["--step", "soon"], "--step: expected a duration"),
    (["--nodes", "0"], "need at least one node"),
])
def test_a_bad_option_exits_2_saying_which(args: list[str], says: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from sn_monitor.cli import build_parser  # not main(): it sets the process's logging
    from sn_monitor.goodput.command import run_goodput

    assert run_goodput(build_parser().parse_args(["goodput", *args])) == 2
    assert says in capsys.readouterr().err


def test_the_catalogue_is_the_paper_s_table() -> None:
    catalogue = load_catalogue()
    assert catalogue.total() == 419
    assert (catalogue.days, catalogue.nodes) == (54, 2048)
    counts = {c.name: c.count for c in catalogue.categories}
    assert counts["faulty-gpu"] == 148
    assert counts["gpu-hbm3-memory"] == 72
    trace = draw(catalogue, [f"node-{i:04d}" for i in range(2048)], 54 * 86400.0, seed=1)
    assert abs(len(trace.faults) - 419) < 4 * math.sqrt(419)  # a Poisson draw of it


# ---------------------------------------------------------------------- the subcommand


def test_the_subcommand_prints_json_and_refuses_a_bad_trace(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sn_monitor.cli", "goodput", "--nodes", "8", "--spares", "1",
         "--days", "1", "--seed", "3", "--policies", "kubernetes,torchrun", "--json"],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [p["name"] for p in doc["policies"]] == ["kubernetes", "torchrun"]
    assert doc["trace"]["seed"] == 3
    (tmp_path / "bad.csv").write_text("time,node,kind\n1h,n1,explodes\n")
    bad = subprocess.run(
        [sys.executable, "-m", "sn_monitor.cli", "goodput", "--trace",
         str(tmp_path / "bad.csv")], capture_output=True, text=True, timeout=120,
        check=False)
    assert bad.returncode == 2
    assert f"{tmp_path / 'bad.csv'}:2: kind:" in bad.stderr
    assert "Traceback" not in bad.stderr


# ---------------------------------------------------------------------- logging


def test_a_replay_logs_nothing_above_warning_unless_asked(
        caplog: pytest.LogCaptureFixture) -> None:
    """The XID outlasts every rung: the simulated controller says "needs a person"
    (CRITICAL) only when the person running the replay asked for its logs."""
    from sn_monitor.cli import build_parser  # not main(): it sets the process's logging
    from sn_monitor.goodput.command import run_goodput

    caplog.set_level(logging.DEBUG)
    quiet = ReplayOptions(policies=("sn-monitor",))
    [result] = replay(_one_xid(), TINY, quiet)
    assert result.interruptions == 1  # the fault was played and handled
    assert [r.getMessage() for r in caplog.records if r.levelno > logging.WARNING] == []
    assert logging.getLogger("sn_monitor.controller").level == logging.NOTSET  # restored

    replay(_one_xid(), TINY, ReplayOptions(policies=("sn-monitor",), controller_logs=True))
    assert any("no rung cleared the fault" in r.getMessage() and r.levelno == logging.CRITICAL
               for r in caplog.records)

    caplog.clear()
    args = build_parser().parse_args(["goodput", "--nodes", "64", "--spares", "2",
                                      "--days", "3", "--policies", "sn-monitor", "--json"])
    assert run_goodput(args) == 0
    assert [r.getMessage() for r in caplog.records if r.levelno > logging.WARNING] == []
