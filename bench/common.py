"""Helpers the benchmarks share: percentiles, ports, /proc readings, formatting, results."""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
