"""dcgm-exporter's families from the fake NVML's snapshot: names, types, labels, units.

The names are the facts written down in tests/fixtures/dcgm/ (dcgm-exporter's default
counters file and its Grafana dashboard); the snapshot is eight simulated H100s read by
the real NVML collector through the fake NVML.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sn_monitor.agent import exposition_dcgm
from sn_monitor.agent.collectors.gpu import NvmlCollector
from sn_monitor.agent.exporter import SnapshotCollector
from sn_monitor.agent.exposition import TextRenderer
from sn_monitor.agent.exposition_dcgm import (
    GPU_LABELS,
    MIB,
    DcgmCollector,
    catalogue_name,
    dcgm_bus_id,
    served_families,
)
from sn_monitor.agent.sampler import Sampler
from sn_monitor.agent.settings import load_agent_settings
from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot
from sn_monitor.clock import ManualClock
from sn_monitor.config import ConfigError
from sn_monitor.sim import fake_nvml
from sn_monitor.sim.gpu_model import H100_SXM, SimulatedGpu
from tests.conftest import FIXTURES

COUNTERS = yaml.safe_load((FIXTURES / "dcgm" / "default_counters.yaml").read_text())
DASHBOARDS = yaml.safe_load((FIXTURES / "dcgm" / "dashboard_queries.yaml").read_text())
SERIES_FIELDS = [f for f in COUNTERS["fields"] if f["type"] != "label"]
SERVED = {f["name"] for f in SERIES_FIELDS if f["served"]}
NOT_SERVED = {f["name"] for f in SERIES_FIELDS if not f["served"]}
GPUS = 8


@pytest.fixture(scope="module")
def snapshot() -> NodeSnapshot:
    gpus = [SimulatedGpu(i, H100_SXM, seed=11) for i in range(GPUS)]
    for gpu in gpus:
        gpu.step(60.0)
    fake_nvml.configure(gpus)
    clock = ManualClock()
    sampler = Sampler("node-a", [NvmlCollector(fake_nvml, clock)], clock)
    try:
        sampler.sample()
        for gpu in gpus:
            gpu.step(1.0)
        gpus[3].inject_xid(79)
        gpus[3].inject_xid(13)
        clock.advance(1.0)
        return sampler.sample()
    finally:
        sampler.close()


def parsed(collector: DcgmCollector) -> dict[str, Any]:
    text = TextRenderer().render(collector.families()).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def by_gpu(family: Any) -> dict[str, float]:
    return {sample.labels["gpu"]: sample.value for sample in family.samples}


def gpu_of(snapshot: NodeSnapshot, index: int) -> GpuSample:
    return next(g for g in snapshot.gpus if g.index == index)


def test_every_served_field_of_the_counters_file_is_there_with_its_type(snapshot):
    families = parsed(DcgmCollector(lambda: snapshot, "node-a"))
    assert set(families) == SERVED
    types = {f["name"]: f["type"] for f in SERIES_FIELDS}
    for name, family in families.items():
        assert family.type == types[name], name
        assert len(family.samples) == GPUS, name


def test_the_text_writes_counters_under_their_own_name(snapshot):
    # dcgm-exporter's counters carry no _total: queries name them as the file does (the
    # client_python parser above adds one on reading; Prometheus stores what is written)
    text = TextRenderer().render(DcgmCollector(lambda: snapshot, "node-a").families()).decode()
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "_total" not in text


def test_every_series_carries_dcgm_exporters_labels(snapshot):
    families = parsed(DcgmCollector(lambda: snapshot, "node-a"))
    assert set(COUNTERS["labels"]["always"]) == set(GPU_LABELS)
    for name, family in families.items():
        for sample in family.samples:
            extra = {"err_code", "err_msg"} if name == "DCGM_FI_DEV_XID_ERRORS" else set()
            assert set(sample.labels) == set(GPU_LABELS) | extra, name
            gpu = gpu_of(snapshot, int(sample.labels["gpu"]))
            assert sample.labels["UUID"] == gpu.uuid
            assert sample.labels["device"] == f"nvidia{gpu.index}"
            assert sample.labels["modelName"] == gpu.name
            assert sample.labels["pci_bus_id"] == dcgm_bus_id(gpu.pci_bus_id)
            assert sample.labels["Hostname"] == "node-a"
            assert sample.labels["DCGM_FI_DRIVER_VERSION"] == gpu.driver_version


def test_values_are_in_dcgm_exporters_units(snapshot):
    families = parsed(DcgmCollector(lambda: snapshot, "node-a"))
    for gpu in snapshot.gpus:
        i = str(gpu.index)
        assert gpu.memory_used_bytes is not None
        assert gpu.memory_total_bytes is not None
        assert by_gpu(families["DCGM_FI_DEV_FB_USED"])[i] == gpu.memory_used_bytes // MIB
        assert by_gpu(families["DCGM_FI_DEV_FB_FREE"])[i] == (
            (gpu.memory_total_bytes - gpu.memory_used_bytes) // MIB)
        assert by_gpu(families["DCGM_FI_DEV_SM_CLOCK"])[i] == pytest.approx(
            gpu.sm_clock_hertz / 1e6)
        assert 100 <= by_gpu(families["DCGM_FI_DEV_SM_CLOCK"])[i] <= 3000  # MHz, not Hz
        assert by_gpu(families["DCGM_FI_DEV_MEM_CLOCK"])[i] == pytest.approx(
            gpu.memory_clock_hertz / 1e6)
        assert by_gpu(families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"])[i] == round(
            gpu.energy_joules_total * 1000)
        assert by_gpu(families["DCGM_FI_DEV_GPU_UTIL"])[i] == round(gpu.utilization_ratio * 100)
        assert by_gpu(families["DCGM_FI_DEV_POWER_USAGE"])[i] == gpu.power_watts
        assert by_gpu(families["DCGM_FI_DEV_GPU_TEMP"])[i] == gpu.temperature_celsius
        assert by_gpu(families["DCGM_FI_PROF_PCIE_RX_BYTES"])[i] == (
            gpu.pcie_receive_bytes_per_second)
        for ratio in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                      "DCGM_FI_PROF_DRAM_ACTIVE"):
            assert 0.0 <= by_gpu(families[ratio])[i] <= 1.0, ratio
    # the simulated training load keeps the tensor pipes busy, read through GPM
    assert max(by_gpu(families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]).values()) > 0.0


def test_the_xid_family_holds_each_gpus_latest_code(snapshot):
    family = parsed(DcgmCollector(lambda: snapshot, "node-a"))["DCGM_FI_DEV_XID_ERRORS"]
    values = by_gpu(family)
    assert values["3"] == 13
    assert {gpu for gpu, code in values.items() if code} == {"3"}
    (latest,) = (s for s in family.samples if s.labels["gpu"] == "3")
    assert latest.labels["err_code"] == "13"
    assert latest.labels["err_msg"] == catalogue_name(13)
    assert catalogue_name(13) != "Unknown Error"
    quiet = next(s for s in family.samples if s.labels["gpu"] == "0")
    assert quiet.labels["err_code"] == "0"


def test_a_missing_value_leaves_the_gpu_out_and_a_lost_gpu_has_no_series(snapshot):
    gpus = list(snapshot.gpus)
    gpus[1] = replace(gpus[1], tensor_active_ratio=None, memory_used_bytes=None)
    gpus[2] = replace(gpus[2], lost=True)
    changed = replace(snapshot, gpus=tuple(gpus))
    families = parsed(DcgmCollector(lambda: changed, "node-a"))
    assert "1" not in by_gpu(families["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"])
    assert "1" not in by_gpu(families["DCGM_FI_DEV_FB_USED"])
    assert "1" not in by_gpu(families["DCGM_FI_DEV_FB_FREE"])
    assert "1" in by_gpu(families["DCGM_FI_DEV_GPU_TEMP"])
    for family in families.values():
        assert "2" not in by_gpu(family), family.name


@pytest.mark.parametrize(("ours", "dcgm"), [
    ("0000:1b:00.0", "00000000:1B:00.0"),
    ("00000000:db:00.0", "00000000:DB:00.0"),
    ("not a bus", "not a bus"),
])
def test_pci_addresses_are_written_as_nvml_writes_them(ours: str, dcgm: str):
    assert dcgm_bus_id(ours) == dcgm


def test_nothing_before_the_first_snapshot():
    assert list(DcgmCollector(lambda: None, "node-a").families()) == []


def workloads(gpu: GpuSample) -> Sequence[Mapping[str, str]]:
    if gpu.index == 0:
        return [{"pod": "train-0", "namespace": "ml", "container": "trainer"}]
    if gpu.index == 1:  # a time-sliced GPU: two pods
        return [{"pod": "a", "namespace": "ml", "container": "c"},
                {"pod": "b", "namespace": "ml", "container": "c"}]
    if gpu.index == 2:
        return [{"hpc_job": "4242"}]
    return []


def test_known_workloads_label_the_series_one_per_workload(snapshot):
    families = parsed(DcgmCollector(lambda: snapshot, "node-a", workloads=workloads))
    temps = families["DCGM_FI_DEV_GPU_TEMP"].samples
    assert {(s.labels["gpu"], s.labels.get("pod", "")) for s in temps
            if s.labels["gpu"] in {"0", "1"}} == {("0", "train-0"), ("1", "a"), ("1", "b")}
    (job,) = (s for s in temps if s.labels["gpu"] == "2")
    assert job.labels["hpc_job"] == "4242"
    (unknown,) = (s for s in temps if s.labels["gpu"] == "5")
    # the empty values read as absent: Prometheus drops a label whose value is ""
    assert all(unknown.labels.get(name, "") == "" for name in exposition_dcgm.WORKLOAD_LABELS)
    assert set(exposition_dcgm.WORKLOAD_LABELS) == set(COUNTERS["labels"]["workload"])


def test_without_attribution_no_workload_label_is_written(snapshot):
    text = TextRenderer().render(DcgmCollector(lambda: snapshot, "node-a").families()).decode()
    assert not re.search(r"\b(pod|namespace|container|hpc_job)=", text)


def test_every_metric_the_dashboards_query_is_served():
    queried = {name for board in DASHBOARDS["dashboards"]
               for item in [*board["queries"], *board["variables"]]
               for name in re.findall(r"\bDCGM_FI_\w+", item.get("expr") or item["metric"])}
    assert queried
    assert queried <= SERVED, queried - SERVED


def test_the_module_says_why_each_field_is_not_served():
    doc = exposition_dcgm.__doc__ or ""
    not_served = doc.split("Not served", 1)[1]
    for name in NOT_SERVED:
        stem = name.removeprefix("DCGM_FI_DEV_")
        assert name in not_served or f"_{stem}" in not_served, name
    for name in SERVED:
        assert name in doc.split("Not served", 1)[0], name


def test_exposition_sn_dcgm_and_dcgm_only(snapshot):
    native = SnapshotCollector(lambda: snapshot).families
    dcgm = DcgmCollector(lambda: snapshot, "node-a").families

    def names(mode: Any) -> set[str]:
        return {family.name for family in served_families(mode, native, dcgm)()}
    assert not any(n.startswith("DCGM_") for n in names("sn"))
    assert names("dcgm-only") == SERVED
    both = names("dcgm")
    assert both >= SERVED
    assert "sn_gpu_temperature_celsius" in both


@pytest.mark.parametrize("mode", ["sn", "dcgm", "dcgm-only"])
def test_the_setting_takes_each_mode(tmp_path: Path, mode: str):
    path = tmp_path / "agent.yaml"
    path.write_text(f"exposition: {mode}\n")
    assert load_agent_settings(path).exposition == mode


def test_the_setting_defaults_to_sn_and_rejects_other_names(tmp_path: Path):
    assert load_agent_settings(None).exposition == "sn"
    path = tmp_path / "agent.yaml"
    path.write_text("exposition: dcgm-exporter\n")
    with pytest.raises(ConfigError, match="exposition: must be one of sn, dcgm, dcgm-only"):
        load_agent_settings(path)
