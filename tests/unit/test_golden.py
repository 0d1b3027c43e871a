"""Golden exposition: a fixture node in, the exact /metrics text out, promtool-clean.

The node is the real H100 InfiniBand tree plus hand-made /proc and /sys files under
tests/fixtures/h100-node, eight simulated H100s behind the fake NVML (seeded), and the
real captured kernel logs. Regenerate after an intended change with
``UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py`` and read the diff.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.collectors.host import HostCollector
from sn_monitor.agent.collectors.infiniband import InfinibandCollector
from sn_monitor.agent.collectors.kmsg import KmsgCollector
from sn_monitor.agent.collectors.net import NetCollector
from sn_monitor.agent.collectors.processes import ProcessesCollector
from sn_monitor.agent.exporter import SnapshotCollector
from sn_monitor.agent.sampler import Sampler
from sn_monitor.clock import ManualClock
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import H100_SXM, SimulatedGpu
from tests.conftest import FIXTURES, assert_promtool_clean

GOLDEN = FIXTURES / "golden" / "h100-node.prom"
NODE = FIXTURES / "h100-node"
# The captured logs name GPUs at buses 0x38 and 0x9b: give two simulated GPUs those.
BUSES = (0x18, 0x2A, 0x38, 0x5D, 0x9B, 0xAB, 0xBA, 0xDB)


@pytest.fixture
def kernel_log(tmp_path: Path) -> Path:
    path = tmp_path / "kern.log"
    path.write_text(
        (FIXTURES / "kernel-log" / "dmesg-iso-xid-13-43-oom.log").read_text()
        + (FIXTURES / "kernel-log" / "dmesg-xid-119-gsp-timeout.log").read_text()
    )
    return path


def exposition(kernel_log: Path) -> str:
    gpus = [SimulatedGpu(i, H100_SXM, seed=7, pci_bus_id=f"00000000:{bus:02X}:00.0")
            for i, bus in enumerate(BUSES)]
    gpus[1].inject_cooling_failure(1.7)
    gpus[2].inject_nvlink_errors(3, crc=12, replay=2, recovery=1)
    gpus[5].inject_pcie_downgrade(4, 8)
    gpus[6].inject_row_remap_pending()
    gpus[7].inject_fabric_not_ready()  # Fabric Manager not running
    gpus[0].set_processes([(4242, 61 * 2**30), (4243, 2**30)])
    for gpu in gpus:
        gpu.step(300.0)
    fake_nvml.configure(gpus)
    clock = ManualClock()
    collectors = [
        NvmlCollector(fake_nvml, clock, procfs=NODE / "proc"),
        NetCollector(NODE / "proc", NODE / "sys", exclude="^lo$"),
        InfinibandCollector(NODE / "sys"),
        HostCollector(NODE / "proc", NODE / "sys", ticks_per_second=100),
        KmsgCollector(kernel_log, clock, start_at_end=False),
        # pid 5150 sits in D: stuck by the second sample, 11 s later
        ProcessesCollector(NODE / "proc", clock, interval=0, stuck_after=10),
    ]
    sampler = Sampler("golden-node", collectors, clock)
    try:
        sampler.sample()
        for gpu in gpus:
            gpu.step(1.0)
        gpus[4].inject_xid(119)
        clock.advance(11.0)  # past the ledger's window: a new error, not the log's twin
        sampler.sample()
    finally:
        sampler.close()
        fake_nvml.reset()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: sampler.latest))
    return generate_latest(registry).decode()


def test_exposition_matches_golden_file(kernel_log):
    text = exposition(kernel_log)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_golden_covers_every_design_family():
    text = GOLDEN.read_text()
    for family in (
        "sn_gpu_info", "sn_gpu_utilization_ratio", "sn_gpu_memory_bandwidth_utilization_ratio",
        "sn_gpu_memory_used_bytes", "sn_gpu_memory_total_bytes", "sn_gpu_temperature_celsius",
        "sn_gpu_memory_temperature_celsius", "sn_gpu_slowdown_temperature_celsius",
        "sn_gpu_shutdown_temperature_celsius", "sn_gpu_power_watts", "sn_gpu_power_limit_watts",
        "sn_gpu_energy_joules_total", "sn_gpu_clock_hertz", "sn_gpu_throttle_active",
        "sn_gpu_ecc_corrected_errors_total", "sn_gpu_ecc_uncorrected_errors_total",
        "sn_gpu_remapped_rows_correctable", "sn_gpu_remapped_rows_uncorrectable",
        "sn_gpu_row_remap_pending", "sn_gpu_row_remap_failed", "sn_gpu_pcie_replays_total",
        "sn_gpu_pcie_link_generation", "sn_gpu_pcie_link_width", "sn_gpu_pcie_link_width_max",
        "sn_gpu_nvlink_crc_errors_total", "sn_gpu_nvlink_replay_errors_total",
        "sn_gpu_nvlink_recovery_errors_total", "sn_gpu_nvlink_up", "sn_gpu_xid_errors_total",
        "sn_gpu_lost", "sn_network_receive_bytes_total", "sn_network_transmit_bytes_total",
        "sn_network_carrier_changes_total", "sn_infiniband_port_received_bytes_total",
        "sn_infiniband_port_transmitted_bytes_total", "sn_infiniband_port_symbol_errors_total",
        "sn_infiniband_port_link_downed_total", "sn_infiniband_port_state",
        "sn_host_memory_bandwidth_bytes_total", "sn_agent_collector_success",
        "sn_agent_collector_duration_seconds", "sn_agent_collector_stuck",
        "sn_agent_last_sample_timestamp_seconds", "sn_gpu_workload_info",
        "sn_gpu_process_memory_bytes", "sn_gpu_process_sm_utilization_ratio",
    ):
        assert f"\n{family}{{" in text or f"\n{family} " in text, family


def test_captured_kernel_xids_are_mapped_to_gpus():
    text = GOLDEN.read_text()
    # 16 x Xid 13 and one Xid 43 on bus 0x38 (GPU 2); five Xid 119 on 0x9b (GPU 4), the
    # NVML event injected on GPU 4 later adding one more.
    assert 'sn_gpu_xid_errors_total{gpu="2",' in text
    lines = {line.split("{")[0] + "{" + line.split("{")[1].split("}")[0]: line.rsplit(" ", 1)[1]
             for line in text.splitlines() if line.startswith("sn_gpu_xid_errors_total{")}
    by_code = {key.split('xid="')[1].rstrip('"'): float(v) for key, v in lines.items()
               if float(v)}
    assert by_code == {"13": 16.0, "43": 1.0, "119": 6.0}
    # the reset / reboot codes are there at 0 on every GPU, 119 included
    assert 'sn_gpu_xid_errors_total{gpu="7",uuid="GPU-66a0375e-6b9e-4052-a5e5-563a0f817c26",' \
        'xid="119"} 0.0' in text
    assert 'sn_gpu_xid_errors_all_codes_total{gpu="2",' in text
    totals = [line for line in text.splitlines()
              if line.startswith("sn_gpu_xid_errors_all_codes_total{")]
    assert len(totals) == 9  # the 8 GPUs and the XIDs that name none
    assert sum(float(line.rsplit(" ", 1)[1]) for line in totals) == 23.0


def test_golden_passes_promtool_lint():
    assert_promtool_clean(GOLDEN.read_text())


def test_fast_renderer_writes_what_client_python_writes():
    """The renderer must be byte-identical to generate_latest on a full node, at the first
    render and at the next ones (which reuse the series' formatted labels)."""
    from sn_monitor.agent.exposition import TextRenderer

    gpus = [SimulatedGpu(i, H100_SXM, seed=1) for i in range(2)]
    fake_nvml.configure(gpus)
    with ExitStack() as stack:
        stack.callback(fake_nvml.reset)
        sampler = Sampler("n", [NvmlCollector(fake_nvml, ManualClock()),
                                InfinibandCollector(NODE / "sys")], ManualClock())
        stack.callback(sampler.close)
        sampler.sample()
        collector = SnapshotCollector(lambda: sampler.latest)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        renderer = TextRenderer()
        assert renderer.render(collector.families()) == generate_latest(registry)
        for gpu in gpus:
            gpu.step(5.0)
        sampler.sample()
        assert renderer.render(collector.families()) == generate_latest(registry)


def test_escaping_matches_client_python():
    from sn_monitor.agent.exposition import TextRenderer, gauge, to_metric

    family = gauge("sn_x", 'help with \\ and\nnewline', labels=["b", "a"])
    family.add_metric(['quote " back \\ nl \n', "ü"], 1e20)
    family.add_metric(["x", "y"], float("inf"))
    family.add_metric(["1", "2"], 1234567.0)

    class One:
        def collect(self):
            yield to_metric(family)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())
    assert TextRenderer().render([family]) == generate_latest(registry)


@given(st.one_of(st.floats(), st.integers(min_value=0, max_value=2**64)))
def test_values_are_written_as_client_python_writes_them(value: float) -> None:
    from prometheus_client.utils import floatToGoString

    from sn_monitor.agent.exposition import go_float

    assert go_float(value) == floatToGoString(value)


@given(st.lists(st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 0, 1, 1.0])),
                max_size=20))
def test_a_renderer_used_again_writes_each_value_as_client_python_does(
        values: list[float]) -> None:
    from prometheus_client.utils import floatToGoString

    from sn_monitor.agent.exposition import TextRenderer, gauge

    renderer = TextRenderer()  # it remembers values it formatted: -0.0 is 0.0 to a dict
    for _ in range(2):
        family = gauge("sn_x", "help", labels=["i"])
        for i, value in enumerate(values):
            family.add_metric([str(i)], value)
        lines = renderer.render([family]).decode().splitlines()[2:]
        assert [line.rpartition(" ")[2] for line in lines] == [
            floatToGoString(v) for v in values]


def test_a_series_with_the_wrong_number_of_label_values_is_refused() -> None:
    from sn_monitor.agent.exposition import TextRenderer, gauge

    family = gauge("sn_x", "help", labels=["gpu", "uuid"])
    family.add_metric(["0"], 1.0)
    with pytest.raises(ValueError, match="sn_x: 1 label values for 2 names"):
        TextRenderer().render([family])
