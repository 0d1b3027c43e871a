"""sn-monitor: monitoring and fault recovery for GPU supernodes."""

__version__ = "0.1.0"
