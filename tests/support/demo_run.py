"""Running ``sn-monitor demo --headless`` from a test, and reading its JSON summary."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.ports import free_port


def demo(*args: str, timeout: float = 110) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sn_monitor.cli", "demo", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def kill_left_over(state: Path) -> None:
    """Kill what a demo stopped midway (a test timeout) left running under ``state``.

    The demo starts its controller, agents and ranks in sessions of their own, and stops
    them itself; killed before it could, it leaves them running for good.
    """
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(str(state).encode() in arg for arg in argv):
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)


def faults(summary: dict[str, Any], fault: str) -> list[dict[str, Any]]:
    found = [f for f in summary["faults"] if f["fault"] == fault]
    assert found, f"no {fault} in {[f['fault'] for f in summary['faults']]}"
    return found


def headless_on_eight_nodes(tmp_path: Path, scenario: str, timeout: float) -> Any:
    """``demo --headless`` of a packaged scenario on 8 nodes at x10: its JSON summary,
    after checking the run exited 0 and judged itself ok."""
    state = tmp_path / "demo"
    try:
        done = demo("--headless", "--nodes", "8", "--scenario", scenario, "--speed",
                     "10", "--listen", f"127.0.0.1:{free_port()}", "--state-dir", str(state),
                     timeout=timeout)
    finally:
        kill_left_over(state)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["ok"], doc
    return doc
