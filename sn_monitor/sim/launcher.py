"""A tiny job launcher: what torchrun's elastic agent or a Kubernetes operator does.

This is the launcher ``sn-monitor demo`` gives its DistributedJob as ``spec.control``
(and as the command driver of evict / cordon, which it only records): run it as
``python -m sn_monitor.sim.launcher``. The example training loop is
``sn_monitor/sim/train.py`` (``python -m sn_monitor.sim.train``).

It runs as a DistributedJob's ``spec.control.command`` (the controller's command driver
calls it with ``SN_ACTION``, ``SN_ACTION_ID`` and ``SN_PARAMS`` in its environment) and
keeps the job's ranks in a JSON state file: one training process per node
(a "node" is only the ``SN_NODE`` name; every process runs on this machine), started
detached (own session, output to a log file per rank) so they outlive the launcher.

    launcher.py --state F init --controller URL --job NAME --checkpoint-dir D ...
    launcher.py --state F start --nodes n0,n1,...     # generation 0 (the test helper)
    launcher.py --state F                             # an action: SN_ACTION from the env

Actions:

``restore``   SN_PARAMS has ``nodes``, ``generation``, ``checkpoint`` and ``recovery``:
              kill the old ranks (the pids in the state file, their whole process
              groups) and start rank i on ``nodes[i]`` with WORLD_SIZE = len(nodes).
              The ranks ask the controller for their restore point themselves.
``checkpoint`` nothing to do: the training client's ``should_checkpoint`` already saw
              the request in its progress reply. Exit 0 at once.
``failover``  logged only (the orchestrator restores job nodes itself).

Every invocation is appended to the state's ``calls`` (also a repeated action id, marked
``duplicate``), so a test can tell how often each action reached the launcher. A restore
whose action id was already carried out is not carried out again (``SN_ACTION_ID`` is the
same on every retry of one action).

Options for tests: ``init --rank-args RANK=ARGS`` adds arguments to one rank of
generation 0 only (``--hang-at 80``); ``--restart-delay S`` makes restored ranks start S
seconds late (a slow scheduler or image pull), which widens the window in which a test
can kill the controller between "restore taken" and "progress resumed"; ``--hold-file F``
makes a restore wait while F exists (at most a minute), first creating ``F.waiting``:
a test kills the controller while its restore runs.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

#: The example training loop each rank runs (``python -m sn_monitor.sim.train``).
TRAIN_MODULE = "sn_monitor.sim.train"
#: How to run this launcher as a command: ``[*LAUNCHER, "--state", F, ...]``.
LAUNCHER = (sys.executable, "-m", "sn_monitor.sim.launcher")
#: A generation's folder of its ranks' pid files (``rank<N>.pid``), in the log folder.
PEERS_SUFFIX = ".peers"
#: In that folder: the launcher is stopping the generation (its ranks die on purpose).
STOPPING = "stopping"
#: What a delayed rank runs first: sleep, then become train.py (same pid).
_DELAYED = ("import os, sys, time; time.sleep(float(sys.argv[1])); "
            "os.execv(sys.argv[2], sys.argv[2:])")


# ------------------------------------------------------------------ the state file


@contextlib.contextmanager
def locked(state_path: Path) -> Iterator[dict[str, Any]]:
    """The state, read under an exclusive lock and written back on a clean exit."""
    lock_path = state_path.with_name(state_path.name + ".lock")
    with lock_path.open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = load(state_path)
        yield state
        tmp = state_path.with_name(state_path.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, state_path)


def load(state_path: Path) -> dict[str, Any]:
    try:
        data = json.loads(state_path.read_text())
    except FileNotFoundError:
        return {}
    assert isinstance(data, dict)
    return data


# ------------------------------------------------------------------ processes


def is_running_rank(pid: int) -> bool:
    """The pid is alive (not a zombie) and runs the training loop: never signal anything else."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if stat.rpartition(")")[2].split()[0] == "Z":
        return False
    return TRAIN_MODULE.encode() in cmdline.split(b"\0")


def kill_ranks(pids: Sequence[int], timeout: float = 10.0) -> list[int]:
    """SIGKILL the process group of each rank still running; wait until they are gone."""
    killed = []
    for pid in pids:
        if is_running_rank(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # started with its own session: pgid == pid
            killed.append(pid)
    deadline = time.monotonic() + timeout
    while any(is_running_rank(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.02)
    return killed


def signal_rank(state_path: Path, node: str, sig: int) -> int | None:
    """Send ``sig`` to the current generation's rank on ``node``; its rank, or None.

    Only a process that still runs the training loop is signalled (never a recycled pid).
    """
    with locked(state_path) as state:
        ranks = [r for r in state.get("ranks", []) if r["node"] == node]
    for rank in ranks:
        if is_running_rank(rank["pid"]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(rank["pid"], sig)
                return int(rank["rank"])
    return None


def start_ranks(state: dict[str, Any], nodes: Sequence[str], generation: int,
                delay: float = 0.0) -> list[dict[str, Any]]:
    """Rank i on nodes[i], detached; the state's ``ranks`` become these."""
    log_dir = Path(state["log_dir"])
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
           and not k.startswith(("SLURM_", "SN_"))}
    peers = Path(tempfile.mkdtemp(prefix=f"gen{generation}-", suffix=PEERS_SUFFIX,
                                  dir=log_dir))
    env.update(SN_CONTROLLER_URL=state["controller"],
               SN_JOB=state["job"], WORLD_SIZE=str(len(nodes)), LOCAL_RANK="0",
               SN_FLUSH_INTERVAL=str(state.get("flush_interval", 1.0)),
               SN_JOB_NODES=",".join(nodes), SN_PEER_DIR=str(peers))
    if state.get("token_file"):
        env["SN_TOKEN_FILE"] = state["token_file"]
    python = state.get("python") or sys.executable
    extra = state.get("rank_args", {}) if generation == 0 else {}
    ranks = []
    for rank, node in enumerate(nodes):
        argv = [python, "-m", TRAIN_MODULE, "--checkpoint-dir", state["checkpoint_dir"],
                *state.get("train_args", []), *extra.get(str(rank), [])]
        if delay > 0:
            argv = [python, "-c", _DELAYED, str(delay), *argv]
        log_path = log_dir / f"gen{generation}-rank{rank}-{node}.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                argv, cwd=log_dir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**env, "SN_NODE": node, "RANK": str(rank)}, start_new_session=True)
        ranks.append({"rank": rank, "node": node, "pid": proc.pid, "log": str(log_path),
                      "generation": generation})
    state["ranks"] = ranks
    state["nodes"] = list(nodes)
    state["generation"] = generation
    state["peer_dir"] = str(peers)
    state.setdefault("all_pids", []).extend(r["pid"] for r in ranks)
    return ranks


# ------------------------------------------------------------------ commands


def init(state_path: Path, args: argparse.Namespace) -> int:
    rank_args: dict[str, list[str]] = {}
    for item in args.rank_args:
        rank, sep, rest = item.partition("=")
        if not sep or not rank.isdigit():
            print(f"--rank-args wants RANK=ARGS, got {item!r}", file=sys.stderr)
            return 2
        rank_args[rank] = shlex.split(rest)
    with locked(state_path) as state:
        state.clear()
        state.update(controller=args.controller, job=args.job, token_file=args.token_file,
                     checkpoint_dir=str(args.checkpoint_dir), log_dir=str(args.log_dir),
                     train_args=list(args.train_args), rank_args=rank_args,
                     restart_delay=args.restart_delay, flush_interval=args.flush_interval,
                     hold_file=str(args.hold_file) if args.hold_file else None,
                     python=sys.executable, generation=None, nodes=[], ranks=[], calls=[],
                     all_pids=[])
    return 0


#: What a launcher does on ``restore``: stop the old generation, start ``generation`` on
#: ``nodes`` (``params`` is the whole SN_PARAMS); what to record in the call.
Restart = Callable[[dict[str, Any], list[str], int, dict[str, Any]], dict[str, Any]]


def act(state_path: Path, restart: Restart | None = None, what: str = "ranks") -> int:
    """One action from the controller (SN_ACTION, SN_ACTION_ID, SN_PARAMS).

    ``restore`` runs ``restart`` (this launcher's: kill the ranks, start them again)
    unless its action id was carried out already; anything else is recorded only. Every
    call goes into the state's ``calls``; what was done is printed (the command driver
    keeps the first line as the action's outcome). ``what`` names the processes started,
    unless ``restart`` returns a ``summary`` of what it did.
    """
    action = os.environ.get("SN_ACTION", "")
    action_id = os.environ.get("SN_ACTION_ID", "")
    try:
        params = json.loads(os.environ.get("SN_PARAMS") or "{}")
    except ValueError as err:
        print(f"SN_PARAMS is not JSON: {err}", file=sys.stderr)
        return 2
    if action == "restore":
        _hold(load(state_path).get("hold_file"))
    with locked(state_path) as state:
        calls = state.setdefault("calls", [])
        duplicate = bool(action_id) and any(
            c.get("action_id") == action_id and c.get("done") for c in calls)
        call: dict[str, Any] = {"action": action, "action_id": action_id, "params": params,
                                "at": time.time(), "duplicate": duplicate, "done": False}
        calls.append(call)
        if action == "restore" and not duplicate:
            nodes = [str(n) for n in params.get("nodes") or []]
            if not nodes:
                print("restore without nodes", file=sys.stderr)
                return 1  # the state is still written: the call is on record
            generation = int(params.get("generation") or 0)
            call.update((restart or _restart_ranks)(state, nodes, generation, params))
        call["done"] = True
    print(_outcome(action, params, call, what))
    return 0


def _outcome(action: str, params: dict[str, Any], call: dict[str, Any], what: str) -> str:
    """The line the command driver keeps as the action's outcome."""
    if action != "restore":
        return f"{action or 'no action'}: nothing to do"
    checkpoint = (params.get("checkpoint") or {}).get("path") or "none (from scratch)"
    done = call.get("summary") or f"{what} on {len(params.get('nodes') or [])} nodes"
    return (f"restore: generation {params.get('generation')}: {done}, checkpoint {checkpoint}"
            + (" (already done: same action id)" if call["duplicate"] else ""))


def stopping(state: dict[str, Any]) -> None:
    """Tell the current generation's ranks that their peers are being stopped on purpose.

    Marked before the first kill: a rank that finds a peer gone then waits to be killed
    instead of failing as a broken collective does (:class:`sn_monitor.sim.train.Peers`).
    """
    if state.get("peer_dir"):
        with contextlib.suppress(OSError):
            (Path(state["peer_dir"]) / STOPPING).touch()


def _restart_ranks(state: dict[str, Any], nodes: list[str], generation: int,
                   params: dict[str, Any]) -> dict[str, Any]:
    stopping(state)
    killed = kill_ranks([r["pid"] for r in state.get("ranks", [])])
    delay = float(state.get("restart_delay") or 0.0) if generation else 0.0
    ranks = start_ranks(state, nodes, generation, delay)
    return {"killed": killed, "pids": [r["pid"] for r in ranks]}


def start(state_path: Path, nodes: list[str], restart: Restart | None = None,
          what: str = "ranks") -> int:
    """Generation 0 on ``nodes`` (whatever ran before is stopped first)."""
    with locked(state_path) as state:
        done = (restart or _restart_ranks)(state, nodes, 0, {})
        state.setdefault("calls", []).append(
            {"action": "start", "at": time.time(), "nodes": nodes, "generation": 0, **done})
    print(f"started generation 0: {what} on {len(nodes)} nodes")
    return 0




def _hold(hold_file: str | None, limit: float = 60.0) -> None:
    """While ``hold_file`` exists, wait (it says so in ``hold_file.waiting``)."""
    if not hold_file or not Path(hold_file).exists():
        return
    Path(hold_file + ".waiting").write_text(str(os.getpid()))
    deadline = time.monotonic() + limit
    while Path(hold_file).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


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
    p_init.add_argument("--rank-args", action="append", default=[], metavar="RANK=ARGS",
                        help="extra train.py arguments for one rank of generation 0")
    p_init.add_argument("--restart-delay", type=float, default=0.0, metavar="S")
    p_init.add_argument("--flush-interval", type=float, default=1.0, metavar="S")
    p_init.add_argument("--hold-file", type=Path, metavar="F",
                        help="a restore waits while this file exists (for tests)")
    p_init.add_argument("train_args", nargs=argparse.REMAINDER,
                        help="after --: arguments for every rank's train.py")
    p_start = sub.add_parser("start", help="start generation 0")
    p_start.add_argument("--nodes", required=True, help="comma-separated node names")
    args = parser.parse_args(argv)
    if args.command == "init":
        if args.train_args and args.train_args[0] == "--":
            args.train_args = args.train_args[1:]
        return init(args.state, args)
    if args.command == "start":
        return start(args.state, [n for n in args.nodes.split(",") if n])
    return act(args.state)


if __name__ == "__main__":
    sys.exit(main())
