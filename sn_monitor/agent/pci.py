"""PCI addresses in one canonical spelling, so NVML, sysfs and the kernel log agree."""

from __future__ import annotations

import re

_BUS_ID = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?$"
)


def canonical_bus_id(text: str) -> str | None:
    """``00000000:18:00.0``, ``PCI:0000:18:00`` and ``18:00.0`` -> ``0000:18:00.0``.

    NVML pads the domain to 8 digits, the kernel log prints 4 and sometimes omits the
    function; all name the same device. Returns None when ``text`` is not a bus id.
    """
    match = _BUS_ID.match(text.strip())
    if match is None:
        return None
    domain = int(match["domain"] or "0", 16)
    bus = int(match["bus"], 16)
    dev = int(match["dev"], 16)
    fn = int(match["fn"] or "0")
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}"
