"""Controller take-over time: two controllers on a real PostgreSQL, the active stopped.

For each way of losing the active (SIGTERM: an orderly stop that releases the lease;
SIGKILL: a crash, the lease runs out), ``--rounds`` times: start two controllers, wait
until one is active, stop it, and time until the other answers ``/readyz`` 200 (polled
every 50 ms). Medians, with the lease settings printed: the expected take-over after a
kill is the lease's remaining time (up to ``lease_duration``) plus up to one
``retry_period``.

    python -m bench.ha_bench [--rounds 3] [--lease 4s] [--retry 0.5s]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

from bench.common import fmt, free_port, summary, write_results
from tests.postgres import PostgresServer, find_bindir

ROOT = Path(__file__).resolve().parents[1]
POLL_SECONDS = 0.05


def _ready(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _wait(predicate: object, timeout: float) -> float:
    """Seconds until ``predicate()`` is true; raises after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - started
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
    procs = []
    try:
        for port in ports:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "sn_monitor.cli", "controller", "--config", str(config),
                 "--listen", f"127.0.0.1:{port}", "--rules", str(ROOT / "sn_monitor" / "rules"),
                 "--state-dir", str(workdir)], cwd=ROOT, stdout=subprocess.DEVNULL,
                stderr=(workdir / f"{name}-{port}.log").open("wb")))
        _wait(lambda: any(_ready(p) for p in ports), 60)
        active = 0 if _ready(ports[0]) else 1
        time.sleep(1.0)  # a few renewals: a kill lands somewhere in a renewal period
        procs[active].send_signal(sig)
        started = time.monotonic()
        other = ports[1 - active]
        _wait(lambda: _ready(other), 60)
        return time.monotonic() - started
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
        pg.drop_database(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lease", default="4s", help="lease_duration (default 4s)")
    parser.add_argument("--retry", default="0.5s", help="retry_period (default 0.5s)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ha.json")
    args = parser.parse_args()
    if find_bindir() is None:
        print("PostgreSQL is not installed (apt-get install postgresql): skipped")
        return 0
    results: dict[str, object] = {"lease_duration": args.lease, "retry_period": args.retry}
    with tempfile.TemporaryDirectory(prefix="sn-ha-bench-") as tmp, PostgresServer() as pg:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            times = [one_round(pg, Path(tmp), n, sig, args.lease, args.retry)
                     for n in range(args.rounds)]
            stats = summary(times)
            results[sig.name] = stats
            print(f"take-over after {sig.name}: median {fmt(stats['median'])} s, "
                  f"max {fmt(stats['max'])} s over {args.rounds} rounds "
                  f"(lease {args.lease}, retry {args.retry})")
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
