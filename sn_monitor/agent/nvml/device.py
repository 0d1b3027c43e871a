"""What the adapter remembers about one NVML device between cycles.

Imports nothing of the package but the snapshot types it caches.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

from sn_monitor.agent.snapshot import GpuSample, NvLinkSample


@dataclass(slots=True)
class Device:
    """One NVML device: its handle and identity, what it lacks, and the cycle caches."""

    index: int
    handle: Any = None
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    serial: str | None = None
    vbios_version: str | None = None
    minor_number: int | None = None
    identified: bool = False
    absent: set[str] = field(default_factory=set)
    static: dict[str, Any] = field(default_factory=dict)
    nvlink_count: int | None = None
    nvlink_links: tuple[NvLinkSample, ...] = ()
    nvlink_read_at: float | None = None
    nvlink_totals: tuple[int, ...] | None = None
    nvlink_settled: bool = False
    gpm_supported: bool | None = None
    gpm_previous: Any = None
    pcie_read_at: float | None = None
    pcie_throughput: tuple[float | None, float | None] = (None, None)
    events_registered: bool = False
    #: The newest per-process utilisation sample seen (NVML's microseconds; 0: none yet).
    process_samples_seen: int = 0
    lost: bool = False
    last_sample: GpuSample | None = None
    #: MIG mode as last read (None: not read yet, or no MIG); a change re-probes.
    mig_mode: bool | None = None
    #: The pending MIG mode as last read, and when the mode was read (the clock's).
    mig_mode_pending: bool | None = None
    mig_mode_read_at: float | None = None
    #: The MIG devices under this GPU by slot (``nvmlDeviceGetMigDeviceHandleByIndex``),
    #: each a :class:`Device` of its own (its handle, what it lacks, its static values).
    mig_devices: dict[int, Device] = field(default_factory=dict)
    #: Per GPU instance id, the GPM sample kept from the last cycle.
    mig_gpm_previous: dict[int, Any] = field(default_factory=dict)

    def forget_nvlinks(self) -> None:
        """The next cycle reads every link again (after a loss, or on XID 74)."""
        self.nvlink_links = ()
        self.nvlink_read_at = None
        self.nvlink_totals = None
        self.nvlink_settled = False

    def forget_mig_devices(self) -> None:
        """The next cycle asks for every MIG device handle, and the mode, again.

        After a loss, or a mode change.
        """
        self.mig_devices.clear()
        self.mig_mode_read_at = None


def handle_key(handle: Any) -> object:
    """A hashable key for a device handle: the address for ctypes pointers, else identity."""
    if isinstance(handle, ctypes._Pointer):
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    return ("obj", id(handle))
