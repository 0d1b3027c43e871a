"""Whose job is on each GPU, from a running agent: the kubelet source wired by agent.yaml.

``sn-monitor agent --simulate 2`` with ``attribution.kubelet`` enabled on the socket of a
throwaway kubelet (tests/support/kubelet.py: the real pod-resources v1 proto) in this
process. The kubelet gives GPU 0 to a pod: the agent's /metrics shows the pod, its
namespace and container on that GPU's ``sn_gpu_workload_info``, and the source up; the
kubelet stops: the source is down and the rest of the sample goes on.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from tests.support.kubelet import FakeKubelet, pod
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

WAIT_SECONDS = 60.0
POLL_SECONDS = 0.2


def metrics(url: str) -> str:
    try:
        return requests.get(url, timeout=5).text
    except requests.RequestException:
        return ""


def wait_for(probe: Callable[[], str | None], what: str) -> str:
    """The first truthy answer of ``probe`` within :data:`WAIT_SECONDS`."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"no {what} within {WAIT_SECONDS:g} s")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[str, FakeKubelet]]:
    socket = tmp_path / "kubelet.sock"
    kubelet = FakeKubelet(socket).start()
    config = tmp_path / "agent.yaml"
    config.write_text(f"attribution:\n  kubelet:\n    enabled: true\n    socket: {socket}\n"
                      "    refresh: 1s\n")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sn_monitor.cli", "agent", "--simulate", "2",
         "--config", str(config), "--listen", f"127.0.0.1:{port}", "--node", "attr-node",
         "--state-dir", str(tmp_path / "state"), "--duration", "300"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "agent.log").open("wb"))
    try:
        yield f"http://127.0.0.1:{port}/metrics", kubelet
    finally:
        kubelet.stop()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_the_kubelet_s_pod_shows_on_its_gpu_and_a_stopped_kubelet_drops_only_itself(
        agent: tuple[str, FakeKubelet]) -> None:
    url, kubelet = agent
    uuid = wait_for(lambda: (m := re.search(r'sn_gpu_info\{[^}]*gpu="0"[^}]*uuid="([^"]+)"',
                                            metrics(url))) and m.group(1), "GPU 0's uuid")
    kubelet.pods = [pod("trainer-0", "ml", {"pytorch": {"nvidia.com/gpu": [uuid]}})]
    line = wait_for(lambda: next((x for x in metrics(url).splitlines()
                                  if x.startswith("sn_gpu_workload_info{")
                                  and 'pod="trainer-0"' in x), None),
                    "the pod on sn_gpu_workload_info")
    assert 'namespace="ml"' in line
    assert 'container="pytorch"' in line
    assert f'uuid="{uuid}"' in line
    assert 'sn_agent_source_up{source="kubelet"} 1' in metrics(url)

    kubelet.stop()
    wait_for(lambda: 'sn_agent_source_up{source="kubelet"} 0' in metrics(url) or None,
             "the kubelet source down")
    text = metrics(url)
    assert 'sn_gpu_info{' in text  # the sample goes on without the source
    assert 'pod="trainer-0"' not in text
