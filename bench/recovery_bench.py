"""Job recovery: how fast a fatal XID becomes a restore request, and the simulated MTTR.

Run with ``python -m bench.recovery_bench`` (``make bench``); ``--quick`` for a smoke run
(two XIDs with settle 0 only, one recovery of a 2-node job: about half a minute).
Real processes on 127.0.0.1 (the integration tests' ``Cluster``,
``tests/integration/cluster.py``): ``sn-monitor controller`` with a sweep every 1 s and
the settle said below, and ``sn-monitor agent --simulate 8`` per node; evictions go to a
command script.

1. **Report -> restore request.** N one-node jobs (restart strategy, one spare each, no
   ranks: nothing to checkpoint first), one XID 79 per node (``/sim/fault``). Latency
   = the restore action's ``created_at`` - the fatal-xid incident's ``detected_at``
   (the controller's receive time of the report carrying the XID). The path: rule ->
   incident -> settle -> recovery -> evict (the command script runs) -> next sweep sees
   it done -> plan -> restore recorded. Measured twice: with the default 3 s settle,
   and with settle 0. The goal (p99 <= 1 s) is the controller's own path, i.e. the
   figure *excluding* settle: settle is a configured wait (the breaker's chance to see
   a burst), not processing.
2. **MTTR with the example job.** A 4-node job of ``sn_monitor/sim/train.py`` ranks
   (step 0.05 s) under ``sn_monitor/sim/launcher.py`` (the demo's launcher), 3 spares,
   settle 1 s; one ``fall-off-bus`` fault at a time on a different node, each recovery
   waited for. MTTR and its split as the orchestrator records them (GET
   /api/v1/recoveries): detection (fault seen -> incident), eviction (-> node evicted:
   settle, the pre-emptive checkpoint of a node still alive, the evict), restart (->
   restore sent: planning), reload (-> progress from the new generation: the launcher's
   kill + start, the ranks' start-up and checkpoint load, their first progress post).
   Goal: <= 40 s.

Nothing fails on a figure; the exit status is 1 when something could not be measured (a
pass raised: a process never healthy, a restore or recovery that never came, a
recovery that failed; listed on stderr at the end).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import requests

from bench.common import add_output_args, finish, pct, results_path, stop_on_sigterm
from sn_monitor.sim import launcher
from tests.integration.cluster import Cluster

ROUTES = {"evict": ["command"], "cordon": ["command"], "uncordon": ["command"]}
#: Defaults except what would stop the bench: many nodes fault within a minute.
POLICY: dict[str, Any] = {"breaker": {"window": "5s", "max_faulted": "100%",
                                      "min_faulted": 1000}}
FAILOVER_RULES = ("fatal-xid", "gpu-lost", "gpu-fallen-off-bus")
#: The MTTR pass's settle (the Cluster's; the latency pass sets its own).
MTTR_SETTLE = "1s"


def _post_job(c: Cluster, spec: dict[str, Any]) -> None:
    reply = requests.post(f"{c.url}/api/v1/jobs", json=spec, timeout=10,
                          headers={"Authorization": f"Bearer {c.admin_token}"})
    if reply.status_code != 201:
        raise RuntimeError(f"POST job: {reply.status_code} {reply.text}")


def _spec(name: str, nodes: list[str], spares: list[str], ckpt: Path,
          control: list[str]) -> dict[str, Any]:
    return {"apiVersion": "sn-monitor/v1", "kind": "DistributedJob",
            "metadata": {"name": name},
            "spec": {"replicas": len(nodes), "nodes": nodes, "spares": spares,
                     "checkpointInterval": "30s", "maxFailures": 10,
                     "recoveryStrategy": "restart", "hangTimeout": "60s",
                     "checkpoint": {"dir": str(ckpt)},
                     "control": {"command": {"program": control, "timeout": "30s"}}}}


# ---------------------------------------------------------------- 1. latency


def latency_pass(tmp: Path, faults: int, settle: float, spacing: float = 1.5
                 ) -> dict[str, Any]:
    """``faults`` one-node jobs, one XID 79 each, ``spacing`` s apart; report -> restore
    recorded."""
    config = {"settle": f"{settle:g}s", "sweep_interval": "1s", "policy": POLICY}
    with Cluster(tmp, nodes=faults, config=config, routes=ROUTES) as c:
        c.start(timeout=120)
        action = [sys.executable, str(tmp / "action.py"), str(c.job_log)]
        for i in range(faults):
            (tmp / f"ckpt-{i}").mkdir()
            _post_job(c, _spec(f"one-{i}", [f"sim-{i}"], [f"spare-{i}"], tmp / f"ckpt-{i}",
                               action))
        for i in range(faults):
            c.agents[f"sim-{i}"].fault("xid", 0, code=79)
            time.sleep(spacing)

        def restores() -> list[dict[str, Any]]:
            found = [a for a in c.actions() if a["action"] == "restore"]
            return found if len(found) >= faults else []
        found = c.wait_for(restores, 60 + faults * 5, f"{faults} restore actions")
        samples: list[float] = []
        for i in range(faults):
            node = f"sim-{i}"
            incidents = [x for x in c.incidents(node=node) if x["rule"] in FAILOVER_RULES]
            restore = [a for a in found if a["params"].get("job") == f"one-{i}"]
            if not incidents or len(restore) != 1:
                raise RuntimeError(f"{node}: incidents {incidents}, restores {restore}")
            detected = min(x["detected_at"] for x in incidents)
            samples.append(restore[0]["created_at"] - detected)
    return {"settle": settle, "samples": samples, "n": len(samples),
            "p50": statistics.median(samples), "p99": pct(samples, 99),
            "max": max(samples)}


# ---------------------------------------------------------------- 2. MTTR


def mttr_pass(tmp: Path, faults: int, size: int = 4) -> dict[str, Any]:
    """A ``size``-node example job with ``faults`` spares; one fall-off-bus at a time, on
    every node but the first in turn."""
    nodes = [f"sim-{i}" for i in range(size)]
    spares = [f"sim-{size + i}" for i in range(faults)]
    config = {"sweep_interval": "1s", "settle": MTTR_SETTLE, "policy": POLICY}
    with Cluster(tmp, nodes=size + faults, config=config, routes=ROUTES) as c:
        state = tmp / "launcher.json"
        ckpt = tmp / "ckpt"
        ckpt.mkdir()
        run = [*launcher.LAUNCHER, "--state", str(state)]
        try:
            c.start(timeout=120)
            subprocess.run([*run, "init", "--controller", c.url, "--job", "example",
                            "--token-file", str(tmp / "agent.token"), "--checkpoint-dir",
                            str(ckpt), "--log-dir", str(tmp / "ranks"), "--",
                            "--steps", "1000000", "--step-time", "0.05",
                            "--checkpoint-every", "100"], check=True, timeout=60)
            _post_job(c, _spec("example", nodes, spares, ckpt, run))
            subprocess.run([*run, "start", "--nodes", ",".join(nodes)], check=True,
                           timeout=60, stdout=subprocess.DEVNULL)
            c.wait_for(lambda: (d := c.get("/api/v1/jobs/example"))["ranks_reporting"] == size
                       and d["checkpoint"] is not None, 90, "the example job running")
            out: list[dict[str, Any]] = []
            for k in range(faults):
                victim = nodes[1 + k % (size - 1)]
                seen = {r["id"] for r in c.get("/api/v1/recoveries", job="example")[
                    "recoveries"]}
                c.agents[victim].fault("fall-off-bus", 0)

                def done(seen: set[str] = seen) -> dict[str, Any]:
                    recs = [r for r in c.get("/api/v1/recoveries", job="example")[
                        "recoveries"] if r["id"] not in seen]
                    return recs[0] if recs and recs[0]["state"] in ("done", "failed") else {}
                rec = c.wait_for(done, 120, f"recovery {k + 1} done")
                if rec["state"] != "done":
                    raise RuntimeError(f"recovery failed: {rec['error']}")
                t = rec["times"]
                out.append({"node": victim, "mttr": rec["mttr_seconds"],
                            "detection": t["detected"] - t["fault_seen"],
                            "eviction": t["evicted"] - t["detected"],
                            "restart": t["restore_sent"] - t["evicted"],
                            "reload": t["resumed"] - t["restore_sent"],
                            "checkpoint_first": "checkpointing" in [
                                h["event"] for h in rec["history"]]})
                time.sleep(2.0)
            return {"job_nodes": size, "settle": MTTR_SETTLE, "recoveries": out}
        finally:
            launcher.kill_ranks(launcher.load(state).get("all_pids", []))


# ---------------------------------------------------------------- output


def render(results: dict[str, Any]) -> str:
    rows = [
        "| what | measured | goal |",
        "|---|---|---|",
    ]
    lat = results["latency"]
    for key, label, goal in (
            ("settle_0", "fatal XID report -> restore request, controller path (settle 0; "
                         "incl. evict script + next sweep)", "p99 <= 1 s"),
            ("settle_default", "the same with the default 3 s settle in the path",
             "(settle + the above)")):
        done = lat.get(key)
        if done is None:
            continue
        if "error" in done:
            rows.append(f"| {label} | ERROR: {done['error'].splitlines()[0]} | {goal} |")
        elif "skipped" in done:
            rows.append(f"| {label} | skipped ({done['skipped']}) | {goal} |")
        else:
            rows.append(f"| {label} | p50 {done['p50']:.2f} s, p99 {done['p99']:.2f} s "
                        f"(n={done['n']}) | {goal} |")
    mttr = results["mttr"]
    if "error" in mttr:
        rows.append(f"| simulated MTTR, example job | ERROR: {mttr['error'].splitlines()[0]} "
                    "| <= 40 s |")
    recs = mttr.get("recoveries", [])
    if recs:
        def med(key: str) -> float:
            return float(statistics.median(r[key] for r in recs))
        rows.append(f"| simulated MTTR, fall-off-bus -> progress resumed, example job "
                    f"({mttr['job_nodes']} nodes, settle {mttr['settle']}) | median "
                    f"{med('mttr'):.1f} s, max {max(r['mttr'] for r in recs):.1f} s "
                    f"(n={len(recs)}) | <= 40 s |")
        for key, what in (("detection", "detection (fault seen -> incident)"),
                          ("eviction", "eviction (settle, checkpoint first, evict)"),
                          ("restart", "restart (plan -> restore sent)"),
                          ("reload", "reload (relaunch, checkpoint load, first progress)")):
            rows.append(f"| - {what} | median {med(key):.2f} s | |")
    return "\n".join(rows)


def problems(results: dict[str, Any]) -> list[str]:
    """What could not be measured; a figure past its goal is a result, not a failure."""
    out = []
    for key, done in results["latency"].items():
        if "error" in done:
            out.append(f"latency {key}: {done['error']}")
        elif "skipped" not in done and not done["n"]:
            out.append(f"latency {key}: no sample")
    mttr = results["mttr"]
    if "error" in mttr:
        out.append(f"mttr: {mttr['error']}")
    elif not mttr.get("recoveries"):
        out.append("mttr: no recovery measured")
    return out


def _attempt(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``, or what it raised (the other passes still run)."""
    try:
        return run()
    except Exception as err:  # noqa: BLE001 - one pass failing must not hide the others
        return {"error": f"{type(err).__name__}: {err}"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery_bench",
                                     description=__doc__.split("\n\n")[0])
    add_output_args(parser, "a smoke run: 2 XIDs with settle 0 only, one recovery of a "
                            "2-node job")
    parser.add_argument("--faults", type=int, default=None,
                        help="XID faults per latency pass (default 10, quick 2)")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    out_path = results_path(args, "recovery.json")
    faults = args.faults or (2 if args.quick else 10)
    mttr_faults, job_nodes = (1, 2) if args.quick else (3, 4)
    spacing = 0.5 if args.quick else 1.5
    results: dict[str, Any] = {"meta": {"when": time.strftime("%Y-%m-%d %H:%M:%S"),
                                        "python": platform.python_version(),
                                        "quick": args.quick, "fault_spacing_s": spacing}}
    with tempfile.TemporaryDirectory(prefix="sn-rbench-") as tmpdir:
        tmp = Path(tmpdir)
        results["latency"] = {
            "settle_0": _attempt(lambda: latency_pass(tmp / "lat0", faults, 0.0, spacing))}
        results["latency"]["settle_default"] = (
            {"skipped": "--quick"} if args.quick
            else _attempt(lambda: latency_pass(tmp / "lat3", faults, 3.0, spacing)))
        results["mttr"] = _attempt(lambda: mttr_pass(tmp / "mttr", mttr_faults, job_nodes))
    return finish(results, out_path, problems(results), render)


if __name__ == "__main__":
    sys.exit(main())
