"""Every benchmark part, one after the other: ``python -m bench`` (what ``make bench`` runs).

Each part runs as its own process (``python -m bench.PART --out DIR/NAME.json``), to
its end even when an earlier one failed, its output streaming through as it comes. Then a
summary: one line per part (ok, or FAILED with its exit status; its wall time; the load
average before and after it; its results file), the date and the machine's load
average; also written to ``DIR/summary.json``. The exit status is 1 when any part failed:
it exited non-zero (it could not measure something, and said what on stderr after its
figures), or it wrote no results. A figure that misses its goal fails nothing.

    python -m bench [--quick] [--out-dir DIR] [--only PART ...] [--timeout S]

``DIR`` is ``bench/results/`` (ignored by git); with ``--quick`` (every part's smoke run)
a new temporary directory, so that a smoke run never replaces the figures of a real one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, loadavg_text, stop_on_sigterm, stop_session

ROOT = Path(__file__).resolve().parents[1]
#: The parts, in the order they run, and the file each writes its results to.
PARTS: dict[str, str] = {
    "agent_bench": "agent.json",
    "controller_bench": "controller.json",
    "recovery_bench": "recovery.json",
    "simulate_bench": "simulate.json",
    "event_bench": "events.json",
    "ha_bench": "ha.json",
    "ingest_bench": "ingest.json",
    "failslow_bench": "failslow.json",
    "topology_bench": "topology.json",
    "topology_poll_bench": "topology_poll.json",
    "topology_page_bench": "topology_page.json",
    "body_shape_bench": "body_shape.json",
    "joblog_bench": "joblog.json",
    "torch_recovery_bench": "torch_recovery.json",
}
#: After a part's timeout: SIGTERM (it stops what it started), then this long, then SIGKILL.
GRACE_S = 30.0


def run_part(name: str, out: Path, quick: bool, timeout: float | None) -> dict[str, Any]:
    """Run ``python -m bench.NAME``; what the summary says of it."""
    command = [sys.executable, "-m", f"bench.{name}", *(["--quick"] if quick else []),
               "--out", str(out)]
    print(f"\n==== bench.{name} ({time.strftime('%Y-%m-%d %H:%M:%S')}, load average "
          f"{loadavg_text()}): {' '.join(command[1:])}", flush=True)
    if out.exists():
        out.unlink()  # a file left from before must not pass for this run's
    before, started = loadavg_text(), time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    status = None
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        status = f"FAILED (no end within {timeout:g} s: stopped)"
        stop_session(proc, GRACE_S)
    except BaseException:  # Ctrl-C, SIGTERM: the part stops what it started
        stop_session(proc, GRACE_S)
        raise
    seconds = time.monotonic() - started
    code = proc.returncode
    if status is None:
        if code != 0:
            status = f"FAILED (exit {code})"
        elif not out.exists():
            status = "FAILED (exit 0, but no results written)"
        else:
            status = "ok"
    return {"part": name, "status": status, "ok": status == "ok", "exit": code,
            "seconds": round(seconds, 1), "loadavg_before": before, "loadavg_after": loadavg_text(),
            "results": str(out) if out.exists() else None}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="every part's smoke run (results in a temporary directory)")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help="where the results go (default bench/results/; with --quick "
                             "a new temporary directory)")
    parser.add_argument("--only", nargs="+", metavar="PART",
                        help=f"these parts only ({', '.join(PARTS)})")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a part may run before it is stopped and failed "
                             "(default: none; 600 with --quick)")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    out_dir = args.out_dir or (Path(tempfile.mkdtemp(prefix="sn-bench-quick-")) if args.quick
                               else RESULTS_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    timeout = args.timeout or (600.0 if args.quick else None)
    names = [n.removeprefix("bench.") for n in args.only] if args.only else list(PARTS)
    started, load_start = time.strftime("%Y-%m-%dT%H:%M:%S%z"), loadavg_text()
    rows = [run_part(name, out_dir / PARTS.get(name, f"{name}.json"), args.quick, timeout)
            for name in names]
    failed = [r["part"] for r in rows if not r["ok"]]
    summary = {"started": started, "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "cpus": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": loadavg_text(),
               "quick": args.quick, "parts": rows, "failed": failed}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n==== summary ({'quick' if args.quick else 'full'} run): {summary['ended']}, "
          f"{summary['cpus']} CPUs, load average {summary['loadavg_end']} "
          f"(at the start {load_start})")
    width = max(len(r["part"]) for r in rows)
    for r in rows:
        print(f"  {r['part']:<{width}}  {r['status']:<22} {r['seconds']:>7.1f} s  "
              f"load {r['loadavg_before'].split()[0]} -> {r['loadavg_after'].split()[0]}  "
              f"{r['results'] or '(no results)'}")
    if failed:
        print(f"{len(rows) - len(failed)} of {len(rows)} parts measured; FAILED: "
              f"{', '.join(failed)} (each says why on stderr, after its figures)")
        return 1
    print(f"all {len(rows)} parts measured; results and summary.json in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
