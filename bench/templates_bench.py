"""How many lines a second one job's template miner takes, on a realistic mix of lines.

Run with ``python -m bench.templates_bench`` (not yet part of ``make bench``); ``--quick``
for a smoke run (20,000 lines, 3 runs instead of 200,000 lines, 5 runs). The mix is made
here, from a fixed seed, in the proportions of a training job's log: Megatron-style
progress lines (40 %), NCCL INFO lines of ten kinds with host, pid, rank and channel
numbers (25 %), timestamped Python logging lines (10 %), warnings with paths (10 %),
DeepSpeed loss-scale lines, some reduced to 1 (5 %), traceback frames (5 %) and error
lines (NCCL WARN, CUDA OOM, torchrun's exitcode and signal lines: 5 %). Each run feeds
every line, with its own timestamp, to a fresh :class:`JobTemplates` with the default
settings, in this process, timed in CPU seconds of this process (``time.process_time``:
a loaded machine slows the wall clock, not the work); the median of the runs is printed,
for the whole miner and for the masking alone. ``--lines-out FILE`` also writes the mix,
one line a line (to feed another miner the same lines). No goal: the figure is for the
agent's log reading budget.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import add_output_args, finish, machine, results_path, stop_on_sigterm
from sn_monitor.clock import ManualClock
from sn_monitor.joblog.template_settings import TemplateSettings
from sn_monitor.joblog.templates import JobTemplates, LineMasker

SEED = 33
NCCL_KINDS = (
    "NCCL INFO Channel {c:02d}/24 :    0   1   2   3   4   5   6   7",
    "NCCL INFO Channel {c:02d}/0 : {r}[{r}] -> {n}[{n}] via P2P/IPC/read",
    "NCCL INFO Connected all rings",
    "NCCL INFO NET/IB : Using [0]mlx5_{c}:1/IB [1]mlx5_{n}:1/IB ; OOB eth0:10.0.{r}.{c}<0>",
    "NCCL INFO Using network IB",
    "NCCL INFO comm 0x{h:x} rank {r} nranks 64 cudaDev {c} busId {b}000 - Init COMPLETE",
    "NCCL INFO Trees [0] {n}/-1/-1->{r}->{c} [1] {n}/-1/-1->{r}->{c}",
    "NCCL INFO {c} coll channels, {n} p2p channels, 2 p2p channels per peer",
    "NCCL INFO threadThresholds 8/8/64 | 512/8/64 | 512 | 512",
    "NCCL INFO cudaDriverVersion 12020",
)
WARNINGS = (
    "/opt/conda/lib/python3.10/site-packages/torch/utils/checkpoint.py:{n}: UserWarning: "
    "torch.utils.checkpoint: please pass in use_reentrant=True or use_reentrant=False",
    "/usr/local/lib/python3.10/dist-packages/torch/distributed/distributed_c10d.py:{n}: "
    "UserWarning: barrier(): using the device under current context",
)
ERRORS = (
    "host-{r:03d}:{p}:{p} [{c}] NCCL WARN NET/IB : Got completion from peer 10.0.{r}.{c}<{p}> "
    "with error 12, opcode 0, len 0, vendor err 129",
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {n}.00 MiB "
    "(GPU {c}; 79.15 GiB total capacity; 77.{n} GiB already allocated)",
    "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) "
    "local_rank: {c} (pid: {p}) of binary: /usr/bin/python",
    "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) "
    "local_rank: {c} (pid: {p}) of binary: /usr/bin/python",
    "Signal {s} (SIG{sn}) received by PID {p}",
)


def one_line(rng: random.Random, step: int) -> str:
    """One line of the mix."""
    r, c, n, p = rng.randrange(64), rng.randrange(8), rng.randrange(64), rng.randrange(1, 99999)
    roll = rng.random()
    if roll < 0.40:
        return (f" iteration {step:>8}/ 500000 | consumed samples: {step * 512:>12} | "
                f"elapsed time per iteration (ms): {rng.uniform(900, 1100):.1f} | "
                f"learning rate: {rng.uniform(1e-5, 3e-4):.6E} | global batch size: 512 | "
                f"lm loss: {rng.uniform(1.8, 2.6):.6E} | loss scale: 65536.0 | "
                f"grad norm: {rng.uniform(0.2, 3):.3f} | number of skipped iterations: 0 |")
    if roll < 0.65:
        kind = rng.choice(NCCL_KINDS).format(c=c, r=r, n=n, h=rng.getrandbits(48), b=c + 1)
        return f"host-{r // 8:03d}:{p}:{p + 1} [{c}] {kind}"
    if roll < 0.75:
        return (f"[2024-05-{1 + step % 28:02d} {step % 24:02d}:{step % 60:02d}:{c:02d},{n:03d}]"
                f" [INFO] [logging.py:96:log_dist] [Rank {r}] step={step}, "
                f"skipped=0, lr=[{rng.uniform(1e-5, 3e-4):.8f}], mom=[(0.9, 0.95)]")
    if roll < 0.85:
        return rng.choice(WARNINGS).format(n=rng.randrange(100, 3000))
    if roll < 0.90:
        scale = 2 ** rng.randrange(0, 17)
        return (f"[deepspeed] OVERFLOW! Rank {r} Skipping step. Attempted loss scale: "
                f"{scale}, reducing to {max(scale // 2, 1)}")
    if roll < 0.95:
        return (f'  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/'
                f'module.py", line {rng.randrange(100, 2000)}, in _call_impl')
    signal, name = rng.choice(((9, "KILL"), (15, "TERM"), (6, "ABRT")))
    return rng.choice(ERRORS).format(r=r, c=c, n=n, p=p, s=signal, sn=name)


def the_mix(count: int) -> list[str]:
    rng = random.Random(SEED)
    return [one_line(rng, step) for step in range(count)]


def seconds_for(work: Callable[[], object]) -> float:
    """The CPU seconds this process spends on ``work``."""
    started = time.process_time()
    work()
    return time.process_time() - started


def feed_all(lines: Sequence[str]) -> JobTemplates:
    job = JobTemplates(TemplateSettings(), ManualClock())
    for i, line in enumerate(lines):
        job.observe(line, at=i * 0.001)
    return job


def mask_all(lines: Sequence[str]) -> None:
    masker = LineMasker(TemplateSettings())
    for line in lines:
        masker.tokens(line)


def measure(lines: Sequence[str], runs: int) -> dict[str, Any]:
    miner = [seconds_for(lambda: feed_all(lines)) for _ in range(runs)]
    masking = [seconds_for(lambda: mask_all(lines)) for _ in range(runs)]
    megabytes = sum(len(line) + 1 for line in lines) / 1e6
    job = feed_all(lines)
    return {
        "lines": len(lines), "megabytes": round(megabytes, 2), "runs": runs,
        "miner_lines_per_s": round(len(lines) / statistics.median(miner)),
        "miner_megabytes_per_s": round(megabytes / statistics.median(miner), 2),
        "masking_lines_per_s": round(len(lines) / statistics.median(masking)),
        "templates": len(job.summaries()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.templates_bench",
                                     description=__doc__.split("\n\n")[0])
    add_output_args(parser, "a smoke run: 20,000 lines, 3 runs")
    parser.add_argument("--lines-out", type=Path, default=None,
                        help="also write the mix of lines to this file")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    out_path = results_path(args, "templates.json")
    count, runs = (20_000, 3) if args.quick else (200_000, 5)
    lines = the_mix(count)
    if args.lines_out is not None:
        args.lines_out.write_text("\n".join(lines) + "\n")
    figures = measure(lines, runs)
    print(f"template miner, one job, {figures['lines']} lines ({figures['megabytes']} MB), "
          f"median of {runs} runs, per CPU second:\n"
          f"  whole miner  {figures['miner_lines_per_s']:>9} lines/s "
          f"({figures['miner_megabytes_per_s']} MB/s)\n"
          f"  masking only {figures['masking_lines_per_s']:>9} lines/s\n"
          f"  templates at the end: {figures['templates']}", flush=True)
    results: dict[str, Any] = {"meta": {"quick": args.quick, "seed": SEED,
                                        "machine": machine()},
                               "templates": figures}
    return finish(results, out_path, [])


if __name__ == "__main__":
    sys.exit(main())
