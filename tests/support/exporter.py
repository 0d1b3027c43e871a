"""GPU samples (one with every field, one bare) and node snapshots built from them, for the
exporter's tests and the agent server's, which must render the same snapshots."""

from __future__ import annotations

from sn_monitor.agent.snapshot import (
    CollectorStatus,
    GpuSample,
    HostSample,
    IbPortSample,
    MemoryBandwidthSample,
    NetDeviceSample,
    NodeSnapshot,
    NvLinkSample,
    XidCount,
)

FULL_GPU = GpuSample(
    index=0, uuid="GPU-0", name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:18:00.0",
    serial="1650", vbios_version="96.00", driver_version="550.90.07",
    utilization_ratio=0.9, memory_utilization_ratio=0.5, memory_bandwidth_utilization_ratio=0.4,
    memory_used_bytes=10, memory_total_bytes=20, temperature_celsius=70.0,
    memory_temperature_celsius=75.0, slowdown_temperature_celsius=89.0,
    shutdown_temperature_celsius=92.0, power_watts=650.5, power_limit_watts=700.0,
    energy_joules_total=12345.6, sm_clock_hertz=1.98e9, memory_clock_hertz=2.619e9,
    throttle_reasons=(("sw_power_cap", True), ("hw_thermal_slowdown", False)),
    ecc_corrected_errors_total=3, ecc_uncorrected_errors_total=0,
    row_remap_pending=False, pcie_link_width=8, pcie_link_width_max=16,
    nvlinks=(NvLinkSample(link=0, up=True, crc_errors_total=5),
             NvLinkSample(link=1, up=False, crc_errors_total=None)),
)


BARE_GPU = GpuSample(index=1, uuid="GPU-1", name="NVIDIA A100", pci_bus_id="00000000:2a:00.0",
                     temperature_celsius=40.0)


def _snapshot(**kwargs):
    base = dict(
        node="n1", timestamp_seconds=1_700_000_000.0, gpus=(FULL_GPU, BARE_GPU),
        net=(NetDeviceSample("eno1", 1, 2, 3, 4, 5, 6, 7, 8, carrier_up=True,
                             carrier_changes_total=2, speed_bytes_per_second=12_500_000_000),),
        infiniband=(IbPortSample("mlx5_0", 1, state=4, phys_state=5,
                                 rate_bytes_per_second=5e10, link_layer="InfiniBand",
                                 counters=(("received_bytes", 400), ("symbol_errors", 0))),),
        host=HostSample(cpu_seconds_total=(("user", 1.5), ("idle", 9.0)), load1=0.5,
                        memory_bandwidth=(MemoryBandwidthSample("mon_L3_00", 99),)),
        xid_counts=(XidCount(gpu=0, xid=79, count=2, uuid="GPU-0"),
                    XidCount(gpu=0, xid=13, count=1, uuid="GPU-0"),
                    XidCount(gpu=1, xid=79, count=0, uuid="GPU-1"),
                    XidCount(gpu=None, xid=13, count=1)),
        event_counts=(("xid", 3),),
        collectors=(CollectorStatus("nvml", True, 0.002), CollectorStatus("kmsg", False, 0.0),
                    CollectorStatus("host", False, 12.5, stuck=True)),
    )
    base.update(kwargs)
    return NodeSnapshot(**base)
