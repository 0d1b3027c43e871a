"""The controller SIGKILLed at each point of one job recovery, then started again.

Real processes: ``sn-monitor controller``, simulated agents, the job's launcher
(``sn_monitor.sim.launcher``, its restore can be held on a gate) and training ranks, and
a drain program as the eviction driver (``drivers.command``): like a real one it keeps
the action ids it carried out and takes a repeat as done, and it can be held on a gate
or made to fail once. For every point, a fatal XID on a node of the job; at the point
the controller gets SIGKILL; then it starts again on the same state directory. Each
recovery must end ``done`` with the drain program and the launcher's restore each
carried out exactly once, and one audit record per step (no step submitted twice, no
retry key).

The points, in the order a recovery passes them: before the incident (the controller is
stopped and killed with the XID still in the agent's spool), while it settles, while it
waits for the checkpoint, with the drain program running, the moment the drain program
finished, while the drain's retry waits, with the launcher's restore running, after the
launcher took it, with the new generation's ranks starting (before their first
progress), and right after the recovery was done.

``SN_CRASH_ROUNDS`` repeats every point (``make soak`` runs three rounds; ``make test``
one); ``SN_CRASH_REPORT`` names a file that gets one JSON line per round with its counts
(``make soak`` writes ``build/crash-report.jsonl``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sn_monitor.sim import launcher
from tests.integration.cluster import Cluster, metric_value
from tests.support.job_recovery import CONFIG, WAIT, Job, cluster_with, new_job

pytestmark = pytest.mark.integration

ROUNDS = int(os.environ.get("SN_CRASH_ROUNDS", "1"))
REPORT = os.environ.get("SN_CRASH_REPORT")
POLL = 0.05

#: The drain program: keeps the ids it carried out (a repeat is "already done"); holds
#: while GATE exists; fails once (exit 75: retry) when FAIL_ONCE exists.
DRAIN = """\
import json, os, sys, time
root = sys.argv[1]
action, node, action_id = (os.environ.get(k, "") for k in
                           ("SN_ACTION", "SN_NODE", "SN_ACTION_ID"))
def log(what):
    with open(os.path.join(root, "drain.log"), "a") as out:
        out.write(json.dumps({"what": what, "action": action, "node": node,
                              "id": action_id, "at": time.time()}) + "\\n")
if action != "evict":
    log("other")
    print(f"{action} {node} done")
    sys.exit(0)
done_path = os.path.join(root, "drained-ids")
done = open(done_path).read().split() if os.path.exists(done_path) else []
if action_id in done:
    log("repeat")
    print(f"evict {node}: already done ({action_id})")
    sys.exit(0)
fail_once = os.path.join(root, "fail-once")
if os.path.exists(fail_once):
    os.remove(fail_once)
    log("failed")
    sys.exit(75)
log("started")
gate = os.path.join(root, "drain-gate")
deadline = time.monotonic() + 60
while os.path.exists(gate) and time.monotonic() < deadline:
    time.sleep(0.05)
with open(done_path, "a") as out:
    out.write(action_id + "\\n")
log("drained")
print(f"evicted {node}")
"""


class CrashWorld:
    """The cluster, the job and the gates of one crash test."""

    def __init__(self, c: Cluster, job: Job, root: Path) -> None:
        self.c = c
        self.job = job
        self.root = root
        self.drain_gate = root / "drain-gate"
        self.restore_gate = root / "restore-gate"
        self.faulted: dict[str, int] = {}

    # -- reading

    def drain_log(self) -> list[dict[str, Any]]:
        path = self.root / "drain.log"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def recoveries(self) -> list[dict[str, Any]]:
        return self.job.recoveries()

    def newest(self, known: set[str]) -> dict[str, Any] | None:
        fresh = [r for r in self.recoveries() if r["id"] not in known]
        return fresh[0] if fresh else None

    # -- acting

    def kill_when(self, what: str, probe: Callable[[], object]) -> None:
        """SIGKILL the controller as soon as ``probe`` holds (polling fast)."""
        deadline = time.monotonic() + WAIT
        while True:
            try:
                if probe():
                    break
            except (requests.RequestException, ValueError, KeyError, IndexError):
                pass
            assert time.monotonic() < deadline, f"never saw {what}\n{self.c.logs()}"
            time.sleep(POLL)
        assert self.c.controller.kill(signal.SIGKILL) == -signal.SIGKILL

    def fault(self, node: str) -> None:
        """A fatal XID (48, a double-bit ECC error) on the next GPU of ``node`` not yet used:
        an XID incident stays open for its rule's ``clear_after`` (10 m), and a node comes
        back in later rounds.
        """
        gpu = self.faulted.get(node, 0)
        self.faulted[node] = gpu + 1
        self.c.agents[node].fault("xid", gpu % 8, code=48)

    def fault_alive(self, node: str) -> None:
        """An uncorrectable ECC error on the next GPU of ``node``: the ranks live on (unlike
        after an XID), so the recovery asks for a checkpoint first."""
        gpu = self.faulted.get(node, 0)
        self.faulted[node] = gpu + 1
        self.c.agents[node].fault("ecc-uncorrectable", gpu % 8)

    def restart_delay(self, seconds: float) -> None:
        with launcher.locked(self.job.state_path) as state:
            state["restart_delay"] = seconds


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashWorld]:
    root = tmp_path_factory.mktemp("crash")
    (root / "drain.py").write_text(DRAIN)
    config = {
        # settle long enough that a poll on a loaded machine sees the incident within it
        **CONFIG, "settle": "5s",
        # one fault at a time, each a few seconds after the last: not a partition
        "policy": {**CONFIG["policy"], "node_cooldown": "0s", "breaker": {"enabled": False}},
        "runner": {"retries": 3, "backoff": "3s", "timeout": "15s"},
        # the recovery's crash points, not the node's repair (test_remediation's)
        "remediation": {"enabled": False},
        "drivers": {"command": {"program": [sys.executable, str(root / "drain.py"),
                                            str(root)], "timeout": "90s"}},
    }
    with cluster_with(root / "cluster", 4) as c:
        _merge_config(c, config)
        c.start()
        job = new_job(c, "crashy", ["sim-0", "sim-1"], ["sim-2", "sim-3"], max_failures=100,
                      hold_file=root / "restore-gate")
        job.post()
        job.start()
        yield CrashWorld(c, job, root)


def _merge_config(c: Cluster, extra: dict[str, Any]) -> None:
    import yaml

    from tests.integration.cluster import _merge
    settings = yaml.safe_load(c.config_path.read_text())
    _merge(settings, extra)
    c.config_path.write_text(yaml.safe_dump(settings, sort_keys=False))


def _state(world: CrashWorld, known: set[str]) -> str | None:
    rec = world.newest(known)
    return rec["state"] if rec else None


def _action_state(world: CrashWorld, known: set[str], step: str) -> str | None:
    rec = world.newest(known)
    if rec is None or step not in rec["actions"]:
        return None
    return str(next(a["state"] for a in world.c.actions() if a["id"] == rec["actions"][step]))


def _drain(world: CrashWorld, what: str, node: str, since: int) -> bool:
    return any(x["what"] == what and x["node"] == node for x in world.drain_log()[since:])


POINTS: dict[str, Callable[[CrashWorld, str, set[str], int], None]] = {}


def point(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        POINTS[name] = fn
        return fn
    return register


@point("before-the-incident")
def _before_incident(w: CrashWorld, node: str, known: set[str], log: int) -> None:
    assert w.c.controller.popen is not None
    w.c.controller.popen.send_signal(signal.SIGSTOP)

    def xids() -> float:
        return metric_value(w.c.agents[node].metrics(), "sn_agent_events_total",
                            kind="xid") or 0.0
    before = xids()
    w.fault(node)
    # the agent has the XID (spooled; its report waits on the stopped controller)
    w.c.wait_for(lambda: xids() > before, WAIT, f"{node}'s agent seeing the XID")
    assert w.c.controller.kill(signal.SIGKILL) == -signal.SIGKILL


@point("while-settling")
def _settling(w: CrashWorld, node: str, known: set[str], log: int) -> None:
    w.fault(node)
    w.kill_when("the incident, before its settle time", lambda: any(
        i["node"] == node and i["rule"] == "fatal-xid" for i in w.c.incidents(status="open"))
        and w.newest(known) is None)


@point("while-checkpointing")
def _checkpointing(w: CrashWorld, node: str, known: set[str], log: int) -> None:
    w.fault_alive(node)
    w.kill_when("the recovery waiting for its checkpoint",
                lambda: _state(w, known) == "checkpointing")


@point("drain-running")
def _drain_running(w: CrashWorld, node: str, known: set[str], log: int) -> None:
    w.drain_gate.touch()
    w.fault(node)
    w.kill_when("the drain program running", lambda: _drain(w, "started", node, log))
    w.drain_gate.unlink()


@point("drain-done")
def _drain_done(w: CrashWorld, node: str, known: set[str], log: int) -> None:
    w.fault(node)
    w.kill_when("the drain program done", lambda: _drain(w, "drained", node, log))


@point("drain-retry-waiting")
def _drain_retry(w: CrashWorld, node: str, known: set[str], log: int) -> None:
    (w.root / "fail-once").touch()
    w.fault(node)
    w.kill_when("the drain's retry waiting", lambda: _drain(w, "failed", node, log)
                and _action_state(w, known, f"evict:{node}") == "pending")


@point("restore-running")
def _restore_running(w: CrashWorld, node: str, known: set[str], log: int) -> None:
    w.restore_gate.touch()
    waiting = Path(str(w.restore_gate) + ".waiting")
    waiting.unlink(missing_ok=True)
    w.fault(node)
    w.kill_when("the launcher's restore running", waiting.exists)
    w.restore_gate.unlink()


@point("restore-taken")
def _restore_taken(w: CrashWorld, node: str, known: set[str], log: int) -> None:
    w.restart_delay(4.0)
    w.fault(node)
    w.kill_when("the restore taken", lambda: _action_state(w, known, "restore") == "succeeded")


@point("ranks-starting")
def _ranks_starting(w: CrashWorld, node: str, known: set[str], log: int) -> None:
    w.restart_delay(4.0)
    w.fault(node)

    def started() -> bool:
        rec = w.newest(known)
        return bool(rec and rec["state"] == "restoring"
                    and w.job.state().get("generation") == rec["generation"]
                    and rec["times"]["resumed"] is None)
    w.kill_when("the new generation's ranks starting", started)


@point("just-done")
def _just_done(w: CrashWorld, node: str, known: set[str], log: int) -> None:
    w.fault(node)
    w.kill_when("the recovery done", lambda: _state(w, known) == "done")


def _check_round(w: CrashWorld, name: str, node: str, known: set[str], log: int) -> dict[str, Any]:
    """The round's recovery is done; the drain and the restore ran once; one record a step.

    Returns the round's counts: drains carried out and repeats answered "already done",
    restores taken and repeats the launcher took for duplicates, records per step.
    """
    done = w.c.wait_for(lambda: (r := w.newest(known)) and r["state"] == "done" and r,
                        WAIT * 2, f"{name}: the recovery done")
    drains = [x for x in w.drain_log()[log:] if x["node"] == node and x["what"] == "drained"]
    assert len(drains) == 1, (
        f"{name}: {node} drained {len(drains)} times; the recovery: {done}\n"
        f"drain log: {w.drain_log()[log:]}\n{w.c.logs(lines=80)}")
    assert drains[0]["id"] == done["actions"][f"evict:{node}"]
    restores = [x for x in w.job.calls("restore")
                if x["params"].get("recovery") == done["id"] and not x["duplicate"]]
    assert len(restores) == 1, (name, w.job.calls("restore"))
    keys = [a["key"] for a in w.c.actions() if a["key"].startswith(f"recovery:{done['id']}:")]
    assert len(keys) == len(set(keys)), (name, keys)
    steps = {k.split(":", 2)[2] for k in keys}
    assert steps <= {"checkpoint", f"evict:{node}", "restore"}, (name, steps)
    assert {f"evict:{node}", "restore"} <= steps, (name, steps)
    assert done["generation"] == w.job.get()["generation"]
    repeats = [x for x in w.drain_log()[log:] if x["node"] == node and x["what"] == "repeat"]
    duplicates = [x for x in w.job.calls("restore")
                  if x["params"].get("recovery") == done["id"] and x["duplicate"]]
    return {"state": done["state"], "drains": len(drains), "drain_repeats": len(repeats),
            "restores": len(restores), "restore_repeats": len(duplicates),
            "records": {step: sum(1 for k in keys if k.split(":", 2)[2] == step)
                        for step in sorted(steps)}}


def _reset(w: CrashWorld, node: str) -> None:
    """The evicted node is repaired: its GPUs reset, uncordoned and back in the spare pool.

    The reset is the repair: an uncorrectable ECC error leaves a row remap pending until
    the GPU is reset, and a node returned to the pool with it still pending is not
    healthy: a later recovery would find no healthy spare and shrink the job.
    """
    for gpu in range(w.faulted.get(node, 0)):
        w.c.agents[node].fault("gpu-reset", gpu % 8)
    headers = {"Authorization": f"Bearer {w.c.admin_token}"}
    for path in (f"/api/v1/nodes/{node}/uncordon", f"/api/v1/jobs/{w.job.name}/spares/{node}"):
        reply = requests.post(f"{w.c.url}{path}", headers=headers, timeout=10)
        assert reply.status_code in (200, 202), reply.text
    w.restart_delay(0.0)
    for gate in (w.drain_gate, w.restore_gate, w.root / "fail-once"):
        gate.unlink(missing_ok=True)
    # the uncordon runs on the action runner: the next round starts once it has run, so
    # that it never decides with this node still counted out of service
    w.c.wait_for(lambda: not w.c.get(f"/api/v1/nodes/{node}")["cordoned_by_us"], WAIT,
                 f"{node} uncordoned")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [n for n in POINTS for _ in range(ROUNDS)])
def test_a_controller_killed_at_each_point_finishes_the_recovery_once(
        world: CrashWorld, name: str) -> None:
    w = world
    w.c.wait_for(lambda: w.job.get()["state"] == "running"
                 and w.job.get()["ranks_reporting"] == 2, WAIT, "the job running")
    # the member faulted least so far: each fault takes a new GPU (see CrashWorld.fault)
    node = min(w.job.get()["nodes"], key=lambda n: w.faulted.get(n, 0))
    known = {r["id"] for r in w.recoveries()}
    log = len(w.drain_log())
    POINTS[name](w, node, known, log)
    w.c.start_controller()
    counts = _check_round(w, name, node, known, log)
    if REPORT:
        with open(REPORT, "a", encoding="utf-8") as out:
            out.write(json.dumps({"point": name, "node": node, **counts}) + "\n")
    _reset(w, node)
