from __future__ import annotations

import msgspec
import pytest

from sn_monitor.agent.report import (
    EventNumberer,
    build_report,
    event_record,
    gpu_report,
    ib_port_report,
    is_reported_ib_counter,
    net_report,
)
from sn_monitor.agent.snapshot import (
    GpuProcess,
    GpuSample,
    GpuWorkload,
    IbPortSample,
    NetDeviceSample,
    NodeSnapshot,
    NvLinkSample,
    ProcessesSample,
    StuckProcess,
)
from sn_monitor.model import (
    MAX_WORKLOADS,
    CommandResult,
    Event,
    GpuWorkloadReport,
    HostReport,
    Report,
)


def gpu(index: int = 0, **fields) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index}", name="H100", pci_bus_id="0000:18:00.0",
                     **fields)


def test_gpu_values_are_copied_and_nvlinks_summed():
    sample = gpu(
        temperature_celsius=71.5, power_watts=650.0, power_limit_watts=700.0,
        power_default_limit_watts=700.0, utilization_ratio=0.9, memory_used_bytes=10,
        throttle_reasons=(("sw_power_cap", True), ("gpu_idle", False), ("hw_slowdown", True)),
        nvlinks=(
            NvLinkSample(0, up=True, crc_errors_total=3, replay_errors_total=1),
            NvLinkSample(1, up=False, crc_errors_total=4, recovery_errors_total=2),
            NvLinkSample(2, up=None),
        ),
    )
    report = gpu_report(sample, guard_throttled=True)
    assert report.temperature_celsius == 71.5
    assert report.power_limit_watts == 700.0
    assert report.utilization_ratio == 0.9
    assert report.throttle_reasons == ["sw_power_cap", "hw_slowdown"]
    assert report.nvlink_crc_errors_total == 7
    assert report.nvlink_replay_errors_total == 1
    assert report.nvlink_recovery_errors_total == 2
    assert report.nvlinks_down == 1
    assert report.guard_throttled is True


def test_nvlink_data_reaches_the_controller_in_bytes():
    report = gpu_report(gpu(nvlink_transmitted_bytes_total=2048 * 1024,
                            nvlink_received_bytes_total=2**64))  # a sentinel: left out
    assert report.nvlink_transmitted_bytes_total == 2048 * 1024
    assert report.nvlink_received_bytes_total is None


def test_gpu_without_nvlinks_leaves_nvlink_fields_out():
    report = gpu_report(gpu())
    assert report.nvlinks_down is None
    assert report.nvlink_crc_errors_total is None
    assert report.nvlink_transmitted_bytes_total is None
    assert report.throttle_reasons == []


def test_out_of_range_values_are_made_to_fit_the_wire():
    report = gpu_report(gpu(utilization_ratio=1.02, ecc_corrected_errors_total=-1))
    assert report.utilization_ratio == 1.0
    assert report.ecc_corrected_errors_total is None


def test_driver_sentinels_are_left_out_not_sent():
    """An NVML 0xFFFF... or an inf would make the controller refuse the whole report."""
    sentinel = 2**64 - 1
    snapshot = NodeSnapshot(
        node="gpu-node-017", timestamp_seconds=1_700_000_000.0,
        gpus=(gpu(0, ecc_uncorrected_errors_total=sentinel, pcie_replays_total=2**63,
                  temperature_celsius=float("inf"), power_watts=float("nan"),
                  sm_clock_hertz=1e30, memory_used_bytes=5),),
        infiniband=(IbPortSample("mlx5_0", 1, counters=(("symbol_errors", sentinel),
                                                          ("link_downed", 3))),),
    )
    report = build_report(snapshot, instance="abc", sequence=1, labels={}, interval=1.0,
                          events=[], command_results=[], guard_throttled=set())
    (g,) = report.gpus
    assert (g.ecc_uncorrected_errors_total, g.pcie_replays_total) == (None, None)
    assert (g.temperature_celsius, g.power_watts, g.sm_clock_hertz) == (None, None, None)
    assert g.memory_used_bytes == 5
    assert report.infiniband[0].counters == {"link_downed": 3}
    msgspec.json.decode(msgspec.json.encode(report), type=Report)  # the controller takes it


@pytest.mark.parametrize(
    ("stem", "reported"),
    [
        ("symbol_errors", True),
        ("link_downed", True),
        ("link_error_recovery", True),
        ("transmit_discards", True),
        ("out_of_buffer", True),
        ("out_of_sequence", True),
        ("local_ack_timeout_err", True),
        ("rnr_nak_retry_err", True),
        ("np_cnp_sent", True),
        ("transmit_wait", True),
        ("np_ecn_marked_roce_packets", True),
        ("received_bytes", True),
        ("transmitted_bytes", True),
        ("transmitted_packets", False),
        ("multicast_received_packets", False),
    ],
)
def test_ib_counter_filter(stem, reported):
    assert is_reported_ib_counter(stem) is reported


def test_ib_port_keeps_state_rate_data_and_error_counters():
    port = IbPortSample("mlx5_0", 1, state=4, rate_bytes_per_second=5e10, counters=(
        ("received_bytes", 10**12), ("received_packets", 10**9), ("symbol_errors", 3),
        ("link_downed", 1)))
    report = ib_port_report(port)
    assert report.state == 4
    assert report.rate_bytes_per_second == 5e10
    assert report.counters == {"received_bytes": 10**12, "symbol_errors": 3, "link_downed": 1}


def test_net_report_keeps_carrier_and_errors():
    dev = NetDeviceSample("eth0", 1, 2, 3, 4, 5, 6, 7, 8, carrier_up=True,
                          carrier_changes_total=2)
    report = net_report(dev)
    assert (report.receive_errors_total, report.receive_drops_total) == (3, 4)
    assert (report.transmit_errors_total, report.transmit_drops_total) == (7, 8)
    assert report.carrier_up is True
    assert report.carrier_changes_total == 2


def test_event_record_and_numbering():
    event = Event("xid", "nvml", 1.5, "Xid 79" + "x" * 5000, gpu=2, code=79,
                  pci_bus_id="0000:18:00.0", kernel_time_seconds=3.0)
    record = event_record(event, 7)
    assert (record.id, record.kind, record.gpu, record.code) == (7, "xid", 2, 79)
    assert len(record.message) == 4096
    numberer = EventNumberer()
    assert [numberer(event).id for _ in range(3)] == [0, 1, 2]


def test_built_report_passes_the_controllers_validation():
    snapshot = NodeSnapshot(
        node="gpu-node-017", timestamp_seconds=1_700_000_000.0,
        gpus=(gpu(0, temperature_celsius=80.0), gpu(1, utilization_ratio=-0.01)),
        infiniband=(IbPortSample("mlx5_0", 1, counters=(("symbol_errors", 1),)),),
        net=(NetDeviceSample("eth0", 1, 2, 3, 4, 5, 6, 7, 8),),
    )
    events = [event_record(Event("guard", "agent", 1.0, "capped", gpu=0), 0)]
    results = [CommandResult(id="c1", ok=True, time_seconds=2.0)]
    report = build_report(
        snapshot, instance="abc", sequence=3, labels={"supernode": "sn0", "rack": "r1"},
        interval=1.0, events=events, command_results=results, guard_throttled={1},
    )
    wire = msgspec.json.encode(report)
    decoded = msgspec.json.decode(wire, type=Report)  # what the controller does
    assert decoded == report
    assert decoded.sequence == 3
    assert decoded.labels == {"rack": "r1", "supernode": "sn0"}
    assert [g.guard_throttled for g in decoded.gpus] == [False, True]
    assert decoded.events[0].message == "capped"
    assert decoded.command_results[0].id == "c1"
    assert decoded.agent_version


def test_fabric_and_the_process_count_reach_the_controller():
    sample = gpu(fabric_state=3, fabric_status=0, fabric_clique_id=7,
                 processes=(GpuProcess(10, 2**30, "c" * 64), GpuProcess(11)))
    report = gpu_report(sample)
    assert (report.fabric_state, report.fabric_status, report.processes) == (3, 0, 2)
    # None: NVML could not list them (not "no process"); () is "none".
    assert gpu_report(gpu()).processes is None
    assert gpu_report(gpu(processes=())).processes == 0
    assert gpu_report(gpu()).fabric_state is None


def test_stuck_processes_go_out_as_a_host_value():
    processes = ProcessesSample(total=900, uninterruptible=3, stuck_count=1,
                                stuck=(StuckProcess(77, "python", 300.0),))
    snapshot = NodeSnapshot(node="n1", timestamp_seconds=1.0, processes=processes)
    report = build_report(snapshot, instance="i", sequence=1, labels={}, interval=1.0,
                          events=[], command_results=[], guard_throttled=set())
    assert report.host == HostReport(processes_stuck=1)
    decoded = msgspec.json.decode(msgspec.json.encode(report), type=Report)
    assert decoded.host == HostReport(processes_stuck=1)
    bare = build_report(NodeSnapshot(node="n1", timestamp_seconds=1.0), instance="i",
                        sequence=1, labels={}, interval=1.0, events=[], command_results=[],
                        guard_throttled=set())
    assert bare.host is None
    assert b"host" not in msgspec.json.encode(bare)


def test_workloads_and_the_energy_counter_reach_the_controller():
    held = (GpuWorkload(pod="train-0", namespace="ml", container="main"),
            GpuWorkload(mig_instance="MIG-1", slurm_job="42", user="ada", partition="gpu",
                        workload_job="x" * 300))
    snapshot = NodeSnapshot(node="n1", timestamp_seconds=1.0,
                            gpus=(gpu(0, energy_joules_total=1.5e6, workloads=held), gpu(1)))
    report = build_report(snapshot, instance="i", sequence=1, labels={}, interval=1.0,
                          events=[], command_results=[], guard_throttled=set())
    decoded = msgspec.json.decode(msgspec.json.encode(report), type=Report)
    assert decoded == report
    first, idle = decoded.gpus
    assert first.energy_joules_total == 1.5e6
    assert first.workloads[0] == GpuWorkloadReport(pod="train-0", namespace="ml",
                                                   container="main")
    assert first.workloads[1].workload_job == "x" * 128  # cut to the wire's bound
    assert idle.workloads == []
    # nobody's GPU: nothing on the wire (a controller from before attribution reads it)
    assert b"workloads" not in msgspec.json.encode(idle)


def test_a_gpu_reports_at_most_the_wires_workloads_and_a_sane_energy():
    many = tuple(GpuWorkload(user=f"u{i}") for i in range(MAX_WORKLOADS + 3))
    assert len(gpu_report(gpu(workloads=many)).workloads) == MAX_WORKLOADS
    assert gpu_report(gpu(energy_joules_total=-1.0)).energy_joules_total is None
    assert gpu_report(gpu(energy_joules_total=float("nan"))).energy_joules_total is None
