"""Injecting faults into a simulated node, by name and over POST /sim/fault."""

from __future__ import annotations

import json

import pytest

from sn_monitor.sim import fake_nvml
from sn_monitor.sim.node import FaultError, SimulatedNode, fault_endpoint


@pytest.fixture
def node(tmp_path):
    sim = SimulatedNode(tmp_path, gpus=2)
    yield sim
    fake_nvml.reset()


def test_a_fault_by_name_reaches_the_gpu_and_the_kernel_log(node):
    assert node.inject("xid", 1, code=79) == "xid injected on GPU 1"
    assert "Xid (PCI:0000:2a:00): 79" in node.kmsg_path.read_text()
    node.inject("overheat", 0, factor=2.0)
    assert node.gpus[0].cooling_factor == 2.0


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "malformed JSON"),
        (b'{"gpu": 1}', 422, 'expected {"fault": NAME'),
        (b'{"fault": "melt", "gpu": 0}', 422, "unknown fault 'melt'"),
        (b'{"fault": "overheat"}', 422, "overheat needs a gpu from 0 to 1"),
        (b'{"fault": "overheat", "gpu": 7}', 422, "overheat needs a gpu from 0 to 1"),
        (b'{"fault": "overheat", "gpu": "one"}', 422, "gpu must be a whole number"),
        (b'{"fault": "xid", "gpu": 0}', 422, "xid: bad parameters"),
    ],
)
def test_bad_fault_requests_are_refused_with_a_reason(node, body, status, message):
    code, doc = fault_endpoint(node)(body)
    assert code == status
    assert message in doc["error"]


def test_a_good_request_is_applied(node):
    code, doc = fault_endpoint(node)(json.dumps({"fault": "fall-off-bus", "gpu": 1}).encode())
    assert (code, doc) == (200, {"result": "fall-off-bus injected on GPU 1"})
    assert node.gpus[1].lost


def test_unknown_faults_raise_a_fault_error(node):
    with pytest.raises(FaultError, match="unknown fault"):
        node.inject("melt", 0)


def test_nvml_hang_wedges_the_fake_driver_until_nvml_release(node):
    import threading

    fake_nvml.nvmlInit()
    assert node.inject("nvml-hang") == "nvml-hang injected"
    done = threading.Event()
    caller = threading.Thread(target=lambda: (fake_nvml.nvmlDeviceGetCount(), done.set()),
                              name="hung-caller", daemon=True)
    caller.start()
    try:
        (hang,) = fake_nvml._state.hangs
        assert hang.entered.wait(30)
        assert not done.is_set()
        node.inject("nvml-hang")  # already wedged: still the one hang
        assert fake_nvml._state.hangs == [hang]
    finally:
        code, doc = fault_endpoint(node)(b'{"fault": "nvml-release"}')
        caller.join(30)
    assert (code, doc) == (200, {"result": "nvml-release injected"})
    assert done.is_set()
    assert fake_nvml._state.hangs == []


def test_fabric_not_ready_and_back(node):
    assert node.inject("fabric-not-ready", 1) == "fabric-not-ready injected on GPU 1"
    assert (node.gpus[1].fabric_state, node.gpus[0].fabric_state) == (1, 3)
    node.inject("fabric-not-ready", 0, state=3, status=999)
    assert (node.gpus[0].fabric_state, node.gpus[0].fabric_status) == (3, 999)
    node.inject("fabric-ready", 1)
    assert node.gpus[1].fabric_state == 3
    with pytest.raises(FaultError, match="fabric state must be 1, 2 or 3"):
        node.inject("fabric-not-ready", 0, state=0)


def test_stuck_processes_appear_in_proc_and_go(node):
    node.inject("stuck-process", None, name="nfsread", count=2)
    pids = node.tree.stuck_processes
    assert len(pids) == 2
    assert (node.tree.procfs / str(pids[0]) / "stat").read_text().startswith(
        f"{pids[0]} (nfsread) D ")
    node.inject("stuck-process-gone", None)
    assert node.tree.stuck_processes == ()
    assert not (node.tree.procfs / str(pids[0])).exists()
    with pytest.raises(FaultError, match="not a process name"):
        node.inject("stuck-process", None, name="a/b")
