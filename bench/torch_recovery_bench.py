"""MTTR with a real PyTorch job: torchrun, gloo, DCP, a node that dies, a spare.

Run with ``python -m bench.torch_recovery_bench`` (``make bench``; torch comes with
``pip install -e '.[examples]'``); ``--quick`` for a smoke run (one recovery of a 2-node
job). Real processes on 127.0.0.1 (the integration tests' ``Cluster``):
``sn-monitor controller`` (sweep 1 s, settle 1 s), an ``sn-monitor agent --simulate 8``
per node, and the job of ``examples/pytorch/``: per node a ``torchrun`` agent with one
rank of ``train.py`` (DDP on gloo, async DCP saves every 20 steps, 0.05 s of extra
compute a step), started and restarted by ``launcher.py``.

One fault at a time, on a different node of the job each time: a fatal XID (48) on the
node's simulated GPU, then the node's processes die (its torchrun agent, its rank and its
sn-monitor agent SIGKILLed: the host stays up and their connections close, so the other
ranks' collectives fail at once); each recovery is waited for, and the job's progress past
it, before the next. MTTR is the controller's (fault seen -> the new generation's
progress), split into:

- detection: fault seen -> incident (the agent's report);
- eviction: incident -> node evicted (the settle, the evict command);
- restart: -> restore sent to the launcher (planning, the spare taken);
- relaunch and rendezvous: -> the new ranks' process group formed (cold: the launcher
  kills the old agents, torchrun starts, Python and torch import, c10d rendezvous;
  warm: the plan written, the kept ranks and the standby join; from rank 0's timeline,
  ``train.py --timeline``);
- checkpoint load: -> the DCP checkpoint loaded into the model and optimizer;
- first step: -> the first training step done;
- reported: -> the controller sees that progress (the client's flush interval).

Two passes in one command, each on a job of its own (``--restore`` picks one): *cold*,
the launcher kills every rank and starts torchrun again on the new node list; *warm*
(the launcher's default), the healthy ranks leave the broken generation and join the
next in their own processes, and the spare's pre-warmed standby joins with them
(``examples/pytorch/rejoin.py``). The table gives each pass's split and the warm/cold
ratios of the relaunch phase and of MTTR (medians), which the goodput replay's warm
relaunch is derived from (``sn_monitor/goodput``).

Goal: median MTTR <= 40 s. Nothing fails on a figure; the exit status is 1 when
something could not be measured (torch missing, a process never healthy, a recovery that
never came or failed).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import add_output_args, finish, results_path, stop_on_sigterm
from tests.e2e.torch_job import CONFIG, ROUTES, TorchJob
from tests.integration.cluster import Cluster

SETTLE = "1s"
#: The split, in order: (key, what it covers).
PHASES: tuple[tuple[str, str], ...] = (
    ("detection", "detection (fault seen -> incident)"),
    ("eviction", "eviction (settle, evict)"),
    ("restart", "restart (plan, spare -> restore sent)"),
    ("relaunch", "relaunch and rendezvous (cold: kill, torchrun, import torch, c10d; "
                 "warm: plan, join)"),
    ("load", "checkpoint load (DCP, model + optimizer)"),
    ("first_step", "first step"),
    ("reported", "progress reported to the controller"),
)


def split(rec: dict[str, Any], marks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One recovery's MTTR and its split (controller times + rank 0's timeline)."""
    t = rec["times"]
    rendezvous, loaded, first = (marks[k]["time"] for k in
                                 ("rendezvous", "loaded", "first_step"))
    return {"mttr": rec["mttr_seconds"], "checkpoint_step": rec["checkpoint"]["step"],
            "detection": t["detected"] - t["fault_seen"],
            "eviction": t["evicted"] - t["detected"],
            "restart": t["restore_sent"] - t["evicted"],
            "relaunch": rendezvous - t["restore_sent"],
            "load": loaded - rendezvous, "first_step": first - loaded,
            "reported": t["resumed"] - first}


def fatal_incidents(c: Cluster, node: str) -> list[dict[str, Any]]:
    return [i for i in c.incidents(node=node) if i["rule"] == "fatal-xid"]


def restore_call(job: TorchJob, generation: int) -> dict[str, Any]:
    """What the launcher did for the restore of ``generation`` (kept, standbys, cold)."""
    for call in job.state()["calls"]:
        if call["action"] == "restore" and call["params"].get("generation") == generation \
                and not call["duplicate"]:
            return {k: call.get(k) for k in ("kept", "standbys_used", "cold")}
    return {}


def mttr_pass(tmp: Path, faults: int, size: int, restore: str) -> dict[str, Any]:
    nodes = [f"sim-{i}" for i in range(size)]
    spares = [f"sim-{size + i}" for i in range(faults)]
    config = {**CONFIG, "sweep_interval": "1s", "settle": SETTLE}
    with Cluster(tmp, nodes=size + faults, config=config, routes=ROUTES) as c:
        job = TorchJob(c, "bench", nodes, spares, steps=10_000_000, checkpoint_every=20,
                       step_time=0.05, max_failures=faults + 1, restore=restore)
        try:
            c.start(timeout=120)
            job.post()
            job.start()
            job.wait_checkpoint(20, 240)
            out: list[dict[str, Any]] = []
            for k in range(faults):
                victim = job.get()["nodes"][1 + k % (size - 1)]
                seen = {r["id"] for r in job.recoveries()}
                c.agents[victim].fault("xid", 0, code=48)
                c.wait_for(partial(fatal_incidents, c, victim), 60,
                           f"a fatal-xid incident for {victim}")
                job.kill_node(victim)

                def ended(seen: set[str] = seen) -> dict[str, Any]:
                    recs = [r for r in job.recoveries() if r["id"] not in seen]
                    return recs[0] if recs and recs[0]["state"] in ("done", "failed") else {}
                rec = c.wait_for(ended, 240, f"recovery {k + 1} done")
                if rec["state"] != "done":
                    raise RuntimeError(f"recovery failed: {rec['error']}")
                marks = job.wait_mark("first_step", rec["generation"], 120)
                row = split(rec, job.marks(rec["generation"]))
                row["node"] = victim
                row["launcher"] = restore_call(job, rec["generation"])
                out.append(row)
                print(f"{restore} recovery {k + 1}: {victim} MTTR {row['mttr']:.1f} s, "
                      f"relaunch {row['relaunch']:.2f} s", flush=True)
                # the next fault comes once the new generation has saved a checkpoint
                job.wait_checkpoint(int(marks["step"]) + 20, 240)
            return {"job_nodes": size, "settle": SETTLE, "restore": restore,
                    "recoveries": out}
        finally:
            job.close()


def _median(recs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in recs))


def render_pass(name: str, mttr: dict[str, Any]) -> list[str]:
    if "error" in mttr:
        return [f"| MTTR, {name} restore | ERROR: {mttr['error'].splitlines()[0]} "
                "| <= 40 s |"]
    recs = mttr.get("recoveries", [])
    if not recs:
        return []
    rows = [f"| MTTR, fatal XID + dead node -> progress resumed, torchrun job "
            f"({mttr['job_nodes']} nodes, settle {mttr['settle']}), {name} restore | median "
            f"{_median(recs, 'mttr'):.1f} s, max {max(r['mttr'] for r in recs):.1f} s "
            f"(n={len(recs)}) | <= 40 s |"]
    rows.extend(f"| - {what} | median {_median(recs, key):.2f} s | |" for key, what in PHASES)
    return rows


def render(results: dict[str, Any]) -> str:
    rows = ["| what | measured | goal |", "|---|---|---|"]
    passes = results["passes"]
    for name in MODES:
        if name in passes:
            rows.extend(render_pass(name, passes[name]))
    if ratios := results.get("warm_over_cold"):
        rows.append(f"| warm / cold, medians: relaunch {ratios['relaunch']:.3f}, MTTR "
                    f"{ratios['mttr']:.3f} | | |")
    return "\n".join(rows)


def warm_over_cold(passes: dict[str, Any]) -> dict[str, float] | None:
    """The warm pass's medians over the cold pass's (relaunch, MTTR), when both ran."""
    recs = {name: passes.get(name, {}).get("recoveries") for name in MODES}
    if not (recs["warm"] and recs["cold"]):
        return None
    return {key: _median(recs["warm"], key) / _median(recs["cold"], key)
            for key in ("relaunch", "mttr")}


def problems(results: dict[str, Any]) -> list[str]:
    found = []
    for name, mttr in results["passes"].items():
        if "error" in mttr:
            found.append(f"{name}: {mttr['error']}")
        elif not mttr.get("recoveries"):
            found.append(f"{name}: no recovery measured")
    return found


MODES = ("cold", "warm")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.torch_recovery_bench",
                                     description=(__doc__ or "").split("\n\n")[0])
    add_output_args(parser, "a smoke run: one recovery of a 2-node job per pass")
    parser.add_argument("--runs", type=int, default=None, help="recoveries (default 5)")
    parser.add_argument("--restore", choices=(*MODES, "both"), default="both",
                        help="the launcher's restore: cold, warm or both (default), one "
                             "job each")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    out_path = results_path(args, "torch_recovery.json")
    faults, size = (1, 2) if args.quick else (args.runs or 5, 4)
    results: dict[str, Any] = {"meta": {"when": time.strftime("%Y-%m-%d %H:%M:%S"),
                                        "python": platform.python_version(),
                                        "quick": args.quick}, "passes": {}}
    modes = MODES if args.restore == "both" else (args.restore,)
    try:
        import torch
        results["meta"]["torch"] = torch.__version__
    except ImportError:
        results["passes"] = {m: {"error": "torch is not installed: pip install -e "
                                          "'.[examples]'"} for m in modes}
        return finish(results, out_path, problems(results), render)
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix=f"sn-tbench-{mode}-") as tmpdir:
            try:
                results["passes"][mode] = mttr_pass(Path(tmpdir), faults, size, mode)
            except Exception as err:  # noqa: BLE001 - said in the results, exit status 1
                results["passes"][mode] = {"error": f"{type(err).__name__}: {err}"}
    results["warm_over_cold"] = warm_over_cold(results["passes"])
    return finish(results, out_path, problems(results), render)


if __name__ == "__main__":
    sys.exit(main())
