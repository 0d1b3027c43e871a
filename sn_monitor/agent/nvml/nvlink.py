"""A GPU's NVLinks: counting them, their state and error counters per cycle, the topology.

NVLink without ~700 driver calls a cycle: every cycle one batched
``nvmlDeviceGetFieldValues`` per GPU reads the GPU-wide NVLink error totals (with the HBM
temperature, see :mod:`.sampling`); the per-link state and counters are read again only
when those totals moved, a link was down, XID 74 arrived, or ``nvlink_link_interval``
seconds have passed (see :meth:`NvLinks.links`). Imports :mod:`.calls`, :mod:`.device`,
:mod:`.errors` and :mod:`.units`.
"""

from __future__ import annotations

from typing import Any

from sn_monitor.agent.nvml.calls import DriverCalls
from sn_monitor.agent.nvml.device import Device
from sn_monitor.agent.nvml.errors import (
    ABSENT,
    FAULTS,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    DeviceFault,
    NvmlError,
    error_code,
)
from sn_monitor.agent.nvml.units import integer
from sn_monitor.agent.pci import canonical_bus_id
from sn_monitor.agent.snapshot import GpuLinks, NvLinkRemote, NvLinkSample
from sn_monitor.clock import Clock

# Quiet NVLinks: the per-link state and counters are read again this seldom.
NVLINK_LINK_INTERVAL_SECONDS = 10.0
# The GPU-wide NVLink error totals (sums over the links), as field values: (the per-link
# key they stand for, pynvml's name, nvml.h's id for bindings that lack the name).
_TOTAL_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("crc_flit", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 38),
    ("crc_data", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 45),
    ("replay", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 52),
    ("recovery", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 59),
)
# NVLink data over all the GPU's links, in KiB, as field values: (key, pynvml's name,
# nvml.h's id). Asked with scope :data:`_ALL_LINKS` (the sum over every link): a bare id
# means scope 0, link 0 alone.
_DATA_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("nvlink_transmitted_kib", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138),
    ("nvlink_received_kib", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139),
)
_ALL_LINKS = 0xFFFFFFFF
# What is at an NVLink's far end: nvml.h's NVML_NVLINK_DEVICE_TYPE_* (IBMNPU: a POWER
# CPU's NVLink port).
_REMOTE_KINDS = {0: "gpu", 1: "cpu", 2: "switch"}
_MAX_LINKS_FALLBACK = 36


def nvlink_field_ids(nvml: Any) -> list[tuple[str, int | tuple[int, int]]]:
    """The field values a GPU with NVLinks adds to its batched read: totals, then data.

    Keyed ``nvlink_total_<counter>`` and ``nvlink_{transmitted,received}_kib``; the data
    ids come with the all-links scope.
    """
    wanted: list[tuple[str, int | tuple[int, int]]] = [
        (f"nvlink_total_{counter}", int(getattr(nvml, name, field_id)))
        for counter, name, field_id in _TOTAL_FIELDS
    ]
    wanted.extend(
        (key, (int(getattr(nvml, name, field_id)), _ALL_LINKS))
        for key, name, field_id in _DATA_FIELDS
    )
    return wanted


def nvlink_totals(fields: dict[str, float]) -> tuple[int, ...] | None:
    """The four NVLink error totals from this cycle's field values; None unless all four."""
    keys = [f"nvlink_total_{counter}" for counter, _, _ in _TOTAL_FIELDS]
    if not all(key in fields for key in keys):
        return None
    return tuple(int(fields[key]) for key in keys)


class NvLinks:
    """Counts, samples and maps the NVLinks of a device, through ``calls``.

    ``clock``'s monotonic time and ``interval`` (seconds; 0: every cycle) pace the
    per-link reads of quiet links.
    """

    def __init__(self, calls: DriverCalls, clock: Clock, interval: float) -> None:
        self._calls = calls
        self._clock = clock
        self._interval = interval

    def probe(self, device: Device) -> int | None:
        """Count links: ask link 0, 1, ... until the driver says InvalidArgument/NotSupported.

        None when a transient error cut the probe short: the count is kept for good, so it
        is not taken from a partial probe; the next cycle probes again.
        """
        nvml = self._calls.nvml
        fn = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
        if fn is None:
            self._calls.function_missing("nvmlDeviceGetNvLinkState")
            return 0
        limit = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _MAX_LINKS_FALLBACK))
        for link in range(limit):
            try:
                fn(device.handle, link)
            except nvml.NVMLError as error:
                code = error_code(error)
                if code in (INVALID_ARGUMENT, NOT_SUPPORTED):
                    return link
                if code in FAULTS:
                    raise DeviceFault("nvmlDeviceGetNvLinkState", error) from error
                self._calls.classify(device, "nvlink_state", "nvmlDeviceGetNvLinkState", error)
                if code in ABSENT:
                    return link
                return None
        return limit

    def links(self, device: Device, totals: tuple[int, ...] | None) -> tuple[NvLinkSample, ...]:
        """Per link: state and counters, read per link only when something may have changed.

        Reading every link is 5 driver calls (state and 4 error counters) per link each an
        RM ioctl: 720 a cycle on an 8 x 18-link H100 node. So the per-link values are
        read again only when

        * ``totals`` (this cycle's GPU-wide CRC flit, CRC data, replay and recovery totals,
          from the one batched field-values call) differ from those seen at the last
          per-link read: an error happened, and this cycle shows on which link;
        * the totals are not available (not supported, or failed this cycle): every
          cycle, as before;
        * the last per-link read was incomplete (a transient error on some value);
        * XID 74 (NVLink error) arrived for the GPU, the GPU came back after a loss, or
          ``nvlink_link_interval`` seconds passed since the last per-link read.

        Otherwise the cached links are served, and only a link that was down has its
        state asked again (one call each), so a link coming back shows within a cycle.

        The trade-off: a link *going down* with no error counted on any link (the totals
        do not move) and no XID 74 shows only at the next per-link read, at most
        ``nvlink_link_interval`` seconds late. A link drop normally comes with recovery
        attempts (the recovery total moves) and XID 74, either of which forces the read,
        so it shows within one cycle. A quiet GPU costs no extra call: the totals ride in
        the field-values call made for the HBM temperature anyway.
        """
        count = device.nvlink_count or 0
        if count == 0:
            return ()
        now = self._clock.monotonic()
        if (
            device.nvlink_settled
            and device.nvlink_read_at is not None
            and now - device.nvlink_read_at < self._interval
            and totals is not None
            and totals == device.nvlink_totals
            and len(device.nvlink_links) == count
            and self._down_links_still_down(device)
        ):
            return device.nvlink_links
        device.nvlink_links, device.nvlink_settled = self._read_links(device, count)
        device.nvlink_read_at = now
        device.nvlink_totals = totals
        return device.nvlink_links

    def remotes(self, device: Device) -> GpuLinks:
        """Each link up or not, and what is at the far end of those up; strict reads.

        The device must have its handle. Raises :class:`NvmlError` when a value cannot be
        read now (a transient error) and :class:`DeviceFault` on a fault.
        """
        if device.nvlink_count is None:
            device.nvlink_count = self.probe(device)
            if device.nvlink_count is None:
                raise NvmlError(f"GPU {device.index}: its NVLinks could not be counted now")
        call = self._calls.call
        enabled = int(self._calls.nvml.NVML_FEATURE_ENABLED)
        links: list[NvLinkRemote] = []
        for link in range(device.nvlink_count):
            state = call(device, "nvlink_state", "nvmlDeviceGetNvLinkState", link, strict=True)
            if state is None or int(state) != enabled:
                links.append(NvLinkRemote(link, up=None if state is None else False))
                continue
            kind = call(device, "nvlink_remote_type",
                        "nvmlDeviceGetNvLinkRemoteDeviceType", link, strict=True)
            pci = call(device, "nvlink_remote_pci", "nvmlDeviceGetNvLinkRemotePciInfo",
                       link, strict=True)
            links.append(NvLinkRemote(
                link,
                up=True,
                remote_kind=None if kind is None else _REMOTE_KINDS.get(int(kind), "unknown"),
                remote_pci_bus_id=None if pci is None else canonical_bus_id(str(pci.busId)),
            ))
        return GpuLinks(device.index, device.uuid, device.pci_bus_id, tuple(links))

    def _down_links_still_down(self, device: Device) -> bool:
        """Ask the state of each link that was down; False as soon as one is not."""
        disabled = int(self._calls.nvml.NVML_FEATURE_DISABLED)
        for link in device.nvlink_links:
            if link.up is False:
                state = self._calls.call(
                    device, "nvlink_state", "nvmlDeviceGetNvLinkState", link.link
                )
                if state is None or int(state) != disabled:
                    return False
        return True

    def _read_links(self, device: Device, count: int) -> tuple[tuple[NvLinkSample, ...], bool]:
        """Every link's state and counters, and whether every value was read.

        ``crc_errors_total`` is CRC_FLIT + CRC_DATA. A value left out for good (absent)
        still counts as read; one that failed this cycle does not.
        """
        nvml = self._calls.nvml
        settled = True

        def get(key: str, function: str, *args: Any) -> Any:
            nonlocal settled
            value = self._calls.call(device, key, function, *args)
            if value is None and not self._calls.known_absent(device, key, function):
                settled = False
            return value

        def counter(name: str, link: int, counter_type: int) -> int | None:
            return integer(
                get(f"nvlink_{name}", "nvmlDeviceGetNvLinkErrorCounter", link, counter_type)
            )

        enabled = int(nvml.NVML_FEATURE_ENABLED)
        links: list[NvLinkSample] = []
        for link in range(count):
            state = get("nvlink_state", "nvmlDeviceGetNvLinkState", link)
            flit = counter("crc_flit", link, nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)
            data = counter("crc_data", link, nvml.NVML_NVLINK_ERROR_DL_CRC_DATA)
            links.append(
                NvLinkSample(
                    link=link,
                    up=None if state is None else int(state) == enabled,
                    crc_errors_total=(
                        None if flit is None and data is None else (flit or 0) + (data or 0)
                    ),
                    replay_errors_total=counter("replay", link, nvml.NVML_NVLINK_ERROR_DL_REPLAY),
                    recovery_errors_total=counter(
                        "recovery", link, nvml.NVML_NVLINK_ERROR_DL_RECOVERY
                    ),
                )
            )
        return tuple(links), settled
