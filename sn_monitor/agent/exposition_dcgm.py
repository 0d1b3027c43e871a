"""dcgm-exporter's names for the agent's snapshot: the families of its default counters.

With ``exposition: dcgm`` (or ``dcgm-only``) in agent.yaml the agent's /metrics also
(or only) serves the ``DCGM_FI_DEV_*`` / ``DCGM_FI_PROF_*`` families that NVIDIA's
dcgm-exporter exports by default (its ``etc/default-counters.csv``, release
4.5.3-4.8.2), with its label names and in its units, formatted from the SAME
:class:`~sn_monitor.agent.snapshot.NodeSnapshot` the ``sn_*`` families come from: NVIDIA's
Grafana dashboard and alerts written for dcgm-exporter keep working when the agent
replaces it. The names are facts listed in ``tests/fixtures/dcgm/``; this module only
formats (no state, nothing read).

Labels on every GPU series, as dcgm-exporter writes them: ``gpu`` (the NVML index),
``UUID``, ``pci_bus_id`` (NVML's form, ``00000000:1B:00.0``), ``device``
(``nvidia<index>``), ``modelName``, ``Hostname`` (the agent's node name; dcgm-exporter's
main branch renames it ``hostname`` after 4.5.3-4.8.2), ``DCGM_FI_DRIVER_VERSION`` (a
label, as the counters file declares it); ``err_code`` and ``err_msg`` on
``DCGM_FI_DEV_XID_ERRORS``. ``pod``, ``namespace``, ``container`` and ``hpc_job`` come
from the ``workloads`` hook (:data:`WorkloadLabels`) when attribution knows the GPU's
workload: one series per workload on a shared GPU, as dcgm-exporter does, and none of
those labels when nothing is known.

Units are dcgm-exporter's, not base units: MiB, MHz, mJ, percent for ``DCGM_FI_DEV_*``
utilisations, ratios for ``DCGM_FI_PROF_*``. Its counters are named without ``_total``.

Served, and from which snapshot field:

======================================== ==========================================================
DCGM_FI_DEV_SM_CLOCK                     ``sm_clock_hertz`` / 1e6 (MHz)
DCGM_FI_DEV_MEM_CLOCK                    ``memory_clock_hertz`` / 1e6 (MHz)
DCGM_FI_DEV_GPU_TEMP                     ``temperature_celsius``
DCGM_FI_DEV_MEMORY_TEMP                  ``memory_temperature_celsius``
DCGM_FI_DEV_POWER_USAGE                  ``power_watts``
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION     ``energy_joules_total`` x 1000 (mJ, counter)
DCGM_FI_DEV_PCIE_REPLAY_COUNTER          ``pcie_replays_total`` (counter)
DCGM_FI_DEV_GPU_UTIL                     ``utilization_ratio`` x 100 (%)
DCGM_FI_DEV_MEM_COPY_UTIL                ``memory_utilization_ratio`` x 100 (%)
DCGM_FI_DEV_XID_ERRORS                   the GPU's latest XID code (``NodeSnapshot.last_xids``), 0
                                         before any
DCGM_FI_DEV_FB_FREE                      (``memory_total_bytes`` - ``memory_used_bytes``) in MiB
DCGM_FI_DEV_FB_USED                      ``memory_used_bytes`` in MiB
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS  ``remapped_rows_uncorrectable`` (counter)
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS    ``remapped_rows_correctable`` (counter)
DCGM_FI_DEV_ROW_REMAP_FAILURE            ``row_remap_failed`` (0 / 1)
DCGM_FI_PROF_GR_ENGINE_ACTIVE            ``utilization_ratio`` (NVML's kernel-busy share: the same
                                         engine, measured coarser than DCGM's profiler)
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE          ``tensor_active_ratio`` (GPM ANY_TENSOR_UTIL, Hopper+)
DCGM_FI_PROF_DRAM_ACTIVE                 ``memory_bandwidth_utilization_ratio`` (GPM DRAM_BW_UTIL
                                         on Hopper+, NVML utilization.memory before)
DCGM_FI_PROF_PCIE_TX_BYTES               ``pcie_transmit_bytes_per_second``
DCGM_FI_PROF_PCIE_RX_BYTES               ``pcie_receive_bytes_per_second``
======================================== ==========================================================

Not served, and why (a field whose snapshot value is None on a GPU is left out for that
GPU, never written as NaN):

=================================== ==========================================================
DCGM_FI_DEV_ENC_UTIL, _DEC_UTIL     the agent does not read the video engines (no use to a
                                    training fleet); no snapshot field
DCGM_FI_DEV_FB_RESERVED             NVML's v1 memory info, which the agent reads, counts the
                                    driver's reserve as used; no separate value
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL  typed counter, but DCGM's value is a rate (KiB/s) that
                                    its users read without rate(); the snapshot has the
                                    cumulative bytes (``sn_gpu_nvlink_*_bytes_total``) and
                                    the exposition computes no rates
DCGM_FI_DEV_VGPU_LICENSE_STATUS     vGPU guests only; the agent runs on bare-metal hosts
=================================== ==========================================================

MIG instances get ``GPU_I_PROFILE`` / ``GPU_I_ID`` series once the snapshot carries them
(issue 32's MIG part).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from sn_monitor.agent.exposition import Family, FamilySource, FamilyType
from sn_monitor.agent.pci import canonical_bus_id
from sn_monitor.agent.settings import Exposition
from sn_monitor.agent.snapshot import GpuSample, NodeSnapshot
from sn_monitor.rules.xid_catalog import load_catalog

MIB: Final = 1 << 20

#: The labels dcgm-exporter puts on every GPU series, in its order.
GPU_LABELS: Final = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname",
                     "DCGM_FI_DRIVER_VERSION")
#: The labels its Kubernetes and HPC job mapping add when they know the GPU's workload.
WORKLOAD_LABELS: Final = ("pod", "namespace", "container", "hpc_job")

WorkloadLabels = Callable[[GpuSample], Sequence[Mapping[str, str]]]
"""The workloads on a GPU, each as values of :data:`WORKLOAD_LABELS` (a key left out: not
known). Empty: nothing known, the GPU's series carry none of those labels."""

SnapshotSource = Callable[[], NodeSnapshot | None]


@dataclass(frozen=True, slots=True)
class DcgmField:
    """One served family: its name, type, help and its value from a GPU's sample."""

    name: str
    kind: FamilyType
    documentation: str
    value: Callable[[GpuSample], float | None]


def _scaled(attr: str, factor: float) -> Callable[[GpuSample], float | None]:
    def value(gpu: GpuSample) -> float | None:
        raw = getattr(gpu, attr)
        return None if raw is None else float(raw) * factor
    return value


def _percent(attr: str) -> Callable[[GpuSample], float | None]:
    def value(gpu: GpuSample) -> float | None:
        raw = getattr(gpu, attr)
        return None if raw is None else float(round(raw * 100))
    return value


def _mib(attr: str) -> Callable[[GpuSample], float | None]:
    def value(gpu: GpuSample) -> float | None:
        raw = getattr(gpu, attr)
        return None if raw is None else float(int(raw) // MIB)
    return value


def _fb_free(gpu: GpuSample) -> float | None:
    if gpu.memory_total_bytes is None or gpu.memory_used_bytes is None:
        return None
    return float(max(0, gpu.memory_total_bytes - gpu.memory_used_bytes) // MIB)


def _energy_mj(gpu: GpuSample) -> float | None:
    joules = gpu.energy_joules_total
    return None if joules is None else float(round(joules * 1000))


def _same(attr: str) -> Callable[[GpuSample], float | None]:
    return _scaled(attr, 1.0)


def _flag(attr: str) -> Callable[[GpuSample], float | None]:
    def value(gpu: GpuSample) -> float | None:
        raw = getattr(gpu, attr)
        return None if raw is None else (1.0 if raw else 0.0)
    return value


#: Every served family but DCGM_FI_DEV_XID_ERRORS (its value is the node's, by GPU), in
#: the counters file's order.
FIELDS: Final[tuple[DcgmField, ...]] = (
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
              _scaled("sm_clock_hertz", 1e-6)),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
              _scaled("memory_clock_hertz", 1e-6)),
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "HBM temperature (in C).",
              _same("memory_temperature_celsius")),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU core temperature (in C).",
              _same("temperature_celsius")),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "gauge", "Board power draw (in W).",
              _same("power_watts")),
    DcgmField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
              "Energy used since the driver loaded (in mJ).", _energy_mj),
    DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter",
              "PCIe link-level retransmissions.", _same("pcie_replays_total")),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "gauge",
              "Share of time a kernel ran on the GPU (in %).", _percent("utilization_ratio")),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge",
              "Share of time device memory was read or written (in %).",
              _percent("memory_utilization_ratio")),
    DcgmField("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory not in use (in MiB).",
              _fb_free),
    DcgmField("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory in use (in MiB).",
              _mib("memory_used_bytes")),
    DcgmField("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
              "HBM rows remapped after uncorrectable errors.",
              _same("remapped_rows_uncorrectable")),
    DcgmField("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
              "HBM rows remapped after correctable errors.", _same("remapped_rows_correctable")),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "1 once a row remap has failed.",
              _flag("row_remap_failed")),
    DcgmField("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge",
              "Share of time the graphics/compute engine was busy (ratio).",
              _same("utilization_ratio")),
    DcgmField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
              "Share of cycles the tensor pipes were busy (ratio).",
              _same("tensor_active_ratio")),
    DcgmField("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
              "Share of cycles the device memory interface moved data (ratio).",
              _same("memory_bandwidth_utilization_ratio")),
    DcgmField("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
              "PCIe transmit rate, headers and payload (in B/s).",
              _same("pcie_transmit_bytes_per_second")),
    DcgmField("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
              "PCIe receive rate, headers and payload (in B/s).",
              _same("pcie_receive_bytes_per_second")),
)

XID_FAMILY: Final = "DCGM_FI_DEV_XID_ERRORS"


def catalogue_name(code: int) -> str:
    """The ``err_msg`` of an XID code: its name in NVIDIA's catalogue (packaged)."""
    entry = load_catalog().get(code)
    return "Unknown Error" if entry is None else entry.name


def dcgm_bus_id(text: str) -> str:
    """A PCI address as DCGM writes it (NVML's ``busId``: 8-digit domain, upper-case hex)."""
    canonical = canonical_bus_id(text)
    if canonical is None:
        return text
    domain, bus, rest = canonical.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


def served_families(mode: Exposition, native: FamilySource, dcgm: FamilySource) -> FamilySource:
    """The families /metrics serves for ``exposition: mode`` (see its setting)."""
    if mode == "sn":
        return native
    if mode == "dcgm-only":
        return dcgm
    return lambda: itertools.chain(native(), dcgm())


class DcgmCollector:
    """The dcgm-exporter families of the latest snapshot (see the module's tables).

    ``hostname`` is the ``Hostname`` label (the agent's node name); ``xid_names`` gives
    the ``err_msg`` of an XID code (NVIDIA's catalogue); ``workloads`` the workload labels
    of a GPU (None: attribution off).
    """

    def __init__(self, source: SnapshotSource, hostname: str,
                 xid_names: Callable[[int], str] = catalogue_name,
                 workloads: WorkloadLabels | None = None) -> None:
        self._source = source
        self._hostname = hostname
        self._xid_names = xid_names
        self._workloads = workloads

    def families(self) -> Iterator[Family]:
        """The served families of the latest snapshot; none before the first."""
        snapshot = self._source()
        if snapshot is None or not snapshot.gpus:
            return
        rows = self._label_rows(snapshot.gpus)
        extra = sorted({name for _, labels in rows for name in labels})
        names = (*GPU_LABELS, *extra)
        for field in FIELDS:
            family = Family(field.name, field.documentation, field.kind, names,
                            total_suffix=False)
            for gpu, labels in rows:
                value = field.value(gpu)
                if value is not None and not gpu.lost:
                    family.add_metric(self._values(gpu, labels, extra), value)
            if family.samples:
                yield family
        yield self._xids(snapshot, rows, extra)

    def _label_rows(self, gpus: Sequence[GpuSample]) -> list[tuple[GpuSample, Mapping[str, str]]]:
        """Each GPU once per workload on it (once with no workload labels when none)."""
        rows: list[tuple[GpuSample, Mapping[str, str]]] = []
        for gpu in gpus:
            known = [
                {k: v for k, v in labels.items() if k in WORKLOAD_LABELS and v}
                for labels in (self._workloads(gpu) if self._workloads is not None else ())
            ]
            rows.extend((gpu, labels) for labels in (known or [{}]))
        return rows

    def _values(self, gpu: GpuSample, labels: Mapping[str, str],
                extra: Sequence[str]) -> list[str]:
        return [str(gpu.index), gpu.uuid, dcgm_bus_id(gpu.pci_bus_id), f"nvidia{gpu.index}",
                gpu.name, self._hostname, gpu.driver_version or "",
                *(labels.get(name, "") for name in extra)]

    def _xids(self, snapshot: NodeSnapshot, rows: Sequence[tuple[GpuSample, Mapping[str, str]]],
              extra: Sequence[str]) -> Family:
        family = Family(XID_FAMILY, "Code of the GPU's latest XID error (0: none yet).",
                        "gauge", (*GPU_LABELS, *extra, "err_code", "err_msg"))
        last = dict(snapshot.last_xids)
        for gpu, labels in rows:
            if gpu.lost:
                continue
            code = last.get(gpu.index, 0)
            message = self._xid_names(code) if code else "No Error"
            family.add_metric([*self._values(gpu, labels, extra), str(code), message],
                              float(code))
        return family
