r"""A torchrun launcher for sn-monitor's job control: one torchrun agent per node.

A DistributedJob's ``spec.control.command`` (the controller's command driver calls it
with ``SN_ACTION``, ``SN_ACTION_ID`` and ``SN_PARAMS`` in its environment). It keeps the
job in a JSON state file and runs, for each node of the job, one ``torchrun`` agent
(``python -m torch.distributed.run``, c10d rendezvous on 127.0.0.1, one process per node,
``--max-restarts 0``: a dead peer ends the generation, and sn-monitor decides what comes
next) with ``SN_NODE`` set to the node's name. Every node is simulated on this machine;
on a real cluster the same job is a Slurm ``srun torchrun`` or a PyTorchJob / JobSet
(docs/jobs/pytorch.md).

    launcher.py --state F init --controller URL --job NAME --checkpoint-dir D --log-dir L \
        [--token-file T] [--first-generation-args ARGS] -- TRAIN_ARGS...
    launcher.py --state F start --nodes n0,n1,...   # generation 0
    launcher.py --state F kill-node NODE            # tests: the node dies (SIGKILL)
    launcher.py --state F kill-all                  # tests: every agent it ever started
    launcher.py --state F                           # an action: SN_ACTION from the env

Actions:

``restore``     SN_PARAMS has ``nodes``, ``generation``, ``checkpoint`` and ``recovery``:
                SIGKILL every torchrun agent of the job and its workers, then start one
                agent per node of ``nodes`` under the rendezvous id ``JOB-g<generation>``
                on a new port. The ranks ask the controller for their restore point
                themselves (``JobClient.restore_point()``), so the checkpoint to load is
                the controller's, and is also passed as ``SN_RESTORE_CHECKPOINT``.
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
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# the demo launcher's state file and its answer to the controller's actions
from sn_monitor.sim.launcher import act, locked, start

#: How a torchrun agent shows in /proc/PID/cmdline: only such processes are ever killed.
AGENT_MODULE = "torch.distributed.run"
TRAIN_SCRIPT = Path(__file__).with_name("train.py")


# ------------------------------------------------------------------ processes


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def is_agent(pid: int) -> bool:
    """``pid`` is alive (not a zombie) and is a torchrun agent: never signal anything else."""
    stat = _stat(pid)
    if stat is None or stat[0] == "Z":
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return AGENT_MODULE.encode() in cmdline


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


def kill_agents(pids: Sequence[int], timeout: float = 15.0) -> list[int]:
    """SIGKILL each agent still running and every process under it; wait until gone."""
    killed, victims = [], []
    for pid in pids:
        if is_agent(pid):
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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_agents(state: dict[str, Any], nodes: Sequence[str], generation: int,
                 checkpoint: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One torchrun agent per node, detached; the state's ``agents`` become these."""
    log_dir = Path(state["log_dir"])
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SN_", "TORCHELASTIC_")) and k not in (
               "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(SN_CONTROLLER_URL=state["controller"], SN_JOB=state["job"],
               SN_FLUSH_INTERVAL=str(state.get("flush_interval", 1.0)),
               SN_GENERATION=str(generation), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    if state.get("token_file"):
        env["SN_TOKEN_FILE"] = state["token_file"]
    if checkpoint and checkpoint.get("path"):
        env["SN_RESTORE_CHECKPOINT"] = str(checkpoint["path"])
    train = [*state["train_args"], *(state["first_args"] if generation == 0 else [])]
    agents = []
    for node in nodes:
        argv = [state["python"], "-m", AGENT_MODULE, "--nnodes", str(len(nodes)),
                "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", f"{state['job']}-g{generation}", "--local-addr", "127.0.0.1",
                "--max-restarts", "0", "--monitor-interval", "0.5",
                str(state.get("script") or TRAIN_SCRIPT), *train]
        log_path = log_dir / f"gen{generation}-{node}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                argv, cwd=log_dir, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env={**env, "SN_NODE": node},
                start_new_session=True)
        agents.append({"node": node, "pid": proc.pid, "log": str(log_path),
                       "generation": generation, "port": port})
    state.update(agents=agents, nodes=list(nodes), generation=generation)
    state.setdefault("all_pids", []).extend(a["pid"] for a in agents)
    return agents


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
                     generation=None, nodes=[], agents=[], calls=[], all_pids=[])
    return 0


def kill_node(state_path: Path, node: str) -> int:
    """The node dies: its torchrun agent and its ranks, SIGKILLed (no clean-up)."""
    with locked(state_path) as state:
        pids = [a["pid"] for a in state.get("agents", []) if a["node"] == node]
        killed = kill_agents(pids)
        state["calls"].append({"action": "kill-node", "at": time.time(), "node": node,
                               "killed": killed})
    print(f"{node}: killed torchrun agent {killed[0]} and its ranks" if killed
          else f"{node}: no torchrun agent running there")
    return 0


def kill_all(state_path: Path) -> int:
    """Every torchrun agent the job ever started, and its ranks (tests' clean-up)."""
    with locked(state_path) as state:
        killed = kill_agents(state.get("all_pids", []))
    print(f"killed {len(killed)} torchrun agents")
    return 0


def restart(state: dict[str, Any], nodes: list[str], generation: int,
            params: dict[str, Any]) -> dict[str, Any]:
    """``restore``: every agent of the old generation killed, one per node started."""
    killed = kill_agents([a["pid"] for a in state.get("agents", [])])
    agents = start_agents(state, nodes, generation, params.get("checkpoint"))
    return {"killed": killed, "pids": [a["pid"] for a in agents], "started_at": time.time()}


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
    p_init.add_argument("--first-generation-args", metavar="ARGS",
                        help="extra train.py arguments for generation 0 only (tests)")
    p_init.add_argument("train_args", nargs=argparse.REMAINDER,
                        help="after --: arguments for every rank's train.py")
    p_start = sub.add_parser("start", help="start generation 0")
    p_start.add_argument("--nodes", required=True, help="comma-separated node names")
    p_kill = sub.add_parser("kill-node", help="SIGKILL a node's agent and ranks (tests)")
    p_kill.add_argument("node")
    sub.add_parser("kill-all", help="SIGKILL every agent the job ever started (tests)")
    args = parser.parse_args(argv)
    if args.command == "init":
        if args.train_args and args.train_args[0] == "--":
            args.train_args = args.train_args[1:]
        return init(args.state, args)
    if args.command == "start":
        return start(args.state, [n for n in args.nodes.split(",") if n], restart, "torchrun")
    if args.command == "kill-node":
        return kill_node(args.state, args.node)
    if args.command == "kill-all":
        return kill_all(args.state)
    return act(args.state, restart, "torchrun")


if __name__ == "__main__":
    sys.exit(main())
