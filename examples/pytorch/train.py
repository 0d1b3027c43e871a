r"""A real data-parallel PyTorch job under sn-monitor: DDP on gloo, DCP checkpoints, resume.

Run one copy per node with torchrun (``examples/pytorch/launcher.py`` does, one torchrun
agent per simulated node, c10d rendezvous on 127.0.0.1)::

    export SN_CONTROLLER_URL=http://127.0.0.1:9848 SN_JOB=llm SN_NODE=node-3
    torchrun --nnodes 4 --nproc-per-node 1 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:29400 --rdzv-id llm-g0 --max-restarts 0 \
        examples/pytorch/train.py --steps 400 --checkpoint-dir /ckpt/llm --checkpoint-every 50

What it does, as a real training script would:

- **The model and the data.** A small MLP learns a fixed random "teacher" function on
  synthetic data, with AdamW. Every batch is a function of (seed, step, rank), the model
  starts from the seed, and torch runs one thread per rank, so a run that was killed and
  resumed ends with the same bytes in its weights as one that never stopped (with the
  same world size: gloo's allreduce adds the ranks' gradients in the same order).
- **Progress.** Every rank reports each step with ``sn_monitor.client.JobClient`` (the
  rank and world size from torchrun's environment, the node from ``SN_NODE``).
- **Checkpoints.** ``torch.distributed.checkpoint`` (DCP) saves the model, the optimizer
  and the step to ``DIR/step_<9 digits>/``, each rank writing its share (``__R_0.distcp``)
  and rank 0 the ``.metadata`` last: every ``--checkpoint-every`` steps and when the
  controller asks (rank 0's ``should_checkpoint()``, broadcast: each rank's client sees
  the request at a step of its own, and one request is one save). The save is asynchronous
  (``dcp.async_save``, on a process group of its own) where torch has it: training goes on
  while the files are written, and rank 0 reports the checkpoint once it is complete.
- **Resume.** At start every rank asks the controller for its restore point; with none
  (no controller, or none recorded) it takes the one its launcher was given
  (``SN_RESTORE_CHECKPOINT``), else the latest *complete* checkpoint in the directory
  (``sn_monitor.dcp.is_complete``: ``.metadata`` there and every byte it names), else it
  starts from scratch. A restore point that is not a complete checkpoint stops the run
  (exit 1, saying why): starting over would silently throw the job's work away.

For measurements: ``--timeline FILE`` (rank 0) appends a JSON line per milestone
(``started``, ``rendezvous``, ``loaded``, ``first_step``, ``checkpoint`` for each complete
save, ``scheduled`` or ``requested``, and ``done``) with its wall time.
``--final-weights FILE`` (rank 0) saves the model's state dict at the end. For tests:
``--stall-save N`` writes the N-th save of the run but never its ``.metadata`` (rank 0
waits instead, writing ``DIR/stalled-step_<step>``): a job killed then leaves an
incomplete checkpoint.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before torch is imported: the relaunch's cost includes the import

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from concurrent.futures import Future  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint import FileSystemWriter  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from sn_monitor.client import JobClient, RestorePoint  # noqa: E402
from sn_monitor.dcp import is_complete  # noqa: E402

FEATURES = 32
HIDDEN = 64
BATCH = 64
#: The longest a stalled save (``--stall-save``) waits to be killed.
STALL_LIMIT_SECONDS = 600.0


# ------------------------------------------------------------------ the model, the data


def build_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def batch(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``rank`` at ``step``: the same whatever ran before."""
    teacher = torch.Generator().manual_seed(seed)
    weights = torch.randn(FEATURES, 1, generator=teacher)
    data = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(BATCH, FEATURES, generator=data)
    return x, torch.sin(x @ weights)


def data_parallel(model: nn.Module) -> DistributedDataParallel:
    """DDP with one parameter per gradient bucket, so that a resumed run adds up the same.

    DDP's first step allreduces one bucket laid out in parameter order; from the second
    on, buckets laid out in the order the gradients became ready. Gloo's ring sums each
    element in an order that depends on its offset in the bucket, so the first step of a
    resumed run would round differently from the same step of a run that never stopped.
    With one parameter per bucket every element has the same place in every step.
    """
    try:
        return DistributedDataParallel(model, bucket_cap_mb_list=[1e-6])
    except TypeError:  # an older torch: no per-bucket sizes; the weights may differ in the ulp
        return DistributedDataParallel(model)


# ------------------------------------------------------------------ checkpoints


def step_dir(checkpoint_dir: Path, step: int) -> Path:
    return checkpoint_dir / f"step_{step:09d}"


def latest_complete(checkpoint_dir: Path) -> Path | None:
    found = sorted(p for p in checkpoint_dir.glob("step_*")
                   if p.name[5:].isdigit() and is_complete(p))
    return found[-1] if found else None


class StallingWriter(FileSystemWriter):
    """Writes the data files, then never the ``.metadata`` (a save killed midway)."""

    def finish(self, metadata: Any, results: Any) -> None:
        target = Path(str(self.path))
        marker = target.parent / f"stalled-{target.name}"
        marker.write_text(str(os.getpid()))
        print(f"save of {self.path}: data written, stalling before .metadata", flush=True)
        time.sleep(STALL_LIMIT_SECONDS)
        raise RuntimeError("the stalled save was never killed")


@dataclass
class Save:
    """One checkpoint save: complete once ``future`` is done (None: a synchronous one)."""

    step: int
    path: Path
    why: str
    blocked_seconds: float
    future: Future[Any] | None = None


class Checkpointer:
    """DCP saves of the model and optimizer; one in flight at a time."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 checkpoint_dir: Path, *, asynchronous: bool, stall: int | None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.dir = checkpoint_dir
        self.asynchronous = asynchronous and hasattr(dcp, "async_save")
        self.stall = stall
        self.count = 0
        # Its own process group: the async save's collectives run on a thread, beside the
        # training's allreduce on the default group.
        self.group = dist.new_group(backend="gloo")
        self.pending: Save | None = None

    def state(self, step: int) -> dict[str, Any]:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state,
                "step": torch.tensor(step, dtype=torch.int64)}

    def save(self, step: int, why: str) -> Save | None:
        """Start the save of ``step`` (the one before it finished first).

        A synchronous save returns itself, complete.
        """
        self.wait()
        self.count += 1
        path = step_dir(self.dir, step)
        writer_type = StallingWriter if self.count == self.stall else FileSystemWriter
        writer = writer_type(str(path))
        started = time.monotonic()
        if self.asynchronous:
            future = dcp.async_save(self.state(step), storage_writer=writer,
                                    process_group=self.group)
            self.pending = Save(step, path, why, time.monotonic() - started, future)
            return None
        dcp.save(self.state(step), storage_writer=writer, process_group=self.group)
        return Save(step, path, why, time.monotonic() - started)

    def finished(self) -> Save | None:
        """The asynchronous save that completed since the last call, if one did."""
        done = self.pending
        if done is None or done.future is None or not done.future.done():
            return None
        self.pending = None
        done.future.result()  # a failed save raises here: the run stops, as a real one would
        return done

    def wait(self) -> Save | None:
        if self.pending is not None and self.pending.future is not None:
            self.pending.future.result()
        return self.finished()

    def load(self, path: Path) -> int:
        """Load ``path`` into the model and optimizer; its step."""
        state = self.state(0)
        dcp.load(state, checkpoint_id=str(path), process_group=self.group)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        return int(state["step"].item())


# ------------------------------------------------------------------ the run


class Timeline:
    """Rank 0's milestones as JSON lines (``--timeline``); nothing on other ranks."""

    def __init__(self, path: Path | None, rank: int, generation: int) -> None:
        self.path = path if rank == 0 else None
        self.generation = generation

    def mark(self, event: str, when: float | None = None, **extra: Any) -> None:
        if self.path is None:
            return
        line = {"event": event, "time": time.time() if when is None else when,
                "pid": os.getpid(), "generation": self.generation, **extra}
        with self.path.open("a") as handle:
            handle.write(json.dumps(line) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, required=True, help="the step to finish at")
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--checkpoint-every", type=int, default=50, metavar="K")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--step-time", type=float, default=0.0, metavar="SECONDS",
                        help="extra time per step (a bigger model's compute)")
    parser.add_argument("--sync-save", action="store_true",
                        help="save synchronously (dcp.save) even where async_save exists")
    parser.add_argument("--timeline", type=Path, metavar="FILE")
    parser.add_argument("--final-weights", type=Path, metavar="FILE")
    parser.add_argument("--stall-save", type=int, metavar="N",
                        help="the N-th save of this run never writes its .metadata (tests)")
    args = parser.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 1:
        parser.error("--steps >= 0 and --checkpoint-every >= 1")
    return args


def connect() -> JobClient | None:
    """The controller's client; None without ``SN_CONTROLLER_URL`` (an unmonitored run)."""
    if not os.environ.get("SN_CONTROLLER_URL"):
        return None
    return JobClient.from_env()


def resume_from(point: RestorePoint | None, checkpoint_dir: Path) -> tuple[Path | None, str]:
    """The checkpoint to load: the controller's restore point.

    Without an answer from the controller: the one the launcher was given
    (``SN_RESTORE_CHECKPOINT``), else the latest complete one in the directory.
    """
    if point is not None:
        source, how = (Path(point.path) if point.path else None,
                       f"generation {point.generation}, step {point.step}")
    elif os.environ.get("SN_RESTORE_CHECKPOINT"):
        source, how = Path(os.environ["SN_RESTORE_CHECKPOINT"]), "the launcher's restore"
    else:
        return latest_complete(checkpoint_dir), "latest local checkpoint"
    if source is not None and not (complete := is_complete(source)):
        raise SystemExit(f"train.py: cannot resume from {source} ({how}): not a complete "
                         f"checkpoint: {complete.reason}")
    return source, how


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # deterministic sums, and no oversubscribed cores
    torch.use_deterministic_algorithms(True)
    try:
        client = connect()
    except ValueError as err:
        print(f"train.py: {err}", file=sys.stderr)
        return 2
    point = client.restore_point() if client is not None else None
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    # the launcher says which generation this is; the restore point says it too
    generation = point.generation if point else int(os.environ.get("SN_GENERATION") or 0)
    timeline = Timeline(args.timeline, rank, generation)
    timeline.mark("started", STARTED)
    timeline.mark("rendezvous", world_size=dist.get_world_size())

    model = data_parallel(build_model(args.seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    checkpoints = Checkpointer(model, optimizer, args.checkpoint_dir,
                               asynchronous=not args.sync_save, stall=args.stall_save)
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)

    source, how = resume_from(point, args.checkpoint_dir)
    step = 0
    if source is not None:
        step = checkpoints.load(source)
        print(f"resuming from step {step} ({source}, {how})", flush=True)
        timeline.mark("loaded", step=step, path=str(source))
    else:
        print("starting from step 0", flush=True)

    def report(done: Save | None) -> None:
        if done is not None and rank == 0:
            if client is not None:
                # what training stood still for (the interval advisor's input)
                client.checkpoint_saved(done.step, done.path,
                                        save_seconds=done.blocked_seconds)
            timeline.mark("checkpoint", step=done.step, why=done.why)
            print(f"checkpoint {done.path} complete ({done.why})", flush=True)

    first = True
    loss = torch.tensor(0.0)
    while step < args.steps:
        step += 1
        x, y = batch(args.seed, step, rank)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if args.step_time:
            time.sleep(args.step_time)
        if client is not None:
            client.progress(step)
        if first:
            timeline.mark("first_step", step=step)
            first = False
        # Rank 0's client decides and tells the others: each rank's client sees a request
        # in its own progress reply, at a step of its own, and one request is one save.
        asked = rank == 0 and client is not None and client.should_checkpoint()
        requested = torch.tensor([1 if asked else 0])
        dist.broadcast(requested, src=0)
        report(checkpoints.finished())
        if requested.item() or step % args.checkpoint_every == 0:
            report(checkpoints.save(step, "requested" if requested.item() else "scheduled"))
    report(checkpoints.wait())

    if rank == 0 and args.final_weights is not None:
        torch.save({k: v.clone() for k, v in model.module.state_dict().items()},
                   args.final_weights)
    timeline.mark("done", step=step)
    print(f"done at step {step}, loss {loss.item():.6f}", flush=True)
    if client is not None:
        client.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
