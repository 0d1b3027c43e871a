r"""A torchrun launcher for sn-monitor's job control: one torchrun agent per node.

A DistributedJob's ``spec.control.command`` (the controller's command driver calls it
with ``SN_ACTION``, ``SN_ACTION_ID`` and ``SN_PARAMS`` in its environment). It keeps the
job in a JSON state file and runs, for each node of the job, one ``torchrun`` agent
(``python -m torch.distributed.run``, c10d rendezvous, one process per node,
``--max-restarts 0``: a dead peer ends the generation, and sn-monitor decides what comes
next) with ``SN_NODE`` set to the node's name. The rendezvous store is the job's own
process (``job_store.py``), off the job's nodes, so that no node's death takes it away.
Every node is simulated on this machine; on a real cluster the same job is a Slurm
``srun torchrun`` or a PyTorchJob / JobSet (docs/jobs/pytorch.md).

    launcher.py --state F init --controller URL --job NAME --checkpoint-dir D --log-dir L \
        [--restore warm|cold] [--rejoin-wait S] [--token-file T] \
        [--first-generation-args ARGS] -- TRAIN_ARGS...
    launcher.py --state F start --nodes n0,n1,... [--spares s0,...]   # generation 0
    launcher.py --state F kill-node NODE            # tests: the node dies (SIGKILL)
    launcher.py --state F kill-all                  # tests: every process it ever started
    launcher.py --state F                           # an action: SN_ACTION from the env

``start --spares``: on each spare node a *standby*, a ``train.py --standby`` process with
Python, torch and the job's code already loaded, waiting to be named in a plan. A warm
restore does the same for the spares its ``SN_PARAMS`` lists (the pool left after the
restore's own: a node given back after repair gets its standby there).

Actions:

``restore``     SN_PARAMS has ``nodes``, ``generation``, ``checkpoint`` and ``recovery``.
                *warm* (the default): the processes of nodes leaving the job are
                SIGKILLed, the next generation's plan is written (``rejoin.py``), and
                every node whose process answers within ``--rejoin-wait`` (a rank that
                left the broken generation, a standby) joins it in that process: only
                Python's and torch's start, and torchrun's rendezvous, are saved, the
                checkpoint is loaded as in any restart. A node whose process does not
                answer (a rank stuck in a save, a dead one) is killed and gets a fresh
                ``train.py --standby`` that joins at once. *cold*: SIGKILL every agent of
                the job and its workers, then start one torchrun agent per node under
                the rendezvous id ``JOB-g<generation>``.
                Either way the ranks ask the controller for their restore point
                themselves (``JobClient.restore_point()``), so the checkpoint to load is
                the controller's, and the launcher's is the fallback.
                A restore whose ``SN_ACTION_ID`` was already carried out is not carried
                out again (the controller retries an action with the same id).
``checkpoint``  nothing to do: the ranks see the request in their progress replies.
anything else   logged, nothing done.

Every call is appended to the state's ``calls`` (with ``duplicate`` for a repeated id),
and what was done is printed: the controller keeps it in the action's record.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

# beside this script: the plans of warm restores
from rejoin import Plan, answer, write_plan

# the demo launcher's state file and its answer to the controller's actions
from sn_monitor.sim.launcher import act, locked, start

#: How a torchrun agent shows in /proc/PID/cmdline.
AGENT_MODULE = "torch.distributed.run"
TRAIN_SCRIPT = Path(__file__).with_name("train.py")
JOB_STORE = Path(__file__).with_name("job_store.py")
#: How long a restore waits for the job's store to come up (it imports torch).
STORE_START_SECONDS = 120.0


# ------------------------------------------------------------------ processes


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def is_ours(pid: int) -> bool:
    """``pid`` is alive (not a zombie) and is a torchrun agent, a rank or the job's store.

    Never signal anything else: a pid in the state file may have been reused.
    """
    stat = _stat(pid)
    if stat is None or stat[0] == "Z":
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return AGENT_MODULE.encode() in cmdline or any(
        arg.endswith((b"train.py", JOB_STORE.name.encode())) for arg in cmdline)


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid``.

    torchrun starts its workers in sessions of their own: a signal to the agent's process
    group does not reach them.
    """
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def kill_processes(pids: Iterable[int], timeout: float = 15.0) -> list[int]:
    """SIGKILL each of ours still running and every process under it; wait until gone."""
    killed, victims = [], []
    for pid in pids:
        if is_ours(pid):
            victims.extend([pid, *descendants(pid)])
            killed.append(pid)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(
            (stat := _stat(p)) is not None and stat[0] != "Z" for p in victims):
        time.sleep(0.02)
    return killed


def _spawn(state: dict[str, Any], argv: list[str], log_path: Path,
           env: dict[str, str]) -> int:
    """Start ``argv`` detached (own session, output to ``log_path``); its pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(argv, cwd=log_path.parent, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    state.setdefault("all_pids", []).append(proc.pid)
    return proc.pid


def ensure_store(state: dict[str, Any]) -> str:
    """The job's rendezvous store (``job_store.py``), started if it is not running."""
    store = state.get("store") or {}
    if store.get("pid") and is_ours(int(store["pid"])):
        return f"127.0.0.1:{store['port']}"
    port_file = Path(state["log_dir"]) / "job-store.port"
    port_file.unlink(missing_ok=True)
    pid = _spawn(state, [state["python"], str(JOB_STORE), str(port_file)],
                 Path(state["log_dir"]) / "job-store.log", _base_env(state))
    deadline = time.monotonic() + STORE_START_SECONDS
    while not port_file.exists():
        if time.monotonic() > deadline or not is_ours(pid):
            raise RuntimeError(f"the job's store did not start: see {port_file.parent}")
        time.sleep(0.05)
    state["store"] = {"pid": pid, "port": int(port_file.read_text())}
    return f"127.0.0.1:{state['store']['port']}"


def _base_env(state: dict[str, Any], generation: int = 0) -> dict[str, str]:
    """What every process of the job gets: the controller, the job, its store and plans."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SN_", "TORCHELASTIC_")) and k not in (
               "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(SN_CONTROLLER_URL=state["controller"], SN_JOB=state["job"],
               SN_FLUSH_INTERVAL=str(state.get("flush_interval", 1.0)),
               SN_GENERATION=str(generation), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    if state.get("store"):
        env["SN_JOB_STORE"] = f"127.0.0.1:{state['store']['port']}"
    if state.get("restore") == "warm":
        env["SN_REJOIN_DIR"] = state["rejoin_dir"]
    if state.get("token_file"):
        env["SN_TOKEN_FILE"] = state["token_file"]
    return env


def start_agents(state: dict[str, Any], nodes: Sequence[str], generation: int,
                 checkpoint: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One torchrun agent per node, detached, rendezvousing on the job's store."""
    endpoint = ensure_store(state)
    env = _base_env(state, generation)
    if checkpoint and checkpoint.get("path"):
        env["SN_RESTORE_CHECKPOINT"] = str(checkpoint["path"])
    train = [*state["train_args"], *(state["first_args"] if generation == 0 else [])]
    agents = []
    for node in nodes:
        argv = [state["python"], "-m", AGENT_MODULE, "--nnodes", str(len(nodes)),
                "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", endpoint,
                "--rdzv-id", f"{state['job']}-g{generation}", "--local-addr", "127.0.0.1",
                "--max-restarts", "0", "--monitor-interval", "0.5",
                str(state.get("script") or TRAIN_SCRIPT), *train]
        log_path = Path(state["log_dir"]) / f"gen{generation}-{node}.log"
        pid = _spawn(state, argv, log_path, {**env, "SN_NODE": node})
        agents.append({"node": node, "pid": pid, "kind": "torchrun", "log": str(log_path),
                       "generation": generation})
    return agents


def start_standby(state: dict[str, Any], node: str, after: int) -> dict[str, Any]:
    """A pre-warmed process for ``node``: it joins the first plan after ``after`` naming it."""
    ensure_store(state)
    argv = [state["python"], str(state.get("script") or TRAIN_SCRIPT), *state["train_args"],
            "--standby", str(after)]
    log_path = Path(state["log_dir"]) / f"standby-{node}-after-g{after}.log"
    pid = _spawn(state, argv, log_path, {**_base_env(state, after), "SN_NODE": node})
    return {"node": node, "pid": pid, "kind": "standby", "log": str(log_path),
            "generation": after}


# ------------------------------------------------------------------ restores


def answering(rejoin_dir: Path, node: str, generation: int,
              serving: dict[str, Any] | None) -> bool:
    """The process serving ``node`` waits for ``generation`` or has joined it."""
    said = answer(rejoin_dir, node)
    if said is None or serving is None or not is_ours(int(said["pid"])):
        return False
    pid = int(said["pid"])
    if pid != serving["pid"] and pid not in descendants(serving["pid"]):
        return False
    return (said["state"] == "waiting" and int(said["generation"]) < generation) or (
        said["state"] == "joined" and int(said["generation"]) == generation)


def cold_restart(state: dict[str, Any], nodes: list[str], generation: int,
                 params: dict[str, Any]) -> dict[str, Any]:
    """Every process of the job killed; one torchrun agent per node started."""
    standbys = state.setdefault("standbys", {})
    killed = kill_processes([a["pid"] for a in state.get("agents", [])]
                            + [standbys.pop(n)["pid"] for n in nodes if n in standbys])
    agents = start_agents(state, nodes, generation, params.get("checkpoint"))
    state.update(agents=agents, nodes=list(nodes), generation=generation)
    return {"killed": killed, "pids": [a["pid"] for a in agents], "started_at": time.time(),
            "cold": list(nodes), "kept": [], "standbys_used": [],
            "summary": f"torchrun on {len(nodes)} nodes (every process started again)"}


def warm_restart(state: dict[str, Any], nodes: list[str], generation: int,
                 params: dict[str, Any]) -> dict[str, Any]:
    """The next generation's plan, joined by every process that answers; the rest anew."""
    rejoin_dir = Path(state["rejoin_dir"])
    standbys: dict[str, Any] = state.setdefault("standbys", {})
    current = {a["node"]: a for a in state.get("agents", [])}
    killed = kill_processes(a["pid"] for n, a in current.items() if n not in nodes)
    checkpoint = (params.get("checkpoint") or {}).get("path")
    write_plan(rejoin_dir, Plan(generation, tuple(nodes), checkpoint))
    serving = {n: current.get(n) or standbys.get(n) for n in nodes}
    deadline = time.monotonic() + float(state.get("rejoin_wait", 5.0))
    ready: set[str] = set()
    while True:
        ready |= {n for n in nodes if n not in ready
                  and answering(rejoin_dir, n, generation, serving[n])}
        if len(ready) == len(nodes) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    cold = [n for n in nodes if n not in ready]
    killed += kill_processes(serving[n]["pid"] for n in cold if serving[n] is not None)
    agents = []
    for node in nodes:
        entry = start_standby(state, node, generation - 1) if node in cold else serving[node]
        standbys.pop(node, None)
        agents.append(entry)
    state.update(agents=agents, nodes=list(nodes), generation=generation)
    if "spares" in params:
        killed += prewarm(state, [str(n) for n in params["spares"]], generation)
    kept = [n for n in nodes if n in ready and n in current]
    warm = [n for n in nodes if n in ready and n not in current]
    return {"killed": killed, "pids": [a["pid"] for a in agents], "started_at": time.time(),
            "kept": kept, "standbys_used": warm, "cold": cold,
            "summary": (f"torchrun on {len(nodes)} nodes (warm: {len(kept)} ranks kept, "
                        f"{len(warm)} standbys joined, {len(cold)} started again)")}


def prewarm(state: dict[str, Any], spares: list[str], generation: int) -> list[int]:
    """A standby on each of ``spares`` (a node given back after repair included).

    A standby on a node that is no longer a spare is killed; what was killed is returned.
    """
    standbys: dict[str, Any] = state.setdefault("standbys", {})
    gone = [n for n in standbys if n not in spares]
    killed = kill_processes(standbys.pop(n)["pid"] for n in gone)
    for node in spares:
        if node not in standbys or not is_ours(int(standbys[node]["pid"])):
            standbys[node] = start_standby(state, node, generation)
    return killed


def restart(state: dict[str, Any], nodes: list[str], generation: int,
            params: dict[str, Any]) -> dict[str, Any]:
    """``restore`` (and generation 0): warm unless the job says cold."""
    if generation == 0 or state.get("restore") != "warm":
        return cold_restart(state, nodes, generation, params)
    return warm_restart(state, nodes, generation, params)


# ------------------------------------------------------------------ commands


def init(state_path: Path, args: argparse.Namespace) -> int:
    with locked(state_path) as state:
        state.clear()
        state.update(controller=args.controller, job=args.job, token_file=args.token_file,
                     checkpoint_dir=str(args.checkpoint_dir), log_dir=str(args.log_dir),
                     train_args=["--checkpoint-dir", str(args.checkpoint_dir),
                                 *args.train_args],
                     first_args=shlex.split(args.first_generation_args or ""),
                     flush_interval=args.flush_interval, python=sys.executable,
                     script=str(args.script) if args.script else None,
                     restore=args.restore, rejoin_wait=args.rejoin_wait,
                     rejoin_dir=str(Path(args.log_dir) / "rejoin"),
                     generation=None, nodes=[], agents=[], standbys={}, calls=[],
                     all_pids=[])
    return 0


def start_spares(state_path: Path, spares: list[str]) -> None:
    """A standby on each spare node (warm restores only): Python and torch loaded early."""
    with locked(state_path) as state:
        if state.get("restore") != "warm":
            return
        prewarm(state, [n for n in spares if n not in state.get("nodes", [])],
                int(state["generation"] or 0))
    print(f"standbys on {len(spares)} spare nodes")


def kill_node(state_path: Path, node: str) -> int:
    """The node dies: whatever of the job runs there, SIGKILLed (no clean-up)."""
    with locked(state_path) as state:
        pids = [a["pid"] for a in state.get("agents", []) if a["node"] == node]
        if node in state.get("standbys", {}):
            pids.append(state["standbys"][node]["pid"])
        killed = kill_processes(pids)
        state["calls"].append({"action": "kill-node", "at": time.time(), "node": node,
                               "killed": killed})
    print(f"{node}: killed {killed} and the processes under them" if killed
          else f"{node}: nothing of the job running there")
    return 0


def kill_all(state_path: Path) -> int:
    """Every process the job ever started: agents, ranks, standbys, its store (tests)."""
    with locked(state_path) as state:
        killed = kill_processes(state.get("all_pids", []))
    print(f"killed {len(killed)} processes")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--state", type=Path, required=True, help="the launcher's state file")
    sub = parser.add_subparsers(dest="command")
    p_init = sub.add_parser("init", help="write the job's launch configuration")
    p_init.add_argument("--controller", required=True)
    p_init.add_argument("--job", required=True)
    p_init.add_argument("--token-file")
    p_init.add_argument("--checkpoint-dir", type=Path, required=True)
    p_init.add_argument("--log-dir", type=Path, required=True)
    p_init.add_argument("--flush-interval", type=float, default=1.0, metavar="S")
    p_init.add_argument("--script", type=Path, help=f"the training script ({TRAIN_SCRIPT.name})")
    p_init.add_argument("--restore", choices=("warm", "cold"), default="warm",
                        help="warm: keep the ranks that can rejoin and use standbys "
                             "(default); cold: start every process again")
    p_init.add_argument("--rejoin-wait", type=float, default=5.0, metavar="S",
                        help="how long a warm restore waits for a node's process to "
                             "answer before starting it again (default 5)")
    p_init.add_argument("--first-generation-args", metavar="ARGS",
                        help="extra train.py arguments for generation 0 only (tests)")
    p_init.add_argument("train_args", nargs=argparse.REMAINDER,
                        help="after --: arguments for every rank's train.py")
    p_start = sub.add_parser("start", help="start generation 0")
    p_start.add_argument("--nodes", required=True, help="comma-separated node names")
    p_start.add_argument("--spares", default="", help="comma-separated spare nodes: a "
                         "standby on each (warm restores)")
    p_kill = sub.add_parser("kill-node", help="SIGKILL a node's processes (tests)")
    p_kill.add_argument("node")
    sub.add_parser("kill-all", help="SIGKILL every process the job ever started (tests)")
    args = parser.parse_args(argv)
    if args.command == "init":
        if args.train_args and args.train_args[0] == "--":
            args.train_args = args.train_args[1:]
        return init(args.state, args)
    if args.command == "start":
        code = start(args.state, [n for n in args.nodes.split(",") if n], restart, "torchrun")
        start_spares(args.state, [n for n in args.spares.split(",") if n])
        return code
    if args.command == "kill-node":
        return kill_node(args.state, args.node)
    if args.command == "kill-all":
        return kill_all(args.state)
    return act(args.state, restart, "torchrun")


if __name__ == "__main__":
    sys.exit(main())
