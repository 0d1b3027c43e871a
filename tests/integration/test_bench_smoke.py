"""The benchmarks still run: every part of ``make bench`` with ``--quick``, and a part that
cannot measure exits non-zero.

Each part runs as ``make bench`` runs it (``python -m bench.PART``, from the repository
root), with ``--out`` in the test's temporary directory, never bench/results/. Only that
it ran to the end is checked (exit 0, the results file with its top-level keys, no
failure recorded): never a figure, which on a shared machine says nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bench.common import stop_session
from bench.controller_bench import LoadSpec, Templates, _sender
from tests.postgres import find_bindir
from tests.support.browser import chromium

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: One quick run, on a loaded 2-core machine (most take 2 to 30 s on an idle one).
RUN_TIMEOUT_S = 240
#: What a part gets after SIGTERM to stop the processes it started, before SIGKILL.
STOP_GRACE_S = 30

#: Part -> the top-level keys its results file has after a quick run.
PARTS: dict[str, set[str]] = {
    "agent_bench": {"meta", "sample", "profile", "scrape", "rss", "side_by_side", "failures"},
    "controller_bench": {"meta", "throughput", "rate_small", "rate_large", "rss", "memory",
                         "profile", "failures"},
    "recovery_bench": {"meta", "latency", "mttr", "failures"},
    "simulate_bench": {"meta", "levels", "failures"},
    "event_bench": {"meta", "idle_cost", "runs", "idle", "loaded", "burst", "held",
                    "failures"},
    "ha_bench": {"meta", "lease_duration", "retry_period", "SIGTERM", "SIGKILL", "failures"},
    "ingest_bench": {"meta", "runs", "median_us", "failures"},
    "failslow_bench": {"meta", "summary", "per_kind", "faults", "false_positives", "failures"},
    "topology_bench": {"meta", "document", "answers", "reports", "failures"},
    "topology_poll_bench": {"meta", "levels", "failures"},
    "topology_page_bench": {"meta", "levels", "failures"},
    "body_shape_bench": {"meta", "shapes", "failures"},
    "joblog_bench": {"meta", "phases", "runs", "goal", "failures"},
}


def run(module: str, *args: str, log: Path) -> tuple[int, str]:
    """``python -m module args`` from the repository root: (exit status, its output)."""
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT,
                                stdin=subprocess.DEVNULL, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_session(proc, STOP_GRACE_S)
    output = log.read_text(errors="replace")
    if code is None:
        pytest.fail(f"{module} {' '.join(args)}: no end within {RUN_TIMEOUT_S} s\n"
                    f"{output[-4000:]}")
    return code, output


@pytest.mark.timeout(300)
@pytest.mark.parametrize("part", list(PARTS))
def test_quick_run_measures(part: str, tmp_path: Path) -> None:
    if part == "ha_bench" and find_bindir() is None:
        if os.environ.get("REQUIRE_POSTGRES") == "1":
            pytest.fail("PostgreSQL is not installed (REQUIRE_POSTGRES=1)")
        pytest.skip("PostgreSQL is not installed")
    if part == "topology_page_bench":
        chromium()  # skipped without it, failed with REQUIRE_CHROMIUM
    out = tmp_path / f"{part}.json"
    code, output = run(f"bench.{part}", "--quick", "--out", str(out),
                       log=tmp_path / f"{part}.log")
    assert code == 0, f"bench.{part} --quick exited {code}:\n{output[-6000:]}"
    assert out.is_file(), f"no results written:\n{output[-3000:]}"
    results: dict[str, Any] = json.loads(out.read_text())
    assert PARTS[part] <= set(results), f"missing: {sorted(PARTS[part] - set(results))}"
    assert results["failures"] == []


@pytest.mark.timeout(300)
def test_a_part_that_cannot_measure_exits_non_zero(tmp_path: Path) -> None:
    """A controller that exits at once (the sn-monitor command is a program that exits 3):
    the level fails, the bench says why, writes what it has, and exits 1."""
    out = tmp_path / "simulate.json"
    exits = shlex.join([sys.executable, "-c", "raise SystemExit(3)"])
    code, output = run("bench.simulate_bench", "--quick", "--sn-monitor", exits,
                       "--out", str(out), log=tmp_path / "simulate.log")
    assert code == 1, output[-3000:]
    assert "FAILED" in output
    results = json.loads(out.read_text())
    assert len(results["failures"]) == 1
    assert "controller exited 3" in results["failures"][0]
    assert "error" in results["levels"][0]


@pytest.mark.timeout(300)
def test_the_runner_runs_every_part_and_fails_if_one_did(tmp_path: Path) -> None:
    """``python -m bench`` (make bench): a part that fails (here, one that does not exist)
    does not stop the next; the summary says which failed, and the exit status is 1."""
    code, output = run("bench", "--quick", "--out-dir", str(tmp_path / "results"),
                       "--only", "no_such_bench", "ingest_bench", log=tmp_path / "bench.log")
    assert code == 1, output[-3000:]
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert summary["failed"] == ["no_such_bench"]
    assert [(p["part"], p["ok"]) for p in summary["parts"]] == [
        ("no_such_bench", False), ("ingest_bench", True)]
    assert (tmp_path / "results" / "ingest.json").is_file()
    assert "FAILED: no_such_bench" in output


# ---------------------------------------------------------------- the load sender


class _CloseAfterEachAnswer(socketserver.StreamRequestHandler):
    """Answers one request per connection, then closes it without saying so first (no
    ``connection: close``): a keep-alive connection the server ends while it is idle."""

    timeout = 30

    def handle(self) -> None:
        length = 0
        while (line := self.rfile.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if not line:
            return  # the client closed it unused
        self.rfile.read(length)
        self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n"
                         b"content-type: application/json\r\n\r\n{}")


class _Results:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def put(self, item: dict[str, Any]) -> None:
        self.items.append(item)


def test_the_load_sender_replaces_connections_the_server_closed() -> None:
    """The controller bench's sender on a server that closes every connection after one
    answer: it drops each closed connection, opens another, sends again a request that
    met a closed one, and every request is answered (it used to die with EBADF)."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _CloseAfterEachAnswer)
    server.daemon_threads = False  # server_close() joins every handler
    serving = threading.Thread(target=server.serve_forever, name="bench-smoke-server")
    serving.start()
    try:
        templates = Templates(reports=[], heads=[b'{"node":"n","sequence":'], labels=[b"{}"],
                              mid=b',"labels":', tails=[b"}"], names=["n"])
        spec = LoadSpec(port=server.server_address[1], nodes=[0], connections=2,
                        start_at=time.monotonic(), duration=120.0, rounds=20)
        out = _Results()
        _sender(spec, templates, out)
    finally:
        server.shutdown()
        serving.join(timeout=10)
        server.server_close()
    [result] = out.items
    assert "error" not in result
    assert result["sent"] == 20
    assert result["statuses"] == {200: 20}
    assert result["errors"] == 0
    assert result["reconnects"] >= 18  # two connections to start with, one per answer
