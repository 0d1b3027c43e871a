"""Helpers the benchmarks share: percentiles, ports, /proc readings, formatting, results."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.support.ports import free_port as free_port  # the benchmarks import it from here


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "median": statistics.median(values) if values else math.nan,
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "max": max(values) if values else math.nan,
        "min": min(values) if values else math.nan,
    }


def proc_status_kb(pid: int, name: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process from /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def write_results(path: Path, results: Any) -> None:
    """Write a benchmark's results as JSON (the folder made if need be) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nresults: {path}")


# ---------------------------------------------------------------- where results go, failing


#: Where a full run writes its results (ignored by git): bench/results/NAME.
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def add_output_args(parser: argparse.ArgumentParser, quick_help: str) -> None:
    """``--quick`` and ``--out``, the same in every part (``python -m bench`` passes both)."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", type=Path, default=None,
                        help="the results' JSON file (default: bench/results/NAME.json; "
                             "with --quick a new temporary directory, never bench/results/)")


def results_path(args: argparse.Namespace, name: str) -> Path:
    """``--out``, else bench/results/``name`` for a full run, else a fresh temporary
    directory: a smoke run never overwrites the results of a real one."""
    if args.out is not None:
        return Path(args.out)
    if args.quick:
        return Path(tempfile.mkdtemp(prefix="sn-bench-quick-")) / name
    return RESULTS_DIR / name


def sn_monitor_command(program: str | None = None) -> list[str]:
    """How to run ``sn-monitor``: ``program`` (a command line, e.g. another checkout's
    ``/opt/old/bin/sn-monitor``), else this environment's."""
    if program:
        return shlex.split(program)
    exe = Path(sys.prefix) / "bin" / "sn-monitor"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "sn_monitor.cli"]


def loadavg_text() -> str:
    """The machine's load averages (1, 5, 15 min), as printed beside the figures."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def stop_session(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM a benchmark process still running (it stops what it started), then, after
    ``grace`` seconds, SIGKILL whatever is left in its session (started with
    ``start_new_session``: what it forked, too)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def machine() -> dict[str, Any]:
    """What the figures were measured on, and when: stored beside every result."""
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count(), "python": platform.python_version()}


def finish(results: dict[str, Any], out: Path, failures: Sequence[str],
           render: Callable[[dict[str, Any]], str] | None = None) -> int:
    """Print the figures (``render``: a part that did not print them as it went), write
    ``results`` (with ``failures``, the parts that could not measure) and return the exit
    status: 1 when anything could not be measured, else 0.

    A figure that misses its goal is a result, not a failure; a crash, an exception, a
    process that never became healthy or a measurement without samples is a failure, and
    it says so on stderr after the figures, so that a summary cannot hide it. A render
    that breaks is one more failure: the results are written all the same.
    """
    failures = list(failures)
    try:
        if render is not None:
            print(render(results))
    except Exception as err:  # noqa: BLE001 - the results are still written
        failures.append(f"render: {type(err).__name__}: {err}")
    results["failures"] = failures
    results.setdefault("meta", {})["machine_end"] = machine()
    write_results(out, results)
    if failures:
        print(f"\nFAILED: {len(failures)} measurement(s) could not be made:", file=sys.stderr)
        for failure in failures:
            print(f"  - {failure}", file=sys.stderr)
        return 1
    return 0


def stop_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt in the main thread, so that every ``finally``
    runs and the processes a benchmark started are stopped (a timeout's SIGTERM, Ctrl-C)."""
    def interrupt(signum: int, _frame: object) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a second one kills
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupt)
