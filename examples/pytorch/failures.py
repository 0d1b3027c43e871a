r"""Failures injected into the example job for real, to test the analysis of its logs.

Off unless asked: ``train.py --fail MODE --fail-rank R --fail-step N`` makes rank R fail
at step N in one of five ways, each the real thing, so that every rank and torchrun print
what they would print in production:

``kill``       the rank SIGKILLs itself (a process killed from outside: the OOM killer, an
               operator's ``kill -9``); it prints nothing, its peers lose it in a collective.
``oom``        the rank allocates a 1 PiB activation (a corrupted batch size): the CPU
               allocator refuses it at allocation time (more than any Linux process's
               address space, whatever ``vm.overcommit_memory`` says), and torch raises
               its ``DefaultCPUAllocator: can't allocate memory`` error: no memory is used.
``nan``        the rank's batch is a corrupted record: its features go through a ``log``
               of negative values, the NaN flows through the model into the loss, and the
               job's own finite-loss check (``train.py``) stops the rank.
``hang``       the rank stops entering collectives (it waits, bounded by
               :data:`HANG_LIMIT_SECONDS`); its peers wait in the gradients' all-reduce
               until the process group's timeout (``--collective-timeout``) fails them.
``exception``  an application bug on that rank alone: its data shard is missing from the
               shard manifest, a ``KeyError``.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from dataclasses import dataclass

import torch

MODES = ("kill", "oom", "nan", "hang", "exception")
#: The ``oom`` allocation: 2**50 bytes (1 PiB), past a Linux process's address space.
OOM_ROWS = 2**43
#: The longest a ``hang`` rank waits to be killed before it gives up (a bounded wait).
HANG_LIMIT_SECONDS = 600.0


@dataclass(frozen=True)
class Failure:
    """Rank ``rank`` fails in ``mode`` at step ``step``."""

    mode: str
    rank: int
    step: int

    def due(self, rank: int, step: int) -> bool:
        return rank == self.rank and step == self.step


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("failure injection (tests of the log analysis)")
    group.add_argument("--fail", choices=MODES, metavar="MODE",
                       help=f"make one rank fail for real: {', '.join(MODES)}")
    group.add_argument("--fail-rank", type=int, default=0, metavar="R",
                       help="the rank that fails (default 0)")
    group.add_argument("--fail-step", type=int, default=1, metavar="N",
                       help="the step it fails at (default 1)")


def from_args(args: argparse.Namespace) -> Failure | None:
    if args.fail is None:
        return None
    if args.fail_rank < 0 or args.fail_step < 1:
        raise SystemExit("train.py: --fail-rank >= 0 and --fail-step >= 1")
    return Failure(args.fail, args.fail_rank, args.fail_step)


def before_step(failure: Failure | None, rank: int, step: int) -> None:
    """The failures that strike before the rank's forward pass (all but ``nan``)."""
    if failure is None or not failure.due(rank, step):
        return
    if failure.mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif failure.mode == "oom":
        activations = torch.empty(OOM_ROWS, 32)  # raises: never allocated
        raise AssertionError(f"a {activations.nbytes}-byte allocation succeeded")
    elif failure.mode == "hang":
        hang(HANG_LIMIT_SECONDS)
    elif failure.mode == "exception":
        manifest = {f"shard-{r:05d}": f"/data/train/shard-{r:05d}.bin" for r in range(rank)}
        print(f"rank {rank} reading {manifest[f'shard-{rank:05d}']}", flush=True)


def hang(limit: float) -> None:
    """Never return to the training loop (until ``limit`` seconds: then fail)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    raise RuntimeError(f"the hung rank was not stopped in {limit:g} s")


def corrupt(failure: Failure | None, rank: int, step: int, x: torch.Tensor) -> torch.Tensor:
    """The batch's features, a corrupted record's when ``nan`` is due: NaN through ``log``."""
    if failure is None or failure.mode != "nan" or not failure.due(rank, step):
        return x
    # the record's raw values were stored negated: the feature transform's log of them is NaN
    return torch.log(-x.abs() - 1.0)
