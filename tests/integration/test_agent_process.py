"""The agent as a real process: scraped over HTTP, linted by promtool, stopped by SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import FIXTURES, assert_promtool_clean
from tests.support.ports import free_port

pytestmark = pytest.mark.integration


def wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"agent exited early with {proc.returncode}: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        try:
            if requests.get(f"{url}/healthz", timeout=5).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):
            pass  # not listening yet, or too busy starting to answer (a loaded machine)
        time.sleep(0.2)
    raise AssertionError("agent never became healthy")


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=25)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=5)
        raise AssertionError("agent ignored SIGTERM for 25 s") from None
    return proc.returncode, err


@pytest.fixture
def simulated_agent() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sn_monitor.cli", "agent", "--simulate", "8",
         "--listen", f"127.0.0.1:{port}", "--node", "sim-a", "--log-format", "json",
         "--duration", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=5)


def test_simulated_agent_serves_every_source(simulated_agent):
    url, _ = simulated_agent
    first = requests.get(f"{url}/metrics", timeout=5).text
    assert_promtool_clean(first)
    found = samples(first)
    assert len(found["sn_gpu_info"]) == 8
    assert len(found["sn_gpu_nvlink_up"]) == 8 * 18
    assert {labels["collector"]: v for labels, v in found["sn_agent_collector_success"]} == {
        "nvml": 1.0, "net": 1.0, "infiniband": 1.0, "host": 1.0, "kmsg": 1.0,
        "processes": 1.0,
    }
    assert len(found["sn_infiniband_port_state"]) == 10  # 8 rail NICs, 2 storage NICs
    assert len(found["sn_gpu_nvlink_transmitted_bytes_total"]) == 8
    assert {labels["device"] for labels, _ in found["sn_network_receive_bytes_total"]} >= {"eno1"}
    assert all(0 < v < 100 for _, v in found["sn_gpu_temperature_celsius"])
    health = requests.get(f"{url}/healthz", timeout=5).json()
    assert health["status"] == "ok"
    assert health["node"] == "sim-a"


def test_the_agent_samples_on_its_own_clock(simulated_agent):
    url, _ = simulated_agent

    def last_sample() -> tuple[float, float]:
        found = samples(requests.get(f"{url}/metrics", timeout=5).text)
        ib = sum(v for _, v in found["sn_infiniband_port_received_bytes_total"])
        return found["sn_agent_last_sample_timestamp_seconds"][0][1], ib

    t0, ib0 = last_sample()
    deadline = time.monotonic() + 10
    t1, ib1 = t0, ib0
    while t1 == t0 and time.monotonic() < deadline:
        time.sleep(0.3)
        t1, ib1 = last_sample()
    assert t1 > t0, "no new sample within 10 s at a 1 s interval"
    assert ib1 > ib0, "simulated InfiniBand counters did not advance"


def test_sigterm_stops_the_agent_cleanly_with_json_logs(simulated_agent):
    _, proc = simulated_agent
    code, err = stop(proc)
    assert code == 0
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    messages = [line["message"] for line in lines]
    assert any("received SIGTERM" in m for m in messages)
    assert messages[-1] == "agent stopped"
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)


def test_real_pynvml_without_a_gpu_keeps_host_collectors(tmp_path: Path):
    """This machine has no NVIDIA driver: the real pynvml fails, the rest still works."""
    node = FIXTURES / "h100-node"
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"node: no-gpu\npaths: {{procfs: {node / 'proc'}, sysfs: {node / 'sys'}, "
        f"kmsg: {tmp_path / 'kmsg.log'}}}\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sn_monitor.cli", "agent", "--config", str(config),
         "--listen", f"127.0.0.1:{port}", "--duration", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        found = samples(requests.get(f"{url}/metrics", timeout=5).text)
    finally:
        code, err = stop(proc) if proc.poll() is None else (proc.returncode, "")
    success = {labels["collector"]: v for labels, v in found["sn_agent_collector_success"]}
    if success["nvml"] == 1.0:
        pytest.skip("this machine has an NVIDIA driver; the no-library path is not exercised")
    assert success == {"nvml": 0.0, "net": 1.0, "infiniband": 1.0, "host": 1.0, "kmsg": 0.0,
                       "processes": 1.0}
    assert "sn_gpu_info" not in found
    assert len(found["sn_infiniband_port_state"]) == 9
    assert err.count("NVML library not found") == 1
    assert "Traceback" not in err
    assert code == 0
