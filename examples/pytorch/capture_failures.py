r"""Run the example job under torchrun, failing for real, and keep every rank's logs.

For each failure mode of ``failures.py`` (kill, oom, nan, hang, exception): one torchrun
agent with 4 ranks on this host (``--standalone``, gloo), every rank's stdout and stderr
in its own file (``--log-dir --redirects 3 --tee 3``: torchrun's layout,
``logs/<run id>/attempt_0/<rank>/{stdout,stderr}.log`` and the ``error.json`` of
``@record``), and the
agent's console (its own messages and the ranks' lines it tees, ``[default<rank>]:``) in
``torchrun.log``. A small model: each run takes seconds (the hang: the collective
timeout more).

    python examples/pytorch/capture_failures.py --out tests/fixtures/joblogs/torchrun
    python examples/pytorch/capture_failures.py --out /tmp/logs hang kill

Each mode's directory is ``OUT/<mode>/``, with ``expected.yaml`` (the rank that failed
first and the failure's category, what an analysis must name). Paths of this machine
(the repository, the run's directory) and its host name are replaced by fixed ones, so
the logs can be kept in the repository.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent
REPO = EXAMPLE.parents[1]
WORLD = 4
STEPS = 10
FAIL_STEP = 3
#: The process group's timeout: what the ranks beside a hung one wait in a collective.
COLLECTIVE_TIMEOUT = 10.0
#: The longest one run may take: a loaded two-core machine, 4 ranks importing torch.
RUN_TIMEOUT = 240.0
#: What replaces this machine's paths and host name in the kept logs.
REPO_ALIAS = "/srv/job"
RUN_ALIAS = "/tmp/torchrun"
HOST_ALIAS = "node-0"


@dataclass(frozen=True)
class Mode:
    """A failure mode: which rank fails, how an analysis should call it, and why."""

    name: str
    rank: int
    category: str
    note: str


MODES = {m.name: m for m in (
    Mode("kill", 2, "process-killed",
         "rank 2 SIGKILLed itself at step 3 and printed nothing; the others lost it in the "
         "gradients' all-reduce (gloo: connection closed or reset by peer) or were stopped "
         "by torchrun (SIGTERM). The root cause is the rank torchrun saw die of signal 9, "
         "not the ranks whose collectives failed after it."),
    Mode("oom", 1, "cuda-oom",
         "rank 1 asked the CPU allocator for 1 PiB at step 3 (DefaultCPUAllocator: can't "
         "allocate memory): the CPU stand-in for a CUDA out-of-memory error. host-oom is "
         "the other fair name for it (the allocation was of host memory); the others' gloo "
         "errors are the cascade."),
    Mode("nan", 3, "nan-loss",
         "rank 3's batch at step 3 was a corrupted record (log of negative values): its "
         "loss is nan, and the job's finite-loss check (as Megatron-LM's "
         "check_for_nan_in_loss_and_grad) stopped it before the all-reduce; the others' "
         "gloo errors are the cascade."),
    Mode("hang", 1, "nccl-timeout",
         "rank 1 stopped entering collectives at step 3 and printed nothing more; the "
         "other ranks hit the process group's 10 s timeout in the gradients' all-reduce "
         "(gloo: Timed out waiting 10000ms for recv/send operation) and torchrun then "
         "SIGTERMed rank 1 (its own Root Cause names a rank that timed out). The category "
         "is the collective timeout's (no category of its own for a hang; gloo's timeout "
         "stands for NCCL's watchdog), the root the rank that never reached the "
         "collective, not the ranks that timed out waiting for it."),
    Mode("exception", 2, "app-bug",
         "rank 2 raised KeyError in the job's own code at step 3 (its shard missing from "
         "the manifest): an application bug, not a node fault; the others' gloo errors "
         "are the cascade."),
)}


def torchrun_argv(python: str, log_dir: Path, run_dir: Path, mode: Mode) -> list[str]:
    return [python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(WORLD), "--max-restarts", "0",
            "--log-dir", str(log_dir), "--redirects", "3", "--tee", "3",
            str(EXAMPLE / "train.py"), "--steps", str(STEPS), "--log-every", "1",
            "--checkpoint-every", str(10 * STEPS), "--checkpoint-dir", str(run_dir / "ckpt"),
            "--collective-timeout", f"{COLLECTIVE_TIMEOUT:g}",
            "--fail", mode.name, "--fail-rank", str(mode.rank),
            "--fail-step", str(FAIL_STEP)]


def run(mode: Mode, run_dir: Path, python: str, timeout: float) -> int | None:
    """Run torchrun failing in ``mode``; its exit code (None: killed at ``timeout``)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SN_", "TORCHELASTIC_")) and k not in (
               "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with (run_dir / "torchrun.log").open("wb") as console:
        proc = subprocess.Popen(torchrun_argv(python, run_dir / "logs", run_dir, mode),
                                cwd=run_dir, stdin=subprocess.DEVNULL, stdout=console,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


def keep(run_dir: Path, dest: Path, mode: Mode) -> None:
    """The console and every rank's files into ``dest``, this machine's names replaced."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    sources = [(run_dir / "torchrun.log", dest / "torchrun.log")]
    # torchrun's layout: LOG_DIR/<run id>_<random>/attempt_0/<local rank>/<file>
    for path in sorted((run_dir / "logs").glob("*/attempt_*/*/*")):
        sources.append((path, dest / path.relative_to(run_dir)))
    for source, target in sources:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(anonymise(source.read_text(errors="replace"), run_dir))
    (dest / "expected.yaml").write_text(
        f"root_rank: {mode.rank}\ncategory: {mode.category}\nnote: >-\n"
        + "".join(f"  {line}\n" for line in wrap(mode.note)))


def anonymise(text: str, run_dir: Path) -> str:
    for real, alias in ((str(run_dir), RUN_ALIAS), (str(REPO), REPO_ALIAS),
                        (sys.prefix, f"{REPO_ALIAS}/.venv")):
        text = text.replace(real, alias)
    host = socket.gethostname()
    return re.sub(rf"\b{re.escape(host)}\b", HOST_ALIAS, text) if host != "localhost" else text


def wrap(text: str, width: int = 86) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


def capture(name: str, out: Path, python: str = sys.executable,
            timeout: float = RUN_TIMEOUT) -> int | None:
    """Run mode ``name`` and keep its logs in ``out/<name>``; torchrun's exit code."""
    mode = MODES[name]
    with tempfile.TemporaryDirectory(prefix=f"torchrun-{name}-") as tmp:
        code = run(mode, Path(tmp), python, timeout)
        keep(Path(tmp), out / name, mode)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a directory per mode in it")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT, metavar="SECONDS")
    parser.add_argument("modes", nargs="*", metavar="MODE",
                        help=f"the modes to run (default all: {', '.join(MODES)})")
    args = parser.parse_args(argv)
    if unknown := [m for m in args.modes if m not in MODES]:
        parser.error(f"unknown modes {unknown}: choose from {', '.join(MODES)}")
    status = 0
    for name in args.modes or list(MODES):
        code = capture(name, args.out, timeout=args.timeout)
        print(f"{name}: torchrun exited {'(killed at the timeout)' if code is None else code}"
              f" -> {args.out / name}", flush=True)
        if code in (0, None):  # a failure mode that did not fail, or never ended
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
