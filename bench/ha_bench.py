"""Controller take-over time: two controllers on a real PostgreSQL, the active stopped.

For each way of losing the active (SIGTERM: an orderly stop that releases the lease;
SIGKILL: a crash, the lease runs out), ``--rounds`` times: start two controllers, wait
until one is active, stop it, and time until the other answers ``/readyz`` 200 (polled
every 50 ms). Medians, with the lease settings printed: the expected take-over after a
kill is the lease's remaining time (up to ``lease_duration``) plus up to one
``retry_period``.

    python -m bench.ha_bench [--rounds 3] [--lease 4s] [--retry 0.5s] [--quick]

``--quick`` is one round of each. Nothing fails on a figure; the exit status is 1 when
something could not be measured: PostgreSQL is not installed, a round raised (no
controller became active, the standby never took over; listed on stderr at the end).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import requests
import yaml

from bench.common import (
    add_output_args,
    finish,
    fmt,
    free_port,
    machine,
    results_path,
    stop_on_sigterm,
    summary,
)
from tests.postgres import PostgresServer, find_bindir

ROOT = Path(__file__).resolve().parents[1]
POLL_SECONDS = 0.05


def _ready(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _wait(predicate: Callable[[], bool], timeout: float,
          procs: Sequence[subprocess.Popen[bytes]] = ()) -> float:
    """Seconds until ``predicate()`` is true; raises after ``timeout``, or at once when
    every one of ``procs`` has exited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        if procs and all(p.poll() is not None for p in procs):
            raise RuntimeError("every controller exited: "
                               + ", ".join(str(p.returncode) for p in procs))
        time.sleep(POLL_SECONDS)
    raise TimeoutError(f"not within {timeout:g}s")


def one_round(pg: PostgresServer, workdir: Path, round_no: int, sig: signal.Signals,
              lease: str, retry: str) -> float:
    name = f"ha_{sig.name.lower()}_{round_no}"
    dsn_file = workdir / f"{name}.dsn"
    dsn_file.write_text(pg.create_database(name))
    config = workdir / f"{name}.yaml"
    renew = f"{float(lease.rstrip('s')) * 0.75:g}s"
    config.write_text(yaml.safe_dump({
        "store": {"backend": "postgresql", "dsn_file": str(dsn_file)},
        "ha": {"lease": "postgresql", "lease_duration": lease, "renew_deadline": renew,
               "retry_period": retry}}))
    ports = [free_port(), free_port()]
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for port in ports:
            logs.append(workdir / f"{name}-{port}.log")
            with logs[-1].open("wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "sn_monitor.cli", "controller", "--config",
                     str(config), "--listen", f"127.0.0.1:{port}", "--rules",
                     str(ROOT / "sn_monitor" / "rules"), "--state-dir", str(workdir)],
                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
                    stdin=subprocess.DEVNULL))
        try:
            _wait(lambda: any(_ready(p) for p in ports), 60, procs)
            active = 0 if _ready(ports[0]) else 1
            time.sleep(1.0)  # a few renewals: a kill lands somewhere in a renewal period
            procs[active].send_signal(sig)
            started = time.monotonic()
            other = ports[1 - active]
            _wait(lambda: _ready(other), 60, [procs[1 - active]])
        except (RuntimeError, TimeoutError) as err:
            tails = "; ".join(f"{path.name}: "
                              + " | ".join(path.read_text(errors="replace").splitlines()[-3:])
                              for path in logs)
            raise RuntimeError(f"{err} ({tails})") from err
        return time.monotonic() - started
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
        pg.drop_database(name)


def take_overs(pg: PostgresServer, tmp: Path, sig: signal.Signals, rounds: int,
               args: argparse.Namespace, failures: list[str]) -> dict[str, Any]:
    """``rounds`` take-overs after ``sig``: their summary (a failed round in ``errors``
    and in ``failures``)."""
    times: list[float] = []
    errors: list[str] = []
    for n in range(rounds):
        try:
            times.append(one_round(pg, tmp, n, sig, args.lease, args.retry))
        except Exception as err:  # noqa: BLE001 - the other rounds still run
            errors.append(f"round {n + 1}: {type(err).__name__}: {err}")
    stats: dict[str, Any] = dict(summary(times))
    if errors:
        stats["errors"] = errors
        failures += [f"{sig.name}: {e}" for e in errors]
    print(f"take-over after {sig.name}: median {fmt(stats['median'])} s, "
          f"max {fmt(stats['max'])} s over {len(times)} of {rounds} rounds "
          f"(lease {args.lease}, retry {args.retry})"
          + (f"; {len(errors)} round(s) FAILED" if errors else ""), flush=True)
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ha_bench",
                                     description=__doc__.splitlines()[0])
    add_output_args(parser, "a smoke run: one round of each")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (quick 1)")
    parser.add_argument("--lease", default="4s", help="lease_duration (default 4s)")
    parser.add_argument("--retry", default="0.5s", help="retry_period (default 0.5s)")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    out_path = results_path(args, "ha.json")
    rounds = args.rounds or (1 if args.quick else 3)
    results: dict[str, Any] = {
        "meta": {"mode": "quick" if args.quick else "full", "rounds": rounds,
                 "machine": machine()},
        "lease_duration": args.lease, "retry_period": args.retry}
    failures: list[str] = []
    if find_bindir() is None:
        failures.append("PostgreSQL is not installed (apt-get install postgresql): "
                        "nothing measured")
        print(failures[0])
        return finish(results, out_path, failures)
    try:
        with (tempfile.TemporaryDirectory(prefix="sn-ha-bench-") as tmp,
              PostgresServer() as pg):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                results[sig.name] = take_overs(pg, Path(tmp), sig, rounds, args, failures)
    except Exception as err:  # noqa: BLE001 - the server itself: said, and exit 1
        failures.append(f"PostgreSQL server: {type(err).__name__}: {err}")
    return finish(results, out_path, failures)


if __name__ == "__main__":
    raise SystemExit(main())
