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
    assert (code, doc["result"]) == (200, "fall-off-bus injected on GPU 1")
    assert isinstance(doc["injected_at"], float)
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
    assert (code, doc["result"]) == (200, "nvml-release injected")
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


# ----------------------------------------------------------------- fail-slow faults


def _port_delta(node, device, counter, seconds=10.0):
    before = node.tree.ib_counter(device, counter)
    node.step(seconds)
    return node.tree.ib_counter(device, counter) - before


def _rate_file(node, device):
    return (node.tree.sysfs / "class" / "infiniband" / device / "ports" / "1"
            / "rate").read_text()


def test_a_congested_link_waits_many_times_longer_and_moves_less_until_cleared(node):
    node.gpus[0].set_load(1.0)
    node.gpus[1].set_load(1.0)
    node.step(1.0)
    assert node.inject("congested-link", device="mlx5_3", factor=30) == "congested-link injected"
    node.step(10.0)
    waits = {d: _port_delta(node, d, "port_xmit_wait") for d in ("mlx5_0", "mlx5_3")}
    assert waits["mlx5_3"] > 15 * waits["mlx5_0"]
    before = {d: node.tree.ib_counter(d, "port_xmit_data") for d in ("mlx5_0", "mlx5_3")}
    node.step(10.0)
    moved = {d: node.tree.ib_counter(d, "port_xmit_data") - before[d] for d in before}
    assert moved["mlx5_3"] < 0.95 * moved["mlx5_0"]
    node.inject("congested-link-cleared", device="mlx5_3")
    waits = {d: _port_delta(node, d, "port_xmit_wait") for d in ("mlx5_0", "mlx5_3")}
    assert waits["mlx5_3"] < 2 * waits["mlx5_0"]


def test_a_congested_roce_port_marks_ecn_and_sends_cnps(tmp_path):
    from sn_monitor.sim.node_tree import SimulatedNodeTree

    tree = SimulatedNodeTree(tmp_path, ib_devices=["mlx5_bond_0", "mlx5_bond_1"], seed=1)
    tree.congest_ib_port("mlx5_bond_1", 20.0)
    before = {d: tree.ib_counter(d, "np_ecn_marked_roce_packets") for d in tree.ib_devices}
    tree.advance(10.0, 1.0)
    marked = {d: tree.ib_counter(d, "np_ecn_marked_roce_packets") - before[d]
              for d in tree.ib_devices}
    assert marked["mlx5_bond_1"] > 50 * marked["mlx5_bond_0"] > 0
    assert tree.ib_counter("mlx5_bond_1", "np_cnp_sent") > tree.ib_counter(
        "mlx5_bond_0", "np_cnp_sent")


def test_a_degraded_nic_says_its_lower_rate_and_moves_at_most_that(node):
    from sn_monitor.agent.collectors.infiniband import parse_rate

    node.gpus[0].set_load(1.0)
    node.gpus[1].set_load(1.0)
    assert _rate_file(node, "mlx5_2") == "400 Gb/sec (4X NDR)\n"
    node.inject("nic-degraded", device="mlx5_2", rate_gbps=200)
    assert parse_rate(_rate_file(node, "mlx5_2")) == 25e9
    before = {d: node.tree.ib_counter(d, "port_xmit_data") for d in ("mlx5_0", "mlx5_2")}
    node.step(10.0)
    moved = {d: 4 * (node.tree.ib_counter(d, "port_xmit_data") - before[d]) for d in before}
    assert moved["mlx5_2"] <= 25e9 * 10.0 < moved["mlx5_0"]
    node.inject("nic-degraded-cleared", device="mlx5_2")
    assert parse_rate(_rate_file(node, "mlx5_2")) == 50e9


def test_nvlink_slow_makes_errors_climb_and_links_drop_until_cleared(node):
    fake_nvml.nvmlInit()
    node.inject("nvlink-slow", 1, links_down=2, errors_per_second=50)
    gpu = node.gpus[1]
    assert sum(not link.up for link in gpu.nvlinks) == 2
    assert gpu.fail_slow.nvlink_bandwidth_ratio == 0.6
    seen = []
    for _ in range(3):
        node.step(5.0)
        seen.append(sum(link.replay_errors for link in gpu.nvlinks))
    assert seen[0] > 0
    assert seen[0] < seen[1] < seen[2]
    assert sum(link.crc_flit_errors for link in gpu.nvlinks) >= 3 * seen[2]
    assert sum(link.replay_errors for link in node.gpus[0].nvlinks) == 0
    node.inject("nvlink-slow-cleared", 1)
    node.step(5.0)
    assert all(link.up for link in gpu.nvlinks)
    assert sum(link.replay_errors for link in gpu.nvlinks) == seen[2]


def test_a_throttled_gpu_reports_low_clocks_and_its_reasons_through_nvml(node):
    fake_nvml.nvmlInit()
    node.gpus[0].set_load(1.0)
    node.gpus[1].set_load(1.0)
    node.inject("gpu-throttled", 1, reason="hw_slowdown,hw_power_brake_slowdown", ratio=0.6)
    node.step(2.0)
    handles = [fake_nvml.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    clocks = [fake_nvml.nvmlDeviceGetClockInfo(h, fake_nvml.NVML_CLOCK_SM) for h in handles]
    assert clocks[1] <= 0.61 * clocks[0]
    reasons = fake_nvml.nvmlDeviceGetCurrentClocksEventReasons(handles[1])
    assert reasons & fake_nvml.nvmlClocksEventReasonHwSlowdown
    assert reasons & fake_nvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    assert not fake_nvml.nvmlDeviceGetCurrentClocksEventReasons(handles[0]) & (
        fake_nvml.nvmlClocksEventReasonHwSlowdown)
    node.inject("gpu-throttled-cleared", 1)
    node.step(2.0)
    assert fake_nvml.nvmlDeviceGetClockInfo(handles[1], fake_nvml.NVML_CLOCK_SM) == clocks[0]


def test_a_noisy_neighbour_is_one_more_compute_process_until_it_goes(node):
    fake_nvml.nvmlInit()
    node.gpus[0].set_processes([(4242, 10**9)])
    node.inject("noisy-neighbour", 0, share=0.4)
    handle = fake_nvml.nvmlDeviceGetHandleByIndex(0)
    pids = [p.pid for p in fake_nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    assert len(pids) == 2
    assert 4242 in pids
    node.inject("noisy-neighbour-cleared", 0)
    assert [p.pid for p in fake_nvml.nvmlDeviceGetComputeRunningProcesses(handle)] == [4242]


def test_fail_slow_clear_undoes_every_fail_slow_fault_on_the_node(node):
    node.inject("congested-link", device="mlx5_0")
    node.inject("nic-degraded", device="mlx5_1", rate_gbps=100)
    node.inject("nvlink-slow", 0)
    node.inject("gpu-throttled", 1)
    node.inject("noisy-neighbour", 1)
    node.inject("fail-slow-clear")
    assert _rate_file(node, "mlx5_1") == "400 Gb/sec (4X NDR)\n"
    for gpu in node.gpus:
        assert gpu.fail_slow == type(gpu.fail_slow)()
        assert all(link.up for link in gpu.nvlinks)
        assert gpu.processes == []


@pytest.mark.parametrize(
    ("fault", "gpu", "params", "message"),
    [
        ("gpu-throttled", 0, {"reason": "melting"}, "throttle reasons must be some of"),
        ("gpu-throttled", 0, {"ratio": 1.5}, "clock ratio must be in"),
        ("nic-degraded", None, {"device": "mlx5_0", "rate_gbps": 800}, "below 400 Gb/s"),
        ("congested-link", None, {"device": "mlx5_99"}, "no simulated InfiniBand device"),
        ("congested-link", None, {"device": "mlx5_0", "factor": 0.5}, "at least 1"),
        ("noisy-neighbour", 0, {"share": 1.0}, "share must be in"),
        ("nvlink-slow", 0, {"links_down": 18}, "must leave a link up"),
    ],
)
def test_bad_fail_slow_parameters_are_refused_with_a_reason(node, fault, gpu, params, message):
    with pytest.raises(FaultError, match=message):
        node.inject(fault, gpu, **params)


def test_nvlink_slow_moves_less_nvlink_data_than_a_healthy_peer(node):
    for gpu in node.gpus:
        gpu.set_load(1.0)
    node.inject("nvlink-slow", 1, links_down=0, bandwidth_ratio=0.5)
    before = [sum(link.transmitted_bytes for link in g.nvlinks) for g in node.gpus]
    node.step(5.0)
    moved = [sum(link.transmitted_bytes for link in g.nvlinks) - b
             for g, b in zip(node.gpus, before, strict=True)]
    assert moved[1] == pytest.approx(0.5 * moved[0], rel=0.05)


def test_traffic_counters_move_with_the_wall_clock_when_the_simulation_runs_faster(tmp_path):
    from sn_monitor.sim.node import SimulatedNode

    node = SimulatedNode(tmp_path / "n", gpus=1)
    gpu = node.gpus[0]
    before = sum(link.transmitted_bytes for link in gpu.nvlinks)
    tree_before = node.tree.ib_counter("mlx5_0", "port_xmit_data")
    node.step(10.0, traffic_seconds=1.0)  # ten simulated seconds in one of the wall clock
    fast = sum(link.transmitted_bytes for link in gpu.nvlinks) - before
    fast_tree = node.tree.ib_counter("mlx5_0", "port_xmit_data") - tree_before
    before = sum(link.transmitted_bytes for link in gpu.nvlinks)
    tree_before = node.tree.ib_counter("mlx5_0", "port_xmit_data")
    node.step(1.0)
    real = sum(link.transmitted_bytes for link in gpu.nvlinks) - before
    real_tree = node.tree.ib_counter("mlx5_0", "port_xmit_data") - tree_before
    assert 0.5 < fast / real < 2.0  # one wall second's worth, not ten
    assert 0.5 < fast_tree / real_tree < 2.0
