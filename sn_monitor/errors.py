"""The root of every error sn-monitor raises on purpose.

Each part has its own specific exceptions (the NVML adapter's, the config loader's, the
store's, the controller's domain errors); all of them derive from :class:`SnMonitorError`,
so that a caller can tell "sn-monitor refused this, with a message for a person" from a
bug (any other exception) with one ``except``.
"""

from __future__ import annotations


class SnMonitorError(Exception):
    """An error sn-monitor raises on purpose; its message is meant for a person."""
