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

Like Megatron-LM's ``--check-for-nan-in-loss-and-grad``, every rank checks its own loss
before the gradients' all-reduce: a NaN or Inf stops the rank (``FloatingPointError``),
naming it, before it spreads to every rank's weights.

For measurements: ``--timeline FILE`` (rank 0) appends a JSON line per milestone
(``started``, ``rendezvous``, ``loaded``, ``first_step``, ``checkpoint`` for each complete
save, ``scheduled`` or ``requested``, and ``done``) with its wall time.
``--final-weights FILE`` (rank 0) saves the model's state dict at the end. For tests:
``--stall-save N`` writes the N-th save of the run but never its ``.metadata`` (rank 0
waits instead, writing ``DIR/stalled-step_<step>``): a job killed then leaves an
incomplete checkpoint. ``--fail MODE --fail-rank R --fail-step N``: rank R fails for real
at step N (``failures.py``: killed, out of memory, a NaN loss, a hang, an exception), with
``--collective-timeout S`` for the process group's timeout (the hang's peers); every
rank's main is torchrun's ``@record``, so each failure is in torchrun's error summary.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before torch is imported: the relaunch's cost includes the import

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
from concurrent.futures import Future  # noqa: E402
from concurrent.futures import TimeoutError as FutureTimeout  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

# beside this script: the failures of tests, the launcher's plans for warm restores
from failures import add_arguments, before_step, corrupt, from_args  # noqa: E402
from rejoin import Plan, announce, newer_plan, wait_for_plan  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint import FileSystemWriter  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from sn_monitor.client import JobClient, RestorePoint  # noqa: E402
from sn_monitor.dcp import is_complete  # noqa: E402

FEATURES = 32
HIDDEN = 64
BATCH = 64
#: The longest a stalled save (``--stall-save``) waits to be killed.
STALL_LIMIT_SECONDS = 600.0
#: The most generations one process takes part in (each restore is one).
MAX_GENERATIONS = 1000
#: How long a process leaving a broken generation waits for its save in flight to end.
LEAVE_SECONDS = 5.0
#: How long forming a warm generation's group waits for its slowest member.
JOIN_TIMEOUT_SECONDS = 300.0


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

    @classmethod
    def for_new_model(cls, args: argparse.Namespace) -> Checkpointer:
        """A fresh model and optimizer from the seed, under DDP, and their saves."""
        model = data_parallel(build_model(args.seed))
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        return cls(model, optimizer, args.checkpoint_dir, asynchronous=not args.sync_save,
                   stall=args.stall_save)

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
    parser.add_argument("--standby", type=int, metavar="G",
                        help="a pre-warmed process on a spare node: wait for a plan after "
                             "generation G that names this node (SN_REJOIN_DIR), then join it")
    parser.add_argument("--rejoin-timeout", type=float, default=3600.0, metavar="SECONDS",
                        help="the longest a process waits for the next generation's plan")
    parser.add_argument("--collective-timeout", type=float, metavar="SECONDS",
                        help="the process group's timeout for a collective (torch's "
                             "default: 30 minutes)")
    parser.add_argument("--log-every", type=int, default=0, metavar="K",
                        help="rank 0 prints the step and its loss every K steps")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 1:
        parser.error("--steps >= 0 and --checkpoint-every >= 1")
    if args.collective_timeout is not None and args.collective_timeout <= 0:
        parser.error("--collective-timeout > 0")
    return args


def collective_timeout(args: argparse.Namespace) -> timedelta | None:
    if args.collective_timeout is None:
        return None
    return timedelta(seconds=args.collective_timeout)


def connect(environ: dict[str, str]) -> JobClient | None:
    """The controller's client; None without ``SN_CONTROLLER_URL`` (an unmonitored run)."""
    if not environ.get("SN_CONTROLLER_URL"):
        return None
    return JobClient.from_env(environ)


def resume_from(point: RestorePoint | None, given: str | None,
                checkpoint_dir: Path) -> tuple[Path | None, str]:
    """The checkpoint to load: the controller's restore point.

    Without an answer from the controller: the one the launcher was given
    (``given``), else the latest complete one in the directory.
    """
    if point is not None:
        source, how = (Path(point.path) if point.path else None,
                       f"generation {point.generation}, step {point.step}")
    elif given:
        source, how = Path(given), "the launcher's restore"
    else:
        return latest_complete(checkpoint_dir), "latest local checkpoint"
    if source is not None and not (complete := is_complete(source)):
        raise SystemExit(f"train.py: cannot resume from {source} ({how}): not a complete "
                         f"checkpoint: {complete.reason}")
    return source, how


# ------------------------------------------------------------------ generations


class GenerationOver(Exception):
    """The generation cannot go on: a peer is gone, or the launcher planned a newer one."""


@dataclass(frozen=True)
class Member:
    """A process in one generation: its rank, the world, and how its group forms.

    ``plan`` None: torchrun started it (rank, world and the store in its environment);
    else a warm generation of the launcher's plan, formed on the job's store.
    """

    node: str
    generation: int
    rank: int
    world_size: int
    checkpoint: str | None
    plan: Plan | None = None

    @classmethod
    def from_torchrun(cls, node: str) -> Member:
        return cls(node, int(os.environ.get("SN_GENERATION") or 0),
                   int(os.environ.get("RANK") or 0), int(os.environ.get("WORLD_SIZE") or 1),
                   os.environ.get("SN_RESTORE_CHECKPOINT") or None)

    @classmethod
    def from_plan(cls, node: str, plan: Plan) -> Member:
        rank = plan.rank_of(node)
        assert rank is not None
        return cls(node, plan.generation, rank, len(plan.nodes), plan.checkpoint, plan)

    def environ(self) -> dict[str, str]:
        """The environment this member's client reads (its rank and world, not torchrun's)."""
        return {**os.environ, "RANK": str(self.rank), "WORLD_SIZE": str(self.world_size)}

    def form_group(self, timeout: timedelta | None) -> None:
        """The default process group of this generation: every member of it joins."""
        if self.plan is None:
            dist.init_process_group(backend="gloo", timeout=timeout)
            return
        host, _, port = os.environ["SN_JOB_STORE"].rpartition(":")
        store = dist.TCPStore(host, int(port), is_master=False,
                              timeout=timedelta(seconds=JOIN_TIMEOUT_SECONDS))
        prefixed = dist.PrefixStore(self.plan.store_prefix(os.environ.get("SN_JOB", "")),
                                    store)
        dist.init_process_group(backend="gloo", store=prefixed, rank=self.rank,
                                world_size=self.world_size, timeout=timeout)


def peer_lost(err: BaseException) -> bool:
    """A collective failed because another member is gone (gloo says so in its text)."""
    return isinstance(err, (GenerationOver, dist.DistError)) or "/gloo/" in str(err)


def leave(checkpoints: Checkpointer | None, client: JobClient | None) -> None:
    """Leave a broken generation so that this process can join the next one.

    A save still in flight must end first (it fails on its own broken group): one that
    does not in :data:`LEAVE_SECONDS` means this process cannot take part any more.
    """
    pending = checkpoints.pending if checkpoints is not None else None
    if pending is not None and pending.future is not None:
        try:
            pending.future.result(timeout=LEAVE_SECONDS)
        except FutureTimeout:
            raise SystemExit("train.py: a save of the broken generation is still "
                             "running: cannot join another") from None
        except Exception as err:  # noqa: BLE001 - the save's group is broken: expected
            print(f"the save of step {pending.step} failed with its generation: {err}",
                  flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    if client is not None:
        client.close()


def run_generation(args: argparse.Namespace, member: Member,
                   rejoin_dir: Path | None) -> int:
    """Train as ``member`` to ``--steps``; :class:`GenerationOver` when it breaks first.

    Without ``rejoin_dir`` (no warm restores) a broken generation ends the process, as
    torchrun's ``--max-restarts 0`` expects.
    """
    client = connect(member.environ())
    checkpoints: Checkpointer | None = None
    try:
        point = client.restore_point() if client is not None else None
        member.form_group(collective_timeout(args))
        checkpoints = Checkpointer.for_new_model(args)
        return train(args, member, point, client, checkpoints, rejoin_dir)
    except (GenerationOver, RuntimeError) as err:
        if rejoin_dir is None or not peer_lost(err):
            raise
        print(f"generation {member.generation} is over: {str(err).splitlines()[0][:200]}",
              flush=True)
        leave(checkpoints, client)
        raise GenerationOver(str(err)) from err


def train(args: argparse.Namespace, member: Member, point: RestorePoint | None,
          client: JobClient | None, checkpoints: Checkpointer,
          rejoin_dir: Path | None) -> int:
    """Load the restore point, then train to ``--steps`` (rank 0 marks the timeline)."""
    rank = dist.get_rank()
    # the launcher says which generation this is; the restore point says it too
    generation = point.generation if point else member.generation
    timeline = Timeline(args.timeline, rank, generation)
    timeline.mark("started", STARTED)
    timeline.mark("rendezvous", world_size=dist.get_world_size())

    source, how = resume_from(point, member.checkpoint, args.checkpoint_dir)
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
    failure = from_args(args)
    loss = torch.tensor(0.0)
    model, optimizer = checkpoints.model, checkpoints.optimizer
    while step < args.steps:
        if rejoin_dir is not None and (plan := newer_plan(rejoin_dir, member.generation)):
            raise GenerationOver(f"the launcher planned generation {plan.generation}")
        step += 1
        before_step(failure, rank, step)
        x, y = batch(args.seed, step, rank)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(corrupt(failure, rank, step, x)), y)
        check_finite(loss, rank, step)
        loss.backward()
        optimizer.step()
        if args.step_time:
            time.sleep(args.step_time)
        if args.log_every and step % args.log_every == 0 and rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
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


def check_finite(loss: torch.Tensor, rank: int, step: int) -> None:
    """Stop this rank on a NaN or Inf loss, before its gradients reach the all-reduce."""
    if not torch.isfinite(loss).item():
        raise FloatingPointError(f"rank {rank}: loss is {loss.item()} at step {step}: "
                                 "non-finite local loss before the gradients' all-reduce")


@record
def main(argv: list[str] | None = None) -> int:
    """Generations, one after another, in this process.

    Under torchrun, generation 0 (or a cold restore) comes from torchrun's environment;
    with ``SN_REJOIN_DIR`` (the launcher's warm restores) a generation that breaks is left
    and the next plan naming this node is joined. ``--standby``: a pre-warmed process on
    a spare node, waiting for a plan that names it.
    """
    args = parse_args(argv)
    torch.set_num_threads(1)  # deterministic sums, and no oversubscribed cores
    torch.use_deterministic_algorithms(True)
    rejoin_dir = Path(os.environ["SN_REJOIN_DIR"]) if os.environ.get("SN_REJOIN_DIR") else None
    node = os.environ.get("SN_NODE") or socket.gethostname()
    if args.standby is not None:
        if rejoin_dir is None:
            print("train.py: --standby needs SN_REJOIN_DIR", file=sys.stderr)
            return 2
        plan = wait_for_plan(rejoin_dir, node, args.standby, args.rejoin_timeout,
                             standby=True)
        if plan is None:
            print(f"standby on {node}: no generation named it in {args.rejoin_timeout:g} s",
                  flush=True)
            return 0
        member = Member.from_plan(node, plan)
    else:
        member = Member.from_torchrun(node)
    for _ in range(MAX_GENERATIONS):
        if rejoin_dir is not None:
            announce(rejoin_dir, node, "joined", member.generation)
        try:
            return run_generation(args, member, rejoin_dir)
        except ValueError as err:  # the client's environment
            print(f"train.py: {err}", file=sys.stderr)
            return 2
        except GenerationOver:
            assert rejoin_dir is not None
        plan = wait_for_plan(rejoin_dir, node, member.generation, args.rejoin_timeout,
                             standby=False)
        if plan is None or plan.rank_of(node) is None:
            print(f"{node} is not in generation "
                  f"{plan.generation if plan else '(none came)'}: stopping", flush=True)
            return 0
        print(f"joining generation {plan.generation} as rank {plan.rank_of(node)}",
              flush=True)
        member = Member.from_plan(node, plan)
    print(f"train.py: {MAX_GENERATIONS} generations in one process: stopping", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
