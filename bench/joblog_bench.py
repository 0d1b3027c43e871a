"""Job-log reading at 50 MB/s: the follower's CPU, what it reads and drops, and whether
sampling stays on time.

Run with ``python -m bench.joblog_bench`` (``make bench``); ``--quick`` for a smoke run
(each phase once for 6 s, a 0.25 s sampling cycle). A writer process appends realistic
training-log lines (Megatron and DeepSpeed progress, NCCL INFO, Hugging Face dicts,
warnings) at ``--rate`` bytes per second (default 50 MB/s) to ``--files`` rank files
(default 4: each file alone could take the 256 KiB/s of all together) in a tmpfs
folder, renaming each to ``.1`` at 64 MiB and starting a new one (rotation). In the same
process as the follower, a stand-in sampling loop runs a cycle every ``--cycle`` seconds
(default 1 s) on its own thread: it reads /proc files and does ~5 ms of Python work,
like the agent's sampler; its *lateness* is how long after its scheduled time a cycle
starts (a fixed grid on the monotonic clock).

Phases, each ``--seconds`` long (default 30), run ``--repeats`` times (default 3) in turn
so that the machine's load falls on each alike; each figure is the median over the
repeats (every run is in the JSON). The writer runs in all: ``baseline`` (no follower),
``default`` (the follower with the default ``job_logs`` bounds: 256 KiB/s in all and
a file), ``unbounded`` (every bound at 1 GiB/s: what the bounds save). In each, the
follower's thread CPU (its own ``time.thread_time()``, and ``/proc/self/task/<tid>/stat``
beside it) as a share of one core, the bytes it read and dropped, its lines, and the
sampling loop's lateness p50/p99 and cycle time. The follower is the agent's: every
poll ends with the agent's recognition of the lines read
(:class:`~sn_monitor.agent.joblogs.findings.LogRecognition`, the packaged catalogue) on
the same thread, so its CPU is reading and recognition together. Goal (issue 33): the
follower at the default bounds under 5 % of a core, sampling lateness p99 under 2x the
baseline's + 5 ms; printed beside the figures, never a failure. The exit status is 1
only when nothing could be measured.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.common import (
    add_output_args,
    finish,
    loadavg_text,
    machine,
    pct,
    results_path,
    stop_on_sigterm,
)
from sn_monitor.agent.joblogs.build import build_reader
from sn_monitor.agent.joblogs.findings import LogRecognition
from sn_monitor.agent.settings import JobLogFileSettings, JobLogSettings
from sn_monitor.agent.snapshot import JobLogStats
from sn_monitor.clock import SystemClock
from sn_monitor.joblog.recognition import Recognizer

RATE = 50_000_000
ROTATE_BYTES = 64 << 20
#: The writer's pacing tick (seconds): each writes rate * tick bytes.
WRITE_TICK = 0.01
GOAL_CPU_SHARE = 0.05
GOAL_LATENESS_RATIO = 2.0
GOAL_LATENESS_SLACK_S = 0.005
UNBOUNDED = 1 << 30


def training_lines(count: int, seed: int = 7) -> bytes:
    """``count`` lines such as a large training job prints, newline-ended."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        rank, step = rng.randrange(64), 1000 + i // 64
        kind = rng.random()
        if kind < 0.35:
            out.append(
                f" iteration {step:8d}/  500000 | consumed samples: {step * 1024:12d} | "
                f"elapsed time per iteration (ms): {rng.uniform(900, 1300):.1f} | learning rate:"
                f" {rng.uniform(1e-5, 3e-4):.6E} | global batch size:  1024 | lm loss: "
                f"{rng.uniform(1.8, 2.6):.6E} | loss scale: 65536.0 | grad norm: "
                f"{rng.uniform(0.5, 2):.3f} | number of skipped iterations:   0 | number of "
                f"nan iterations:   0 |")
        elif kind < 0.6:
            out.append(
                f"[rank{rank}]:[2026-12-07 03:{i // 600 % 60:02d}:{i // 10 % 60:02d},"
                f"{i % 1000:03d}] [INFO] [logging.py:128:log_dist] [Rank {rank}] step={step}, "
                f"skipped=0, lr=[{rng.uniform(1e-5, 3e-4):.8f}], mom=[(0.9, 0.95)]")
        elif kind < 0.8:
            out.append(
                f"node-{rank // 8}:{4000 + rank}:{4100 + rank} [{rank % 8}] NCCL INFO Channel "
                f"{rng.randrange(32):02d}/0 : {rank}[{rank % 8}] -> {(rank + 1) % 64}"
                f"[{(rank + 1) % 8}] via P2P/CUMEM/read")
        elif kind < 0.97:
            out.append(
                f"{{'loss': {rng.uniform(1.8, 2.6):.4f}, 'grad_norm': {rng.uniform(0.5, 2):.4f},"
                f" 'learning_rate': {rng.uniform(1e-6, 3e-5):.4e}, 'epoch': {i / 1e5:.2f}}}")
        else:
            out.append(
                "/usr/local/lib/python3.11/site-packages/torch/utils/data/dataloader.py:617: "
                "UserWarning: This DataLoader will create 16 worker processes in total. Our "
                "suggested max number of worker in current system is 12, which is smaller than "
                "what this DataLoader is going to create.")
    return ("\n".join(out) + "\n").encode()


def write(folder: Path, rate: float, seconds: float, files: int) -> dict[str, Any]:
    """The writer process: ``rate`` bytes/s for ``seconds`` to ``files`` rotated files."""
    block = training_lines(20_000)
    paths = [folder / f"rank{rank}.log" for rank in range(files)]
    handles = [path.open("ab") for path in paths]
    sizes = [0] * files
    positions = [len(block) * rank // files for rank in range(files)]
    written, rotations = 0, 0
    started = time.monotonic()
    tick = 0
    while (now := time.monotonic()) - started < seconds:
        due = int(rate * (now - started)) - written
        for rank in range(files):
            share = due // files
            while share > 0:
                piece = block[positions[rank]:positions[rank] + share]
                positions[rank] = (positions[rank] + len(piece)) % len(block)
                handles[rank].write(piece)
                sizes[rank] += len(piece)
                written += len(piece)
                share -= len(piece)
            handles[rank].flush()
            if sizes[rank] >= ROTATE_BYTES:
                handles[rank].close()
                paths[rank].rename(paths[rank].with_suffix(".log.1"))
                handles[rank], sizes[rank] = paths[rank].open("ab"), 0
                rotations += 1
        tick += 1
        time.sleep(max(0.0, started + tick * WRITE_TICK - time.monotonic()))
    for handle in handles:
        handle.close()
    elapsed = time.monotonic() - started
    return {"bytes": written, "seconds": elapsed, "bytes_per_second": written / elapsed,
            "rotations": rotations}


@dataclass
class SamplingLoop:
    """A stand-in for the agent's sampler: a cycle every ``period`` s on its own thread."""

    period: float
    lateness: list[float]
    work: list[float]

    def run(self, stop: threading.Event) -> None:
        started = time.monotonic()
        cycle = 1
        while not stop.wait(max(0.0, started + cycle * self.period - time.monotonic())):
            begun = time.monotonic()
            self.lateness.append(begun - (started + cycle * self.period))
            self._sample()
            self.work.append(time.monotonic() - begun)
            cycle = int((time.monotonic() - started) / self.period) + 1

    @staticmethod
    def _sample() -> None:
        fields: dict[str, int] = {}
        for name in ("/proc/self/stat", "/proc/meminfo", "/proc/net/dev", "/proc/stat"):
            for line in Path(name).read_text().splitlines():
                parts = line.split()
                if len(parts) > 1 and parts[1].isdigit():
                    fields[parts[0]] = int(parts[1])
        deadline = time.thread_time() + 0.005
        total = 0
        while time.thread_time() < deadline:
            total += sum(range(200))


def thread_cpu_from_proc(tid: int | None) -> float | None:
    """utime + stime of thread ``tid`` of this process, from /proc/self/task/<tid>/stat."""
    if tid is None:
        return None
    try:
        stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def follower_settings(folder: Path, bounded: bool) -> JobLogSettings:
    settings = JobLogSettings(enabled=True, files=[
        JobLogFileSettings(glob=str(folder / "rank*.log"), job="bench")])
    if bounded:
        return settings
    return replace(settings, max_bytes_per_second=UNBOUNDED,
                   stream_bytes_per_second=UNBOUNDED, queue_lines=1 << 20)


def run_phase(name: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One phase: the writer, the sampling loop and (unless baseline) the follower."""
    for old in folder.glob("rank*"):
        old.unlink()
    writer = subprocess.Popen(
        [sys.executable, "-m", "bench.joblog_bench", "--writer", str(folder),
         "--rate", str(args.rate), "--seconds", str(args.seconds + 1), "--files",
         str(args.files)], stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    loop = SamplingLoop(args.cycle, [], [])
    threads = [threading.Thread(target=loop.run, args=(stop,), name="bench-sampling")]
    reader = recognition = None
    try:
        time.sleep(0.5)  # the writer's files exist: the follower starts at their end
        if name != "baseline":
            clock = SystemClock()
            recognition = LogRecognition(Recognizer(), "bench-node", clock)
            reader = build_reader(follower_settings(folder, name == "default"), clock,
                                  consumer=recognition.consume)
            reader.start()
        started = time.monotonic()
        for thread in threads:
            thread.start()
        time.sleep(args.seconds)
        # the follower's figures at the phase's end, before it is stopped
        stats = reader.stats() if reader else None
        found = recognition.counts()[0] if recognition else ()
        proc_cpu = thread_cpu_from_proc(reader.native_thread_id) if reader else None
        wall = time.monotonic() - started
    finally:
        stop.set()
        for thread in threads:
            if thread.is_alive():
                thread.join(timeout=10)
        if reader is not None:
            reader.stop(timeout=10)
        out, _ = writer.communicate(timeout=60)
    return summarise(name, wall, loop, stats, sum(n for _, n in found), proc_cpu,
                     json.loads(out))


def summarise(name: str, wall: float, loop: SamplingLoop, stats: JobLogStats | None,
              findings: int, proc_cpu: float | None,
              written: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {
        "phase": name, "seconds": round(wall, 2), "cycles": len(loop.lateness),
        "lateness_p50_ms": round(pct(loop.lateness, 50) * 1e3, 3),
        "lateness_p99_ms": round(pct(loop.lateness, 99) * 1e3, 3),
        "lateness_max_ms": round(max(loop.lateness, default=float("nan")) * 1e3, 3),
        "cycle_work_p50_ms": round(pct(loop.work, 50) * 1e3, 3),
        "writer_mb_per_s": round(written["bytes_per_second"] / 1e6, 1),
        "writer_rotations": written["rotations"], "loadavg": loadavg_text()}
    if stats is not None:
        read = sum(s.bytes for s in stats.sources)
        dropped = sum(s.dropped_bytes for s in stats.sources)
        row.update({
            "follower_cpu_share": round(stats.cpu_seconds / wall, 4),
            "follower_cpu_share_proc": None if proc_cpu is None else round(proc_cpu / wall, 4),
            "findings": findings,
            "read_mb_per_s": round(read / wall / 1e6, 2),
            "dropped_mb_per_s": round(dropped / wall / 1e6, 2),
            "lines_per_s": round(sum(s.lines for s in stats.sources) / wall),
            "lines_dropped_from_queue": sum(s.dropped_lines_queue for s in stats.sources),
            "truncations": sum(s.truncations for s in stats.sources),
            "rotations_seen": sum(s.rotations for s in stats.sources)})
    return row


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the medians of ``runs`` (one phase's), number by number."""
    row = dict(runs[-1])
    for key, value in runs[0].items():
        numbers = [r[key] for r in runs if isinstance(r.get(key), int | float)]
        if isinstance(value, int | float) and len(numbers) == len(runs):
            row[key] = statistics.median(numbers)
    row["runs"] = len(runs)
    return row


def render_row(row: dict[str, Any]) -> str:
    text = (f"  {row['phase']:9} writer {row['writer_mb_per_s']:5.1f} MB/s "
            f"({row['writer_rotations']} rotations) | sampling lateness p50 "
            f"{row['lateness_p50_ms']:7.3f} ms p99 {row['lateness_p99_ms']:7.3f} ms "
            f"({row['cycles']} cycles, work p50 {row['cycle_work_p50_ms']:.1f} ms)")
    if "follower_cpu_share" in row:
        text += (f"\n            follower CPU {row['follower_cpu_share'] * 100:5.2f} % of a core"
                 f" (/proc: {(row['follower_cpu_share_proc'] or 0) * 100:5.2f} %), read "
                 f"{row['read_mb_per_s']:.2f} MB/s, dropped {row['dropped_mb_per_s']:.2f} "
                 f"MB/s, {row['lines_per_s']} lines/s recognised, {row['findings']} "
                 "findings")
    return text + f"\n            load average {row['loadavg']}"


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by = {row["phase"]: row for row in rows}
    base, default = by.get("baseline"), by.get("default")
    if base is None or default is None:
        return {}
    allowed = GOAL_LATENESS_RATIO * base["lateness_p99_ms"] + GOAL_LATENESS_SLACK_S * 1e3
    return {
        "cpu_goal_met": default["follower_cpu_share"] <= GOAL_CPU_SHARE,
        "lateness_p99_ratio": round(default["lateness_p99_ms"]
                                    / max(base["lateness_p99_ms"], 1e-3), 2),
        "lateness_p50_ratio": round(default["lateness_p50_ms"]
                                    / max(base["lateness_p50_ms"], 1e-3), 2),
        "lateness_goal_met": default["lateness_p99_ms"] <= allowed}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.joblog_bench",
                                     description=__doc__.split("\n\n")[0])
    add_output_args(parser, "a smoke run: phases of 6 s, a 0.25 s sampling cycle")
    parser.add_argument("--rate", type=float, default=RATE, help="writer bytes per second")
    parser.add_argument("--files", type=int, default=4, help="rank files written")
    parser.add_argument("--repeats", type=int, default=None,
                        help="runs of each phase (default 3; --quick 1)")
    parser.add_argument("--seconds", type=float, default=None, help="each phase's length")
    parser.add_argument("--cycle", type=float, default=None, help="the sampling period (s)")
    parser.add_argument("--phases", nargs="+", default=["baseline", "default", "unbounded"])
    parser.add_argument("--writer", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer is not None:
        print(json.dumps(write(args.writer, args.rate, args.seconds, args.files)))
        return 0
    stop_on_sigterm()
    args.seconds = args.seconds or (6.0 if args.quick else 30.0)
    args.cycle = args.cycle or (0.25 if args.quick else 1.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    out_path = results_path(args, "joblog.json")
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    print(f"job-log reading: a writer at {args.rate / 1e6:g} MB/s to {args.files} rotated "
          f"files, phases of {args.seconds:g} s, a sampling cycle of {args.cycle:g} s; load "
          f"average {loadavg_text()}", flush=True)
    runs, failures = [], []
    with tempfile.TemporaryDirectory(prefix="sn-joblog-bench-", dir=base) as folder:
        for repeat in range(args.repeats):
            for name in args.phases:
                try:
                    row = run_phase(name, args, Path(folder))
                except (OSError, ValueError, subprocess.SubprocessError) as err:
                    failures.append(f"{name} (run {repeat + 1}): {type(err).__name__}: {err}")
                    continue
                runs.append(row)
                print(f"run {repeat + 1}/{args.repeats}:\n{render_row(row)}", flush=True)
    rows = [medians([r for r in runs if r["phase"] == name]) for name in args.phases
            if any(r["phase"] == name for r in runs)]
    print(f"medians over {args.repeats} run(s) of each phase:")
    for row in rows:
        print(render_row(row))
    goal = verdict(rows)
    if goal:
        print(f"  goal: follower <= {GOAL_CPU_SHARE * 100:g} % of a core at the default bounds:"
              f" {'met' if goal['cpu_goal_met'] else 'MISSED'}; sampling lateness p99 <= "
              f"{GOAL_LATENESS_RATIO:g}x baseline + {GOAL_LATENESS_SLACK_S * 1e3:g} ms: "
              f"{'met' if goal['lateness_goal_met'] else 'MISSED'} (p99 ratio "
              f"{goal['lateness_p99_ratio']}, p50 ratio {goal['lateness_p50_ratio']})")
    results = {"meta": {"rate": args.rate, "files": args.files, "seconds": args.seconds,
                        "cycle": args.cycle, "quick": args.quick, "machine": machine(),
                        "goal_cpu_share": GOAL_CPU_SHARE},
               "phases": rows, "runs": runs, "goal": goal}
    return finish(results, out_path, failures if rows else [*failures, "no phase measured"])


if __name__ == "__main__":
    sys.exit(main())
