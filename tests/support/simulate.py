"""A real controller process started on a free port for the ``simulate`` and fleet
commands' integration tests, with the process reaped when the test ends."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Controller:
    url: str
    admin: str
    agent_token_file: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, **params: Any) -> Any:
        reply = requests.get(f"{self.url}{path}", params=params or None, timeout=10,
                             headers={"Authorization": f"Bearer {self.admin}"})
        reply.raise_for_status()
        return reply.json()


@contextlib.contextmanager
def running(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process with its output in ``log``, stopped (SIGTERM, then SIGKILL) at the end."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextlib.contextmanager
def running_controller(root: Path) -> Iterator[Controller]:
    """A controller with the default rules, agent tokens for sim-*, actions not rate-limited."""
    root.mkdir(parents=True, exist_ok=True)
    agent, admin = secrets.token_hex(16), secrets.token_hex(16)
    (root / "agent.token").write_text(agent + "\n")
    (root / "admin.token").write_text(admin + "\n")
    (root / "tokens.yaml").write_text(yaml.safe_dump([
        {"name": "fleet", "role": "agent", "token_file": str(root / "agent.token"),
         "nodes": ["sim-*"]},
        {"name": "tests", "role": "admin", "token_file": str(root / "admin.token")},
    ]))
    (root / "controller.yaml").write_text(yaml.safe_dump({
        "sweep_interval": "0.5s", "log_level": "warning",
        "policy": {"rate_limit": {"actions": 10000, "window": "1m"}}}))
    port = free_port()
    log = root / "controller.log"
    with running([sys.executable, "-m", "sn_monitor.cli", "controller",
                  "--config", str(root / "controller.yaml"), "--listen", f"127.0.0.1:{port}",
                  "--state-dir", str(root / "state"),
                  "--rules", str(ROOT / "sn_monitor" / "rules"),
                  "--token-file", str(root / "tokens.yaml")], log) as proc:
        ctl = Controller(f"http://127.0.0.1:{port}", admin, root / "agent.token", proc, log)
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if requests.get(f"{ctl.url}/healthz", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, f"controller never healthy\n{log.read_text()}"
            time.sleep(0.1)
        yield ctl
