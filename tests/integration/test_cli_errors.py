"""First contact: what a person gets wrong on the command line ends in one clear line.

Each command runs as a real process: a bad ``--listen``, a port already taken, a
controller that is down, a misspelt key. Exit 2 (or, for the controller that is down,
a warning naming it while the agent goes on), the address or URL named, no traceback.
"""

from __future__ import annotations

import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

RULES = str(ROOT / "sn_monitor" / "rules")


def sn_monitor(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sn_monitor.cli", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("command", [["agent", "--simulate", "1"], ["controller"]])
def test_a_port_past_65535_exits_2_without_a_traceback(command: list[str],
                                                       tmp_path: Path) -> None:
    done = sn_monitor(*command, "--listen", "127.0.0.1:99999", "--state-dir", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "argument --listen: port 99999 is out of range 1-65535" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_agent_on_a_port_in_use_exits_2_naming_it(listening_port: int, tmp_path: Path) -> None:
    done = sn_monitor("agent", "--simulate", "1", "--listen", f"127.0.0.1:{listening_port}",
                      "--state-dir", str(tmp_path), "--duration", "30")
    assert done.returncode == 2, done.stderr
    assert (f"sn-monitor agent: cannot listen on 127.0.0.1:{listening_port}: address already "
            "in use") in done.stderr
    assert "Traceback" not in done.stderr


def test_a_controller_on_a_port_in_use_exits_2_before_saying_it_serves(
        listening_port: int, tmp_path: Path) -> None:
    done = sn_monitor("controller", "--listen", f"127.0.0.1:{listening_port}", "--rules", RULES,
                      "--state-dir", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert (f"sn-monitor controller: cannot listen on 127.0.0.1:{listening_port}: address "
            "already in use") in done.stderr
    assert "serving" not in done.stderr
    assert "Traceback" not in done.stderr


def test_a_fleet_view_on_a_port_in_use_exits_2_naming_it(listening_port: int,
                                                         tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"supernodes:\n- name: sn0\n  controllers: [http://127.0.0.1:{closed_port()}]\n")
    done = sn_monitor("fleet", "--config", str(fleet), "--listen", f"127.0.0.1:{listening_port}")
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{listening_port}: address already in use" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_demo_on_a_port_in_use_exits_2_naming_it(listening_port: int, tmp_path: Path) -> None:
    done = sn_monitor("demo", "--headless", "--listen", f"127.0.0.1:{listening_port}",
                      "--state-dir", str(tmp_path), timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"127.0.0.1:{listening_port} is taken" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_controller_url_without_a_scheme_exits_2_saying_what_to_write() -> None:
    done = sn_monitor("agent", "--simulate", "1", "--controller", "127.0.0.1:9848")
    assert done.returncode == 2, done.stderr
    assert "(did you mean 'http://127.0.0.1:9848'?)" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_agent_whose_controller_is_down_says_connection_refused_at_its_url(
        tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    agent = subprocess.Popen(
        [sys.executable, "-m", "sn_monitor.cli", "agent", "--simulate", "1",
         "--listen", f"127.0.0.1:{closed_port()}", "--controller", url,
         "--state-dir", str(tmp_path), "--duration", "120"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    assert agent.stderr is not None
    reader = threading.Thread(target=lambda: [lines.put(line) for line in agent.stderr],
                              daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not any("unreachable" in line for line in seen):
            remaining = deadline - time.monotonic()
            assert remaining > 0, "".join(seen)
            assert agent.poll() is None, "".join(seen)
            try:
                seen.append(lines.get(timeout=remaining))
            except queue.Empty:
                raise AssertionError("no 'unreachable' line in 60 s:\n" + "".join(seen)) from None
    finally:
        agent.kill()
        agent.wait(timeout=10)
    (line,) = [line for line in seen if "unreachable" in line]
    assert f"controller {url} unreachable: connection refused" in line
    assert "Traceback" not in "".join(seen)


def test_a_misspelt_key_gets_the_likely_one(tmp_path: Path) -> None:
    config = tmp_path / "controller.yaml"
    config.write_text(f"rules: [{RULES}]\nsweep_intervall: 10s\n")
    done = sn_monitor("controller", "--config", str(config), "--state-dir", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert (f"{config}:2: sweep_intervall: unknown key; did you mean sweep_interval?"
            in done.stderr)
    assert "Traceback" not in done.stderr
    alone = tmp_path / "alone.yaml"
    alone.write_text("sweep_intervall: 10s\n")  # only the misspelt key: still a controller's
    checked = sn_monitor("check-config", str(alone))
    assert checked.returncode == 2
    assert f"{alone}:1: sweep_intervall: unknown key; did you mean sweep_interval?" in (
        checked.stderr)
