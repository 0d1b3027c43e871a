"""NVML's units to the snapshot's, here and nowhere else.

mW, mJ, MHz, KB/s, KiB and percent become W, J, Hz, bytes/s, bytes and 0..1 ratios.
Imports nothing of the package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# NVML reports PCIe throughput in "KB/s" (nvml.h); nvitop and DCGM read that as KiB/s,
# so 1 KB = 1024 bytes here.
PCIE_KB = 1024
KIB = 1024
# GPM's PCIe metrics are MiB/s (pynvml: "PCIe traffic from/to this GPU in MiB/sec").
GPM_PCIE_MIB = 1024 * 1024


def text(value: Any) -> str | None:
    return None if value is None else str(value)


def integer(value: Any) -> int | None:
    return None if value is None else int(value)


def real(value: Any) -> float | None:
    return None if value is None else float(value)


def milli(value: Any) -> float | None:
    """Milli-units to units: mW -> W, mJ -> J."""
    return None if value is None else float(value) / 1000.0


def mhz(value: Any) -> float | None:
    return None if value is None else float(value) * 1e6


def kilobytes(value: Any) -> float | None:
    """NVML's KB/s -> bytes/s (1 KB = 1024 B)."""
    return None if value is None else float(value) * PCIE_KB


def kib_total(value: float | None) -> int | None:
    """A KiB counter (NVLink data) -> bytes."""
    return None if value is None else int(value) * KIB


def clamp_ratio(value: float) -> float:
    return min(1.0, max(0.0, value))


def percent(value: Any) -> float | None:
    return None if value is None else clamp_ratio(float(value) / 100.0)


def field_value(nvml: Any, entry: Any) -> float | None:
    """Read a ``c_nvmlFieldValue_t`` union by its ``valueType``; integer types stay ``int``."""
    readers: dict[int, Callable[[Any], float]] = {
        int(nvml.NVML_VALUE_TYPE_DOUBLE): lambda v: float(v.dVal),
        int(nvml.NVML_VALUE_TYPE_UNSIGNED_INT): lambda v: int(v.uiVal),
        int(nvml.NVML_VALUE_TYPE_UNSIGNED_LONG): lambda v: int(v.ulVal),
        int(nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG): lambda v: int(v.ullVal),
        int(nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG): lambda v: int(v.sllVal),
        int(nvml.NVML_VALUE_TYPE_SIGNED_INT): lambda v: int(v.siVal),
    }
    reader = readers.get(int(entry.valueType))
    return None if reader is None else reader(entry.value)
