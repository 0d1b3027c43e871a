"""The unit files pass systemd-analyze; the daemons speak the notify protocol."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.ports import free_port

pytestmark = pytest.mark.integration
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_files_verify(unit: Path, tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is not installed: run .ci/run (apt-get install systemd)")
    # verify checks that ExecStart exists: point it at this checkout's sn-monitor
    binary = Path(sys.executable).parent / "sn-monitor"
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace("/opt/sn-monitor/bin/sn-monitor", str(binary)))
    result = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ""


def _messages(sock: socket.socket, until: float) -> list[str]:
    got = []
    while time.monotonic() < until:
        try:
            got.append(sock.recv(512).decode())
        except TimeoutError:
            continue
        if got.count("WATCHDOG=1") >= 2:
            break
    return got


@pytest.mark.parametrize("daemon", ["agent", "controller"])
def test_daemon_sends_ready_watchdog_and_stopping(daemon: str, tmp_path: Path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.5)
    port = free_port()
    args = (["agent", "--simulate", "2", "--duration", "60"] if daemon == "agent" else
            ["controller", "--state-dir", str(tmp_path / "state"), "--rules",
             str(ROOT / "sn_monitor" / "rules")])
    env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "2000000", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sn_monitor.cli", *args, "--listen", f"127.0.0.1:{port}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        got = _messages(sock, time.monotonic() + 30)
        assert any(m.startswith("READY=1") for m in got), got
        assert got.count("WATCHDOG=1") >= 2, got
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=25) == 0
        rest = _messages(sock, time.monotonic() + 2)
        assert "STOPPING=1" in got + rest
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=5)
        sock.close()
