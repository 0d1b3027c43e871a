"""A real ``prometheus`` process on loopback and its HTTP API, for integration tests.

Waits poll for the state a test expects, each with a deadline (never a bare sleep).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.conftest import require_tool
from tests.support.ports import free_port

T = TypeVar("T")


class Prometheus:
    """A ``prometheus`` process on loopback and its HTTP API."""

    def __init__(self, config: Path, tsdb: Path) -> None:
        port = free_port()
        self.api = f"http://127.0.0.1:{port}/api/v1"
        self.log = tsdb.parent / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [require_tool("prometheus"), f"--config.file={config}",
                 f"--storage.tsdb.path={tsdb}", f"--web.listen-address=127.0.0.1:{port}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def get(self, path: str, **params: str | list[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.api}/{path}?{query}", timeout=5) as reply:
            return json.load(reply)["data"]

    def query(self, expr: str) -> dict[str, float]:
        """Each series' value, keyed by its labels as ``k=v,...``."""
        return {",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())): float(r["value"][1])
                for r in self.get("query", query=expr)["result"]}

    def value(self, expr: str) -> float | None:
        """The value of an expression that gives one series (None: none)."""
        found = list(self.query(expr).values())
        assert len(found) <= 1, f"{expr}: {found}"
        return found[0] if found else None

    def wait(self, probe: Callable[[], T], what: str, timeout: float = 60.0) -> T:
        """``probe()`` until it is truthy, at most ``timeout`` seconds; the last answer in
        the failure."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                last = probe()
            except OSError as err:  # not listening yet
                last = err
            else:
                if last:
                    return last
            if time.monotonic() > deadline:
                raise AssertionError(f"waited {timeout:g} s for {what}; last: {last!r}")
            time.sleep(0.25)

    def wait_value(self, expr: str, accept: Callable[[float], bool], what: str,
                   timeout: float = 60.0) -> float:
        """Wait until ``expr`` gives one series whose value ``accept`` takes; return it."""
        seen: list[float | None] = [None]

        def probe() -> bool:
            seen.append(self.value(expr))
            return seen[-1] is not None and accept(seen[-1])
        try:
            self.wait(probe, what, timeout)
        except AssertionError as err:
            raise AssertionError(f"{err} ({expr} = {seen[-1]})") from None
        value = seen[-1]
        assert value is not None
        return value

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
