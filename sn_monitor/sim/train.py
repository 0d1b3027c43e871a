"""A small training loop wired to sn-monitor: progress, checkpoints, restore after a failure.

Pure Python (no torch): the "model" is a few lists of floats that every step updates
deterministically, so a run resumed from a checkpoint ends with exactly the weights of a
run that never stopped. Checkpoints use PyTorch DCP's directory layout
(``DIR/step_000000123/`` with the data file ``__0_0.distcp`` and ``.metadata`` written
last, by :func:`sn_monitor.dcp.write_checkpoint`; one bytes entry per layer plus
``train_state``), so a directory without a readable ``.metadata`` is an incomplete
checkpoint (:func:`sn_monitor.dcp.is_complete`) and is never resumed from.

    export SN_CONTROLLER_URL=http://sn-controller:9848 SN_JOB=demo
    python -m sn_monitor.sim.train --steps 1000 --checkpoint-dir /tmp/ckpt --checkpoint-every 100

At start it asks the controller where to resume (``restore_point()``); with no answer it
resumes from the latest complete checkpoint in ``--checkpoint-dir``, else from step 0.
``--steps`` is the step to finish at, not a count from where it resumed. Each step is
reported with ``progress(step)``; a checkpoint is saved every ``--checkpoint-every``
steps and whenever the controller asks (``should_checkpoint()``). Rank 0 writes
checkpoints and reports them; other ranks only report progress.

``--pace-file F`` (the demo's): the step time follows the fail-slow faults standing on
the job's nodes (``SN_JOB_NODES``, set by the launcher), as :mod:`sn_monitor.sim.pace`
reads them.

For tests: ``--crash-at S`` dies at the start of step S (exit code 1, no clean-up, like
a node failure), ``--hang-at S`` stops making progress at the start of step S but keeps
running (like a rank stuck in an NCCL collective) until it is killed.

The demo's ``rank-error`` fault (:data:`INJECTED_ERRORS`): SIGUSR1 makes the next step
fail as a bug in the training code does (an ``IndexError`` out of a batch lookup),
SIGUSR2 as a GPU's uncorrectable ECC error does in PyTorch (``RuntimeError: CUDA error:
uncorrectable ECC error encountered``). The exception is not caught: Python prints its
traceback to the rank's log and the rank exits 1, as a real one does.

The ranks do no collectives, so with ``--peers`` (the demo's) a real job's coupling is
played by :class:`Peers`: a rank whose peer's process ended by itself fails its next step
as gloo does (``Connection closed by peer``), and the whole job stops, as it would. A
peer stopped on purpose by the launcher (a restart) fails nobody. Without it, a rank
goes on whatever happens to the others (the recovery tests kill one and expect the rest
to be stopped by the launcher).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sn_monitor.client import JobClient
from sn_monitor.dcp import DcpError, is_complete, read_metadata, write_checkpoint
from sn_monitor.sim.launcher import STOPPING, is_running_rank
from sn_monitor.sim.pace import Pace

#: The state-dict entry that holds the step (the layers are entries of their own).
TRAIN_STATE = "train_state"
CRASH_EXIT_CODE = 1
_STEP_DIR = re.compile(r"step_(\d+)")

Model = dict[str, list[float]]

#: The failure each signal asks the next step to have (the demo's ``rank-error`` fault).
INJECTED_ERRORS = {signal.SIGUSR1: "app-bug", signal.SIGUSR2: "ecc-error"}
#: What PyTorch prints after a CUDA error's message.
_CUDA_HINT = ("CUDA kernel errors might be asynchronously reported at some other API call, "
              "so the stacktrace below might be incorrect.\nFor debugging consider passing "
              "CUDA_LAUNCH_BLOCKING=1")


def new_model(width: int) -> Model:
    return {
        "embed.weight": [math.sin(i + 1.0) for i in range(width)],
        "layer0.weight": [math.cos(i + 1.0) for i in range(width)],
        "head.weight": [1.0 / (i + 1.0) for i in range(width)],
    }


def train_step(model: Model, step: int) -> float:
    """One deterministic "optimizer step"; returns a made-up loss."""
    loss = 0.0
    for k, (_, weights) in enumerate(sorted(model.items())):
        for i, w in enumerate(weights):
            grad = w - math.cos(0.01 * step + i + k)
            weights[i] = w - 0.05 * grad
            loss += grad * grad
    return loss / sum(len(w) for w in model.values())


def save(model: Model, step: int, checkpoint_dir: Path) -> Path:
    """One DCP bytes entry per layer (little-endian float64s) plus the training state."""
    blobs = {name: struct.pack(f"<{len(weights)}d", *weights)
             for name, weights in sorted(model.items())}
    blobs[TRAIN_STATE] = json.dumps({"step": step}).encode()
    return write_checkpoint(checkpoint_dir, step, blobs)


def load(path: Path) -> tuple[int, Model]:
    """The step and model of a complete checkpoint directory; ValueError if it is not."""
    complete = is_complete(path)
    if not complete:
        raise ValueError(f"{path} is not a complete checkpoint: {complete.reason}")
    try:
        entries: dict[str, bytes] = {}
        for item in read_metadata(path).items:
            with (path / item.relative_path).open("rb") as handle:
                handle.seek(item.offset)
                entries[item.fqn] = handle.read(item.length)
        step = int(json.loads(entries.pop(TRAIN_STATE))["step"])
        model = {name: list(struct.unpack(f"<{len(raw) // 8}d", raw))
                 for name, raw in entries.items()}
    except (OSError, ValueError, KeyError, TypeError, DcpError, struct.error) as err:
        raise ValueError(f"cannot read checkpoint {path}: {err}") from None
    return step, model


def latest_complete(checkpoint_dir: Path) -> Path | None:
    """The newest complete ``step_*`` checkpoint under ``checkpoint_dir``."""
    found = sorted(
        (int(match.group(1)), child)
        for child in (checkpoint_dir.iterdir() if checkpoint_dir.is_dir() else ())
        if (match := _STEP_DIR.fullmatch(child.name)) and is_complete(child)
    )
    return found[-1][1] if found else None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, required=True, help="the step to finish at")
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=100, metavar="K")
    parser.add_argument("--step-time", type=float, default=0.05, metavar="SECONDS",
                        help="simulated compute time per step")
    parser.add_argument("--pace-file", type=Path, metavar="F",
                        help="fail-slow faults standing on the job's nodes (sim.pace): "
                             "the step time slows as they say")
    parser.add_argument("--width", type=int, default=64, help="floats per fake layer")
    parser.add_argument("--crash-at", type=int, metavar="STEP",
                        help="exit non-zero at the start of STEP (a node failure)")
    parser.add_argument("--hang-at", type=int, metavar="STEP",
                        help="stop making progress at the start of STEP (a hang)")
    parser.add_argument("--peers", action="store_true",
                        help="fail as gloo does when a peer rank ended by itself (the "
                             "launcher's SN_PEER_DIR; the demo's)")
    args = parser.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 1 or args.step_time < 0:
        parser.error("--steps >= 0, --checkpoint-every >= 1 and --step-time >= 0")
    return args


def job_pace(pace_file: Path | None) -> Pace | None:
    """The job's pace from ``pace_file`` over the job's nodes (``SN_JOB_NODES``)."""
    if pace_file is None:
        return None
    nodes = os.environ.get("SN_JOB_NODES")
    return Pace(pace_file, nodes.split(",") if nodes else None)


def listen_for_injected_errors() -> list[str]:
    """The failures signalled so far (see :data:`INJECTED_ERRORS`), filled by handlers."""
    told: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        told.append(INJECTED_ERRORS[signal.Signals(signum)])
    for signum in INJECTED_ERRORS:
        signal.signal(signum, on_signal)
    return told


class Peers:
    """The job's other ranks, as a collective sees them (the launcher's ``SN_PEER_DIR``).

    Each rank writes ``rank<N>.pid`` there at start; :meth:`check` (at most once a
    second) raises what gloo raises in a rank whose peer is gone, unless the launcher
    marked the generation as being stopped.
    """

    def __init__(self, directory: Path | None, rank: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._dir = directory
        self._clock = clock
        self._next = 0.0
        if directory is not None:
            (directory / f"rank{rank}.pid").write_text(str(os.getpid()))
        self._own = f"rank{rank}.pid"

    def check(self) -> None:
        """Raise as a broken collective does when a peer ended by itself."""
        now = self._clock()
        if self._dir is None or now < self._next:
            return
        self._next = now + 1.0
        for pid_file in self._dir.glob("rank*.pid"):
            if pid_file.name == self._own:
                continue
            try:
                pid = int(pid_file.read_text())
            except (OSError, ValueError):
                continue
            if not is_running_rank(pid) and not (self._dir / STOPPING).exists():
                raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                                   "Connection closed by peer [127.0.0.1]:29500")


def next_batch(shard: Sequence[int], index: int) -> int:
    """One batch of the shard (the line an off-by-one breaks, in ``app-bug``)."""
    return shard[index]


def fail_as_told(kind: str, step: int) -> None:
    """Raise what a real job raises for ``kind``, at step ``step``."""
    if kind == "app-bug":
        shard = list(range(8))
        next_batch(shard, len(shard) + step % 3)  # past the end: IndexError
    raise RuntimeError(f"CUDA error: uncorrectable ECC error encountered\n{_CUDA_HINT}")


def fail_if_told(args: argparse.Namespace, step: int, told: Sequence[str],
                 peers: Peers) -> None:
    """At the start of ``step``: the failures asked for (signals, a peer gone, the flags)."""
    if told:
        fail_as_told(told[0], step)
    peers.check()
    if step == args.crash_at:
        print(f"simulated node failure at step {step}", file=sys.stderr, flush=True)
        os._exit(CRASH_EXIT_CODE)
    if step == args.hang_at:
        print(f"simulated hang at step {step}", file=sys.stderr, flush=True)
        while True:
            time.sleep(1)


def step_seconds(step_time: float, pace: Pace | None) -> float:
    """One step's compute time: the healthy one, slowed by the fail-slow faults standing."""
    return step_time * (pace.factor() if pace is not None else 1.0)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        client = JobClient.from_env()
    except ValueError as err:
        print(f"sn_monitor.sim.train: {err}", file=sys.stderr)
        return 2
    writer = client.rank == 0

    step, model = 0, new_model(args.width)
    point = client.restore_point()
    if point is None:  # no restore point, or no controller: the latest local checkpoint
        source = latest_complete(args.checkpoint_dir)
    else:  # the controller's word; an empty path means from scratch
        source = Path(point.path) if point.path else None
    if source is not None:
        try:
            step, model = load(source)
        except ValueError as err:
            # Starting over would silently throw the job's work away: stop instead.
            print(f"sn_monitor.sim.train: cannot resume: {err}", file=sys.stderr)
            return 3
        if point is not None and step != point.step:
            print(f"sn_monitor.sim.train: {source} holds step {step}, controller said {point.step}",
                  file=sys.stderr)
            return 3
        how = f"generation {point.generation}" if point else "latest local checkpoint"
        print(f"resuming from step {step} ({source}, {how})", flush=True)
    else:
        print("starting from step 0", flush=True)

    last_saved = step
    pace = job_pace(args.pace_file)
    told = listen_for_injected_errors()
    peer_dir = os.environ.get("SN_PEER_DIR") if args.peers else None
    peers = Peers(Path(peer_dir) if peer_dir else None, client.rank)
    while step < args.steps:
        step += 1
        fail_if_told(args, step, told, peers)
        if args.step_time:
            time.sleep(step_seconds(args.step_time, pace))
        loss = train_step(model, step)
        client.progress(step)
        requested = client.should_checkpoint()
        if writer and (step % args.checkpoint_every == 0 or requested) and step != last_saved:
            started = time.monotonic()
            path = save(model, step, args.checkpoint_dir)
            # A synchronous save: training stood still for all of it (the advisor's input).
            client.checkpoint_saved(step, path, save_seconds=time.monotonic() - started)
            last_saved = step
            why = "requested by the controller" if requested else "scheduled"
            print(f"step {step} loss {loss:.6f}: checkpoint {path} ({why})", flush=True)

    client.close()
    print(f"done at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
