"""The node agent: collectors, sampler, exporter, daemon."""
